"""Token choice: greedy, or sampling with temperature, top-k and top-p.

`SamplingParams` is the host-side description. Inside compiled loops its numbers travel as
arrays (`SamplingArrays`), so changing temperature, top-k or top-p never recompiles; only
`greedy` (temperature == 0) is static, because it removes the sort from the loop.

`filtered_logprobs` returns the log-distribution a level actually samples from; speculative
verifiers divide by exactly this distribution, so it is the single place where temperature,
top-k and top-p are applied.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from hispec_jax.decoding import options


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to choose tokens.

    Attributes:
      temperature: 0 means greedy (argmax); > 0 samples from softmax(logits / temperature).
      top_k: keep the k most likely tokens (0: no limit).
      top_p: keep the smallest set of most likely tokens with total probability >= top_p
        (1.0: no limit).
      seed: base PRNG seed; each sequence's randomness depends only on the seed, its index
        in the request and the position, never on what else is in the batch.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        options.check_sampling(self.temperature, self.top_k, self.top_p, self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def arrays(self) -> "SamplingArrays":
        return SamplingArrays(
            temperature=jnp.asarray(max(self.temperature, 1e-6), jnp.float32),
            top_k=jnp.asarray(self.top_k, jnp.int32),
            top_p=jnp.asarray(self.top_p, jnp.float32),
        )


@flax.struct.dataclass
class SamplingArrays:
    """The numeric sampling settings as traced arrays (no recompiles when they change):
    scalars [] for the whole batch, or one entry per sequence [B] (serving: every slot has
    its request's settings)."""

    temperature: jax.Array  # [] or [B] float32, > 0
    top_k: jax.Array  # [] or [B] int32, 0 = off
    top_p: jax.Array  # [] or [B] float32, 1 = off


def _per_row(setting, z_xV: jax.Array) -> jax.Array:
    """A setting of shape [] or [B], shaped to broadcast against z [B, ..., V]."""
    return jnp.reshape(setting, setting.shape + (1,) * (z_xV.ndim - setting.ndim))


def filtered_logprobs(logits_xV: jax.Array, s: SamplingArrays) -> jax.Array:
    """Log-probabilities [..., V] after temperature, top-k and top-p (removed tokens: -inf)."""
    z = logits_xV.astype(jnp.float32) / _per_row(s.temperature, logits_xV)
    sorted_desc = -jnp.sort(-z, axis=-1)
    vocab = z.shape[-1]
    # top-k: keep logits >= the k-th largest (ties at the threshold are kept, as in HF).
    k_x1 = jnp.broadcast_to(_per_row(jnp.clip(s.top_k - 1, 0, vocab - 1), z), z.shape[:-1] + (1,))
    kth = jnp.take_along_axis(sorted_desc, k_x1, axis=-1)
    kth = jnp.where(_per_row(s.top_k, z) > 0, kth, -jnp.inf)
    z = jnp.where(z >= kth, z, -jnp.inf)
    sorted_desc = jnp.where(sorted_desc >= kth, sorted_desc, -jnp.inf)
    # top-p: keep a sorted entry while the mass strictly before it is < top_p.
    probs_sorted = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(probs_sorted, axis=-1) - probs_sorted
    kept = (mass_before < _per_row(s.top_p, z)) & jnp.isfinite(sorted_desc)
    threshold = jnp.min(jnp.where(kept, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    z = jnp.where(z >= threshold, z, -jnp.inf)
    return jax.nn.log_softmax(z, axis=-1)


def choose_tokens(logits_BxV: jax.Array, greedy: bool, s: SamplingArrays,
                  keys_Bx2: jax.Array) -> jax.Array:
    """Next tokens [B]: argmax when `greedy` (static), else one sample per row with its key."""
    if greedy:
        return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
    logp_BxV = filtered_logprobs(logits_BxV, s)
    return jax.vmap(jax.random.categorical)(keys_Bx2, logp_BxV).astype(jnp.int32)


def sequence_keys(seed: int, sequence_ids_B) -> jax.Array:
    """One raw PRNG key per sequence, from the seed and the sequence's index in the request."""
    base = jax.random.PRNGKey(seed)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.asarray(sequence_ids_B, jnp.uint32))
