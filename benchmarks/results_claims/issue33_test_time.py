"""What issue 33's tests cost the suite: the seconds (setup + call + teardown) of the tests
its commits added or extended (0619762, 69ceab3, 3351b7e, 91f1a34, da46a79), summed from a
`pytest --durations=0` listing of the whole suite.

    python -m pytest -q -n 2 --dist loadfile tests --durations=0 > DURATIONS
    python benchmarks/results_claims/issue33_test_time.py DURATIONS

Counted in full: the tests those commits added; of `test_rule_preserves_target_distribution_
exactly`, only its `-exact` cases (the zero-probability drafts the issue added; the
`-smoothed` cases are the test as it was). The heads-moved and memory-plan checks changed
assertions inside existing tests and cost nothing measurable. Durations are per test on one
xdist worker; the suite runs on two.
"""

import re
import sys

ADDED = (
    "test_oracle.py::test_always_agree_every_exit_equals_the_final_layer",
    "test_oracle.py::test_always_agree_check_catches_a_no_op_transform",
    "test_sampling_exact.py::test_zero_probability_drafts_catch_a_draft_support_residual",
    "test_engine.py::test_true_reject_and_false_accept_rates_take_their_forced_values",
    "test_engine.py::test_rate_check_catches_broken_bookkeeping",
    "test_engine.py::test_adaptive_windows_grow_and_shrink",
    "test_engine.py::test_window_check_catches_a_policy_that_never_adapts",
    "test_numerics.py::test_linear_rope_scaling_logits_every_exit",
    "test_gguf.py::test_smollm2_chat_answer",
    "test_gguf.py::test_readme_smollm2_transcript",
)
EXTENDED = ("test_sampling_exact.py::test_rule_preserves_target_distribution_exactly", "-exact]")


def main(path: str) -> None:
    line = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+tests/(\S+)")
    total, suite, per = 0.0, 0.0, {}
    for text in open(path):
        m = line.match(text)
        if not m:
            continue
        seconds, name = float(m.group(1)), m.group(3)
        suite += seconds
        base = name.split("[")[0]
        if base in ADDED or (base == EXTENDED[0] and name.endswith(EXTENDED[1])):
            per[base] = per.get(base, 0.0) + seconds
            total += seconds
    for name, seconds in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"{seconds:7.2f} s  {name}")
    print(f"{total:7.2f} s  issue 33's tests, of {suite:.0f} s listed for the whole suite "
          f"({100 * total / suite:.1f} %); on two workers about {total / 2:.0f} s of wall time")


if __name__ == "__main__":
    main(sys.argv[1])
