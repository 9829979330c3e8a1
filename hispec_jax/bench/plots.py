"""PNG plots of a `hispec bench` report (matplotlib, headless Agg backend).

    speedup_heatmap      HiSpec speedup over AR for every (draft exit, intermediate exit)
                         pair, like HiSpec Fig. 9
    agreement_plot       per-exit top-1 agreement with the final layer, like Fig. 5
    batch_plot           AR vs HiSpec tokens/s at each batch size, like Table 5
    methods_plot         tokens/s of every method of a comparison, AR marked
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def speedup_heatmap(grid: np.ndarray, exits: list[int], path: Path, title: str) -> Path:
    """`grid[r, c]`: speedup at draft exit exits[r], intermediate exit exits[c] (NaN: none)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * len(exits), 0.8 + 0.5 * len(exits)), dpi=100)
    masked = np.ma.masked_invalid(grid)
    finite = grid[np.isfinite(grid)]
    # Centre the colour map on 1.0x: red slower than AR, blue faster.
    span = max(abs(finite - 1.0).max(), 0.05) if finite.size else 1.0
    image = ax.imshow(masked, cmap="RdBu", vmin=1.0 - span, vmax=1.0 + span, origin="lower")
    for r in range(len(exits)):
        for c in range(len(exits)):
            if np.isfinite(grid[r, c]):
                ax.text(c, r, f"{grid[r, c]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(exits)), exits)
    ax.set_yticks(range(len(exits)), exits)
    ax.set_xlabel("intermediate verifier exit Li")
    ax.set_ylabel("draft exit Ld")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="speedup over AR (x)")
    return _save(fig, path)


def agreement_plot(curves: dict[str, dict], path: Path, title: str) -> Path:
    """`curves[label] = {"exits": [...], "agreement": [...]}` -> one line per label."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
    for label, curve in curves.items():
        ax.plot(curve["exits"], curve["agreement"], marker="o", markersize=3, label=label)
    ax.set_xlabel("exit layer")
    ax.set_ylabel("top-1 agreement with final layer")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return _save(fig, path)


def batch_plot(batch_sizes: list[int], tokens_per_second: dict[str, list[float]], path: Path,
               title: str) -> Path:
    """Grouped bars: `tokens_per_second[method][k]` at batch_sizes[k]."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
    width = 0.8 / max(len(tokens_per_second), 1)
    x = np.arange(len(batch_sizes))
    for k, (name, values) in enumerate(tokens_per_second.items()):
        bars = ax.bar(x + (k - (len(tokens_per_second) - 1) / 2) * width, values, width,
                      label=name)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(x, [str(b) for b in batch_sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("new tokens / s")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return _save(fig, path)


def methods_plot(names: list[str], tokens_per_second: list[float], reference: float, path: Path,
                 title: str) -> Path:
    """Horizontal bars of tokens/s per method with AR's tokens/s as a dashed line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 0.9 + 0.25 * len(names)), dpi=100)
    y = np.arange(len(names))
    ax.barh(y, tokens_per_second, color="tab:blue")
    ax.axvline(reference, color="black", linestyle="--", linewidth=1, label="AR")
    ax.set_yticks(y, names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("new tokens / s")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
