"""AR on SmolLM2 extract (4 prompts, 64 tokens), batch 1: YNNPACK dot fusions in the prefill
program, the rounds program, both, or neither. One process, interleaved rounds.

    python benchmarks/results_engine/ar_dot_ab.py "$(hispec pull smollm2-135m-instruct)" ar
"""
import collections, statistics, sys
import hispec_jax.decoding.generate as G
from hispec_jax import load_model
from hispec_jax.bench.tasks import task_prompts
from hispec_jax.decoding.engine import compile_cache
from interleaved_tok_s import interleaved_tok_s

M = sys.argv[1]
METHOD = sys.argv[2] if len(sys.argv) > 2 else "ar"
m = load_model(M)
prompts = task_prompts(m, "extract", 4, 256, chat=True)
NEW = 64
K, L = "xla_cpu_experimental_ynn_fusion_type", "LIBRARY_FUSION_TYPE_"
orig_co, orig_ro = compile_cache.compiler_options, compile_cache.rounds_options
def with_dot(opts):
    opts = dict(opts)
    have = [x for x in opts.get(K, "").split(",") if x]
    opts[K] = ",".join(have + [f"{L}DOT"])
    return opts
variants = [("off", "off"), ("dot", "off"), ("off", "dot"), ("dot", "dot")]
state = {v: (collections.OrderedDict(), {}) for v in variants}
compile_cache.PROGRAM_CACHE = None
def use(v):
    compile_cache.compiler_options = (lambda capacity=None: with_dot(orig_co(capacity))) if v[0] == "dot" else orig_co
    compile_cache.rounds_options = (lambda e: with_dot(orig_ro(e))) if v[1] == "dot" else orig_ro
    compile_cache._COMPILED, compile_cache._PROGRAMS = state[v]
def run(v, p):
    return G.generate(m, [p], method=METHOD, max_new_tokens=NEW, ignore_eos=True)
dec = interleaved_tok_s(variants, use, run, prompts)
for v in variants:
    print(f"prefill={v[0]} rounds={v[1]}: decode tok/s {statistics.median(dec[v]):.1f} {[round(x,1) for x in dec[v]]}", flush=True)
