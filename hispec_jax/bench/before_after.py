"""Single-device AR speed of two source trees, side by side (is a change free for mesh=None?).

    git archive BASE hispec_jax | tar -x -C /tmp/base
    python -m hispec_jax.bench before-after --before /tmp/base --after . --rounds 3

Each round runs one fresh process per tree (before, then after, so machine load hits both
alike; `PYTHONPATH` = the tree, `JAX_PLATFORMS=cpu`): the shipped model, AR, batch 1, 64 new
tokens (EOS ignored), one warm-up call (compiles), then 5 timed `generate` calls; the process
reports their median tokens/s (the loop's own time, `stats["tokens_per_second"]`) and a hash
of the lowered loop's StableHLO (equal hashes: both trees compile the same single-device
program). The summary: each side's median and best of the round medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from hispec_jax.bench import args as args_lib

PROG = "hispec bench-tool before-after"

# One measurement in a fresh process of one tree; prints one JSON line.
CHILD = """
import hashlib, json, statistics
import hispec_jax
from hispec_jax.decoding import engine as engine_lib
m = hispec_jax.load_model(hispec_jax.DEFAULT_MODEL_DIR)
prompt = "User: What is the capital of France?\\nAssistant:"
kw = dict(method="ar", max_new_tokens=64, ignore_eos=True)
hispec_jax.generate(m, prompt, **kw)
tps = [hispec_jax.generate(m, prompt, **kw).stats["tokens_per_second"] for _ in range(5)]
hlo = next(iter(engine_lib._COMPILED)).lower().as_text()
print(json.dumps({"median": statistics.median(tps), "all": tps,
                  "hlo": hashlib.sha256(hlo.encode()).hexdigest()[:12]}))
"""


def measure(tree: str) -> dict:
    """{"median": tokens/s, "all": [5 calls' tokens/s], "hlo": hash} of one fresh process."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env=env, timeout=600)
    if proc.returncode:
        raise RuntimeError(f"{tree}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary_lines(results: dict[str, list[dict]]) -> list[str]:
    """Per side the median and best of its rounds' medians; whether every process lowered
    the same single-device loop."""
    lines = []
    for side, rounds in results.items():
        medians = [o["median"] for o in rounds]
        lines.append(f"{side:6s} median of round medians {statistics.median(medians):6.1f} tok/s, "
                     f"best {max(medians):6.1f}")
    hashes = sorted({o["hlo"] for rounds in results.values() for o in rounds})
    lines.append("lowered single-device loop: "
                 + ("identical" if len(hashes) == 1 else f"differs {hashes}"))
    return lines


def main(argv=None) -> int:
    ap = args_lib.Parser(prog=PROG, description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--before", required=True, help="source tree holding hispec_jax/ (before)")
    ap.add_argument("--after", required=True, help="source tree holding hispec_jax/ (after)")
    ap.add_argument("--rounds", type=int, default=3, help="processes per tree")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    for side in ("before", "after"):
        tree = getattr(args, side)
        if not os.path.isdir(os.path.join(tree, "hispec_jax")):
            ap.error(f"--{side} {tree}: no hispec_jax/ in it")
    results: dict[str, list[dict]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for side in ("before", "after"):
            out = measure(getattr(args, side))
            results[side].append(out)
            print(f"round {r + 1} {side:6s} {out['median']:6.1f} tok/s  "
                  f"(calls {', '.join(f'{t:.1f}' for t in out['all'])})  hlo {out['hlo']}",
                  flush=True)
    print("\n".join(summary_lines(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
