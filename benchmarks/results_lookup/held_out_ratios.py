"""auto against the best fixed row with the row picked on the other timing rounds
(`bench.tasks.held_out_ratio`), for a `hispec bench --tasks --auto` JSON written before the
bench reported it itself (BENCHMARKS.md, "auto's misses: the benchmark's winner's curse").

    python benchmarks/results_lookup/held_out_ratios.py TASKS.json [TASKS.json ...]
"""

import json
import statistics
import sys
import types

from hispec_jax.bench.tasks import held_out_ratio


def main(paths: list[str]) -> None:
    for path in paths:
        print(f"## {path}")
        for task in json.load(open(path))["results"]:
            rows = [types.SimpleNamespace(name=r["name"], seconds=r["seconds"])
                    for r in task["rows"]]
            autos = [r for r in rows if r.name.startswith("auto")]
            fixed = [r for r in rows if not r.name.startswith("auto")]
            speed = lambda r: statistics.median(1 / s for s in r.seconds)
            best = max(fixed, key=speed)
            for auto in autos:
                print(f"{task['task']:9s} | {auto.name[:60]:60s} | vs {best.name[:40]:40s} "
                      f"{speed(auto) / speed(best):.3f} | held out {held_out_ratio(auto, fixed):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
