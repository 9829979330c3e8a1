"""AR decoding speed of one model loaded three ways, as `hispec generate --dtype` /
`--quantize` load it: float32, bfloat16 and weight-only int8 (float32 activations), in one
process, interleaved round by round (the first round compiles and is not counted), the
median decode tokens/s of each (`result.stats["tokens_per_second"]`).

    python benchmarks/results_engine/dtype_ab.py MODEL [--rounds 4] [--tokens 48] \
        > benchmarks/results_engine/dtype_ab.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess

from hispec_jax.cli import common

FORMS = {"float32": {}, "bfloat16": {"dtype": "bfloat16"},
         "int8": {"quantize": "int8", "layer_layout": "unrolled"}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--tokens", type=int, default=48)
    args = p.parse_args()
    common.use_compilation_cache()
    common.use_cpu_codegen()  # as the `hispec` command compiles
    import hispec_jax
    import jax

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# {args.model}; {platform.node()} {os.cpu_count()} CPUs, {jax.default_backend()}, "
          f"jax {jax.__version__}, commit {commit}; AR, {args.tokens} tokens, EOS ignored")
    models = {name: hispec_jax.load_model(args.model, **kw) for name, kw in FORMS.items()}
    speeds = {name: [] for name in FORMS}
    for r in range(args.rounds):
        for name, model in models.items():
            result = hispec_jax.generate(model, "The capital of France is", method="ar",
                                         max_new_tokens=args.tokens, ignore_eos=True)
            if r:
                speeds[name].append(result.stats["tokens_per_second"])
        print(f"round {r}: load average {os.getloadavg()[0]:.1f}" + ("" if not r else ", " +
              ", ".join(f"{n} {v[-1]:.1f}" for n, v in speeds.items())), flush=True)
    base = statistics.median(speeds["float32"])
    for name, values in speeds.items():
        m = statistics.median(values)
        print(f"{name:9s} median {m:.2f} tokens/s ({m / base:.2f}x float32)")


if __name__ == "__main__":
    main()
