"""Single-device AR speed of two source trees, side by side (is a change free for mesh=None?).

Each round runs one fresh process per tree (alternating, so machine load hits both alike):
the shipped model, AR, batch 1, 64 new tokens (EOS ignored), one warm-up call (compiles),
then 5 timed `generate` calls; the process prints their median tokens/s and a hash of the
lowered loop's StableHLO (equal hashes: both trees compile the same single-device program).

    git archive BASE hispec_jax | tar -x -C /tmp/base
    python benchmarks/single_device_before_after.py --before /tmp/base --after . --rounds 3

Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = """
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


def run(tree: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          env=env, timeout=600)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="source tree holding hispec_jax/ (before)")
    ap.add_argument("--after", required=True, help="source tree holding hispec_jax/ (after)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    results = {"before": [], "after": []}
    for r in range(args.rounds):
        for side in ("before", "after"):
            out = run(getattr(args, side))
            results[side].append(out)
            print(f"round {r + 1} {side:6s} {out['median']:6.1f} tok/s  "
                  f"(calls {', '.join(f'{t:.1f}' for t in out['all'])})  hlo {out['hlo']}",
                  flush=True)
    for side, rows in results.items():
        medians = [o["median"] for o in rows]
        print(f"{side:6s} median of round medians {statistics.median(medians):6.1f} tok/s, "
              f"best {max(medians):6.1f}")
    same = {o["hlo"] for rows in results.values() for o in rows}
    print("lowered single-device loop:", "identical" if len(same) == 1 else f"differs {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
