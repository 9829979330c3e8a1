"""The model's default plan (what `hispec generate`, `chat` and `serve` run without --method:
`recommended.default_plan`) side by side with `--method ar`, with its acceptance gate off,
and (for an exit plan) with the exit drafter's gate on, on the task prompts of
`hispec bench --tasks` (greedy, batch 1, loop time, interleaved rounds; every output checked
against AR's). With --stop-at-eos each prompt stops at its end of turn, as a user's answer
does.

    python benchmarks/results_lookup/default_plan_ab.py --model "$(hispec pull smollm2-135m-instruct)" \
        --chat --stop-at-eos --tasks chat,extract,summarize > benchmarks/results_lookup/default_plan_ab.txt
    python benchmarks/results_lookup/default_plan_ab.py --model hispec_jax/default_model \
        --stop-at-eos --tasks chat,summarize
"""

from __future__ import annotations

import argparse

from hispec_jax.cli.common import use_compilation_cache

use_compilation_cache()

from hispec_jax.bench import suite, tasks  # noqa: E402
from hispec_jax.decoding import recommended  # noqa: E402
from hispec_jax.models.model import load_model  # noqa: E402

from schedule_ab import print_header, task_arguments  # noqa: E402  (this folder's)


def specs_for(model) -> list[suite.MethodSpec]:
    """AR, the default plan, and the plan with its gate switched the other way."""
    method, options, reason = recommended.default_plan(model)
    print(f"# default plan: {method} ({reason})", flush=True)
    specs = [suite.MethodSpec.of("ar", "ar"),
             suite.MethodSpec.of(f"default plan: {method}", method, **options)]
    if method == "lookup" or options.get("lookup") is not None:
        specs.append(suite.MethodSpec.of(f"{method}, lookup gate off", method,
                                         **{**options, "lookup_gate": False}))
    else:
        specs.append(suite.MethodSpec.of(f"{method}, exit gate on", method,
                                         **{**options, "exit_gate": True}))
    return specs


def compare_plans(model, specs: list[suite.MethodSpec], a) -> None:
    """Per task of `a.tasks`: `specs` (AR first) side by side at batch 1, loop time, every
    output checked against AR's (`a.stop_at_eos`: each prompt stops at its end of turn), one
    table each with the lookup's counts and tokens per round (also `host_cost_ab.py`)."""
    for task in a.tasks.split(","):
        prompts = tasks.task_prompts(model, task, a.prompts, 512, a.chat)
        runners, capacity = suite.loop_time_runners(model, prompts, specs, a.max_new_tokens,
                                                    stop_at_eos=a.stop_at_eos, chat=a.chat)
        results = suite.compare(runners, a.rounds)
        ar = results[0]
        print(f"\n## {task}: prompts of {[len(q) for q in prompts]} tokens, capacity {capacity}, "
              f"AR {ar.tokens_per_second:.1f} tok/s, {ar.new_tokens} new tokens")
        print("| method | tok/s | x AR (medians) | x AR (paired, median) | lookup proposed / "
              "accepted | tokens per round | same as AR |")
        print("|---|---|---|---|---|---|---|")
        for r in results[1:]:
            look = (r.stats or {}).get("lookup") or {}
            per_round = (r.stats or {}).get("tokens_per_round")
            print(f"| {r.name} | {r.tokens_per_second:.1f} "
                  f"| {r.tokens_per_second / ar.tokens_per_second:.3f} "
                  f"| {suite.paired_ratio(ar, r):.3f} | {look.get('proposed')} / "
                  f"{look.get('accepted')} | "
                  f"{'-' if per_round is None else f'{per_round:.2f}'} "
                  f"| {r.identical_to_ar} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    task_arguments(p, tasks="chat,extract", prompts=4, max_new_tokens=128, rounds=2)
    p.add_argument("--stop-at-eos", action="store_true",
                   help="each prompt stops at its end of turn (else every prompt gets "
                        "--max-new-tokens)")
    a = p.parse_args()
    print_header(a)
    model = load_model(a.model)
    specs = specs_for(model)
    compare_plans(model, specs, a)
    print(f"\n# load at the end {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
