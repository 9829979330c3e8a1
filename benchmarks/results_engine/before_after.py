"""Two checkouts of hispec-jax side by side: the same `hispec bench` runs, alternating
between the trees (A B A B ...), each a fresh process with the tree first on PYTHONPATH.
Prints, per benchmark and method, tokens/s of every run and the after / before ratio of
the medians, with the load average around each run.

    git worktree add --detach /tmp/before <commit>
    python benchmarks/results_engine/before_after.py --before /tmp/before --after . \
        --reps 2 > benchmarks/results_engine/before_after.txt

The benchmarks: `hispec bench` on the shipped model (AR, LayerSkip d=4 n=4, HiSpec at its
defaults and adaptive; ShareGPT and HumanEval prompts) and `hispec bench --tasks chat,extract
--chat` on SmolLM2-135M-Instruct (AR, prompt lookup).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def shipped_bench(out: str) -> list[str]:
    return ["hispec", "bench", "--draft-exits", "4", "--draft-lens", "4", "--grid-exits", "none",
            "--batch-sizes", "none", "--no-seed-methods", "--no-transformers", "--no-agreement",
            "--prompts", "4", "--max-new-tokens", "64", "--rounds", "3", "--no-progress",
            "--out-dir", out]


def smollm2_tasks(model: str):
    def command(out: str) -> list[str]:
        return ["hispec", "bench", "--model", model, "--tasks", "chat,extract", "--chat",
                "--prompts", "4", "--max-new-tokens", "64", "--rounds", "3",
                "--no-transformers", "--no-progress", "--out-dir", out]
    return command


def shipped_rows(out: str, stdout: str) -> dict[str, float]:
    """{dataset/method: tokens/s} from report.json (median of the timed rounds)."""
    report = json.loads((Path(out) / "report.json").read_text())
    return {f"{dataset}/{row['name']}": row["new_tokens"] / statistics.median(row["seconds"])
            for dataset, rows in report["methods"].items() for row in rows}


def task_rows(out: str, stdout: str) -> dict[str, float]:
    """{task/method: tokens/s} from the markdown tables `--tasks` prints (ours only)."""
    rows, task = {}, None
    for line in stdout.splitlines():
        m = re.match(r"^(\w+) \(\d+ prompts", line)
        if m:
            task = m.group(1)
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if task and line.startswith("| ") and len(cells) > 2 and re.match(r"^[\d.]+$", cells[1]):
            if not cells[0].startswith("transformers"):
                rows[f"{task}/{cells[0]}"] = float(cells[1])
    return rows


def run(tree: str, command: list[str], parse, out: str) -> tuple[dict[str, float], float, float]:
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()), JAX_PLATFORMS="cpu")
    load0 = os.getloadavg()[0]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tree)
    if proc.returncode:
        sys.exit(f"{' '.join(command)} in {tree} failed:\n{proc.stderr[-3000:]}")
    return parse(out, proc.stdout), load0, os.getloadavg()[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="checkout of the earlier commit")
    p.add_argument("--after", required=True, help="checkout of the later commit")
    p.add_argument("--reps", type=int, default=2, help="runs of each tree per benchmark")
    p.add_argument("--smollm2", default=None,
                   help="SmolLM2 model path (default: `hispec pull smollm2-135m-instruct`)")
    p.add_argument("--only", choices=["shipped", "smollm2"], default=None)
    a = p.parse_args()
    smol = a.smollm2 or subprocess.run(["hispec", "pull", "smollm2-135m-instruct"],
                                       capture_output=True, text=True, check=True).stdout.strip()
    benches = {"shipped": ("shipped model, hispec bench", shipped_bench, shipped_rows),
               "smollm2": ("SmolLM2, hispec bench --tasks", smollm2_tasks(smol), task_rows)}
    if a.only:
        benches = {a.only: benches[a.only]}
    trees = {"before": a.before, "after": a.after}
    for commit_of, tree in trees.items():
        head = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        print(f"{commit_of}: {tree} at {head}")
    print(f"machine: {os.cpu_count()} cores, {sys.platform}")
    for title, command, parse in benches.values():
        speeds: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
        print(f"\n## {title}\n")
        for rep in range(a.reps):
            for name, tree in trees.items():
                with tempfile.TemporaryDirectory() as out:
                    cmd = command(out)
                    rows, l0, l1 = run(tree, cmd, parse, out)
                print(f"run {rep + 1} {name}: load {l0:.1f} -> {l1:.1f}: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in rows.items()), flush=True)
                for k, v in rows.items():
                    speeds[name].setdefault(k, []).append(v)
        print(f"\ncommand: {' '.join(command('OUT'))}\n")
        print("| benchmark / method | before tok/s (runs) | after tok/s (runs) | after / before "
              "(medians) |")
        print("|---|---|---|---|")
        for k in speeds["before"]:
            b, f = speeds["before"][k], speeds["after"].get(k, [])
            ratio = statistics.median(f) / statistics.median(b) if f else float("nan")
            print(f"| {k} | {', '.join(f'{x:.1f}' for x in b)} | "
                  f"{', '.join(f'{x:.1f}' for x in f)} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
