"""Exit heads: map layer-`e` hidden states to logits.

Exit `e` (1 <= e <= L) uses the trained head `heads[str(e)]` when there is one, otherwise
the **shared** head: the model's own final norm + LM head (how LayerSkip checkpoints are
meant to exit at any layer). Exit L always uses the shared head (it is the model itself).

Trained heads: their own RMSNorm, then a full `D×V` projection (`proj`) or a low-rank
`D×R` (`proj_down`) then `R×V` (`proj_up`) projection.

A head may also carry a **draft vocabulary** (`vocab`: K sorted token ids, K < V): its
projection then has K output columns (`D×K`, or `R×K`), and every token outside the
vocabulary gets logit -inf. A drafter never proposes those tokens, which only lowers its
acceptance where the final layer wants a rare token; the full model still verifies over
all V, so greedy output and the sampling distribution are unchanged. What it buys is the
head's cost: on small models with large vocabularies the `D×V` head is most of a draft
step (SmolLM2-135M: V = 49,152, D = 576, one head = 8 transformer layers).

    logits_BxTxK = norm(h) @ proj_DxK                   K = len(vocab)
    logits_BxTxV = full(-inf).at[..., vocab].set(logits_BxTxK)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.params import ExitHeads, Params
from hispec_jax.models.transformer import rms_norm


def head_kind(cfg: ModelConfig, heads: ExitHeads, exit_layer: int) -> str:
    """"shared", "full" or "low_rank": which head exit `exit_layer` uses."""
    if not 1 <= exit_layer <= cfg.num_layers:
        raise ValueError(f"exit layer {exit_layer} is outside [1, {cfg.num_layers}]")
    head = heads.get(str(exit_layer)) if exit_layer < cfg.num_layers else None
    if head is None:
        return "shared"
    return "full" if "proj" in head else "low_rank"


def draft_vocab_size(cfg: ModelConfig, heads: ExitHeads, exit_layer: int) -> int:
    """How many tokens exit `exit_layer` can propose: K with a draft vocabulary, else V."""
    if head_kind(cfg, heads, exit_layer) == "shared":
        return cfg.vocab_size
    head = heads[str(exit_layer)]
    return int(head["vocab"].shape[0]) if "vocab" in head else cfg.vocab_size


def layer_macs(cfg: ModelConfig) -> int:
    """Multiply-adds of one decoder layer for one token, weights only (the projections:
    q, k, v, o and the three SwiGLU matrices; attention over the cache grows with context
    and is left out, as it is of AR's count)."""
    D, H, F = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    return D * H * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * D * F


def head_macs(cfg: ModelConfig, heads: ExitHeads, exit_layer: int) -> int:
    """Multiply-adds of one evaluation of exit `exit_layer`'s head for one token: `D×V` for
    the shared head, `D×K` for a full head over K draft tokens, `D×R + R×K` for a low-rank
    one (norms and the -inf scatter are left out)."""
    kind = head_kind(cfg, heads, exit_layer)
    D, K = cfg.hidden_size, draft_vocab_size(cfg, heads, exit_layer)
    if kind == "low_rank":
        R = int(heads[str(exit_layer)]["proj_down"].shape[1])
        return D * R + R * K
    return D * K


def head_cost_layers(cfg: ModelConfig, heads: ExitHeads, exit_layer: int) -> float:
    """Exit `exit_layer`'s head in layer equivalents: `head_macs / layer_macs`
    (SmolLM2-135M's shared head: 576·49152 / 3.5 M ≈ 8 layers)."""
    return head_macs(cfg, heads, exit_layer) / layer_macs(cfg)


def lm_head_matrix(params: Params, cfg: ModelConfig) -> jax.Array:
    """The shared LM head as a [D, V] matrix (the transposed embedding when tied)."""
    return params["embed"].T if cfg.tie_word_embeddings else params["lm_head"]


def exit_logits(params: Params, heads: ExitHeads, cfg: ModelConfig, h_BxTxD: jax.Array,
                exit_layer: int) -> jax.Array:
    """Float32 logits [B, T, V] of exit `exit_layer` (static) from layer-`exit_layer` states."""
    kind = head_kind(cfg, heads, exit_layer)
    dot = functools.partial(jnp.einsum, precision=cfg.precision)
    if kind == "shared":
        x = rms_norm(h_BxTxD, params["final_norm"], cfg.rms_norm_eps)
        if cfg.tie_word_embeddings:  # contract with the embedding directly: no transposed copy
            return dot("BTD,VD->BTV", x, params["embed"], preferred_element_type=jnp.float32)
        return dot("BTD,DV->BTV", x, params["lm_head"], preferred_element_type=jnp.float32)
    head = heads[str(exit_layer)]
    x = rms_norm(h_BxTxD, head["norm"], cfg.rms_norm_eps)
    if kind == "full":
        logits = dot("BTD,DV->BTV", x, head["proj"], preferred_element_type=jnp.float32)
    else:
        r_BxTxR = dot("BTD,DR->BTR", x, head["proj_down"])
        logits = dot("BTR,RV->BTV", r_BxTxR, head["proj_up"], preferred_element_type=jnp.float32)
    if "vocab" not in head:
        return logits
    # a draft vocabulary: K columns -> V, -inf for the tokens the head cannot propose
    B, T, _ = logits.shape
    full_BxTxV = jnp.full((B, T, cfg.vocab_size), -jnp.inf, jnp.float32)
    return full_BxTxV.at[:, :, head["vocab"]].set(logits, unique_indices=True,
                                                   indices_are_sorted=True)
