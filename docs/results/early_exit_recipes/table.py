"""Prints docs/early_exit_recipes.md's comparison table from the kept run summaries.

    python docs/results/early_exit_recipes/table.py

Reads docs/results/early_exit_recipes/NAME.json (the `training_summary.json` each run of
run.sh wrote) for every run present; columns as in the doc (perplexity on the assistant
replies and on all tokens, top-1 agreement of exit e with the final layer on the replies).
"""

import json
import pathlib

HERE = pathlib.Path(__file__).parent
RUNS = {
    "init": "candidate, no training",
    "linear_ce": "linear weights, CE (the original loss)",
    "uniform_ce": "uniform weights, CE",
    "uniform_kl": "uniform weights, KL",
    "uniform_kl_rot_drop": "uniform, KL, rotational R=2, layer dropout 0.1",
    "focus_kl": "uniform, KL, only exits 3, 6, 12",
}

print("| run | recipe | steps | ppl, replies | ppl, all | agree e=3 | agree e=6 | agree e=8 | agree e=12 | mean agree e=1..12 |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, recipe in RUNS.items():
    path = HERE / f"{name}.json"
    if not path.exists():
        continue
    s = json.loads(path.read_text())
    replies = s["eval"]["replies"]
    a = replies["agreement_exits"]
    print(f"| {name} | {recipe} | {s['steps']} | {replies['perplexity']:.2f} | {s['eval']['perplexity']:.2f} | "
          f"{a[2]:.3f} | {a[5]:.3f} | {a[7]:.3f} | {a[11]:.3f} | {sum(a[:12]) / 12:.3f} |")
