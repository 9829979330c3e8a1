"""method="auto" side by side with AR and the best LayerSkip / HiSpec grid points.

    python -m hispec_jax.bench auto [--model DIR] [--prompts 4] [--max-new-tokens 64]
        [--rounds 3] [--layerskip D,N ...] [--hispec LD,LI,ND,NI ...] [--plan FILE]

Held-out ShareGPT prompts (the evaluation split; the plan was calibrated on the training
split), greedy, EOS ignored, interleaved rounds (`suite.compare`). The auto row uses the
saved plan (`hispec tune`; a quick tune first when there is none) and carries its
predicted tokens/s (end to end, `latency.end_to_end_tokens_per_second`) beside the measured.
Targets (issue 14): auto >= 0.97x the best of the others; |measured / predicted - 1| <= 15 %.
"""

from __future__ import annotations

import json
import statistics
import sys

from hispec_jax import datasets as prompts_lib
from hispec_jax.bench import args as args_lib
from hispec_jax.bench import suite
from hispec_jax.models.model import load_model
from hispec_jax.planner import latency, plan as plan_lib, tune as tune_lib


def run(model, *, num_prompts: int, max_new_tokens: int, rounds: int, layerskip, hispec,
        plan_file=None, progress=None) -> dict:
    prompts = prompts_lib.load_prompts("sharegpt", model.tokenizer, num_prompts, 64)
    batch = 1
    plan = plan_lib.load_plan(model, batch, plan_file)
    payload = None
    if plan is None:
        print("no saved plan: tuning quickly", file=sys.stderr)
        report = tune_lib.tune(model, batch, quick=True)
        plan, costs = report["plans"][0], report["calibration"].costs
    else:
        path = plan_file or plan_lib.plan_path(model, batch)
        payload = json.loads(open(path).read())
        costs = latency.Costs.from_json(payload["calibration"]["costs"])
    auto = suite.MethodSpec.of(f"auto: {plan.name()}", plan.method, **plan.method_options())
    grid = [suite.MethodSpec.of(f"layerskip d={d} n={n}", "layerskip", draft_exit=d, draft_len=n)
            for d, n in layerskip]
    grid += [suite.MethodSpec.of(f"hispec d={a} i={b} nd={c} ni={w}", "hispec", draft_exit=a,
                                 verify_exits=(b,), draft_len=c, verify_window=w)
             for a, b, c, w in hispec]
    # A grid point that is auto's own plan would be the same program timed twice: the
    # ratio between the two is the machine's noise, not the planner's choice. Time it once.
    same_as_auto = [g.name for g in grid if (g.method, g.options) == (auto.method, auto.options)]
    specs = [suite.MethodSpec.of("ar", "ar"), auto] + [g for g in grid if g.name not in same_as_auto]
    cache_len = suite.common_cache_len(model, prompts, specs, max_new_tokens)
    runners = [suite.hispec_runner(model, prompts, s, max_new_tokens=max_new_tokens,
                                   batch_size=batch, max_cache_len=cache_len) for s in specs]
    results = suite.compare(runners, rounds, progress)
    ar = results[0]
    pred = latency.Prediction(plan.tokens_per_round, 1 / plan.predicted_tokens_per_second,
                              plan.predicted_tokens_per_second)
    predicted = latency.end_to_end_tokens_per_second(pred, costs, max_new_tokens)
    rows = [r.to_json(ar) for r in results]
    auto = rows[1]
    others = [r for r in rows if r is not auto]
    best = max(others, key=lambda r: r["tokens_per_second"])
    # Paired per round: the rounds are interleaved, so round i of auto and of another method
    # ran under the same machine load; the median of their per-round ratios is less noisy
    # than the ratio of the two medians.
    paired = {r["name"]: statistics.median(o / a for a, o in zip(auto["seconds"], r["seconds"]))
              for r in others}
    best_paired = min(paired, key=paired.get)
    return {"device": suite.device_description(), "prompts": num_prompts,
            "max_new_tokens": max_new_tokens, "rounds": rounds, "plan": plan.to_json(),
            "predicted_tokens_per_second_end_to_end": predicted, "rows": rows,
            "auto_vs_best_other": auto["tokens_per_second"] / best["tokens_per_second"],
            "best_other": best["name"], "grid_points_equal_to_auto": same_as_auto,
            "auto_vs_others_paired": paired, "auto_vs_best_other_paired": paired[best_paired],
            "best_other_paired": best_paired,
            "measured_over_predicted": auto["tokens_per_second"] / predicted}


def markdown(report: dict) -> str:
    lines = [f"{report['device']}; {report['prompts']} held-out ShareGPT prompts, "
             f"{report['max_new_tokens']} new tokens, batch 1, {report['rounds']} interleaved rounds",
             "", "| method | tokens/s (median) | vs AR | identical to AR | layer passes / token |",
             "|---|---|---|---|---|"]
    for r in report["rows"]:
        lpt = (r["stats"] or {}).get("layer_passes_per_token")
        lines.append(f"| {r['name']} | {r['tokens_per_second']:.1f} | {r['speedup_vs_ar']:.2f}x | "
                     f"{r['identical_to_ar']} | {lpt if lpt is None else round(lpt, 2)} |")
    if report.get("grid_points_equal_to_auto"):
        lines += ["", f"auto's plan is also the grid point {', '.join(report['grid_points_equal_to_auto'])}: "
                      "timed once, as auto."]
    lines += ["", f"auto / best other ({report['best_other']}): {report['auto_vs_best_other']:.2f}x; "
              f"paired per round, lowest: {report['auto_vs_best_other_paired']:.2f}x "
              f"({report['best_other_paired']}); "
              f"auto predicted {report['predicted_tokens_per_second_end_to_end']:.1f} tok/s, "
              f"measured / predicted {report['measured_over_predicted']:.2f}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = args_lib.Parser(prog="hispec bench-tool auto",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--layerskip", type=args_lib.positive_int_list, nargs="*", default=[(8, 2), (12, 2), (12, 4)])
    p.add_argument("--hispec", type=args_lib.positive_int_list, nargs="*", default=[(8, 12, 1, 2), (3, 6, 2, 4)])
    p.add_argument("--plan", default=None, help="plan file (default: the saved plan)")
    p.add_argument("--out", default=None, help="write the report JSON here")
    args = p.parse_args(argv)
    from hispec_jax import DEFAULT_MODEL_DIR

    model = load_model(args.model or DEFAULT_MODEL_DIR)
    report = run(model, num_prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                 rounds=args.rounds, layerskip=args.layerskip, hispec=args.hispec,
                 plan_file=args.plan, progress=lambda m: print(f"[auto] {m}", file=sys.stderr))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
