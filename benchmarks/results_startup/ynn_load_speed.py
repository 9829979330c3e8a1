"""XLA:CPU's YNNPACK fusions off and on, per model and method, in one process: how long the
loop takes to compile, how long to load from the program cache afterwards (what every later
start pays), how many YNNPACK fusions it holds, and its decode speed (4 interleaved rounds of
ShareGPT's first 4 prompts, greedy, EOS ignored; median tokens/s of rounds 1-3).

    python benchmarks/results_startup/ynn_load_speed.py MODEL NEW_TOKENS METHOD[,METHOD...] [all|reduce]

MODEL: "shipped" or a checkpoint path (e.g. SmolLM2's GGUF). "on" enables every YNNPACK
fusion type (jaxlib's default) or only its reductions ("reduce").
"""
import collections
import statistics
import sys
import tempfile
import time

from hispec_jax import DEFAULT_MODEL_DIR, load_model
from hispec_jax.datasets import load_prompts
from hispec_jax.decoding import generate as G
from hispec_jax.decoding.engine import compile_cache

L = "LIBRARY_FUSION_TYPE_"
# "on": which YNNPACK fusion types (jaxlib 0.10's default list is all three)
VARIANTS = {"all": f"{L}DOT,{L}ELTWISE,{L}REDUCE", "reduce": f"{L}REDUCE"}

name, NEW, methods = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
VARIANT = sys.argv[4] if len(sys.argv) > 4 else "all"
model = load_model(DEFAULT_MODEL_DIR if name == "shipped" else name)
prompts = load_prompts("sharegpt", model.tokenizer, 4, 256)
cap = -(-(max(map(len, prompts)) + NEW + 16) // 64) * 64
print("model", name, "prompt lens", [len(p) for p in prompts], "capacity", cap, flush=True)
K, L = "xla_cpu_experimental_ynn_fusion_type", "LIBRARY_FUSION_TYPE_"
variants = {"off": {K: ""}, "on": {K: VARIANTS[VARIANT]}}
state = {v: (collections.OrderedDict(), {}) for v in variants}
dirs = {v: tempfile.mkdtemp(prefix=f"ynn_{v}_") for v in variants}


def use(variant):
    compile_cache.COMPILER_OPTIONS["cpu"] = dict(variants[variant])
    compile_cache.ONE_SPAN_OPTIONS["cpu"] = {}  # the variant's options, whatever the capacity
    compile_cache._COMPILED, compile_cache._PROGRAMS = state[variant]
    compile_cache.PROGRAM_CACHE = dirs[variant]


def run(method, prompt):
    return G.generate(model, [prompt], method=method, max_new_tokens=NEW, ignore_eos=True,
                      max_cache_len=cap)


for method in methods:
    for v in variants:
        use(v)
        first = run(method, prompts[0]).stats["compile_seconds"]
        text = next(reversed(compile_cache._COMPILED.values()))[0].as_text()
        fusions = text.count("__ynn_fusion")
        loads = []
        for _ in range(2):
            compile_cache.clear_compiled()
            t0 = time.perf_counter()
            run(method, prompts[0])
            loads.append(time.perf_counter() - t0)
        print(f"{method:10s} ynn {v if v == 'off' else VARIANT:6s}: compile {first:6.1f} s, load+first run "
              f"{min(loads):5.2f} s, ynn fusions {fusions}", flush=True)
    res = {v: [] for v in variants}
    outs = {}
    for rnd in range(4):
        for v in variants:
            use(v)
            t = n = 0
            toks = []
            for p in prompts:
                r = run(method, p)
                t += r.stats["decode_seconds"]; n += r.stats["new_tokens"]
                toks.append(list(r.token_ids[0]))
            outs[v] = toks
            res[v].append(n / t)
    med = {v: statistics.median(x[1:]) for v, x in res.items()}
    print(f"{method:10s} tok/s: off {med['off']:6.1f}  {VARIANT} {med['on']:6.1f}  on/off "
          f"{med['on'] / med['off']:.2f}  rounds off {[round(x) for x in res['off']]} "
          f"on {[round(x) for x in res['on']]}  same tokens {outs['off'] == outs['on']}",
          flush=True)
