"""How often does `auto`'s pick, tuned on C prompts of a task, run within 3 % of the best
fixed choice on M other prompts? An offline study in the planner's own terms.

    python benchmarks/results_lookup/choice_rules_offline.py [--splits 8] \
        > benchmarks/results_lookup/choice_rules_offline.txt

For each task (summarize, extract, code) the default model's greedy continuations of its
first 24 prompts (64 new tokens) and every exit's choices along them are recorded once
(`calibrate.measure_lookup_trace`). Each split draws M measured and C calibration prompts
at random, disjoint; `search.search` ranks plans on the C prompts (acceptance from the
trace, the lookup replayed on it, costs from the tasks bench's tune, below) and each rule
of `search.CHOICE_RULES` picks one. Its "speed" on the M prompts is the same model's
prediction there (`search.rescore`: the acceptance and lookup replays of those prompts),
against the best of `hispec bench --tasks --recommended`'s fixed rows there. The costs
are one calibration's, shared by both sides: the study sees what choosing on other
prompts costs (the prompts differ: on extract the lookup's work speedup ranges 1.1-3.5x
and LayerSkip's 1.2-2.7x from prompt to prompt), not what the cost model gets wrong;
wall time decides (`hispec bench --tasks ... --auto-choose`, BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from hispec_jax import DEFAULT_MODEL_DIR, generate, load_model
from hispec_jax.bench import tasks
from hispec_jax.planner import calibrate, latency, search, tune
from hispec_jax.planner.plan import Plan

HERE = Path(__file__).parent
COSTS = HERE / "auto_default_model_v4_tasks5_uniform" / "tasks.json"  # its first tune's costs
PROMPTS, NEW_TOKENS, L = 24, 64, 24
SIZES = ((4, 8), (8, 16))  # (M measured, C calibration) prompts
# `hispec bench --tasks --recommended`'s rows on the default model v4 (lookup k = 16 alone,
# half of it under exits; LayerSkip at the default exit 3; the recommended plans)
FIXED = [Plan((L,), (), lookup=16), Plan((3, L), (2,)), Plan((3, L), (2,), lookup=8),
         Plan((5, L), (6,)), Plan((5, L), (6,), lookup=8), Plan((4, 12, L), (3, 6)),
         Plan((4, 12, L), (3, 6), lookup=8)]


def subset(trace: latency.LookupTrace, idx: list[int]) -> latency.LookupTrace:
    return latency.LookupTrace(
        max_ngram=trace.max_ngram, sequences=tuple(trace.sequences[i] for i in idx),
        starts=tuple(trace.starts[i] for i in idx),
        predictions=tuple((e, tuple(per[i] for i in idx)) for e, per in trace.predictions))


def lookup_profile(trace: latency.LookupTrace, k: int = 16) -> latency.LookupProfile:
    """What `calibrate.measure_lookup` would have measured: `method="lookup"` replayed."""
    run = latency.simulate_lookup(trace, k, (L,), ())
    return latency.LookupProfile(k=k, rounds=run.rounds, tokens=round(run.emitted),
                                 verified=run.verified, trace=trace)


def picks(trace: latency.LookupTrace, costs: latency.Costs, known) -> dict[str, Plan]:
    exits = tuple(sorted(e for e, _ in trace.predictions)) + (L,)
    profile = lookup_profile(trace)
    ranked = search.search(exits, search.trace_alpha(trace), costs, top=8, lookup=profile,
                           known=known)
    names = search.known_plan_names(known, exits, profile)
    return {rule: search.choose(ranked, rule, names, trace, costs)[0][0]
            for rule in search.CHOICE_RULES}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--splits", type=int, default=8)
    args = p.parse_args()
    model = load_model(DEFAULT_MODEL_DIR)
    known = tune.recommended_hierarchies(model)
    costs = latency.Costs.from_json(json.loads(COSTS.read_text())["results"][0]["auto"]["costs"])
    print(f"# default model, {PROMPTS} prompts per task, {NEW_TOKENS} new tokens, "
          f"{args.splits} random splits per size; costs from {COSTS.parent.name}")
    for task in ("summarize", "extract", "code"):
        prompts = tasks.task_prompts(model, task, PROMPTS, 512, False)
        out = generate(model, prompts, method="ar", max_new_tokens=NEW_TOKENS, ignore_eos=True,
                       batch_size=1)
        trace = calibrate.measure_lookup_trace(
            model, [p + t for p, t in zip(prompts, out.token_ids)], [len(p) for p in prompts])
        rng = random.Random(0)
        for m, c in SIZES:
            ratios = {rule: [] for rule in search.CHOICE_RULES}
            for _ in range(args.splits):
                idx = rng.sample(range(PROMPTS), m + c)
                measured, calibration = subset(trace, idx[:m]), subset(trace, idx[m:])
                alpha = search.trace_alpha(measured)
                speed = lambda plan: search.rescore(plan, alpha, measured, costs)
                best = max(map(speed, FIXED))
                for rule, plan in picks(calibration, costs, known).items():
                    ratios[rule].append(speed(plan) / best)
            for rule, xs in ratios.items():
                print(f"{task:9s} M={m:2d} C={c:2d} {rule:10s} within 3 %: "
                      f"{sum(x >= 0.97 for x in xs)}/{len(xs)}  median {statistics.median(xs):.3f}"
                      f"  min {min(xs):.3f}  | " + " ".join(f"{x:.2f}" for x in xs), flush=True)


if __name__ == "__main__":
    main()
