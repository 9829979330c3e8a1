"""AR on SmolLM2 extract (4 prompts, 64 tokens), weights canonical or out-major x YNNPACK
fusions off or all types, one process, interleaved rounds: how much of AR's gap to 0c0c8fe
(out-major on CPU, YNNPACK on) the two settings explain.

    python benchmarks/results_engine/ar_layout_ynn_ab.py "$(hispec pull smollm2-135m-instruct)"
"""
import collections, statistics, sys
import hispec_jax.decoding.generate as G
from hispec_jax import load_model
from hispec_jax.bench.tasks import task_prompts
from hispec_jax.decoding.engine import compile_cache
from interleaved_tok_s import interleaved_tok_s

M = sys.argv[1]  # "$(hispec pull smollm2-135m-instruct)"
models = {False: load_model(M, out_major=False), True: load_model(M, out_major=True)}
prompts = task_prompts(models[False], "extract", 4, 256, chat=True)
NEW = 64
K, L = "xla_cpu_experimental_ynn_fusion_type", "LIBRARY_FUSION_TYPE_"
ynn = {"off": {K: ""}, "all": {K: f"{L}DOT,{L}ELTWISE,{L}REDUCE"}}
variants = [(om, y) for om in (False, True) for y in ynn]
state = {v: (collections.OrderedDict(), {}) for v in variants}
compile_cache.PROGRAM_CACHE = None

def use(v):
    compile_cache.COMPILER_OPTIONS["cpu"] = dict(ynn[v[1]])
    compile_cache.ONE_SPAN_OPTIONS["cpu"] = dict(ynn[v[1]])
    compile_cache._COMPILED, compile_cache._PROGRAMS = state[v]

def run(v, p):
    return G.generate(models[v[0]], [p], method="ar", max_new_tokens=NEW, ignore_eos=True)

dec = interleaved_tok_s(variants, use, run, prompts)
for v in variants:
    print(f"out_major={v[0]} ynn={v[1]}: decode tok/s {statistics.median(dec[v]):.1f} {[round(x,1) for x in dec[v]]}")
