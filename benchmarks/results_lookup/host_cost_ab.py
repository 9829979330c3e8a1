"""The default plan's lookup gate priced by the backend's default pass costs against the same
gate priced by this host's measurement (`decoding/device_costs.py`, measured first if none is
kept), side by side with AR: greedy, batch 1, the task prompts of `hispec bench --tasks`,
loop time, interleaved rounds, every output checked against AR's.

    python benchmarks/results_lookup/host_cost_ab.py --model "$(hispec pull smollm2-135m-instruct)" \
        --chat --stop-at-eos --tasks chat,extract --prompts 8 --max-new-tokens 256 --rounds 1
"""

from __future__ import annotations

import argparse

from hispec_jax.cli.common import use_compilation_cache

use_compilation_cache()

from hispec_jax.bench import suite, tasks  # noqa: E402
from hispec_jax.decoding import device_costs, gate, recommended  # noqa: E402
from hispec_jax.models.model import load_model  # noqa: E402

from schedule_ab import print_header, task_arguments  # noqa: E402  (this folder's)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    task_arguments(p, tasks="chat,extract", prompts=8, max_new_tokens=256, rounds=1)
    p.add_argument("--stop-at-eos", action="store_true")
    a = p.parse_args()
    print_header(a)
    model = load_model(a.model)
    method, options, reason = recommended.default_plan(model)
    print(f"# default plan: {method} ({reason})")
    measured = device_costs.load(model)
    if measured is None:
        measured, _ = device_costs.measure_and_store(model)
    default = gate.default_pass_cost()
    print(f"# the backend's default: {device_costs.describe(default)}")
    print(f"# this host ({device_costs.path_for(model).name}): {device_costs.describe(measured)}",
          flush=True)
    specs = [suite.MethodSpec.of("ar", "ar"),
             suite.MethodSpec.of("default plan, the backend's pass costs", method,
                                 lookup_cost=default, **options),
             suite.MethodSpec.of("default plan, this host's pass costs", method,
                                 lookup_cost=measured, **options)]
    for task in a.tasks.split(","):
        prompts = tasks.task_prompts(model, task, a.prompts, 512, a.chat)
        runners, capacity = suite.loop_time_runners(model, prompts, specs, a.max_new_tokens,
                                                    stop_at_eos=a.stop_at_eos, chat=a.chat)
        results = suite.compare(runners, a.rounds)
        ar = results[0]
        print(f"\n## {task}: prompts of {[len(q) for q in prompts]} tokens, capacity {capacity}, "
              f"AR {ar.tokens_per_second:.1f} tok/s, {ar.new_tokens} new tokens")
        print("| gate priced by | tok/s | x AR (paired, median) | lookup proposed / accepted | "
              "tokens per round | same as AR |")
        print("|---|---|---|---|---|---|")
        for r in results[1:]:
            look = (r.stats or {}).get("lookup") or {}
            per_round = (r.stats or {}).get("tokens_per_round")
            print(f"| {r.name} | {r.tokens_per_second:.1f} | {suite.paired_ratio(ar, r):.3f} "
                  f"| {look.get('proposed')} / {look.get('accepted')} "
                  f"| {'-' if per_round is None else f'{per_round:.2f}'} "
                  f"| {r.identical_to_ar} |", flush=True)
    print(f"\n# load at the end {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
