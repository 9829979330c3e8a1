"""The shipped model's AR loop at capacities 192, 256 and 384 (a 40-token prompt, 128 new
tokens, greedy, EOS ignored) with its attention read in one span (the whole cache), in
today's spans (`transformer.attention_spans`: one span below 256) and in two spans
(S / 2, S), all compiled without any YNNPACK fusion (`ONE_SPAN_OPTIONS` cleared), in one
process, 3 interleaved rounds; median tokens/s (decode_seconds) of rounds 1-2.

    python benchmarks/results_startup/one_span_ab.py
"""
import collections, statistics, sys, jax
from hispec_jax import DEFAULT_MODEL_DIR, load_model
from hispec_jax.decoding import generate as G
from hispec_jax.decoding.engine import compile_cache
from hispec_jax.models import transformer as T
model = load_model(DEFAULT_MODEL_DIR)
prompt = list(range(100, 5000, 7))[:40]
compile_cache.PROGRAM_CACHE = None
compile_cache.COMPILER_OPTIONS["cpu"] = {"xla_cpu_experimental_ynn_fusion_type": ""}
compile_cache.ONE_SPAN_OPTIONS["cpu"] = {}
orig = T.attention_spans
variants = {"one span": lambda S: (S,), "today": orig, "half": lambda S: (S // 2, S) if S % 2 == 0 else (S,)}
caps = [192, 256, 384]
state = {v: (collections.OrderedDict(), {}) for v in variants}
res = {(v, c): [] for v in variants for c in caps}
for rnd in range(3):
    for v, fn in variants.items():
        T.attention_spans = fn
        compile_cache._COMPILED, compile_cache._PROGRAMS = state[v]
        for c in caps:
            r = G.generate(model, [prompt], method="ar", max_new_tokens=128, ignore_eos=True, max_cache_len=c)
            res[v, c].append(r.stats["new_tokens"] / r.stats["decode_seconds"])
print({f"{v} {c}": round(statistics.median(x[1:]), 1) for (v, c), x in res.items()}, flush=True)
