"""The layer projections' stored forms side by side on this device: apart (as shipped),
fused (`params.fuse_layer`: q/k/v as one product, gate/up as another) and weight-only int8
(`params.quantize_layer`). Times the verification pass (every layer, the head, argmax;
`gate.time_passes`) over T positions of b sequences, in one process, the forms
interleaved, the fastest of each.

    python benchmarks/results_engine/weight_forms_ab.py MODEL [--rounds 3] \
        > benchmarks/results_engine/weight_forms_ab.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time

import jax

from hispec_jax.decoding import gate
from hispec_jax.models.model import load_model

SHAPES = ((1, 1), (1, 4), (1, 8), (1, 16), (1, 64), (8, 1), (8, 2), (8, 4))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# {platform.machine()}, {os.cpu_count()} cores, jax {jax.__version__}, commit "
          f"{commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load "
          f"{os.getloadavg()}")
    models = {"apart": load_model(a.model, fused=False), "fused": load_model(a.model, fused=True),
              "int8": load_model(a.model, fused=False, quantize="int8")}
    print(f"# {a.model}; 256 cached positions, capacity 512; {a.rounds} interleaved rounds of "
          "3 repeats x 5 calls, the fastest")
    best = {name: {} for name in models}
    for _ in range(a.rounds):
        for name, model in models.items():
            for shape, seconds in gate.time_passes(model, SHAPES, repeats=3, calls=5).items():
                best[name][shape] = min(best[name].get(shape, seconds), seconds)
    print("\n| b | T | apart ms | fused ms | int8 ms | fused / apart | int8 / apart |\n"
          "|---|---|---|---|---|---|---|")
    for b, T in SHAPES:
        x, y, z = (best[name][b, T] for name in ("apart", "fused", "int8"))
        print(f"| {b} | {T} | {x * 1e3:.1f} | {y * 1e3:.1f} | {z * 1e3:.1f} | {y / x:.3f} | "
              f"{z / x:.3f} |")
    print(f"\n# load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
