"""Prefill: run a batch of ragged prompts through a layer range, a chunk of T positions
at a time.

Prompts sit right-padded in the request's token buffer. Token j of sequence b sits at
absolute position j; entries past a prompt get the sentinel position S, so their cache
writes are dropped. The prefill runs chunks of T positions (T: `Shapes.prompt_block`, a
power of two) until the longest prompt is cached, each chunk attending over the cache the
earlier chunks wrote plus itself, as a verification block does. What a last full chunk
would leave mostly empty runs instead in small chunks of t = T / 4 positions (at least 16;
`small_chunk`): full chunks while more than 2t positions are left, then at most two small
ones.

    tokens       a b c d e f g h | i j k _          lengths_B = [11, 10], T = 8, t = 2:
                 m n o p q r s t | u v _ _          one full chunk, then two small ones
    positions    0 1 2 3 4 5 6 7 | 8 9 | 10 S
                 0 1 2 3 4 5 6 7 | 8 9 | S  S
                 full chunk 0      small 0, 1

Both trip counts are traced values: for one cache capacity, prompts of any length share one
compilation (two compiled chunk passes: T and t positions; one where t == T), and a
prompt costs the positions it fills rounded up to t (or to T where the rest needs more than
two small chunks), not the next power of two of its length (at T = 128, a 272-token prompt
runs 288 positions, not the 384 of whole chunks or the 512 of one block).
A small chunk reads every weight as a full one does, so on a CPU it costs more per
position: two of them cost less than a full chunk, three about as much, hence `MAX_SMALL`
(what a block of T positions costs on XLA:CPU: docs/layer_layouts.md).

`prefill_chunk` is one chunk at an array start: the serving slots (`decoding/slots.py`) run
a prompt through it chunk by chunk, between the decoding rounds of the other slots.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import Params
from hispec_jax.models.transformer import embed, run_layers_cached

MIN_PROMPT_BLOCK = 16  # T of the shortest prompts (a power of two)
# The longest chunk offline `generate` runs: a long prompt pays for about the positions it
# fills (a 272-token prompt: 288 positions, not the 512 of its power-of-two bucket), and
# prompts of any length above it share one compiled program. (The serving slots run
# shorter ones, `slots.PREFILL_CHUNK`: a chunk between two rounds pauses the other streams.)
PREFILL_CHUNK = 128
SMALL_PARTS = 4  # a small chunk is T / SMALL_PARTS positions ...
MIN_SMALL = 16  # ... and at least this many (or T)
MAX_SMALL = 2  # small chunks end a prompt only when they are this few


def small_chunk(chunk: int) -> int:
    """t, the positions of a small chunk for full chunks of T = `chunk`: T / 4, at least 16
    (t == T for T <= 16: then every chunk is full)."""
    return min(chunk, max(chunk // SMALL_PARTS, MIN_SMALL))


def chunk_counts(longest, chunk: int):
    """(full chunks, small chunks) for a longest prompt of `longest` positions (traced or
    not): full chunks while more than `MAX_SMALL` t positions are left, then
    ceil(rest / t) <= `MAX_SMALL` small ones, fewer positions than a full chunk (none
    when t == T)."""
    small = small_chunk(chunk)
    tail = min(MAX_SMALL, (chunk - 1) // small) * small  # (< T: small chunks run fewer)
    num_full = (jnp.maximum(longest - tail, 0) + chunk - 1) // chunk
    rest = jnp.maximum(longest - num_full * chunk, 0)
    return num_full, (rest + small - 1) // small


def block_positions(start_B: jax.Array, num_valid_B: jax.Array, block_len: int,
                    capacity: int) -> jax.Array:
    """Positions [B, T] of a block starting at `start_B`; entries past `num_valid_B` get S."""
    offsets_T = jnp.arange(block_len)
    positions_BxT = start_B[:, None] + offsets_T[None, :]
    return jnp.where(offsets_T[None, :] < num_valid_B[:, None], positions_BxT, capacity)


def prefill(params: Params, cfg: ModelConfig, tokens_BxS: jax.Array, lengths_B: jax.Array,
            cache: KVCache, stop: int, chunk: int) -> tuple[jax.Array, KVCache]:
    """Caches layers [0, stop) for every prompt position, in full chunks of `chunk`
    positions, then small ones (`chunk_counts`).

    Args:
      tokens_BxS: [B, S'] int32, the prompts right-padded (S' >= the longest prompt; the
        request's token buffer).
      lengths_B: [B] int32 prompt lengths (>= 1).
      chunk: T, positions per full chunk.

    Returns:
      (layer-`stop` hidden states [B, D] at each prompt's last position, updated cache).
    """
    B, T = tokens_BxS.shape[0], chunk
    # a chunk may run past the buffer's end (its positions there are padding): pad the
    # tokens so the slice is never clamped back onto real positions
    tokens_BxS = jnp.pad(tokens_BxS, ((0, 0), (0, T)))

    def run(size, start, h_BxD, cache):
        tokens_BxT = jax.lax.dynamic_slice_in_dim(tokens_BxS, start, size, axis=1)
        chunk_h_BxD, here_B, cache = prefill_chunk(params, cfg, tokens_BxT, start, lengths_B,
                                                   cache, stop)
        return jnp.where(here_B[:, None], chunk_h_BxD, h_BxD), cache

    t = small_chunk(T)
    num_full, num_small = chunk_counts(jnp.max(lengths_B), T)
    carry = (jnp.zeros((B, cfg.hidden_size), params["embed"].dtype), cache)
    carry = jax.lax.fori_loop(0, num_full, lambda i, c: run(T, i * T, *c), carry)
    if t == T:  # no small chunks (num_small is 0): not a second compiled copy of the model
        return carry
    return jax.lax.fori_loop(0, num_small, lambda i, c: run(t, num_full * T + i * t, *c),
                             carry)


def prefill_chunk(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array, start: jax.Array,
                  lengths_B: jax.Array, cache: KVCache,
                  stop: int) -> tuple[jax.Array, jax.Array, KVCache]:
    """Caches layers [0, stop) for positions [start, start + T) of every prompt (`start` a
    traced scalar: one compilation for every chunk of T positions).

    Args:
      tokens_BxT: [B, T] int32, the prompts' tokens at those positions (anything past a
        prompt's end: its positions get the sentinel S and write nothing).
      start: [] int32, the chunk's first position.
      lengths_B: [B] int32 prompt lengths.

    Returns:
      (layer-`stop` hidden states [B, D] at each prompt's last position, valid where
      `here_B`; [B] bool, that last position lies in this chunk; the updated cache).
    """
    B, T = tokens_BxT.shape
    n_B = jnp.clip(lengths_B - start, 0, T)
    positions_BxT = block_positions(jnp.full((B,), start, jnp.int32), n_B, T, cache.capacity)
    h_BxTxD, cache = run_layers_cached(params, cfg, embed(params, tokens_BxT), positions_BxT,
                                       cache, 0, stop)
    last_B = jnp.maximum(lengths_B - 1, 0)
    offset_B = jnp.clip(last_B - start, 0, T - 1)
    h_BxD = jnp.take_along_axis(h_BxTxD, offset_B[:, None, None], axis=1)[:, 0]
    return h_BxD, (last_B >= start) & (last_B < start + T), cache
