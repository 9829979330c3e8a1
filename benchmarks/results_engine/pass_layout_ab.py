"""SmolLM2 pass seconds (every layer + head, context 256, capacity 512), canonical vs
out-major projections, YNNPACK off (the library's CPU options), interleaved, best of.

    python benchmarks/results_engine/pass_layout_ab.py "$(hispec pull smollm2-135m-instruct)"
"""
import sys
import numpy as np
from hispec_jax import load_model
from hispec_jax.decoding import gate
M = sys.argv[1]  # "$(hispec pull smollm2-135m-instruct)"
shapes = ((1, 1), (1, 2), (1, 4), (1, 8), (1, 16), (1, 64), (8, 1), (8, 2), (8, 4))
res = {}
for rep in range(2):
    for om in (False, True):
        m = load_model(M, out_major=om)
        t = gate.time_passes(m, shapes, repeats=3, calls=5)
        for s, v in t.items():
            res.setdefault((om, s), []).append(v)
        del m
for s in shapes:
    c, o = min(res[(False, s)]), min(res[(True, s)])
    print(f"b={s[0]} T={s[1]:3d}: canonical {1000*c:6.1f} ms  out-major {1000*o:6.1f} ms  out/canon {o/c:.2f}", flush=True)
