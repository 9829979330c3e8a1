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

An **adapter** head first adds a small residual MLP block of width Fa to the exit's states
(its own RMSNorm, SwiGLU or GELU; `adapter_down` starts at zero, so an untrained adapter is
the identity), then applies its own norm + projection, or the shared final norm + LM head
when it has no projection of its own (kind "adapter"):

    x_BxTxD = adapter_norm(h)
    h'      = h + (silu(x @ gate_DxFa) * (x @ up_DxFa)) @ down_FaxD     SwiGLU
    h'      = h + gelu(x @ up_DxFa) @ down_FaxD                          GELU (no gate)
    logits  = head(h')                        shared, full or low-rank, as above

Cost per token: `(3 or 2)·D·Fa` multiply-adds for the block + the projection's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.params import ExitHeads, Params
from hispec_jax.models.transformer import rms_norm, weight_left_matmul


def head_kind(cfg: ModelConfig, heads: ExitHeads, exit_layer: int) -> str:
    """Which head exit `exit_layer` uses: "shared", "full" or "low_rank"; with an adapter
    block "adapter" (then the shared projection), "adapter_full" or "adapter_low_rank"."""
    if not 1 <= exit_layer <= cfg.num_layers:
        raise ValueError(f"exit layer {exit_layer} is outside [1, {cfg.num_layers}]")
    head = heads.get(str(exit_layer)) if exit_layer < cfg.num_layers else None
    if head is None:
        return "shared"
    projection = "full" if "proj" in head else "low_rank" if "proj_down" in head else None
    if "adapter_up" not in head:
        return projection
    return "adapter" if projection is None else f"adapter_{projection}"


def projection_kind(cfg: ModelConfig, heads: ExitHeads, exit_layer: int) -> str:
    """"shared", "full" or "low_rank": the projection exit `exit_layer`'s logits come from
    (an adapter head without its own projection uses the shared one)."""
    kind = head_kind(cfg, heads, exit_layer)
    return "shared" if kind in ("shared", "adapter") else kind.removeprefix("adapter_")


def draft_vocab_size(cfg: ModelConfig, heads: ExitHeads, exit_layer: int) -> int:
    """How many tokens exit `exit_layer` can propose: K with a draft vocabulary, else V."""
    if projection_kind(cfg, heads, exit_layer) == "shared":
        return cfg.vocab_size
    head = heads[str(exit_layer)]
    return int(head["vocab"].shape[0]) if "vocab" in head else cfg.vocab_size


def layer_macs(cfg: ModelConfig) -> int:
    """Multiply-adds of one decoder layer for one token, weights only (the projections:
    q, k, v, o and the three SwiGLU matrices; attention over the cache grows with context
    and is left out, as it is of AR's count)."""
    D, H, F = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    return D * H * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + 3 * D * F


def adapter_macs(cfg: ModelConfig, heads: ExitHeads, exit_layer: int) -> int:
    """Multiply-adds of exit `exit_layer`'s adapter block for one token: `3·D·Fa` (SwiGLU)
    or `2·D·Fa` (GELU); 0 without an adapter."""
    if not head_kind(cfg, heads, exit_layer).startswith("adapter"):
        return 0
    head = heads[str(exit_layer)]
    matrices = 3 if "adapter_gate" in head else 2
    return matrices * cfg.hidden_size * int(head["adapter_up"].shape[1])


def head_macs(cfg: ModelConfig, heads: ExitHeads, exit_layer: int) -> int:
    """Multiply-adds of one evaluation of exit `exit_layer`'s head for one token: `D×V` for
    the shared head, `D×K` for a full head over K draft tokens, `D×R + R×K` for a low-rank
    one, plus an adapter block's `(3 or 2)·D·Fa` (norms, activations and the -inf scatter
    are left out)."""
    kind = projection_kind(cfg, heads, exit_layer)
    D, K = cfg.hidden_size, draft_vocab_size(cfg, heads, exit_layer)
    adapter = adapter_macs(cfg, heads, exit_layer)
    if kind == "low_rank":
        R = int(heads[str(exit_layer)]["proj_down"].shape[1])
        return adapter + D * R + R * K
    return adapter + D * K


def head_cost_layers(cfg: ModelConfig, heads: ExitHeads, exit_layer: int) -> float:
    """Exit `exit_layer`'s head in layer equivalents: `head_macs / layer_macs`
    (SmolLM2-135M's shared head: 576·49152 / 3.5 M ≈ 8 layers)."""
    return head_macs(cfg, heads, exit_layer) / layer_macs(cfg)


def head_cost_scales(cfg: ModelConfig, heads: ExitHeads) -> tuple[tuple[int, float], ...]:
    """((exit, cost of its trained head / the shared head's), ...) for every exit below L
    with a trained head, by `head_macs` (the V-wide -inf fill of a draft vocabulary and the
    argmax are left out: linear in V, not in D x V). Exits without one cost 1."""
    shared = head_macs(cfg, heads, cfg.num_layers)
    return tuple((int(e), head_macs(cfg, heads, int(e)) / shared)
                 for e in sorted(heads, key=int) if int(e) < cfg.num_layers)


def lm_head_matrix(params: Params, cfg: ModelConfig) -> jax.Array:
    """The shared LM head as a [D, V] matrix (the transposed embedding when tied)."""
    return params["embed"].T if cfg.tie_word_embeddings else params["lm_head"]


# Blocks of up to this many rows (B * T) take the tied head as `E @ x^T` on CPU (`_tied_head`).
EMBED_LHS_MAX_ROWS = 32


def _tied_head(x_BxTxD: jax.Array, embed_VxD: jax.Array, precision) -> jax.Array:
    """Float32 logits [B, T, V] of the tied LM head: `x @ E^T` with the embedding E [V, D].

    On XLA:CPU a block of 2..`EMBED_LHS_MAX_ROWS` rows is computed as `E @ x^T` -> [V, B, T],
    then transposed: the same products, with the large [V, D] matrix as the left operand.
    As `x @ E^T`, the YNNPACK GEMM that serves every dot of more than one row repacks the
    whole embedding on each call, which makes the head of a short verification block cost
    much more than it does as `E @ x^T` on a CPU (docs/layer_layouts.md). One row stays `x @ E^T` (XLA's own matrix-vector product: the
    AR step), and so do larger blocks (prefill chunks, training) and other backends, where
    the repacking is not measured. `weight_left_matmul`'s optimization barrier keeps XLA
    from folding the transpose back into `x @ E^T`. Only the summation order changes
    (float32 differences ~1e-5, as between any two dot kernels)."""
    B, T, _ = x_BxTxD.shape
    if jax.default_backend() != "cpu" or not 1 < B * T <= EMBED_LHS_MAX_ROWS:
        return jnp.einsum("BTD,VD->BTV", x_BxTxD, embed_VxD, precision=precision,
                          preferred_element_type=jnp.float32)
    return weight_left_matmul(embed_VxD, x_BxTxD, precision, preferred_element_type=jnp.float32)


def apply_adapter(head, cfg: ModelConfig, h_BxTxD: jax.Array) -> jax.Array:
    """`h + MLP(adapter_norm(h))`: the adapter block of `head` (module docstring), in h's dtype."""
    dot = functools.partial(jnp.einsum, precision=cfg.precision)
    x_BxTxD = rms_norm(h_BxTxD, head["adapter_norm"], cfg.rms_norm_eps)
    up_BxTxF = dot("BTD,DF->BTF", x_BxTxD, head["adapter_up"])
    if "adapter_gate" in head:
        act_BxTxF = jax.nn.silu(dot("BTD,DF->BTF", x_BxTxD, head["adapter_gate"])) * up_BxTxF
    else:
        act_BxTxF = jax.nn.gelu(up_BxTxF)
    return h_BxTxD + dot("BTF,FD->BTD", act_BxTxF, head["adapter_down"]).astype(h_BxTxD.dtype)


def exit_logits(params: Params, heads: ExitHeads, cfg: ModelConfig, h_BxTxD: jax.Array,
                exit_layer: int) -> jax.Array:
    """Float32 logits [B, T, V] of exit `exit_layer` (static) from layer-`exit_layer` states.

    `params` is read only for the shared projection (`final_norm` and `embed` / `lm_head`),
    so a dict of just those serves for heads that use it."""
    kind = projection_kind(cfg, heads, exit_layer)
    dot = functools.partial(jnp.einsum, precision=cfg.precision)
    if head_kind(cfg, heads, exit_layer).startswith("adapter"):
        h_BxTxD = apply_adapter(heads[str(exit_layer)], cfg, h_BxTxD)
    if kind == "shared":
        x = rms_norm(h_BxTxD, params["final_norm"], cfg.rms_norm_eps)
        if cfg.tie_word_embeddings:  # contract with the embedding directly: no transposed copy
            return _tied_head(x, params["embed"], cfg.precision)
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
