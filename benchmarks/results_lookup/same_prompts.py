"""Is auto's miss the cost model or the prompts? Its plans timed on the prompts it was tuned on.

    python benchmarks/results_lookup/same_prompts.py extract 16 > benchmarks/results_lookup/same_prompts_extract.txt

`hispec bench --tasks T --auto` tunes on the task's `--auto-prompts` calibration prompts and
times auto's pick on the `--prompts` prompts before them (`tasks.split_prompts`): two
different sets. Where auto loses to a fixed row there, either the latency model ranked the
plans wrongly, or the two prompt sets favour different plans. This script separates the
two on the default model: it tunes exactly as the task bench does (`tasks.tune_for_task`,
8 measured prompts, C calibration prompts, 64 new tokens), then times AR, the tune's top
two plans, lookup alone, and the lookup under the recommended LayerSkip and HiSpec on the
calibration prompts themselves (`tune.measure_plans`: interleaved rounds, end to end).
Timing the whole ranked list takes over 40 minutes; these take about 15.

Printed per plan: predicted and measured tokens/s as multiples of AR's (each against its
own AR), their ratio, tokens per round and seconds per round predicted and measured.
"""

from __future__ import annotations

import sys
import types

from passes import header, load

from hispec_jax import DEFAULT_MODEL_DIR, load_model
from hispec_jax.bench import tasks
from hispec_jax.decoding import methods
from hispec_jax.planner import search
from hispec_jax.planner import tune as tune_lib
from hispec_jax.planner.plan import Plan

NEW_TOKENS = 64
# besides the tune's top two: the recommended hierarchies with the lookup under them
UNDER_RECOMMENDED = ("layerskip d=5 nd=6 + lookup", "hispec d=4 i=12 nd=3 ni=6 + lookup")


def main():
    task = sys.argv[1]
    num_calibration = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    model = load_model(DEFAULT_MODEL_DIR)
    args = types.SimpleNamespace(prompts=8, auto=True, auto_prompts=num_calibration,
                                 max_prompt_tokens=512, chat=False, max_new_tokens=NEW_TOKENS,
                                 lookup=None, auto_verify=False, auto_choose=None)
    _, calibration = tasks.split_prompts(model, task, args)
    report = tasks.tune_for_task(model, calibration, args,
                                 progress=lambda m: print(f"# .. {m}", file=sys.stderr, flush=True))
    costs = report["calibration"].costs
    ranked = list(report["ranked"])
    names = [plan.name() for plan in ranked]
    keep = set(names[:2]) | {n for n in names if n.startswith("lookup")
                             or any(n.startswith(u) for u in UNDER_RECOMMENDED)}
    plans = [plan for plan in ranked if plan.name() in keep]
    ar = search.with_prediction(Plan.of_decoder(methods.make_method(model, "ar")),
                                report["calibration"].alpha_of, costs)
    capacity = max(map(len, calibration)) + NEW_TOKENS + 64
    rows = tune_lib.measure_plans(model, [ar] + plans, 1, calibration, NEW_TOKENS, costs,
                                  repeats=2, max_cache_len=capacity)
    print(f"{header()}")
    print(f"# default model, task {task}: {len(calibration)} calibration prompts "
          f"({min(map(len, calibration))}-{max(map(len, calibration))} tokens), "
          f"{NEW_TOKENS} new tokens, batch 1, greedy; median of 2 interleaved rounds")
    print(f"# the tune's ranking, best first: {', '.join(names)}\n")
    print("| plan | tune rank | predicted x AR | measured x AR | predicted / measured "
          "| tokens per round, predicted | measured | ms per round, predicted | measured |")
    print("|---|---|---|---|---|---|---|---|---|")
    base_measured = rows[0]["measured_tokens_per_second"]
    base_predicted = rows[0]["predicted_end_to_end"]
    for row in rows:
        predicted = row["predicted_end_to_end"] / base_predicted
        measured = row["measured_tokens_per_second"] / base_measured
        rank = names.index(row["plan"]) + 1 if row["plan"] in names else "-"
        ms_predicted = 1e3 * row["tokens_per_round_predicted"] / row["predicted_tokens_per_second"]
        ms_measured = 1e3 * row["tokens_per_round_measured"] / row["measured_tokens_per_second"]
        print(f"| {row['plan']} | {rank} | {predicted:.3f} | {measured:.3f} | "
              f"{predicted / measured:.2f} | {row['tokens_per_round_predicted']:.2f} | "
              f"{row['tokens_per_round_measured']:.2f} | {ms_predicted:.2f} | {ms_measured:.2f} |")
    print(f"\n# load at end {load()}")


if __name__ == "__main__":
    main()
