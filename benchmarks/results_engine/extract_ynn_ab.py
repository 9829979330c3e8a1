"""Prompt lookup (k=16) on SmolLM2's extract task (--chat, 4 prompts, 64 new tokens, EOS
ignored: `hispec bench --tasks extract --chat`'s lookup row) with XLA:CPU's YNNPACK fusions
off (the library's CPU default for lookup) / dots only / every type, one process,
interleaved rounds.

    python benchmarks/results_engine/extract_ynn_ab.py "$(hispec pull smollm2-135m-instruct)" extract
"""
import collections, statistics, sys, time
import hispec_jax.decoding.generate as G
from hispec_jax import load_model
from hispec_jax.bench.tasks import task_prompts
from hispec_jax.decoding.engine import compile_cache

model = load_model(sys.argv[1])
task = sys.argv[2] if len(sys.argv) > 2 else "extract"
prompts = task_prompts(model, task, 4, 256, chat=True)
NEW = 64
cap = -(-(max(map(len, prompts)) + NEW + 64) // 64) * 64
print("task", task, "prompt lens", [len(p) for p in prompts], "capacity", cap, flush=True)
K, L = "xla_cpu_experimental_ynn_fusion_type", "LIBRARY_FUSION_TYPE_"
variants = {"off": {K: ""}, "dot": {K: f"{L}DOT"}, "all": {K: f"{L}DOT,{L}ELTWISE,{L}REDUCE"}}
state = {v: (collections.OrderedDict(), {}) for v in variants}
compile_cache.PROGRAM_CACHE = None

def use(v):
    compile_cache.COMPILER_OPTIONS["cpu"] = dict(variants[v])
    compile_cache.ONE_SPAN_OPTIONS["cpu"] = {}
    compile_cache._COMPILED, compile_cache._PROGRAMS = state[v]

def run(method, p):
    options = {"lookup": 16} if method == "lookup" else {}
    return G.generate(model, [p], method=method, max_new_tokens=NEW, ignore_eos=True,
                      max_cache_len=cap, **options)

for method in ("lookup", "ar"):
    for v in variants:
        use(v); t0 = time.perf_counter(); run(method, prompts[0])
        print(f"{method} {v}: first run (compile) {time.perf_counter() - t0:.1f} s", flush=True)
    res, outs = {v: [] for v in variants}, {}
    for rnd in range(3):
        for v in variants:
            use(v)
            t = n = 0; toks = []
            for p in prompts:
                r = run(method, p)
                t += r.stats["decode_seconds"]; n += r.stats["new_tokens"]; toks.append(list(r.token_ids[0]))
            outs[v] = toks; res[v].append(n / t)
    med = {v: statistics.median(x) for v, x in res.items()}
    print(f"{method} tok/s " + "  ".join(f"{v} {med[v]:.1f} {[round(x, 1) for x in res[v]]}" for v in variants)
          + f"  dot/off {med['dot'] / med['off']:.2f} all/off {med['all'] / med['off']:.2f}"
          + f"  same tokens {outs['off'] == outs['dot'] == outs['all']}", flush=True)
