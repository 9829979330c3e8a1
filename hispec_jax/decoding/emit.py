"""The output buffer every decoding loop appends to, with per-sequence EOS and budgets.

    tokens_BxS   p p p p g g g _ _ _     p = prompt, g = generated, slot == position
                         ^       ^
                   prompt_len   length

A loop emits a block of tokens per sequence per round (AR: 1; speculative: the accepted
prefix plus the correction or bonus token). `append_block` cuts each block at the first EOS
and at the sequence's `max_new_tokens`, so a sequence never emits past either, and marks
the sequence done; done sequences emit nothing more. The EOS ids are one list for every
sequence ([E]) or a list per sequence ([B, E], -1 padded: the server's slots, where a
request with `ignore_eos` has none). `suppress_eos` keeps a sequence's EOS out of the
top level's logits until it has `min_new_B` new tokens (the server's `min_tokens`).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class Output:
    """Tokens emitted so far.

    Attributes:
      tokens_BxS: [B, S] int32, prompt then generated tokens, by position.
      lengths_B: [B] int32, number of valid tokens (prompt + generated).
      num_new_B: [B] int32, generated tokens.
      done_B: [B] bool, the sequence emitted EOS or reached its budget.
    """

    tokens_BxS: jax.Array
    lengths_B: jax.Array
    num_new_B: jax.Array
    done_B: jax.Array


def start_output(tokens_BxS: jax.Array, prompt_lens_B: jax.Array, max_new_B: jax.Array) -> Output:
    return Output(tokens_BxS=tokens_BxS, lengths_B=prompt_lens_B,
                  num_new_B=jnp.zeros_like(prompt_lens_B), done_B=max_new_B <= 0)


def append_block(out: Output, block_BxM: jax.Array, count_B: jax.Array, eos_ids_E: jax.Array,
                 max_new_B: jax.Array) -> tuple[Output, jax.Array]:
    """Appends the first `count_B` tokens of each block, cut at EOS and at the budget.

    Args:
      block_BxM: candidate tokens, M static.
      count_B: how many of them each sequence emits (0 <= count <= M).
      eos_ids_E: EOS token ids (padded with -1).
      max_new_B: per-sequence `max_new_tokens`.

    Returns:
      (updated output, the number of tokens actually appended per sequence [B]).
    """
    B, M = block_BxM.shape
    count_B = jnp.where(out.done_B, 0, jnp.minimum(count_B, max_new_B - out.num_new_B))
    j_M = jnp.arange(M)
    is_eos_BxM = jnp.any(block_BxM[:, :, None] == _eos_rows(eos_ids_E)[:, None, :], axis=-1)
    is_eos_BxM &= j_M[None, :] < count_B[:, None]
    first_eos_B = jnp.argmax(is_eos_BxM, axis=-1)
    hit_eos_B = jnp.any(is_eos_BxM, axis=-1)
    count_B = jnp.where(hit_eos_B, first_eos_B + 1, count_B)
    S = out.tokens_BxS.shape[1]
    slots_BxM = jnp.where(j_M[None, :] < count_B[:, None], out.lengths_B[:, None] + j_M[None, :], S)
    tokens_BxS = out.tokens_BxS.at[jnp.arange(B)[:, None], slots_BxM].set(block_BxM, mode="drop")
    num_new_B = out.num_new_B + count_B
    done_B = out.done_B | hit_eos_B | (num_new_B >= max_new_B)
    return Output(tokens_BxS, out.lengths_B + count_B, num_new_B, done_B), count_B


def _eos_rows(eos_ids) -> jax.Array:
    """EOS ids [E] (every sequence's) or [B, E] (per sequence) as [1 or B, E]."""
    return eos_ids if eos_ids.ndim == 2 else eos_ids[None, :]


def suppress_eos(logits_BxTxV: jax.Array, eos_ids: jax.Array, new_index_BxT: jax.Array,
                 min_new_B: jax.Array | None) -> jax.Array:
    """`logits_BxTxV` with each sequence's EOS ids at -inf where the token they predict
    would be new token number `new_index_BxT` (0-based) < `min_new_B`: EOS is neither
    drawn nor accepted before a sequence has `min_new_B` new tokens, and every other
    token keeps its logit (vLLM's `min_tokens`). Nothing changes when `min_new_B` is None
    (no loop but the server's slots has it). Only for logits over the whole vocabulary
    (the top level's head: a draft vocabulary's columns are not token ids)."""
    if min_new_B is None:
        return logits_BxTxV
    V = logits_BxTxV.shape[-1]
    is_eos_BxV = jnp.any(jnp.arange(V)[None, None, :] == _eos_rows(eos_ids)[:, :, None], axis=1)
    early_BxT = new_index_BxT < min_new_B[:, None]
    return jnp.where(is_eos_BxV[:, None, :] & early_BxT[:, :, None],
                     jnp.array(-jnp.inf, logits_BxTxV.dtype), logits_BxTxV)
