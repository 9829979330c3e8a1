"""Fixed-shape KV cache with per-sequence positions.

    k, v: [L, B, K, S, H]     S = cache capacity (max_len), slot index == absolute position

The kv-head axis K sits before the slot axis S so that a layer's slice [B, K, S, H] has the
attention matmuls' batch axes (B, K) outermost. With [B, S, K, H] XLA relaid out (copied)
both the keys and the values of every layer at every decoding step; now the values are
read in place (XLA:CPU still transposes the keys for the score matmul).

Every sequence writes the token at absolute position p into slot p, so sequences of one
batch can sit at different lengths, and rollback after a rejected draft only moves that
sequence's length back: stale slots beyond it are never cleared. They are harmless because
attention is causal by absolute position (a query at position p reads slots <= p) and every
slot <= p is rewritten at every layer before any later query reads that layer.

Padding rows and padded query positions carry the out-of-range sentinel position S; their
writes are dropped (`mode="drop"`).
"""

from __future__ import annotations

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
    """Keys and values of every cached layer.

    Attributes:
      k: [L', B, K, S, H] keys after RoPE (L' <= L: a cache may hold only the first L' layers).
      v: [L', B, K, S, H] values.
    """

    k: jax.Array
    v: jax.Array

    @property
    def capacity(self) -> int:
        """S: the number of positions each sequence can hold."""
        return self.k.shape[3]

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @classmethod
    def zeros(cls, cfg: ModelConfig, batch: int, capacity: int, num_layers: int | None = None,
              dtype=None) -> "KVCache":
        """An empty cache for `batch` sequences of up to `capacity` positions."""
        shape = (num_layers or cfg.num_layers, batch, cfg.num_kv_heads, capacity, cfg.head_dim)
        dtype = dtype or jnp.dtype(cfg.dtype)
        return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))

    def write_block(self, start: int, positions_BxT: jax.Array, block: "KVBlock") -> "KVCache":
        """Writes a block's keys/values for layers [start, start + n); sentinel S is dropped."""
        n = block.k.shape[0]
        layer_Lx1x1 = jnp.arange(start, start + n)[:, None, None]
        batch_1xBx1 = jnp.arange(positions_BxT.shape[0])[None, :, None]
        pos_1xBxT = positions_BxT[None]
        # Advanced indices around the K slice: the indexed shape is [n, B, T, K, H], the block's.
        k = self.k.at[layer_Lx1x1, batch_1xBx1, :, pos_1xBxT].set(block.k.astype(self.k.dtype), mode="drop")
        v = self.v.at[layer_Lx1x1, batch_1xBx1, :, pos_1xBxT].set(block.v.astype(self.v.dtype), mode="drop")
        return KVCache(k=k, v=v)

    def write_all_layers(self, positions_LxBxT: jax.Array, block: "KVBlock") -> "KVCache":
        """Writes a block covering every cached layer, with per-layer positions (S: skip)."""
        L, B, _ = positions_LxBxT.shape
        layer_Lx1x1 = jnp.arange(L)[:, None, None]
        batch_1xBx1 = jnp.arange(B)[None, :, None]
        k = self.k.at[layer_Lx1x1, batch_1xBx1, :, positions_LxBxT].set(block.k.astype(self.k.dtype), mode="drop")
        v = self.v.at[layer_Lx1x1, batch_1xBx1, :, positions_LxBxT].set(block.v.astype(self.v.dtype), mode="drop")
        return KVCache(k=k, v=v)
