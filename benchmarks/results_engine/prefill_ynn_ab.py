"""SmolLM2 prefill-chunk passes (b=1, T=16/64, context 256, capacity 512) and the AR step,
XLA:CPU YNNPACK fusions off / dots / every type, canonical weights, interleaved, best of.

    python benchmarks/results_engine/prefill_ynn_ab.py "$(hispec pull smollm2-135m-instruct)"
"""
import sys
from hispec_jax import load_model
from hispec_jax.decoding import gate, xla_options
M = sys.argv[1]
K, L = "xla_cpu_experimental_ynn_fusion_type", "LIBRARY_FUSION_TYPE_"
variants = {"off": "", "dot": f"{L}DOT", "all": f"{L}DOT,{L}ELTWISE,{L}REDUCE"}
shapes = ((1, 1), (1, 16), (1, 64))
m = load_model(M)
res = {}
for rep in range(3):
    for v, val in variants.items():
        xla_options.PLATFORM_OPTIONS["cpu"] = {K: val}
        for s, t in gate.time_passes(m, shapes, repeats=3, calls=5).items():
            res[v, s] = min(res.get((v, s), 9), t)
for s in shapes:
    print(f"b={s[0]} T={s[1]:3d}: " + "  ".join(f"{v} {1000*res[v, s]:.1f} ms" for v in variants)
          + f"  dot/off {res['dot', s]/res['off', s]:.2f} all/off {res['all', s]/res['off', s]:.2f}", flush=True)
