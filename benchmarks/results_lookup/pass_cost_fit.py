"""The CPU default of the lookup gate's pass costs (`gate.DEFAULT_PASS_COST["cpu"]`): SmolLM2-135M's
verification pass timed over T positions of b sequences (`gate.MEASURED_PASSES`: one
sequence's blocks and a server's busy-row batches), the relative costs C(b, T) against the
AR step of the same b, and the (F, J) that fits them (`gate.fit_pass_cost`), with what the
fit and the library's current default predict.

    python benchmarks/results_lookup/pass_cost_fit.py > benchmarks/results_lookup/pass_cost_fit.txt

Compiled without XLA:CPU's YNNPACK fusions, as every `hispec` command and decoding loop is
(`xla_options.PLATFORM_OPTIONS`): the flag is set before JAX starts.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "hispec_jax", "decoding"))
from xla_options import PLATFORM_OPTIONS  # noqa: E402 - no JAX import: before JAX starts

flags = " ".join(f"--{k}={v}" for k, v in PLATFORM_OPTIONS["cpu"].items())
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()
sys.path.pop(0)

from passes import header, load  # noqa: E402

from hispec_jax import load_model  # noqa: E402
from hispec_jax.decoding import gate  # noqa: E402
from hispec_jax.models.pull import pull  # noqa: E402

CONTEXT, CAPACITY, REPEATS = 256, 512, 7


def main():
    model = load_model(str(pull("smollm2-135m-instruct")))
    seconds = gate.time_passes(model, gate.MEASURED_PASSES, CONTEXT, CAPACITY, REPEATS)
    fit = gate.fit_pass_cost(seconds)
    old = gate.default_pass_cost("cpu")
    print(header())
    print(f"# SmolLM2-135M-Instruct, {CONTEXT} cached positions, capacity {CAPACITY}, "
          f"XLA_FLAGS={os.environ['XLA_FLAGS']!r}; fastest of {REPEATS} interleaved rounds\n")
    print(f"fit: F = {float(fit.fixed):.2f}, J = {float(fit.jump):.2f}  "
          f"(the default: F = {float(old.fixed):.2f}, J = {float(old.jump):.2f})\n")
    print("| b | T | ms | C(b, T) measured | fit | default |")
    print("|---|---|---|---|---|---|")
    for (b, T), s in seconds.items():
        print(f"| {b} | {T} | {s * 1e3:.1f} | {s / seconds[(b, 1)]:.2f} | "
              f"{float(gate.relative_cost(b, T, fit)):.2f} | "
              f"{float(gate.relative_cost(b, T, old)):.2f} |")
    print(f"\n# load at end {load()}")


if __name__ == "__main__":
    main()
