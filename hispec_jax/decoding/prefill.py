"""Prefill: run a batch of ragged prompts through a layer range in one parallel pass.

Prompts are right-padded into a fixed block of T tokens (T is a length bucket, so prompts
of different lengths share one compilation). Token j of sequence b sits at absolute
position j; padded entries get the sentinel position S, so their cache writes are dropped:

    tokens_BxT   a b c d _ _ _ _        lengths_B = [4, 6]
                 e f g h i j _ _
    positions    0 1 2 3 S S S S
                 0 1 2 3 4 5 S S
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


def prefill(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array, lengths_B: jax.Array,
            cache: KVCache, stop: int) -> tuple[jax.Array, KVCache]:
    """Caches layers [0, stop) for every prompt position.

    Returns:
      (layer-`stop` hidden states [B, D] at each prompt's last position, updated cache).
    """
    B, T = tokens_BxT.shape
    positions_BxT = block_positions(jnp.zeros((B,), jnp.int32), lengths_B, T, cache.capacity)
    h_BxTxD, cache = run_layers_cached(params, cfg, embed(params, tokens_BxT), positions_BxT, cache, 0, stop)
    last_B = jnp.maximum(lengths_B - 1, 0)
    h_BxD = jnp.take_along_axis(h_BxTxD, last_B[:, None, None], axis=1)[:, 0]
    return h_BxD, cache
