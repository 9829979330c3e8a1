"""Host memory of loading a GGUF model and decoding with it (resident set size, CPU).

For each (dtype, layer layout) a fresh process imports hispec_jax, records its RSS, loads the
GGUF file with `hispec_jax.load_model`, records RSS and the peak RSS so far (`ru_maxrss`),
then runs one greedy chat generation and records the peak again. The weights' own size
(parameters x bytes per value) is reported beside it, so "beyond the weights" is
`peak - baseline - weights`. RSS counts the GGUF file's pages while they are mapped
(file-backed, reclaimable); "anonymous" memory (RssAnon) does not. Also checks that loading never imported torch.

    python benchmarks/gguf_memory.py [MODEL.gguf]      # default: the pulled SmolLM2-135M

Not part of the test suite.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
def status(key):
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(key + ':')) / 1024
def rss(): return status('VmRSS')
def anon(): return status('RssAnon')
def peak(): return status('VmHWM')
import jax, numpy as np, hispec_jax
path, dtype, layout = sys.argv[1:4]
jax.numpy.zeros(1).block_until_ready()
base, anon_base = rss(), anon()
t0 = time.perf_counter()
model = hispec_jax.load_model(path, dtype=dtype, layer_layout=layout)
load_s = time.perf_counter() - t0
after_load, anon_load, peak_load = rss(), anon(), peak()
weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model.params)) / 2**20
torch_imported = "torch" in sys.modules
r = hispec_jax.generate(model, "What is the capital of France?", chat=True, max_new_tokens=32)
print(json.dumps(dict(dtype=dtype, layout=layout, load_s=load_s, baseline_mb=base,
                      weights_mb=weights, after_load_mb=after_load, anon_after_load_mb=anon_load,
                      anon_baseline_mb=anon_base, peak_load_mb=peak_load,
                      peak_generate_mb=peak(), torch_imported=torch_imported,
                      text=r.texts[0])))
"""


def main() -> int:
    if len(sys.argv) > 1:
        path = sys.argv[1]
    else:
        from hispec_jax.models import pull
        path = str(pull.cached_path("smollm2-135m-instruct"))
    rows = []
    for dtype in ("float32", "bfloat16"):
        for layout in ("unrolled", "scan"):
            out = subprocess.run([sys.executable, "-c", CHILD, path, dtype, layout],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("| dtype | layout | load s | weights MB | RSS after import | RSS after load (anonymous "
          "memory beyond import + weights) | peak RSS while loading (beyond import + weights) | "
          "peak RSS after generating (beyond import + weights) | torch imported |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        extra_load = r["peak_load_mb"] - r["baseline_mb"] - r["weights_mb"]
        extra_gen = r["peak_generate_mb"] - r["baseline_mb"] - r["weights_mb"]
        anon_extra = r["anon_after_load_mb"] - r["anon_baseline_mb"] - r["weights_mb"]
        print(f"| {r['dtype']} | {r['layout']} | {r['load_s']:.1f} | {r['weights_mb']:.0f} | "
              f"{r['baseline_mb']:.0f} | {r['after_load_mb']:.0f} (+{anon_extra:.0f}) | "
              f"{r['peak_load_mb']:.0f} "
              f"(+{extra_load:.0f}) | {r['peak_generate_mb']:.0f} (+{extra_gen:.0f}) | "
              f"{r['torch_imported']} |")
    print("\n" + "\n".join(f"{r['dtype']}/{r['layout']}: {r['text']!r}" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
