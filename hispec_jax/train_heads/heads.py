"""Initial exit heads for distillation: copies of the model's own final norm + LM head.

A trained head at exit `e` starts as the **shared** head (what LayerSkip-style models use at
every exit), so step 0 of distillation is exactly "exit with the final norm + LM head", and
training only has to correct it:

    full head      norm = final_norm,  proj = W                       W = LM head [D, V]
    low-rank head  norm = final_norm,  proj_down @ proj_up = W_R      W_R = best rank-R approx.

`W_R` is the truncated SVD `U_R S_R V_Rᵀ`, computed from the eigendecomposition of the small
Gram matrix `W Wᵀ = U S² Uᵀ` ([D, D], float64) rather than an SVD of the [D, V] matrix:
`W_R = U_R U_Rᵀ W`. The factors are balanced, `proj_down = U_R √S_R` and
`proj_up = (U_Rᵀ W) / √S_R`, so both carry the singular values' scale. With R = D,
`U Uᵀ = I` and the product reproduces W (to float32 rounding).

An **adapter** (`adapter_width` Fa) adds a residual MLP block before that norm + projection
(`models/heads.py`): its norm starts at ones, its gate / up matrices at normal(0, 1/√D)
(seeded per exit), its down matrix at zero, so the block starts as the identity and step 0
is still the shared head. With `projection="shared"` the head holds the adapter alone and
feeds the model's frozen final norm + LM head: only the block trains.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.heads import lm_head_matrix
from hispec_jax.models.params import ExitHeads, Params, head_specs, init_from_specs


def check_head_layers(cfg: ModelConfig, head_layers: Sequence[int]) -> tuple[int, ...]:
    """Sorted exit layers as ints; raises ValueError unless each is in [1, L - 1], no repeats.

    Exit L is the model itself (its head is the LM head), so it cannot get a trained head.
    """
    layers = tuple(int(e) for e in head_layers)
    if not layers:
        raise ValueError("head_layers is empty: give at least one exit layer")
    for e in layers:
        if not 1 <= e < cfg.num_layers:
            raise ValueError(f"head layer {e} is outside [1, {cfg.num_layers - 1}] "
                             f"(the model has {cfg.num_layers} layers; exit L needs no head)")
    if len(set(layers)) != len(layers):
        raise ValueError(f"head_layers {layers} has repeated layers")
    return tuple(sorted(layers))


def check_rank(cfg: ModelConfig, rank: int | None) -> int | None:
    """None (full heads) or a rank in [1, min(D, V)]; raises ValueError otherwise."""
    if rank is None:
        return None
    max_rank = min(cfg.hidden_size, cfg.vocab_size)
    if not isinstance(rank, int) or not 1 <= rank <= max_rank:
        raise ValueError(f"head rank must be an integer in [1, {max_rank}] (min(D, V)), "
                         f"got {rank!r}; use 0 / None for full D x V heads")
    return rank


def low_rank_factors(w_DxV: jax.Array, rank: int) -> tuple[jax.Array, jax.Array]:
    """Balanced factors (proj_down [D, R], proj_up [R, V]) of W's rank-R truncated SVD, float32."""
    w = jnp.asarray(w_DxV, jnp.float32)
    D = w.shape[0]
    if not 1 <= rank <= min(w.shape):
        raise ValueError(f"rank {rank} is outside [1, {min(w.shape)}]")
    gram_DxD = jnp.einsum("DV,EV->DE", w, w, precision=jax.lax.Precision.HIGHEST)
    eigvals, eigvecs = np.linalg.eigh(np.asarray(gram_DxD, np.float64))
    order = np.argsort(eigvals)[::-1][:rank]
    singular_R = np.sqrt(np.clip(eigvals[order], 0.0, None))
    u_DxR = eigvecs[:, order]
    # Directions with (numerically) zero singular value carry no part of W: keep their
    # factors finite instead of dividing by ~0. The product U_R U_Rᵀ W is unaffected.
    tiny = 1e-6 * singular_R[0]
    scale_R = np.sqrt(np.where(singular_R > tiny, singular_R, 1.0))
    proj_down = jnp.asarray(u_DxR * scale_R[None, :], jnp.float32)
    u_r = jnp.asarray(u_DxR, jnp.float32)
    proj_up = jnp.einsum("DR,DV->RV", u_r, w, precision=jax.lax.Precision.HIGHEST)
    proj_up = proj_up / jnp.asarray(scale_R, jnp.float32)[:, None]
    assert proj_down.shape == (D, rank)
    return proj_down, proj_up


def init_heads(params: Params, cfg: ModelConfig, head_layers: Sequence[int],
               rank: int | None = None, dtype=jnp.float32, adapter_width: int | None = None,
               adapter_act: str = "swiglu", projection: str = "own", seed: int = 0) -> ExitHeads:
    """Exit heads at `head_layers`, each a copy of the shared head (module docstring).

    Args:
      params: the frozen model's parameters (read only).
      cfg: its config.
      head_layers: exits in [1, L - 1].
      rank: None for full `D×V` heads, else the low-rank heads' rank R.
      dtype: dtype of the head parameters (float32: the optimizer's master copy).
      adapter_width, adapter_act: an adapter block of width Fa ("swiglu" or "gelu") in
        every head; None for none.
      projection: "own" (a trained copy of the final norm + LM head, full or rank R) or
        "shared" (adapters only: the model's own, frozen).
      seed: seeds the adapters' random matrices (exit e draws from key (seed, e)).
    """
    layers = check_head_layers(cfg, head_layers)
    rank = check_rank(cfg, rank)
    specs = head_specs(cfg, rank, adapter_width=adapter_width, adapter_act=adapter_act,
                       projection=projection)  # validates the combination
    template = {}
    if projection == "own":
        norm = jnp.asarray(params["final_norm"], dtype)
        w_DxV = lm_head_matrix(params, cfg)
        if rank is None:
            template = {"norm": norm, "proj": jnp.asarray(w_DxV, dtype)}
        else:
            down, up = low_rank_factors(w_DxV, rank)
            template = {"norm": norm, "proj_down": down.astype(dtype), "proj_up": up.astype(dtype)}
    heads = {}
    for e in layers:
        # Separate copies per exit, so no two heads alias one buffer (donation-safe).
        head = jax.tree.map(jnp.copy, template)
        if adapter_width is not None:
            adapter_specs = {k: v for k, v in specs.items() if k.startswith("adapter_")}
            head.update(init_from_specs(adapter_specs, jax.random.key(seed * 100_003 + e), dtype,
                                        init_std=cfg.hidden_size ** -0.5))
        heads[str(e)] = {k: head[k] for k in specs}  # the specs' order
    return heads


def shared_head_params(params: Params, cfg: ModelConfig) -> Params:
    """The model parameters the shared projection reads (`final_norm`, `embed` or `lm_head`):
    what heads with `projection="shared"` need at training time, as a frozen input."""
    return {"final_norm": params["final_norm"],
            **({"embed": params["embed"]} if cfg.tie_word_embeddings
               else {"lm_head": params["lm_head"]})}
