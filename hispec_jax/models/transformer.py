"""Pure-functional decoder: embed, run any layer range over a block of positions, RMSNorm.

The one primitive every decoding method is built from is `run_layers`: it continues hidden
states from layer `start` through layer `stop - 1` (a `lax.scan` over the stacked weights, so
compile time does not grow with depth, or an unrolled loop over per-layer weights: see the
layer layouts in `params.py`), reading the KV cache of exactly those layers and returning
the block's new keys/values (`KVBlock`) for the caller to write.

Shapes (nanodo suffixes): B batch, T block length, S cache capacity, D hidden, N query heads,
K kv heads, G = N / K, H head dim, F MLP width, V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVBlock, KVCache
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


def _attention(layer_params, cfg: ModelConfig, x_BxTxD, positions_BxT, context_k_BxKxSxH,
               context_v_BxKxSxH):
    """Self-attention of a block over the cached context plus the block itself.

    The cache is only read: a query at block index j sees cache slots < the block's first
    position (that sequence's valid context) and block entries i <= j. The block's own
    keys/values are returned for the caller to write into the cache, which keeps the big
    cache buffer out of control flow (no copies inside `lax.switch` branches).
    """
    B, T, _ = x_BxTxD.shape
    K, G, H = cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim
    inv_freq = jnp.asarray(cfg.inv_freq)
    q_BxTxNxH = jnp.einsum("BTD,DNH->BTNH", x_BxTxD, layer_params["wq"])
    k_BxTxKxH = jnp.einsum("BTD,DKH->BTKH", x_BxTxD, layer_params["wk"])
    v_BxTxKxH = jnp.einsum("BTD,DKH->BTKH", x_BxTxD, layer_params["wv"])
    if cfg.qk_norm:
        q_BxTxNxH = rms_norm(q_BxTxNxH, layer_params["q_norm"], cfg.rms_norm_eps)
        k_BxTxKxH = rms_norm(k_BxTxKxH, layer_params["k_norm"], cfg.rms_norm_eps)
    q_BxTxNxH = apply_rope(q_BxTxNxH, positions_BxT, inv_freq)
    k_BxTxKxH = apply_rope(k_BxTxKxH, positions_BxT, inv_freq)
    k_BxTxKxH = k_BxTxKxH.astype(context_k_BxKxSxH.dtype)
    v_BxTxKxH = v_BxTxKxH.astype(context_v_BxKxSxH.dtype)

    q_BxTxKxGxH = q_BxTxNxH.reshape(B, T, K, G, H) * (H**-0.5)
    scores_ctx = jnp.einsum("BTKGH,BKSH->BKGTS", q_BxTxKxGxH, context_k_BxKxSxH,
                            preferred_element_type=jnp.float32)
    scores_blk = jnp.einsum("BTKGH,BUKH->BKGTU", q_BxTxKxGxH, k_BxTxKxH,
                            preferred_element_type=jnp.float32)
    S = context_k_BxKxSxH.shape[2]
    start_B = positions_BxT[:, 0]
    ctx_visible_BxS = jnp.arange(S)[None, :] < start_B[:, None]
    blk_visible_TxU = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]
    scores_ctx = jnp.where(ctx_visible_BxS[:, None, None, None, :], scores_ctx, -1e30)
    scores_blk = jnp.where(blk_visible_TxU[None, None, None], scores_blk, -1e30)
    probs = jax.nn.softmax(jnp.concatenate([scores_ctx, scores_blk], axis=-1), axis=-1)
    probs = probs.astype(context_v_BxKxSxH.dtype)
    out_BxTxKxGxH = (jnp.einsum("BKGTS,BKSH->BTKGH", probs[..., :S], context_v_BxKxSxH)
                     + jnp.einsum("BKGTU,BUKH->BTKGH", probs[..., S:], v_BxTxKxH))
    # As one [B, T, N*H] x [N*H, D] matmul: (N, H) flattened in the weights' own row-major
    # order, so XLA needs no relayout copy of wo (a 4-D einsum got one per layer and step).
    N = cfg.num_heads
    out_BxTxNH = out_BxTxKxGxH.reshape(B, T, N * H)
    attn_BxTxD = out_BxTxNH @ layer_params["wo"].reshape(N * H, -1)
    return attn_BxTxD, k_BxTxKxH, v_BxTxKxH


def _mlp(layer_params, x_BxTxD):
    gate_BxTxF = jnp.einsum("BTD,DF->BTF", x_BxTxD, layer_params["w_gate"])
    up_BxTxF = jnp.einsum("BTD,DF->BTF", x_BxTxD, layer_params["w_up"])
    return jnp.einsum("BTF,FD->BTD", jax.nn.silu(gate_BxTxF) * up_BxTxF, layer_params["w_down"])


def run_layers(params: Params, cfg: ModelConfig, x_BxTxD: jax.Array, positions_BxT: jax.Array,
               cache: KVCache, start: int, stop: int) -> tuple[jax.Array, KVBlock]:
    """Runs layers [start, stop) over a block, continuing from layer-`start` hidden states.

    Args:
      params: model parameters (per-layer weights stacked on axis 0).
      cfg: the model config (static).
      x_BxTxD: hidden states entering layer `start` (embeddings when start == 0).
      positions_BxT: absolute positions of the block, contiguous from each sequence's first
        entry `positions_BxT[:, 0]`; padded entries hold the cache capacity S.
      cache: KV cache holding at least `stop` layers; only read. A sequence's context is
        its cache slots < `positions_BxT[:, 0]`, which must be valid for these layers.
      start, stop: static layer range, 0 <= start <= stop <= L.

    Returns:
      (hidden states leaving layer stop - 1, i.e. "layer-`stop` states", the block's new
      keys/values for layers [start, stop), to write with `KVCache.write_block`).
    """
    if not 0 <= start <= stop <= cfg.num_layers:
        raise ValueError(f"layer range [{start}, {stop}) is outside [0, {cfg.num_layers}]")
    if stop > cache.num_layers:
        raise ValueError(f"cache holds {cache.num_layers} layers, layer range needs {stop}")
    layers = params["layers"]
    if isinstance(layers, (tuple, list)):  # the "unrolled" layout: one buffer set per layer
        ks, vs = [], []
        for layer in range(start, stop):
            x_BxTxD, k, v = _layer(layers[layer], cfg, x_BxTxD, positions_BxT,
                                   cache.k[layer], cache.v[layer])
            ks.append(k)
            vs.append(v)
        if not ks:
            B, T, _ = x_BxTxD.shape
            empty = jnp.zeros((0, B, T, cfg.num_kv_heads, cfg.head_dim), cache.k.dtype)
            return x_BxTxD, KVBlock(k=empty, v=empty)
        return x_BxTxD, KVBlock(k=jnp.stack(ks), v=jnp.stack(vs))

    # The "scan" layout. Index each layer's weights and cache inside the scan: slicing the
    # stacked arrays outside (`w[start:stop]` as scan inputs) makes XLA materialize a copy.
    take = lambda a, layer: jax.lax.dynamic_index_in_dim(a, layer, keepdims=False)

    def step(x, layer):
        layer_params = jax.tree.map(lambda w: take(w, layer), layers)
        x, k, v = _layer(layer_params, cfg, x, positions_BxT, take(cache.k, layer),
                         take(cache.v, layer))
        return x, (k, v)

    x_BxTxD, (k_LxBxTxKxH, v_LxBxTxKxH) = jax.lax.scan(step, x_BxTxD, jnp.arange(start, stop))
    return x_BxTxD, KVBlock(k=k_LxBxTxKxH, v=v_LxBxTxKxH)


def _layer(layer_params, cfg: ModelConfig, x_BxTxD, positions_BxT, context_k_BxKxSxH,
           context_v_BxKxSxH):
    """One pre-norm decoder layer: x + attention(norm(x)), then + MLP(norm(.)).
    Returns (x [B, T, D], the block's k and v [B, T, K, H])."""
    h = rms_norm(x_BxTxD, layer_params["attn_norm"], cfg.rms_norm_eps)
    attn, k, v = _attention(layer_params, cfg, h, positions_BxT, context_k_BxKxSxH,
                            context_v_BxKxSxH)
    x_BxTxD = x_BxTxD + attn
    h = rms_norm(x_BxTxD, layer_params["mlp_norm"], cfg.rms_norm_eps)
    return x_BxTxD + _mlp(layer_params, h), k, v


def run_layers_cached(params: Params, cfg: ModelConfig, x_BxTxD, positions_BxT, cache: KVCache,
                      start: int, stop: int) -> tuple[jax.Array, KVCache]:
    """`run_layers`, then write the block's keys/values into the cache."""
    x_BxTxD, block = run_layers(params, cfg, x_BxTxD, positions_BxT, cache, start, stop)
    return x_BxTxD, cache.write_block(start, positions_BxT, block)
