"""Re-prices a `hispec tune --verify` plan file's draft-model plans without the loop scale
(g = g' = 1: a draft step priced from its pass timed alone, as before commit 00391f2) and
compares them with their measurements (BENCHMARKS.md, "hispec tune over two draft models").

    python benchmarks/results_draft/reprice_passes_alone.py DIR/plan.json
"""

import json
import sys

from hispec_jax.decoding.costs import Costs
from hispec_jax.planner import draft_plans, latency

VERIFY_TOKENS = 64  # `tune --verify`'s default


def main(path: str) -> None:
    saved = json.load(open(path))
    costs = Costs.from_json(saved["calibration"]["costs"])
    measured = dict(saved["draft_model"], loop=None)
    if measured.get("smaller"):
        measured["smaller"] = dict(measured["smaller"], loop=None)
    rows = {r["plan"]: r for r in saved["verify"]}
    for plan in draft_plans.plans(measured, costs, costs.num_layers):
        row = rows.get(plan.name())
        if row is None or plan.kind not in ("draft", "draft+lookup", "draft+draft"):
            continue
        pred = latency.Prediction(plan.tokens_per_round, 1 / plan.predicted_tokens_per_second,
                                  plan.predicted_tokens_per_second)
        e2e = latency.end_to_end_tokens_per_second(pred, costs, VERIFY_TOKENS)
        print(f"{plan.name():45s} passes alone: predicted {e2e:6.1f} tok/s end to end "
              f"(with the loop scale {row['predicted_end_to_end']:6.1f}), measured "
              f"{row['measured_tokens_per_second']:6.1f}, measured / predicted "
              f"{row['measured_tokens_per_second'] / e2e:.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
