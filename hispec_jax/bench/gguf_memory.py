"""Host memory (resident set size) of loading a GGUF model and decoding with it, on CPU.

    python -m hispec_jax.bench gguf-memory [MODEL.gguf]   # default: the pulled SmolLM2-135M

For each (dtype, layer layout) of float32/bfloat16 x unrolled/scan, a fresh process imports
hispec_jax and records its RSS (the baseline), loads the GGUF file with
`hispec_jax.load_model`, records RSS, anonymous RSS (RssAnon) and the peak RSS so far
(VmHWM), then runs one greedy chat generation (32 new tokens) and records the peak again.
The weights' own size (parameters x bytes per value) is reported beside it, so "beyond the
weights" is `peak - baseline - weights`. RSS counts the GGUF file's pages while they are
mapped (file-backed, reclaimable); anonymous memory does not. Also reports whether loading
imported torch (it must not). Sizes in MiB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hispec_jax.bench import args as args_lib

PROG = "hispec bench-tool gguf-memory"
VARIANTS = (("float32", "unrolled"), ("float32", "scan"), ("bfloat16", "unrolled"),
            ("bfloat16", "scan"))

# One measurement, in a fresh process: argv = [path, dtype, layout]; prints one JSON line.
CHILD = r"""
import json, sys, time
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


def beyond_weights(row: dict) -> dict[str, float]:
    """MiB beyond the import baseline and the weights: anonymous memory after loading, peak
    RSS while loading, peak RSS after generating."""
    weights = row["weights_mb"]
    return {"anon_after_load": row["anon_after_load_mb"] - row["anon_baseline_mb"] - weights,
            "peak_load": row["peak_load_mb"] - row["baseline_mb"] - weights,
            "peak_generate": row["peak_generate_mb"] - row["baseline_mb"] - weights}


def table_lines(rows: list[dict]) -> list[str]:
    lines = ["| dtype | layout | load s | weights MB | RSS after import | RSS after load "
             "(anonymous memory beyond import + weights) | peak RSS while loading (beyond "
             "import + weights) | peak RSS after generating (beyond import + weights) | "
             "torch imported |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        extra = beyond_weights(r)
        lines.append(f"| {r['dtype']} | {r['layout']} | {r['load_s']:.1f} | {r['weights_mb']:.0f} "
                     f"| {r['baseline_mb']:.0f} | {r['after_load_mb']:.0f} "
                     f"(+{extra['anon_after_load']:.0f}) | {r['peak_load_mb']:.0f} "
                     f"(+{extra['peak_load']:.0f}) | {r['peak_generate_mb']:.0f} "
                     f"(+{extra['peak_generate']:.0f}) | {r['torch_imported']} |")
    return lines


def measure(path: str, dtype: str, layout: str) -> dict:
    """One fresh process's measurements (the JSON line CHILD prints)."""
    proc = subprocess.run([sys.executable, "-c", CHILD, path, dtype, layout],
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{dtype}/{layout} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = args_lib.Parser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default=None,
                    help="a .gguf file (default: `hispec pull smollm2-135m-instruct`'s)")
    args = ap.parse_args(argv)
    if args.model is None:
        from hispec_jax.models import pull

        path = str(pull.cached_path("smollm2-135m-instruct"))
    else:
        path = args.model
    if not os.path.isfile(path):
        ap.error(f"no GGUF file at {path}" + ("" if args.model else
                                              " (run `hispec pull smollm2-135m-instruct`)"))
    rows = [measure(path, dtype, layout) for dtype, layout in VARIANTS]
    print("\n".join(table_lines(rows)))
    print("\n" + "\n".join(f"{r['dtype']}/{r['layout']}: {r['text']!r}" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
