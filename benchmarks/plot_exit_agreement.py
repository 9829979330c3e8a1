"""Per-exit top-1 agreement with the final layer, one line per model, from the held-out
evaluation that `hispec pretrain` writes into `training_summary.json` (assistant-reply
tokens when the summary has them).

    python benchmarks/plot_exit_agreement.py OUT.png LABEL=path/to/training_summary.json ...
"""

import json
import sys
from pathlib import Path

from hispec_jax.bench.plots import agreement_plot


def main(argv: list[str]) -> None:
    out, *pairs = argv
    curves = {}
    for pair in pairs:
        label, _, path = pair.partition("=")
        ev = json.loads(Path(path).read_text())["eval"]
        ev = ev.get("replies", ev)
        agreement = ev["agreement_exits"]
        curves[f"{label} (ppl {ev['perplexity']:.2f})"] = {
            "exits": list(range(1, len(agreement) + 1)), "agreement": agreement}
    agreement_plot(curves, Path(out), "per-exit agreement with layer L, held-out ShareGPT replies")
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
