"""Work per token (hardware-free) of HiSpec and LayerSkip plans around the wall sweep's best,
on the prompts `hispec bench-tool work` uses (the first 8 held-out ShareGPT prompts of at
most 256 tokens, 64 new tokens, greedy, batch 1, EOS ignored), every output checked against
AR's:

    python benchmarks/results_on_policy_v3/work_sweep.py MODEL_DIR > work_sweep.txt

The wall sweep (`wall_new/report.md`) timed exits 3, 6, 9, 12 and windows up to 4, 8; this
counts the neighbours it did not time (draft exits 4-7, verify exits 9-15, longer windows),
which is what picking a plan by work alone needs.
"""

import sys

from hispec_jax import datasets, load_model
from hispec_jax.bench import work

PLANS = [("ar", "ar", {})]
PLANS += [(f"layerskip d={d} n={n}", "layerskip", {"draft_exit": d, "draft_len": n})
          for d in (5, 6, 7) for n in (6, 8)]
PLANS += [(f"hispec d={d} i={i} nd={nd} ni={ni}", "hispec",
           {"draft_exit": d, "verify_exits": (i,), "draft_len": nd, "verify_window": ni})
          for d, i in ((4, 12), (5, 12), (6, 12), (6, 10), (6, 14), (5, 10), (4, 9))
          for nd, ni in ((3, 6), (3, 9), (4, 8), (4, 12))]


def main(path: str) -> None:
    model = load_model(path)
    ids = (model.tokenizer(t)["input_ids"] for t in datasets.dataset_texts("sharegpt"))
    prompts = datasets.first_prompts(ids, 8, 256, source="sharegpt has")
    rows = work.measure(model, prompts, 64, batch_size=1, plans=PLANS)  # as `bench-tool work`
    rows.sort(key=lambda r: -r["work_speedup"])
    print(f"# {path}, sharegpt, {len(prompts)} prompts x 64 tokens, greedy, batch 1")
    print(work.table(rows))


if __name__ == "__main__":
    main(sys.argv[1])
