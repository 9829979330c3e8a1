"""Per-exit agreement curves of several models from their `hispec pretrain` summaries (PNG).

    python -m hispec_jax.bench plot-agreement OUT.png LABEL=path/to/training_summary.json ...

One line per model: the per-exit top-1 agreement with the final layer of the held-out
evaluation that `hispec pretrain` writes into `training_summary.json` (its assistant-reply
tokens when the summary has them, else every token), labelled with the model's final-layer
perplexity; drawn by `plots.agreement_plot`. Nothing is measured here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hispec_jax.bench import args as args_lib

PROG = "hispec bench-tool plot-agreement"


def summary_curve(path: Path) -> tuple[dict, float]:
    """({"exits": [1..L], "agreement": [L]}, final-layer perplexity) of one summary's held-out
    evaluation (the `replies` part when present)."""
    ev = json.loads(Path(path).read_text())["eval"]
    ev = ev.get("replies", ev)
    agreement = ev["agreement_exits"]
    return {"exits": list(range(1, len(agreement) + 1)), "agreement": agreement}, ev["perplexity"]


def curves(pairs: list[str]) -> dict[str, dict]:
    """`["LABEL=PATH", ...]` -> `{"LABEL (ppl X)": curve}` in the given order."""
    out = {}
    for pair in pairs:
        label, _, path = pair.partition("=")
        if not label or not path:
            raise ValueError(f"{pair!r} is not LABEL=path/to/training_summary.json")
        curve, perplexity = summary_curve(Path(path))
        out[f"{label} (ppl {perplexity:.2f})"] = curve
    return out


def main(argv=None) -> int:
    ap = args_lib.Parser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the PNG to write")
    ap.add_argument("summaries", nargs="+", metavar="LABEL=SUMMARY",
                    help="a label and a training_summary.json, e.g. v2=out/training_summary.json")
    args = ap.parse_args(argv)
    try:
        lines = curves(args.summaries)
    except (ValueError, OSError, KeyError) as e:
        ap.error(f"{type(e).__name__}: {e}")

    from hispec_jax.bench.plots import agreement_plot

    agreement_plot(lines, Path(args.out),
                   "per-exit agreement with layer L, held-out ShareGPT replies")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
