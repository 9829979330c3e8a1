"""The lookup drafter's acceptance gate, on and off, side by side with AR on the task prompts
of `hispec bench --tasks` (greedy, EOS ignored, batch 1, loop time, interleaved rounds;
every output checked against AR's).

    python benchmarks/results_lookup/gate_ab.py --model "$(hispec pull smollm2-135m-instruct)" \
        --chat --tasks chat,extract > benchmarks/results_lookup/gate_ab.txt
"""

from __future__ import annotations

import argparse

from hispec_jax.bench import suite
from hispec_jax.models.model import load_model

from schedule_ab import compare_tasks, print_header, task_arguments  # this folder (the script's own)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    task_arguments(p, tasks="chat,extract", prompts=4, max_new_tokens=128, rounds=2)
    a = p.parse_args()
    print_header(a)
    model = load_model(a.model)
    specs = [suite.MethodSpec.of("ar", "ar"),
             suite.MethodSpec.of("lookup, gate on (default)", "lookup", lookup_gate=True),
             suite.MethodSpec.of("lookup, gate off", "lookup", lookup_gate=False)]
    compare_tasks(model, specs, a)


if __name__ == "__main__":
    main()
