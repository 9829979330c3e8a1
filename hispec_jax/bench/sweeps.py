"""The paper's sweeps: method grids, the (draft, intermediate) exit grid, batch sizes, and
per-exit agreement with the final layer.

    exit grid (Fig. 9)        HiSpec at every pair Ld < Li < L of candidate exits, speedup
                              over AR -> a heatmap; the row Ld = default is Table 9
    batch sizes (Table 5)     AR and HiSpec tokens/s at batch 1, 4, 16
    agreement (Fig. 5)        teacher-forced top-1 agreement of every exit with layer L
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.bench.suite import MethodSpec
from hispec_jax.decoding import methods
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.model import Model
from hispec_jax.models.params import with_layer_layout
from hispec_jax.models.transformer import scan_exits


def candidate_exits(model: Model) -> list[int]:
    """The sweeps' drafters/verifiers: every exit with a head up to L/4, every other one
    up to L/2 (L = 16: 1, 2, 3, 4, 6, 8; the paper's exits are L/8 and L/4)."""
    L = model.cfg.num_layers
    return [e for e in methods.available_exits(model)
            if e < L and (e <= L / 4 or (e <= L / 2 and e % 2 == 0))]


def layerskip_specs(draft_exits, draft_lens) -> list[MethodSpec]:
    return [MethodSpec.of(f"layerskip d={d} n={n}", "layerskip", draft_exit=d, draft_len=n)
            for d in draft_exits for n in draft_lens]


def hispec_name(draft_exit: int, verify_exit: int, draft_len: int = 2,
                verify_window: int = 4) -> str:
    return f"hispec d={draft_exit} i={verify_exit} nd={draft_len} ni={verify_window}"


def hispec_spec(draft_exit: int, verify_exit: int, draft_len: int = 2, verify_window: int = 4,
                name: str | None = None) -> MethodSpec:
    return MethodSpec.of(name or hispec_name(draft_exit, verify_exit, draft_len, verify_window),
                         "hispec", draft_exit=draft_exit, verify_exits=(verify_exit,),
                         draft_len=draft_len, verify_window=verify_window)


def exit_pair_specs(exits: list[int]) -> list[MethodSpec]:
    """HiSpec with the paper's windows (Nd = 2, Ni = 4) at every pair Ld < Li of `exits`."""
    return [hispec_spec(d, i) for d in exits for i in exits if d < i]


def window_specs(draft_exit: int, verify_exit: int,
                 windows=((1, 2), (2, 4), (3, 6), (4, 8))) -> list[MethodSpec]:
    return [hispec_spec(draft_exit, verify_exit, nd, ni) for nd, ni in windows]


def heatmap(rows: list[dict[str, Any]], exits: list[int]) -> np.ndarray:
    """[len(exits), len(exits)] speedup over AR, row = draft exit, column = intermediate
    exit (NaN where Ld >= Li), from exit-grid result rows."""
    index = {e: k for k, e in enumerate(exits)}
    grid = np.full((len(exits), len(exits)), np.nan)
    for row in rows:
        opts = row["options"]
        if opts.get("method") == "hispec":
            grid[index[opts["draft_exit"]], index[opts["verify_exits"][0]]] = row["speedup_vs_ar"]
    return grid


@functools.partial(jax.jit, static_argnames=("model_cfg", "exits"))
def _agreement_counts(params, heads, tokens_BxT, valid_BxT, *, model_cfg, exits):
    # Hidden states of every layer [L, B, T, D], then each exit's head on its layer.
    params = with_layer_layout(params, "scan")  # scan_exits scans the stacked layers
    _, h_LxBxTxD = scan_exits(params, model_cfg, tokens_BxT, lambda h, index: h)
    top = {e: jnp.argmax(exit_logits(params, heads, model_cfg, h_LxBxTxD[e - 1], e), -1)
           for e in exits}
    final = top[model_cfg.num_layers]
    return jnp.stack([jnp.sum((top[e] == final) & valid_BxT) for e in exits])


def exit_agreement(model: Model, sequences: list[list[int]], max_len: int = 256,
                   batch_size: int = 8) -> dict[str, Any]:
    """Teacher-forced top-1 agreement of each exit's head with the final layer (paper
    Fig. 5: the greedy acceptance rate an exit would have as a drafter) over `sequences`
    (token ids, cut to `max_len`). Returns {"exits": [...], "agreement": [...], "tokens"}."""
    exits = tuple(methods.available_exits(model))
    counts, total = np.zeros(len(exits)), 0
    for start in range(0, len(sequences), batch_size):
        chunk = [s[:max_len] for s in sequences[start:start + batch_size]]
        tokens = np.zeros((batch_size, max_len), np.int32)
        valid = np.zeros((batch_size, max_len), bool)
        for b, s in enumerate(chunk):
            tokens[b, :len(s)], valid[b, :len(s)] = s, True
        counts += np.asarray(_agreement_counts(model.params, model.heads, tokens, valid,
                                               model_cfg=model.cfg, exits=exits))
        total += int(valid.sum())
    return {"exits": list(exits), "agreement": (counts / max(total, 1)).round(4).tolist(),
            "tokens": total}
