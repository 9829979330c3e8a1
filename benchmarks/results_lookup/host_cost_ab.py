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

from hispec_jax.bench import suite  # noqa: E402
from hispec_jax.decoding import device_costs, gate, recommended  # noqa: E402
from hispec_jax.models.model import load_model  # noqa: E402

from default_plan_ab import compare_plans  # noqa: E402  (this folder's)
from schedule_ab import print_header, task_arguments  # noqa: E402


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
    compare_plans(model, specs, a)
    print(f"\n# load at the end {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
