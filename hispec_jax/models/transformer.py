"""Pure-functional decoder: embed, run any layer range over a block of positions, RMSNorm.

The one primitive every decoding method is built from is running a layer range: it
continues hidden states from layer `start` through layer `stop - 1` (a `lax.scan` over the
stacked weights, so compile time does not grow with depth, or an unrolled loop over
per-layer weights: see the layer layouts in `params.py`), reading the KV cache of exactly
those layers. Decoding uses `run_layers_cached`, which writes each layer's new keys/values
into the cache in place inside the layer loop; training uses `run_layers`, which returns
them (`KVBlock`). A decoding pass may carry a prefill chunk of another sequence along
(`Rider`): chunked prefill fused with decoding.

Shapes (nanodo suffixes): B batch, T block length, S cache capacity, D hidden, N query heads,
K kv heads, G = N / K, H head dim, F MLP width, V vocab.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp

from hispec_jax.models import sharding
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVBlock, KVCache
from hispec_jax.models.params import OUT_MAJOR_SUFFIX, SCALE_SUFFIX, Params


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


@flax.struct.dataclass
class Rider:
    """A prefill chunk of one sequence riding a decoding pass (chunked prefill fused with
    decoding): its C positions run the pass's layers in the same matmuls as the pass's
    block, so every weight is read once for both, and attend over their own cache row.

        norms, projections, MLP   one token group [ block: B*T tokens | chunk: C tokens ]
        attention                 the block's rows over their cache rows (as without it);
                                  the chunk over cache row `row` and itself, causally

    Where a decoding pass costs the read of the weights (a CPU, an accelerator at small
    batch), a chunk of a few positions adds little to the pass it rides, while a pass of
    its own costs about a round: the streams decoding beside a prompt that enters its slot
    pause for the chunk's extra compute instead of a second pass.

    Attributes:
      x_1xCxD: the chunk's hidden states entering the pass (its embeddings), or, in the
        rider a pass returns, leaving it.
      positions_1xC: [1, C] int32, its positions (padding: the capacity S, written nowhere).
      row: [] int32, its sequence's batch row in the cache.
      kv: in the rider a read-only pass (`run_layers`) returns, the chunk's keys/values of
        the pass's layers [n_layers, 1, C, K, H] for the caller to write at `row`
        (`KVCache.write_block(..., row=row)`); None otherwise.
    """

    x_1xCxD: jax.Array
    positions_1xC: jax.Array
    row: jax.Array
    kv: KVBlock | None = None


def _join(x_BxTx: jax.Array, rider_1xCx: jax.Array) -> jax.Array:
    """The block's tokens and a rider's as one group [1, B*T + C, ...]."""
    B, T = x_BxTx.shape[:2]
    return jnp.concatenate([x_BxTx.reshape((1, B * T) + x_BxTx.shape[2:]),
                            rider_1xCx.astype(x_BxTx.dtype)], axis=1)


def _split(y_1xNx: jax.Array, B: int, T: int) -> tuple[jax.Array, jax.Array]:
    """`_join`'s inverse along the token axis: ([B, T, ...], [1, C, ...])."""
    return y_1xNx[:, :B * T].reshape((B, T) + y_1xNx.shape[2:]), y_1xNx[:, B * T:]


def _row(x_BxKxSxH: jax.Array, row: jax.Array) -> jax.Array:
    """One sequence's slice [1, K, S, H] of a cache layer."""
    return jax.lax.dynamic_slice_in_dim(x_BxKxSxH, row, 1, axis=0)


def project(layer_params, name: str, x_BxTxI: jax.Array, precision) -> jax.Array:
    """The layer projection `name` (`params.PROJECTIONS`) of x [B, T, I] -> [B, T, O], its
    input axes flattened to I and its output axes to O (the caller reshapes).

    Stored canonically (`w` [in..., out...]) it is `x @ w`. Stored out-major (`name_T`
    [out..., in...], the unrolled layout on XLA:CPU: `params.with_layer_layout`), a block of
    more than one row is computed as `w_T @ x^T` -> [O, B, T], then transposed:

        x [B*T, I] @ w [I, O]        YNNPACK's GEMM repacks the [I, O] weight on every call
        w_T [O, I] @ x^T [I, B*T]    the weight is the left operand, read as stored

    the same products with the large matrix on the left, as the tied LM head does
    (`heads._tied_head`); the optimization barrier keeps XLA from folding the transpose
    back. One row (a decoding step) stays a matrix-vector product `x @ w_T^T` (XLA's own
    emitter either way). On SmolLM2-135M on a 2-core CPU a verify pass over 8 positions
    takes 49.0 ms instead of 54.5, the AR step the same (docs/layer_layouts.md). Only the
    summation order differs (float32 differences ~1e-6, as between any two dot kernels).

    A weight-only int8 projection (`params.quantize_layer`: `name_scale` beside it) is
    converted to x's dtype inside the product, which is then scaled per output channel:
    x @ (q s) = (x @ q) s. The conversion is elementwise on the weight's operand, so XLA can
    fuse it into the product and read a byte per weight."""
    y_BxTxO = _product(layer_params, name, x_BxTxI, precision)
    scale = layer_params.get(name + SCALE_SUFFIX)
    if scale is None:
        return y_BxTxO
    return (y_BxTxO.astype(jnp.float32) * scale.reshape(-1).astype(jnp.float32)).astype(
        y_BxTxO.dtype)


def _product(layer_params, name: str, x_BxTxI: jax.Array, precision) -> jax.Array:
    """`project` before an int8 weight's scale: x @ w in x's dtype, w in either order."""
    B, T, I = x_BxTxI.shape
    w_T = layer_params.get(name + OUT_MAJOR_SUFFIX)
    if w_T is None:
        w_IxO = layer_params[name].reshape(I, -1).astype(x_BxTxI.dtype)
        return jnp.einsum("BTI,IO->BTO", x_BxTxI, w_IxO, precision=precision)
    w_OxI = w_T.reshape(-1, I).astype(x_BxTxI.dtype)
    if B * T == 1:
        return jnp.einsum("BTI,OI->BTO", x_BxTxI, w_OxI, precision=precision)
    return weight_left_matmul(w_OxI, x_BxTxI, precision)


def weight_left_matmul(w_OxI: jax.Array, x_BxTxI: jax.Array, precision,
                       preferred_element_type=None) -> jax.Array:
    """`x @ w^T` -> [B, T, O] for an out-major weight w [O, I], computed as `w @ x^T` ->
    [O, B, T] and transposed: the weight is the left operand, read as stored (XLA:CPU's
    YNNPACK GEMM packs its right operand on every call). The optimization barrier keeps XLA
    from folding the transpose back into `x @ w^T`. Used by `project` and the tied LM head
    (`heads._tied_head`, the embedding [V, D] is out-major already)."""
    y_OxBxT = jnp.einsum("OI,BTI->OBT", w_OxI, x_BxTxI, precision=precision,
                         preferred_element_type=preferred_element_type)
    return jax.lax.optimization_barrier(y_OxBxT).transpose(1, 2, 0)


def _project_qkv(layer_params, cfg: ModelConfig, x_BxTxD, positions_BxT, kv_dtype):
    """Queries [B, T, K, G, H] (scaled by H^-1/2), keys and values [B, T, K, H] (kv_dtype),
    with q/k norm (Qwen3) and RoPE applied."""
    B, T, _ = x_BxTxD.shape
    K, G, H = cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim
    inv_freq = jnp.asarray(cfg.inv_freq)
    N = cfg.num_heads
    if _fused(layer_params, "wqkv"):  # one product: per kv head its G queries, key, value
        qkv_BxTxKxG2xH = project(layer_params, "wqkv", x_BxTxD, cfg.precision).reshape(
            B, T, K, G + 2, H)
        q_BxTxNxH = qkv_BxTxKxG2xH[:, :, :, :G].reshape(B, T, N, H)
        k_BxTxKxH, v_BxTxKxH = qkv_BxTxKxG2xH[:, :, :, G], qkv_BxTxKxG2xH[:, :, :, G + 1]
    else:
        q_BxTxNxH = project(layer_params, "wq", x_BxTxD, cfg.precision).reshape(B, T, N, H)
        k_BxTxKxH = project(layer_params, "wk", x_BxTxD, cfg.precision).reshape(B, T, K, H)
        v_BxTxKxH = project(layer_params, "wv", x_BxTxD, cfg.precision).reshape(B, T, K, H)
    if cfg.qk_norm:
        q_BxTxNxH = rms_norm(q_BxTxNxH, layer_params["q_norm"], cfg.rms_norm_eps)
        k_BxTxKxH = rms_norm(k_BxTxKxH, layer_params["k_norm"], cfg.rms_norm_eps)
    q_BxTxNxH = apply_rope(q_BxTxNxH, positions_BxT, inv_freq)
    k_BxTxKxH = apply_rope(k_BxTxKxH, positions_BxT, inv_freq)
    q_BxTxKxGxH = q_BxTxNxH.reshape(B, T, K, G, H) * (H**-0.5)
    return q_BxTxKxGxH, k_BxTxKxH.astype(kv_dtype), v_BxTxKxH.astype(kv_dtype)


def _attend(q_BxTxKxGxH, keys_BxKxSxH, values_BxKxSxH, visible_BxTxS, precision=None):
    """Softmax attention of every query over the slots it may see -> [B, T, K, G, H]."""
    if _single_query_on_cpu(q_BxTxKxGxH):
        return _attend_single_query(q_BxTxKxGxH[:, 0], keys_BxKxSxH, values_BxKxSxH,
                                    visible_BxTxS[:, 0])[:, None]
    scores = jnp.einsum("BTKGH,BKSH->BKGTS", q_BxTxKxGxH, keys_BxKxSxH,
                        preferred_element_type=jnp.float32, precision=precision)
    scores = jnp.where(visible_BxTxS[:, None, None], scores, -1e30)
    probs = jax.nn.softmax(scores, axis=-1).astype(values_BxKxSxH.dtype)
    return jnp.einsum("BKGTS,BKSH->BTKGH", probs, values_BxKxSxH, precision=precision)


SPAN_PARTS = 8  # attention spans are multiples of max(S / SPAN_PARTS, MIN_SPAN) slots
MIN_SPAN = 128


def attention_spans(capacity: int) -> tuple[int, ...]:
    """The cache prefixes (slot counts, ascending, the last = S) one attention may read:
    the multiples of step = max(S / 8, 128) that leave at least a step of slots unread, then
    S, so at most 8 (one, S itself, when S < 256). A span that would skip fewer slots is no
    branch: it would save little and cost a compiled copy of every layer's attention (at S =
    192, a third more program for SmolLM2's lookup loop, and as much more time to load it)."""
    step = max(-(-capacity // SPAN_PARTS), MIN_SPAN)
    return tuple(range(step, capacity - step + 1, step)) + (capacity,)


def _over_used_slots(attend, seen_BxT, capacity: int, keys_BxKxSxH, values_BxKxSxH,
                     visible_BxTxS):
    """`attend(keys, values, visible)` over the shortest cache prefix (`attention_spans`)
    that holds every slot a query may see: `seen_BxT` [B, T'] int32 is how many leading
    slots each query sees (0 for padding: what it attends to is discarded); `visible_BxTxS`
    is any [..., S] mask `attend` takes (sliced on its last axis).

        slots     0 ......... n1 ......... n2 ......... S     spans n1 < n2 < ... < S
        seen      |###### max(seen) ######|
        read      |<-------- n2 --------->|                   the first span >= max(seen)

    One `lax.switch` branch per span, each slicing statically, so a cache planned for long
    requests costs what it holds, at the price of longer compiles, every span being a
    branch (docs/layer_layouts.md). The masked slots past the
    span contribute exp(-1e30 - m) = 0, so the result is the same up to the summation order
    of the softmax's sums.

    On XLA:CPU only (measured there). Elsewhere every attention reads the whole cache:
    XLA:GPU runs a conditional by reading its branch index back on the host, a round trip
    per layer and step, and GPU and TPU have no measurement of the spans."""
    spans = attention_spans(capacity) if jax.default_backend() == "cpu" else (capacity,)
    if len(spans) == 1:
        return attend(keys_BxKxSxH, values_BxKxSxH, visible_BxTxS)
    index = jnp.clip((jnp.max(seen_BxT) - 1) // spans[0], 0, len(spans) - 1)
    branches = [lambda k, v, vis, n=n: attend(k[:, :, :n], v[:, :, :n], vis[..., :n])
                for n in spans]
    return jax.lax.switch(index, branches, keys_BxKxSxH, values_BxKxSxH, visible_BxTxS)


def _single_query_on_cpu(q_BxTxKxGxH) -> bool:
    """One query position per sequence (decoding and drafting steps), on XLA:CPU.

    There the two attention dots over a cache layer that was just updated in place make
    XLA:CPU copy or relayout the layer (at batch 1 each key and value buffer 3-4 times per
    step: the update is duplicated into the dot's operand); elementwise products with
    reductions read it once (docs/layer_layouts.md, "The attention of a single query").
    Blocks of several queries keep the dots, which are several times faster there."""
    return q_BxTxKxGxH.shape[1] == 1 and jax.default_backend() == "cpu"


def _attend_single_query(q_BxKxGxH, keys_BxKxSxH, values_BxKxSxH, visible_BxS):
    """`_attend` for one query per sequence as products and reductions -> [B, K, G, H]."""
    scores_BxKxGxS = jnp.sum(q_BxKxGxH[:, :, :, None, :].astype(jnp.float32)
                             * keys_BxKxSxH[:, :, None, :, :], axis=-1)
    scores_BxKxGxS = jnp.where(visible_BxS[:, None, None], scores_BxKxGxS, -1e30)
    probs = jax.nn.softmax(scores_BxKxGxS, axis=-1).astype(values_BxKxSxH.dtype)
    weighted = (probs[..., None] * values_BxKxSxH[:, :, None, :, :]).astype(jnp.float32)
    return jnp.sum(weighted, axis=-2).astype(values_BxKxSxH.dtype)




def _attention_output(layer_params, cfg: ModelConfig, out_BxTxKxGxH):
    # As one [B, T, N*H] x [N*H, D] matmul: (N, H) flattened in the weights' own row-major
    # order, so XLA needs no relayout copy of wo (a 4-D einsum gets one per layer and step).
    B, T = out_BxTxKxGxH.shape[:2]
    NH = cfg.num_heads * cfg.head_dim
    flat_BxTxNH = out_BxTxKxGxH.reshape(B, T, NH)
    if cfg.flat_attention_output:  # (`ModelConfig.flat_attention_output`)
        flat_BxTxNH = jax.lax.optimization_barrier(flat_BxTxNH)
    return project(layer_params, "wo", flat_BxTxNH, cfg.precision)


def _block_attention(layer_params, cfg: ModelConfig, x_BxTxD, positions_BxT, context_k_BxKxSxH,
                     context_v_BxKxSxH):
    """Self-attention of a block over a read-only context plus the block itself (training
    and feature extraction): a query at block index j sees context slots < the block's
    first position and block entries i <= j. Returns (output, the block's k and v)."""
    T = x_BxTxD.shape[1]
    q, k_BxTxKxH, v_BxTxKxH = _project_qkv(layer_params, cfg, x_BxTxD, positions_BxT,
                                           context_k_BxKxSxH.dtype)
    S = context_k_BxKxSxH.shape[2]
    keys = jnp.concatenate([context_k_BxKxSxH, k_BxTxKxH.transpose(0, 2, 1, 3)], axis=2)
    values = jnp.concatenate([context_v_BxKxSxH, v_BxTxKxH.transpose(0, 2, 1, 3)], axis=2)
    ctx_visible_BxS = jnp.arange(S)[None, :] < positions_BxT[:, :1]
    blk_visible_TxU = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]
    visible_BxTxSU = jnp.concatenate(
        [jnp.broadcast_to(ctx_visible_BxS[:, None, :], (ctx_visible_BxS.shape[0], T, S)),
         jnp.broadcast_to(blk_visible_TxU[None], (ctx_visible_BxS.shape[0], T, T))], axis=-1)
    out = _attend(q, keys, values, visible_BxTxSU, cfg.precision)
    return _attention_output(layer_params, cfg, out), k_BxTxKxH, v_BxTxKxH


def _context_block_attention(layer_params, cfg: ModelConfig, x_BxTxD, positions_BxT,
                             context_k_BxKxSxH, context_v_BxKxSxH, rider: Rider | None = None):
    """`_block_attention` without concatenating the context: one softmax over two score
    blocks (context slots < the block's first position, and the block itself, causal).

        scores   [ context S (masked at >= start) | block T (causal) ]
        m = max over both;  out = (p_ctx V_ctx + p_blk V_blk) / (sum p_ctx + sum p_blk)

    The context is only read (no [S + T] copy of a cache layer per layer), so a pass run
    inside a `lax.switch` branch leaves the cache untouched and XLA copies nothing; the
    block's keys/values are returned and written after the branch (`engine.Round`).
    Only the context slots in use are read (`_over_used_slots`).

    With a `rider`, `x_BxTxD` is the joined group [1, B*T + C, D] (`_join`) and the chunk
    attends over its own row's context the same way.
    Returns (output [B, T, D] (joined with a rider), the block's k and v [B, T, K, H], the
    rider's k and v [1, C, K, H] or None)."""
    B, T = positions_BxT.shape
    dtype = context_k_BxKxSxH.dtype
    if rider is None:
        q, k, v = _project_qkv(layer_params, cfg, x_BxTxD, positions_BxT, dtype)
        out = _attend_over_context(cfg, q, k, v, positions_BxT, context_k_BxKxSxH,
                                   context_v_BxKxSxH)
        return _attention_output(layer_params, cfg, out), k, v, None
    qkv = _project_qkv(layer_params, cfg, x_BxTxD, _join(positions_BxT, rider.positions_1xC),
                       dtype)
    (q, q_r), (k, k_r), (v, v_r) = (_split(a, B, T) for a in qkv)
    out = _attend_over_context(cfg, q, k, v, positions_BxT, context_k_BxKxSxH,
                               context_v_BxKxSxH)
    out_r = _attend_over_context(cfg, q_r, k_r, v_r, rider.positions_1xC,
                                 _row(context_k_BxKxSxH, rider.row),
                                 _row(context_v_BxKxSxH, rider.row))
    return _attention_output(layer_params, cfg, _join(out, out_r)), k, v, (k_r, v_r)


def _attend_over_context(cfg: ModelConfig, q, k_BxTxKxH, v_BxTxKxH, positions_BxT,
                         context_k_BxKxSxH, context_v_BxKxSxH):
    """The attention of `_context_block_attention` for one group -> [B, T, K, G, H]."""
    S = context_k_BxKxSxH.shape[2]
    ctx_visible_BxS = jnp.arange(S)[None, :] < positions_BxT[:, :1]
    attend = lambda keys, values, visible: _attend_context_and_block(
        q, k_BxTxKxH, v_BxTxKxH, keys, values, visible, cfg.precision)
    seen_Bx1 = jnp.where(positions_BxT[:, :1] < S, positions_BxT[:, :1], 0)
    return _over_used_slots(attend, seen_Bx1, S, context_k_BxKxSxH, context_v_BxKxSxH,
                            ctx_visible_BxS)


def _attend_context_and_block(q, k_BxTxKxH, v_BxTxKxH, context_k_BxKxSxH, context_v_BxKxSxH,
                              ctx_visible_BxS, prec):
    """The attention of `_context_block_attention` -> [B, T, K, G, H]."""
    T = q.shape[1]
    f32 = jnp.float32
    if _single_query_on_cpu(q):  # products and reductions (see `_attend_single_query`)
        s_ctx = jnp.sum(q[:, 0, :, :, None, :].astype(f32)
                        * context_k_BxKxSxH[:, :, None, :, :], axis=-1)[:, :, :, None, :]
    else:
        s_ctx = jnp.einsum("BTKGH,BKSH->BKGTS", q, context_k_BxKxSxH,
                           preferred_element_type=f32, precision=prec)
    s_ctx = jnp.where(ctx_visible_BxS[:, None, None, None, :], s_ctx, -1e30)
    s_blk = jnp.einsum("BTKGH,BUKH->BKGTU", q, k_BxTxKxH, preferred_element_type=f32,
                       precision=prec)
    causal_TxU = jnp.arange(T)[None, :] <= jnp.arange(T)[:, None]
    s_blk = jnp.where(causal_TxU[None, None, None], s_blk, -1e30)
    m = jnp.maximum(jnp.max(s_ctx, axis=-1, keepdims=True), jnp.max(s_blk, axis=-1, keepdims=True))
    p_ctx, p_blk = jnp.exp(s_ctx - m), jnp.exp(s_blk - m)
    denom_BxKxGxTx1 = jnp.sum(p_ctx, axis=-1, keepdims=True) + jnp.sum(p_blk, axis=-1, keepdims=True)
    dtype = context_v_BxKxSxH.dtype
    p_ctx, p_blk = (p_ctx / denom_BxKxGxTx1).astype(dtype), (p_blk / denom_BxKxGxTx1).astype(dtype)
    if _single_query_on_cpu(q):
        o_ctx = jnp.sum((p_ctx[:, :, :, 0, :, None] * context_v_BxKxSxH[:, :, None, :, :])
                        .astype(f32), axis=-2).astype(dtype)[:, None]
    else:
        o_ctx = jnp.einsum("BKGTS,BKSH->BTKGH", p_ctx, context_v_BxKxSxH, precision=prec)
    return o_ctx + jnp.einsum("BKGTU,BUKH->BTKGH", p_blk, v_BxTxKxH, precision=prec)


def _cached_attention(layer_params, cfg: ModelConfig, x_BxTxD, positions_BxT, write_positions_BxT,
                      cache: KVCache, layer, rider: Rider | None = None):
    """Self-attention that first writes the block's keys/values into the cache (at
    `write_positions_BxT`; sentinel S is dropped), then reads the updated layer: a query at
    position p sees slots <= p (the valid context below the block's first position, and
    the block's own entries up to itself). Writing before reading makes the read depend on
    the write, so XLA updates the carried cache in place instead of copying it. Only the
    slots in use are read (`_over_used_slots`).

    With a `rider`, `x_BxTxD` is the joined group [1, B*T + C, D] (`_join`): the chunk's
    keys/values go into its row, and it attends over that row the same way.
    Returns (output [B, T, D] (joined with a rider), the cache)."""
    B, T = positions_BxT.shape
    if rider is None:
        q, k, v = _project_qkv(layer_params, cfg, x_BxTxD, positions_BxT, cache.dtype)
        out, cache = _write_and_attend(cfg, q, k, v, positions_BxT, write_positions_BxT,
                                       cache, layer)
        return _attention_output(layer_params, cfg, out), cache
    qkv = _project_qkv(layer_params, cfg, x_BxTxD, _join(positions_BxT, rider.positions_1xC),
                       cache.dtype)
    (q, q_r), (k, k_r), (v, v_r) = (_split(a, B, T) for a in qkv)
    # both groups' writes before either read: a read between two writes of the layer would
    # make XLA copy it to keep the read's view
    cache = cache.write_layer(layer, write_positions_BxT, k, v)
    cache = cache.write_layer(layer, rider.positions_1xC, k_r, v_r, rider.row)
    out = _attend_cached(cfg, q, positions_BxT, cache, layer)
    out_r = _attend_cached(cfg, q_r, rider.positions_1xC, cache, layer, rider.row)
    return _attention_output(layer_params, cfg, _join(out, out_r)), cache


def _write_and_attend(cfg: ModelConfig, q, k_BxTxKxH, v_BxTxKxH, positions_BxT,
                      write_positions_BxT, cache: KVCache, layer):
    """`_cached_attention`'s write, then attention over the updated layer -> (output
    [B, T, K, G, H], cache)."""
    cache = cache.write_layer(layer, write_positions_BxT, k_BxTxKxH, v_BxTxKxH)
    return _attend_cached(cfg, q, positions_BxT, cache, layer), cache


def _attend_cached(cfg: ModelConfig, q, positions_BxT, cache: KVCache, layer, row=None):
    """The queries of positions_BxT over a cache layer: a query at p sees slots <= p
    (`row`: one sequence's queries, B = 1, over that batch row) -> [B, T, K, G, H]."""
    keys, values = cache.layer_keys(layer), cache.layer_values(layer)
    if row is not None:
        keys, values = _row(keys, row), _row(values, row)
    S = cache.capacity
    visible_BxTxS = jnp.arange(S)[None, None, :] <= positions_BxT[:, :, None]
    attend = lambda keys, values, visible: _attend(q, keys, values, visible, cfg.precision)
    seen_BxT = jnp.where(positions_BxT < S, positions_BxT + 1, 0)
    return _over_used_slots(attend, seen_BxT, S, keys, values, visible_BxTxS)


def _fused(layer_params, name: str) -> bool:
    """Whether the layer holds the fused projection `name` (`params.FUSED`), either order."""
    return name in layer_params or name + OUT_MAJOR_SUFFIX in layer_params


def _mlp(layer_params, cfg: ModelConfig, x_BxTxD):
    if _fused(layer_params, "w_gate_up"):  # one product [B, T, 2 F]: the gate, then up
        B, T, _ = x_BxTxD.shape
        gate_up_BxTx2xF = project(layer_params, "w_gate_up", x_BxTxD, cfg.precision).reshape(
            B, T, 2, cfg.intermediate_size)
        gate_BxTxF, up_BxTxF = gate_up_BxTx2xF[:, :, 0], gate_up_BxTx2xF[:, :, 1]
    else:
        gate_BxTxF = project(layer_params, "w_gate", x_BxTxD, cfg.precision)
        up_BxTxF = project(layer_params, "w_up", x_BxTxD, cfg.precision)
    return project(layer_params, "w_down", jax.nn.silu(gate_BxTxF) * up_BxTxF, cfg.precision)


def run_layers(params: Params, cfg: ModelConfig, x_BxTxD: jax.Array, positions_BxT: jax.Array,
               cache: KVCache, start: int, stop: int, *, split_context: bool = False,
               rider: Rider | None = None):
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
      split_context: attend with `_context_block_attention` (no concatenated copy of the
        context; decoding passes over a read-only cache) instead of `_block_attention`.
      rider: a prefill chunk of one sequence that runs the same layers in the same matmuls
        (`Rider`; with `split_context` only), its states entering layer `start`.

    Returns:
      (hidden states leaving layer stop - 1, i.e. "layer-`stop` states", the block's new
      keys/values for layers [start, stop) as a `KVBlock`); with a rider, a third element:
      the rider with its layer-`stop` states and its keys/values (`Rider.kv`).
    """
    if not 0 <= start <= stop <= cfg.num_layers:
        raise ValueError(f"layer range [{start}, {stop}) is outside [0, {cfg.num_layers}]")
    if stop > cache.num_layers:
        raise ValueError(f"cache holds {cache.num_layers} layers, layer range needs {stop}")
    if rider is not None and not split_context:
        raise ValueError("a rider rides a split-context pass (split_context=True)")
    B, T, _ = x_BxTxD.shape
    block_attention = _context_block_attention if split_context else _block_attention

    def one_layer(layer_params, layer, carry):
        x, x_r = carry
        keys, values = cache.layer_keys(layer), cache.layer_values(layer)
        if rider is None:
            attention = lambda h: _unpack(block_attention(layer_params, cfg, h, positions_BxT,
                                                          keys, values)[:3])
            x, (k, v) = _layer(layer_params, cfg, x, attention)
            return (x, x_r), (k, v, None)
        attention = lambda h: (lambda out, k, v, kv_r: (out, (k, v, kv_r)))(
            *_context_block_attention(layer_params, cfg, h, positions_BxT, keys, values, rider))
        y, kvs = _layer(layer_params, cfg, _join(x, x_r), attention)
        return _split(y, B, T), kvs

    carry = (x_BxTxD, None if rider is None else rider.x_1xCxD)
    layers = params["layers"]
    if isinstance(layers, (tuple, list)):  # the "unrolled" layout: one buffer set per layer
        per_layer = []
        for layer in range(start, stop):
            carry, kvs = one_layer(layers[layer], layer, carry)
            per_layer.append(kvs)
        if per_layer:
            k, v, kv_r = jax.tree.map(lambda *a: jnp.stack(a), *per_layer)
        else:
            k = v = jnp.zeros((0, B, T, cfg.num_kv_heads, cfg.head_dim), cache.dtype)
            kv_r = None if rider is None else (jnp.zeros((0,) + rider.x_1xCxD.shape[:2] + (
                cfg.num_kv_heads, cfg.head_dim), cache.dtype),) * 2
    else:
        # The "scan" layout. Index each layer's weights and cache inside the scan: slicing
        # the stacked arrays outside (`w[start:stop]` as scan inputs) makes XLA materialize
        # a copy.
        take = lambda a, layer: jax.lax.dynamic_index_in_dim(a, layer, keepdims=False)
        carry, (k, v, kv_r) = jax.lax.scan(
            lambda c, layer: one_layer(jax.tree.map(lambda w: take(w, layer), layers), layer, c),
            carry, jnp.arange(start, stop))
    (x_BxTxD, x_r), kv = carry, KVBlock(k=k, v=v)
    if rider is None:
        return x_BxTxD, kv
    return x_BxTxD, kv, rider.replace(x_1xCxD=x_r, kv=KVBlock(k=kv_r[0], v=kv_r[1]))


def scan_exits(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array,
               per_exit: Callable[[jax.Array, jax.Array], Any],
               keep_LxB: jax.Array | None = None):
    """Runs every layer over a block (no context), applying `per_exit` to each layer's output.

    Each scan step is the library's `run_layers` for one layer with an empty (capacity 0)
    KV cache and positions 0..T-1, so the block attends to itself causally: the exact
    per-layer math the decoders use. `per_exit(h_BxTxD, layer_index)` gets the 0-based
    layer index (a traced scalar). With `keep_LxB`, layer l is skipped (identity) for the
    sequences where it is False (layer dropout). Returns (layer-L states [B, T, D],
    `per_exit` outputs stacked on a leading [L] axis).
    """
    B, T = tokens_BxT.shape
    positions_BxT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    no_context = KVCache.zeros(cfg, B, 0, num_layers=1)
    if keep_LxB is None:
        keep_LxB = jnp.ones((cfg.num_layers, B), bool)

    def step(x_BxTxD, xs):
        layer_params, index, keep_B = xs
        one_layer = {"layers": jax.tree.map(lambda w: w[None], layer_params)}
        y_BxTxD, _ = run_layers(one_layer, cfg, x_BxTxD, positions_BxT, no_context, 0, 1)
        x_BxTxD = jnp.where(keep_B[:, None, None], y_BxTxD, x_BxTxD)
        return x_BxTxD, per_exit(x_BxTxD, index)

    return jax.lax.scan(step, embed(params, tokens_BxT),
                        (params["layers"], jnp.arange(cfg.num_layers), keep_LxB))


def _unpack(attention_k_v):
    out, k, v = attention_k_v
    return out, (k, v)


def _layer(layer_params, cfg: ModelConfig, x_BxTxD, attention):
    """One pre-norm decoder layer: x + attention(norm(x)), then + MLP(norm(.)).
    `attention(normed x) -> (output [B, T, D], aux)`; returns (x [B, T, D], aux)."""
    with jax.named_scope("attention"):
        h = rms_norm(x_BxTxD, layer_params["attn_norm"], cfg.rms_norm_eps)
        attn, aux = attention(h)
    x_BxTxD = x_BxTxD + attn
    with jax.named_scope("mlp"):
        h = rms_norm(x_BxTxD, layer_params["mlp_norm"], cfg.rms_norm_eps)
        mlp = _mlp(layer_params, cfg, h)
    return x_BxTxD + mlp, aux


def run_layers_cached(params: Params, cfg: ModelConfig, x_BxTxD: jax.Array,
                      positions_BxT: jax.Array, cache: KVCache, start: int, stop: int, *,
                      stop_BxT: jax.Array | None = None, rider: Rider | None = None):
    """Runs layers [start, stop) over a block and writes its keys/values into the cache in
    place, layer by layer (only layers [start, stop) are touched).

    Each layer attends over the cache slots < the block's first position plus the block
    itself (as `run_layers`), then writes the block's new keys/values into its own cache
    slice; padded entries (position S) are dropped. The cache is carried through the layer
    loop, so XLA updates it in place (no per-step copy of the cache or of a padded block).

    Args:
      stop_BxT: optional per-token stop layer (a token runs layer l only if l < its stop;
        beyond it the token's hidden state passes through unchanged and nothing is written
        for it). Lets one pass carry tokens of different exit depths (dynamic-exit
        drafting); None: every token runs every layer in [start, stop).
      rider: a prefill chunk of one sequence that runs the same layers in the same matmuls
        and writes its keys/values into its own row (`Rider`), its states entering layer
        `start`.

    Returns:
      (hidden states leaving layer stop - 1 (or each token's own stop), the updated cache);
      with a rider, a third element: the rider with its layer-`stop` states.
    """
    if not 0 <= start <= stop <= cfg.num_layers:
        raise ValueError(f"layer range [{start}, {stop}) is outside [0, {cfg.num_layers}]")
    if stop > cache.num_layers:
        raise ValueError(f"cache holds {cache.num_layers} layers, layer range needs {stop}")
    if rider is not None and stop_BxT is not None:
        raise ValueError("a rider runs every layer of the pass: no per-token stop layers")
    S = cache.capacity
    B, T, _ = x_BxTxD.shape

    def one_layer(layer_params, layer, x_BxTxD, x_r, cache):
        # On a mesh: split by sequence, whole over "model" between layers (Megatron-style).
        x_BxTxD = sharding.constrain(x_BxTxD, sharding.HIDDEN_AXES)
        write_positions_BxT = positions_BxT
        if stop_BxT is not None:
            runs_BxT = layer < stop_BxT
            write_positions_BxT = jnp.where(runs_BxT, positions_BxT, S)
        attention = lambda h: _cached_attention(layer_params, cfg, h, positions_BxT,
                                                write_positions_BxT, cache, layer, rider)
        if rider is not None:
            y, cache = _layer(layer_params, cfg, _join(x_BxTxD, x_r), attention)
            return *_split(y, B, T), cache
        new_x, cache = _layer(layer_params, cfg, x_BxTxD, attention)
        if stop_BxT is not None:
            new_x = jnp.where(runs_BxT[..., None], new_x, x_BxTxD)
        return new_x, x_r, cache

    carry = (x_BxTxD, None if rider is None else rider.x_1xCxD, cache)
    layers = params["layers"]
    if isinstance(layers, (tuple, list)):  # the "unrolled" layout
        for layer in range(start, stop):
            carry = one_layer(layers[layer], layer, *carry)
    else:
        if cache.per_layer:
            raise ValueError("the scan layer layout needs a stacked cache (KVCache.zeros(..., "
                             "per_layer=False))")
        take = lambda a, layer: jax.lax.dynamic_index_in_dim(a, layer, keepdims=False)

        def step(carry, layer):
            return one_layer(jax.tree.map(lambda w: take(w, layer), layers), layer, *carry), None

        carry, _ = jax.lax.scan(step, carry, jnp.arange(start, stop))
    x_BxTxD, x_r, cache = carry
    if rider is None:
        return x_BxTxD, cache
    return x_BxTxD, cache, rider.replace(x_1xCxD=x_r)
