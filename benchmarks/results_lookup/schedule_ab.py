"""How the lookup drafter's k moves, side by side: "fixed" (k every round, the default)
against "probe" (k = 1 until a match holds; the default before) and "halving", on the task
prompts of `hispec bench --tasks` (greedy, EOS ignored, batch 1, loop time, interleaved
rounds; every output checked against AR's).

    python benchmarks/results_lookup/schedule_ab.py --model "$(hispec pull smollm2-135m-instruct)" \
        --chat --tasks summarize,extract,code,chat > benchmarks/results_lookup/schedule_ab.txt
    python benchmarks/results_lookup/schedule_ab.py --model hispec_jax/default_model \
        --tasks summarize,chat --under layerskip,hispec

`--under`: also the lookup drafter under the model's recommended LayerSkip / HiSpec (the
paper's exits without a recommended plan), with each schedule.

A `--schedules` entry may carry its own k and max_ngram, `SCHEDULE@K/N` (else `--lookup`
and the default max_ngram): "fixed@8/3,ngram@16/8" puts k = 8 with 3-grams beside the
"ngram" schedule with k = 16 and 8-grams.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import subprocess
import time

from hispec_jax.cli.common import use_compilation_cache

use_compilation_cache()

from hispec_jax.bench import suite, tasks  # noqa: E402
from hispec_jax.decoding import methods  # noqa: E402
from hispec_jax.models.model import load_model  # noqa: E402


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
    """`suite.MethodSpec` with the lookup drafter's schedule replaced."""

    name: str
    method: str
    schedule: str | None = None
    options: tuple = ()

    def decoder(self, model):
        decoder = methods.make_method(model, self.method, **dict(self.options))
        return decoder if self.schedule is None else methods.with_lookup_schedule(decoder, self.schedule)


def print_header(a) -> None:
    """The machine, commit, time and load the tables below were measured at."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# {platform.machine()}, commit {commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load {open('/proc/loadavg').read().split()[:3]}; {a}", flush=True)


def compare_tasks(model, specs, a) -> None:
    """Per task of `a.tasks`: `specs` (the first AR) timed side by side, loop time, batch 1,
    one table each (also `level_blocks_ab.py`)."""
    for task in a.tasks.split(","):
        prompts = tasks.task_prompts(model, task, a.prompts, 512, a.chat)
        runners, capacity = suite.loop_time_runners(model, prompts, specs, a.max_new_tokens)
        results = suite.compare(runners, a.rounds)
        ar = results[0]
        print(f"\n## {task}: prompts of {[len(q) for q in prompts]} tokens, capacity {capacity}, "
              f"AR {ar.tokens_per_second:.1f} tok/s")
        print("| method | tok/s | x AR (medians) | x AR (paired, median) | lookup proposed / accepted | rounds | same as AR |")
        print("|---|---|---|---|---|---|---|")
        for r in results[1:]:
            paired = suite.paired_ratio(ar, r)
            look = (r.stats or {}).get("lookup") or {}
            print(f"| {r.name} | {r.tokens_per_second:.1f} | {r.tokens_per_second / ar.tokens_per_second:.3f} "
                  f"| {paired:.3f} | {look.get('proposed')} / {look.get('accepted')} "
                  f"| {(r.stats or {}).get('rounds')} | {r.identical_to_ar} |", flush=True)
    print(f"\n# load at the end {open('/proc/loadavg').read().split()[:3]}")


def task_arguments(p: argparse.ArgumentParser, *, model=None, tasks="summarize,extract,code,chat",
                   prompts=2, max_new_tokens=64, rounds=3) -> None:
    """The flags every side-by-side script of this folder shares (also `level_blocks_ab.py`,
    `gate_ab.py`); `model=None`: --model is required."""
    p.add_argument("--model", required=model is None, default=model)
    p.add_argument("--chat", action="store_true", help="render prompts with the chat template")
    p.add_argument("--tasks", default=tasks)
    p.add_argument("--prompts", type=int, default=prompts)
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--rounds", type=int, default=rounds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    task_arguments(p)
    p.add_argument("--schedules", default="probe,fixed")
    p.add_argument("--under", default="", help="comma list of layerskip,hispec")
    p.add_argument("--lookup", type=int, default=8)
    a = p.parse_args()
    print_header(a)
    model = load_model(a.model)
    specs = [ScheduleSpec("ar", "ar")]
    for method in ["lookup"] + [m for m in a.under.split(",") if m]:
        for entry in a.schedules.split(","):
            schedule, _, size = entry.partition("@")
            k, _, n = size.partition("/")
            options = (("lookup", int(k or a.lookup)),) + ((("max_ngram", int(n)),) if n else ())
            label = f"k={int(k or a.lookup)}" + (f" N={n}" if n else "") + f" {schedule}"
            specs.append(ScheduleSpec(f"lookup {label}" if method == "lookup"
                                      else f"lookup {label} under {method} (recommended)",
                                      method, schedule, options))
    compare_tasks(model, specs, a)


if __name__ == "__main__":
    main()
