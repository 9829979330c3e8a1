"""Pure-functional decoder: embed, run any layer range over a block of positions, RMSNorm.

The one primitive every decoding method is built from is `run_layers`: it continues hidden
states from layer `start` through layer `stop - 1` (a `lax.scan` over the static slice of the
stacked weights, so compile time does not grow with depth), reading and writing the KV cache
of exactly those layers.

Shapes (nanodo suffixes): B batch, T block length, S cache capacity, D hidden, N query heads,
K kv heads, G = N / K, H head dim, F MLP width, V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import Params


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm over the last axis, computed in float32 (as HF does), returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return scale * normed.astype(x.dtype)


def apply_rope(x_BxTxMxH: jax.Array, positions_BxT: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotary embedding, HF "rotate_half" layout: pairs (i, i + H/2)."""
    freqs_BxTxh = positions_BxT[..., None].astype(jnp.float32) * inv_freq
    cos = jnp.cos(freqs_BxTxh)[:, :, None, :].astype(x_BxTxMxH.dtype)
    sin = jnp.sin(freqs_BxTxh)[:, :, None, :].astype(x_BxTxMxH.dtype)
    x1, x2 = jnp.split(x_BxTxMxH, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def embed(params: Params, tokens_BxT: jax.Array) -> jax.Array:
    """Token embeddings [B, T, D] (Llama and Qwen3 do not scale them)."""
    return jnp.take(params["embed"], tokens_BxT, axis=0)


def _attention(layer_params, cfg: ModelConfig, x_BxTxD, positions_BxT, cache: KVCache, layer):
    """Self-attention of a block against the whole cache, after writing the block's keys."""
    B, T, _ = x_BxTxD.shape
    inv_freq = jnp.asarray(cfg.inv_freq)
    q_BxTxNxH = jnp.einsum("BTD,DNH->BTNH", x_BxTxD, layer_params["wq"])
    k_BxTxKxH = jnp.einsum("BTD,DKH->BTKH", x_BxTxD, layer_params["wk"])
    v_BxTxKxH = jnp.einsum("BTD,DKH->BTKH", x_BxTxD, layer_params["wv"])
    if cfg.qk_norm:
        q_BxTxNxH = rms_norm(q_BxTxNxH, layer_params["q_norm"], cfg.rms_norm_eps)
        k_BxTxKxH = rms_norm(k_BxTxKxH, layer_params["k_norm"], cfg.rms_norm_eps)
    q_BxTxNxH = apply_rope(q_BxTxNxH, positions_BxT, inv_freq)
    k_BxTxKxH = apply_rope(k_BxTxKxH, positions_BxT, inv_freq)
    cache = cache.write(layer, positions_BxT, k_BxTxKxH, v_BxTxKxH)

    keys_BxSxKxH = cache.k[layer]
    values_BxSxKxH = cache.v[layer]
    S = keys_BxSxKxH.shape[1]
    q_BxTxKxGxH = q_BxTxNxH.reshape(B, T, cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim)
    scores_BxKxGxTxS = jnp.einsum("BTKGH,BSKH->BKGTS", q_BxTxKxGxH, keys_BxSxKxH,
                                  preferred_element_type=jnp.float32)
    scores_BxKxGxTxS = scores_BxKxGxTxS * (cfg.head_dim**-0.5)
    # Causal by absolute position: slot s is visible to a query at position p iff s <= p.
    visible_BxTxS = jnp.arange(S)[None, None, :] <= positions_BxT[:, :, None]
    scores_BxKxGxTxS = jnp.where(visible_BxTxS[:, None, None], scores_BxKxGxTxS, -1e30)
    probs = jax.nn.softmax(scores_BxKxGxTxS, axis=-1).astype(values_BxSxKxH.dtype)
    out_BxTxKxGxH = jnp.einsum("BKGTS,BSKH->BTKGH", probs, values_BxSxKxH)
    out_BxTxNxH = out_BxTxKxGxH.reshape(B, T, cfg.num_heads, cfg.head_dim)
    return jnp.einsum("BTNH,NHD->BTD", out_BxTxNxH, layer_params["wo"]), cache


def _mlp(layer_params, x_BxTxD):
    gate_BxTxF = jnp.einsum("BTD,DF->BTF", x_BxTxD, layer_params["w_gate"])
    up_BxTxF = jnp.einsum("BTD,DF->BTF", x_BxTxD, layer_params["w_up"])
    return jnp.einsum("BTF,FD->BTD", jax.nn.silu(gate_BxTxF) * up_BxTxF, layer_params["w_down"])


def _layer(layer_params, cfg: ModelConfig, x_BxTxD, positions_BxT, cache: KVCache, layer):
    h = rms_norm(x_BxTxD, layer_params["attn_norm"], cfg.rms_norm_eps)
    attn_BxTxD, cache = _attention(layer_params, cfg, h, positions_BxT, cache, layer)
    x_BxTxD = x_BxTxD + attn_BxTxD
    h = rms_norm(x_BxTxD, layer_params["mlp_norm"], cfg.rms_norm_eps)
    return x_BxTxD + _mlp(layer_params, h), cache


def run_layers(params: Params, cfg: ModelConfig, x_BxTxD: jax.Array, positions_BxT: jax.Array,
               cache: KVCache, start: int, stop: int) -> tuple[jax.Array, KVCache]:
    """Runs layers [start, stop) over a block, continuing from layer-`start` hidden states.

    Args:
      params: model parameters (per-layer weights stacked on axis 0).
      cfg: the model config (static).
      x_BxTxD: hidden states entering layer `start` (embeddings when start == 0).
      positions_BxT: absolute position of every block entry; padded entries hold the cache
        capacity S (their cache writes are dropped and their outputs are meaningless).
      cache: KV cache holding at least `stop` layers; layers [start, stop) are written.
      start, stop: static layer range, 0 <= start <= stop <= L.

    Returns:
      (hidden states leaving layer stop - 1, i.e. "layer-`stop` states", updated cache).
    """
    if not 0 <= start <= stop <= cfg.num_layers:
        raise ValueError(f"layer range [{start}, {stop}) is outside [0, {cfg.num_layers}]")
    if stop > cache.num_layers:
        raise ValueError(f"cache holds {cache.num_layers} layers, layer range needs {stop}")
    if start == stop:
        return x_BxTxD, cache
    layer_slice = jax.tree.map(lambda w: w[start:stop], params["layers"])

    def step(carry, xs):
        x, cache = carry
        layer_params, layer = xs
        x, cache = _layer(layer_params, cfg, x, positions_BxT, cache, layer)
        return (x, cache), None

    (x_BxTxD, cache), _ = jax.lax.scan(step, (x_BxTxD, cache),
                                       (layer_slice, jnp.arange(start, stop)))
    return x_BxTxD, cache
