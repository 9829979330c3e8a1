"""Sums a `HISPEC_TESTS_COMPILE_LOG` run (tests/conftest.py) per test file: wall seconds, XLA
programs built (compiled, or loaded from the compilation cache: "loads"), the seconds they
took, and the slowest tests with their slowest programs; files by wall seconds.

    HISPEC_TESTS_COMPILE_LOG=/tmp/clog python -m pytest -q -n 2 --dist loadfile tests
    python tests/compile_log.py /tmp/clog [--tests 20]
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("--tests", type=int, default=20, help="also list the N slowest tests")
    args = parser.parse_args()
    rows = [json.loads(line) for path in sorted(args.directory.glob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
    files = collections.defaultdict(lambda: [0.0, 0, 0.0, 0, 0])
    for row in rows:
        total = files[row["test"].split("::")[0]]
        total[0] += row["seconds"]
        total[1] += row["programs"]
        total[2] += row["build_s"]
        total[3] += row["loads"]
        total[4] += 1
    print(f"{'file':44s} {'tests':>5s} {'wall s':>8s} {'programs':>8s} {'build s':>9s} "
          f"{'loads':>6s}")
    for name, (wall, n, comp, hits, tests) in sorted(files.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:44s} {tests:5d} {wall:8.1f} {n:8d} {comp:9.1f} {hits:6d}")
    wall = sum(v[0] for v in files.values())
    comp = sum(v[2] for v in files.values())
    print(f"{'all':44s} {len(rows):5d} {wall:8.1f} {sum(v[1] for v in files.values()):8d} "
          f"{comp:9.1f} {sum(v[3] for v in files.values()):6d}")
    print(f"\nslowest {args.tests} tests (wall s, programs, build s, slowest programs):")
    for row in sorted(rows, key=lambda r: -r["seconds"])[:args.tests]:
        print(f"{row['seconds']:7.1f} {row['programs']:4d} {row['build_s']:6.1f}  "
              f"{row['test']}  {row['slowest'][:3]}")


if __name__ == "__main__":
    main()
