"""Fixed-shape KV cache with per-sequence positions.

    k, v: [L, B, K, S, H]     S = cache capacity (max_len), slot index == absolute position
                              (or L arrays [B, K, S, H]: `KVCache.per_layer`)

The kv-head axis K sits before the slot axis S so that a layer's slice [B, K, S, H] has the
attention matmuls' batch axes (B, K) outermost: with [B, S, K, H], XLA would relayout (copy)
both the keys and the values of every layer at every decoding step; with [B, K, S, H] the
values are read in place (XLA:CPU still transposes the keys for the score matmul).

Every sequence writes the token at absolute position p into slot p, so sequences of one
batch can sit at different lengths, and rollback after a rejected draft only moves that
sequence's length back: stale slots beyond it are never cleared. They are harmless because
attention is causal by absolute position (a query at position p reads slots <= p) and every
slot <= p is rewritten at every layer before any later query reads that layer.

Padding rows and padded query positions carry the out-of-range sentinel position S; their
writes are dropped (`mode="drop"`).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from hispec_jax.models.config import ModelConfig


@flax.struct.dataclass
class KVBlock:
    """New keys/values of one block for a range of layers: k, v [n_layers, B, T, K, H]."""

    k: jax.Array
    v: jax.Array


@flax.struct.dataclass
class KVCache:
    """Keys and values of every cached layer, in one of two layouts (as the weights):

        stacked     k, v: [L', B, K, S, H]          (the "scan" layer layout)
        per layer   k, v: L' arrays [B, K, S, H]    (the "unrolled" layer layout)

    Per-layer buffers let XLA update each layer in place even inside `lax.cond` branches
    that run several layers, where one stacked buffer would be copied whole.

    Attributes:
      k: keys after RoPE (L' <= L: a cache may hold only the first L' layers).
      v: values.
    """

    k: Any
    v: Any

    @property
    def per_layer(self) -> bool:
        return isinstance(self.k, (tuple, list))

    @property
    def capacity(self) -> int:
        """S: the number of positions each sequence can hold."""
        return self.k[0].shape[2] if self.per_layer else self.k.shape[3]

    @property
    def num_layers(self) -> int:
        return len(self.k) if self.per_layer else self.k.shape[0]

    @property
    def dtype(self):
        return (self.k[0] if self.per_layer else self.k).dtype

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, capacity: int, num_layers: int | None = None,
              dtype=None, per_layer: bool = False) -> "KVCache":
        """An empty cache for `batch` sequences of up to `capacity` positions."""
        num_layers = num_layers or cfg.num_layers
        layer_shape = (batch, cfg.num_kv_heads, capacity, cfg.head_dim)
        dtype = dtype or jnp.dtype(cfg.dtype)
        if per_layer:
            zeros = lambda: tuple(jnp.zeros(layer_shape, dtype) for _ in range(num_layers))
            return cls(k=zeros(), v=zeros())
        return cls(k=jnp.zeros((num_layers,) + layer_shape, dtype),
                   v=jnp.zeros((num_layers,) + layer_shape, dtype))

    def layer_keys(self, layer) -> jax.Array:
        """Keys [B, K, S, H] of one layer (a static int, or a traced index when stacked)."""
        return self._layer(self.k, layer)

    def layer_values(self, layer) -> jax.Array:
        """Values [B, K, S, H] of one layer."""
        return self._layer(self.v, layer)

    def _layer(self, x, layer):
        if self.per_layer:
            return x[layer]
        return jax.lax.dynamic_index_in_dim(x, layer, keepdims=False)

    def write_block(self, start: int, positions_BxT: jax.Array, block: "KVBlock",
                    row: jax.Array | None = None) -> "KVCache":
        """Writes a block's keys/values of layers [start, start + n_layers) (a `KVBlock`,
        as `run_layers` returns it) at their positions (sentinel S is dropped); with `row`,
        a block of one sequence [n_layers, 1, T, K, H] into that batch row."""
        for i in range(block.k.shape[0]):
            self = self.write_layer(start + i, positions_BxT, block.k[i], block.v[i], row)
        return self

    def write_layer(self, layer, positions_BxT: jax.Array, k_BxTxKxH: jax.Array,
                    v_BxTxKxH: jax.Array, row: jax.Array | None = None) -> "KVCache":
        """Writes one layer's block keys/values at their positions (sentinel S is dropped).
        `row` ([] int32): the block is one sequence's (B = 1), written into that batch row
        of the cache; None: row b of the block into row b.

        Only that layer's slots are written: inside a layer loop that carries the cache,
        XLA performs the scatter in place.
        """
        batch_Bx1 = (jnp.arange(positions_BxT.shape[0])[:, None] if row is None
                     else jnp.reshape(row, (1, 1)))
        if self.per_layer:
            # Advanced indices around the K slice: the indexed shape is [B, T, K, H].
            write = lambda x, new: x.at[batch_Bx1, :, positions_BxT].set(new.astype(x.dtype),
                                                                       mode="drop")
            k, v = list(self.k), list(self.v)
            k[layer], v[layer] = write(k[layer], k_BxTxKxH), write(v[layer], v_BxTxKxH)
            return KVCache(k=tuple(k), v=tuple(v))
        write = lambda x, new: x.at[layer, batch_Bx1, :, positions_BxT].set(new.astype(x.dtype),
                                                                          mode="drop")
        return KVCache(k=write(self.k, k_BxTxKxH), v=write(self.v, v_BxTxKxH))
