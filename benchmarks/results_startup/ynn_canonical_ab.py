"""XLA:CPU's YNNPACK fusions on and off for the decoding loop, in one process, with the
current (canonical) projection order: the shipped model, `generate` 4 times per round
(ShareGPT's first 4 prompts, or "The capital of France is" 4 times), 4 interleaved rounds,
the loop compiled afresh per variant (`engine.COMPILER_OPTIONS["cpu"]` patched; the program
cache off). Median tokens/s of rounds 1-3 (decode_seconds: prefill and rounds).

    python benchmarks/results_startup/ynn_canonical_ab.py sharegpt|short NEW_TOKENS METHOD
"""
import time, statistics, collections
from hispec_jax import load_model
from hispec_jax.datasets import load_prompts
from hispec_jax.decoding import generate as G
from hispec_jax.decoding.engine import compile_cache
from hispec_jax.models import transformer
from hispec_jax.models.pull import default_cache_dir
from hispec_jax import DEFAULT_MODEL_DIR
model = load_model(DEFAULT_MODEL_DIR)
prompts = load_prompts("sharegpt", model.tokenizer, 4, 256)
cap = -(-(max(map(len, prompts)) + 128 + 16) // 64) * 64
print("prompt lens", [len(p) for p in prompts], "capacity", cap)
new_spans = transformer.attention_spans
old_spans = lambda S: tuple(range(max(-(-S // 8), 128), S, max(-(-S // 8), 128))) + (S,)
compile_cache.PROGRAM_CACHE = None
base = dict(compile_cache.COMPILER_OPTIONS["cpu"])
variants = {"ynn off": (new_spans, base), "ynn on": (new_spans, {})}
dicts = {k: collections.OrderedDict() for k in variants}
progs = {k: {} for k in variants}
res = {k: [] for k in variants}
import sys
short = model.tokenizer('The capital of France is')['input_ids']
PROMPTS = [short]*4 if sys.argv[1] == 'short' else prompts
NEW = int(sys.argv[2]); METHOD = sys.argv[3]
for rnd in range(4):
    for name, (spans, opts) in variants.items():
        transformer.attention_spans = spans
        compile_cache.COMPILER_OPTIONS["cpu"] = opts
        compile_cache._COMPILED = dicts[name]; compile_cache._PROGRAMS = progs[name]
        t = n = 0
        for p in PROMPTS:
            r = G.generate(model, [p], method=METHOD, max_new_tokens=NEW, ignore_eos=True, max_cache_len=cap)
            t += r.stats["decode_seconds"]; n += r.stats["new_tokens"]
        res[name].append(n / t)
        print(rnd, name, round(n / t, 1), "capacity", r.stats["cache_capacity"], flush=True)
for k, v in res.items(): print(k, "median of rounds 1-3:", round(statistics.median(v[1:]), 1))
