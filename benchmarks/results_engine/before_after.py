"""Offline `generate` before and after a change to the engine: fresh processes of two
checkouts, interleaved, on the shipped model and SmolLM2 (GGUF, `hispec pull`).

    git worktree add ../before <commit>; git worktree add ../after <commit>
    python benchmarks/results_engine/before_after.py ../before ../after --rounds 4

Each round runs the two checkouts in turn, the first one alternating. Each process loads
the model, runs every case once to compile (or load) its programs, then
`--runs` times more, keeping the fastest run's tokens/s (`stats["decode_seconds"]`: prefill, rounds
and reading the tokens back; compilation excluded). Four prompts, 64 new tokens each, EOS
ignored, greedy. Prints each process's figures and, per case, the median over rounds of
after / before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROMPTS = ["The history of the Roman empire begins with",
           'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
           "Write a short story about a robot who learns to paint. Once upon a time,",
           "Summarize: The quick brown fox jumps over the lazy dog. The dog was not amused "
           "and the fox ran away. Summary:"]
# model -> (method, batch size) cases
CASES = {"shipped": [("ar", 1), ("lookup", 1), ("layerskip", 1), ("hispec", 1), ("ar", 4),
                     ("hispec", 4)],
         "smollm2": [("ar", 1), ("lookup", 1), ("ar", 4)]}


def measure(which: str, runs: int) -> dict[str, float]:
    """This process's tokens/s per case of model `which` (the checkout on sys.path)."""
    import hispec_jax as hj

    if which == "shipped":
        from hispec_jax.cli.common import default_model_dir
        model = hj.load_model(default_model_dir())
    else:
        from hispec_jax.models.pull import pull
        model = hj.load_model(str(pull("smollm2-135m-instruct")))
    out = {}
    for method, batch in CASES[which]:
        kw = dict(method=method, max_new_tokens=64, ignore_eos=True, batch_size=batch)
        hj.generate(model, PROMPTS, **kw)  # compiles or loads its programs
        stats = [hj.generate(model, PROMPTS, **kw).stats for _ in range(runs)]
        out[f"{method} b{batch}"] = max(s["new_tokens"] / s["decode_seconds"] for s in stats)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per case and process")
    ap.add_argument("--models", default="shipped,smollm2", help="of: shipped, smollm2")
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # a worker process
    args = ap.parse_args()
    if args.measure:
        print("RESULT " + json.dumps(measure(args.measure, args.runs)))
        return 0
    ratios: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for which in args.models.split(","):
            got = {}
            for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
                proc = subprocess.run(
                    [sys.executable, __file__, args.before, args.after, "--measure", which,
                     "--runs", str(args.runs)],
                    env=dict(os.environ, PYTHONPATH=getattr(args, name)), capture_output=True,
                    text=True, check=True)
                line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
                got[name] = json.loads(line[len("RESULT "):])
                print(f"{name} {which} round {r + 1}: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in got[name].items()), flush=True)
            for case in got["after"]:
                ratios.setdefault(f"{which} {case}", []).append(
                    got["after"][case] / got["before"][case])
    print("\nafter / before, median over rounds (min-max):")
    for case, values in ratios.items():
        print(f"  {case:20s} {statistics.median(values):.2f} "
              f"({min(values):.2f}-{max(values):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
