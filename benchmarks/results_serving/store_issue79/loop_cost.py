"""The store search's cost inside the compiled loop: the same prompts, an EMPTY store of
R = 16384 vs R = 64 vs none (so every proposal and token is the same), interleaved repeats,
decode seconds (compile excluded), the fastest of each."""
import sys
import hispec_jax
from hispec_jax.bench import tasks
from hispec_jax.decoding import suffix_store
M = "/root/.cache/hispec/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
model = hispec_jax.load_model(M)
prompts = tasks.task_prompts(model, "code", 8, 400, chat=True)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
configs = {"none": None, "R=64": 64, "R=16384": 16384}
for B in (1, 8):
    ps = prompts[:B]
    best = {}
    for rep in range(reps + 1):
        for name, R in configs.items():
            r = hispec_jax.generate(model, ps, max_new_tokens=64, max_cache_len=640, batch_size=B,
                                    cross_request=False if R is None else suffix_store.SuffixStore(R))
            if rep:
                best[name] = min(best.get(name, 1e9), r.stats["decode_seconds"])
                rounds = r.stats.get("rounds") or r.stats.get("lookup", {}).get("lookups")
    print(f"B={B}: " + ", ".join(f"{n} {s:.3f}s ({s / best['none']:.3f})" for n, s in best.items()),
          "lookups", rounds, flush=True)
