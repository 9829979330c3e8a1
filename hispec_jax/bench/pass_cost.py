"""Measure the lookup gate's pass costs of a model on this host and keep them (device_costs).

    hispec bench-tool pass-cost --model "$(hispec pull smollm2-135m-instruct)"
    hispec bench-tool pass-cost --model M --show      # what is kept, measuring nothing

The gate weighs a proposal's expected tokens against its verification pass's cost relative
to the AR step, C(b, T) for b sequences and a block of T positions; this times the model's
passes here (every shape compiles once: a few minutes on a CPU), prints them, and keeps
them where `generate`, `chat` and `serve` read them for this model on this host
(`decoding/device_costs.py`). `hispec serve` measures on its own after its warm-up when
nothing is kept; this is the way to measure before a `generate` or `chat`, or again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hispec_jax.bench import args as args_lib


def main(argv=None) -> int:
    ap = args_lib.Parser(prog="hispec bench-tool pass-cost", description=__doc__.split("\n")[0],
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", help="a HF directory or .gguf file (required)")
    ap.add_argument("--show", action="store_true",
                    help="print the kept measurement (or the default the gate uses) only")
    ap.add_argument("--repeats", type=int, default=5,
                    help="interleaved repeats of every pass (the fastest is kept)")
    ap.add_argument("--calls", type=int, default=10, help="calls per timed repeat")
    args = ap.parse_args(argv)
    if args.model is None:
        ap.error("--model is required (a HF directory or .gguf file)")
    if not Path(args.model).exists():
        ap.error(f"--model {args.model}: no such file or directory")
    for name in ("repeats", "calls"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")

    from hispec_jax.decoding import device_costs
    from hispec_jax.decoding import gate
    from hispec_jax.models.model import load_model

    model = load_model(args.model)
    if args.show:
        cost, source = device_costs.for_model(model)
        print(f"{source}: {device_costs.describe(cost)}")
        print(f"kept in: {device_costs.path_for(model) or 'nowhere (HISPEC_PASS_COSTS=0)'}")
        return 0
    if device_costs.store_dir() is None:
        print("hispec bench-tool pass-cost: HISPEC_PASS_COSTS=0 keeps no measurement",
              file=sys.stderr)
        return 2
    print(f"timing {len(gate.MEASURED_PASSES)} passes (b sequences x T positions) ...",
          file=sys.stderr, flush=True)
    cost, seconds = device_costs.measure_and_store(model, repeats=args.repeats,
                                                   calls=args.calls)
    default = gate.default_pass_cost()
    print("| b | T | ms | C(b, T) measured | the default's |")
    print("|---|---|---|---|---|")
    for (b, T), s in sorted(seconds.items()):
        c = s / seconds[b, 1]
        print(f"| {b} | {T} | {s * 1e3:.1f} | {c:.2f} | "
              f"{float(gate.relative_cost(b, T, default)):.2f} |")
    print(f"\nfit: {device_costs.describe(cost).split(';')[0]} (default F "
          f"{float(default.fixed):.2f}, J {float(default.jump):.2f})")
    print(f"kept in: {device_costs.path_for(model)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
