"""Prefill: run a batch of ragged prompts through a layer range, a chunk of T positions
at a time.

Prompts sit right-padded in the request's token buffer. Token j of sequence b sits at
absolute position j; entries past a prompt get the sentinel position S, so their cache
writes are dropped. The prefill runs chunks of T positions (T: `Shapes.prompt_block`, a
power of two) until the longest prompt is cached, each chunk attending over the cache the
earlier chunks wrote plus itself, as a verification block does:

    tokens       a b c d | e _ _ _        lengths_B = [5, 7], T = 4: two chunks
                 f g h i | j k l _
    positions    0 1 2 3 | 4 S S S
                 0 1 2 3 | 4 5 6 S
                 chunk 0   chunk 1

The trip count is ceil(longest / T), a traced value: for one cache capacity, prompts of
any length share one compilation, and a prompt costs the chunks it fills, not the next
power of two of its length (a 300-token prompt runs 384 positions at T = 128, not 512).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import Params
from hispec_jax.models.transformer import embed, run_layers_cached


def block_positions(start_B: jax.Array, num_valid_B: jax.Array, block_len: int,
                    capacity: int) -> jax.Array:
    """Positions [B, T] of a block starting at `start_B`; entries past `num_valid_B` get S."""
    offsets_T = jnp.arange(block_len)
    positions_BxT = start_B[:, None] + offsets_T[None, :]
    return jnp.where(offsets_T[None, :] < num_valid_B[:, None], positions_BxT, capacity)


def prefill(params: Params, cfg: ModelConfig, tokens_BxS: jax.Array, lengths_B: jax.Array,
            cache: KVCache, stop: int, chunk: int) -> tuple[jax.Array, KVCache]:
    """Caches layers [0, stop) for every prompt position, `chunk` positions at a time.

    Args:
      tokens_BxS: [B, S'] int32, the prompts right-padded (S' >= the longest prompt; the
        request's token buffer).
      lengths_B: [B] int32 prompt lengths (>= 1).
      chunk: T, positions per pass.

    Returns:
      (layer-`stop` hidden states [B, D] at each prompt's last position, updated cache).
    """
    B, T = tokens_BxS.shape[0], chunk
    S = cache.capacity
    # a chunk may run past the buffer's end (its positions there are padding): pad the
    # tokens so the slice is never clamped back onto real positions
    tokens_BxS = jnp.pad(tokens_BxS, ((0, 0), (0, T)))
    last_B = jnp.maximum(lengths_B - 1, 0)
    num_chunks = (jnp.max(lengths_B) + T - 1) // T

    def run_chunk(start, cache):
        """Chunk [start, start + T): (each prompt's last state if it ends here, which
        prompts end here [B], the cache)."""
        tokens_BxT = jax.lax.dynamic_slice_in_dim(tokens_BxS, start, T, axis=1)
        n_B = jnp.clip(lengths_B - start, 0, T)
        positions_BxT = block_positions(jnp.full((B,), start, jnp.int32), n_B, T, S)
        h_BxTxD, cache = run_layers_cached(params, cfg, embed(params, tokens_BxT), positions_BxT,
                                           cache, 0, stop)
        offset_B = jnp.clip(last_B - start, 0, T - 1)
        h_BxD = jnp.take_along_axis(h_BxTxD, offset_B[:, None, None], axis=1)[:, 0]
        return h_BxD, (last_B >= start) & (last_B < start + T), cache

    def later_chunk(i, carry):
        h_BxD, cache = carry
        chunk_h_BxD, here_B, cache = run_chunk(i * T, cache)
        return jnp.where(here_B[:, None], chunk_h_BxD, h_BxD), cache

    h_BxD, _, cache = run_chunk(0, cache)  # most prompts fit one chunk: no loop trip
    return jax.lax.fori_loop(1, num_chunks, later_chunk, (h_BxD, cache))
