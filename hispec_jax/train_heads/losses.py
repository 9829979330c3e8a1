"""Distillation loss: KL(final ‖ exit) on temperature-softened distributions (HiSpec App. I).

For a token with final-layer (teacher) logits z and exit (student) logits s, at temperature
T (2.0 in the paper):

    p = softmax(z / T),  q = softmax(s / T),  loss = T² · KL(p ‖ q) = T² · Σ_v p_v (log p_v − log q_v)

averaged over tokens (T² keeps gradient magnitudes comparable across temperatures, as in
Hinton et al.). The loss of a step is the mean over exits.

**Top-k targets** (`Targets` with `ids`): storing p over the whole vocabulary for every
cached token is ~V floats per token (150k for Qwen3), so the feature cache keeps the
teacher's k most likely tokens (`ids`, `log_probs` = log p at those ids, at temperature T)
and the log of the remaining "tail" mass, `tail_log_prob = log(1 − Σ_topk p)` (computed
from the full logits, not by subtraction). The loss is then the KL between the two
distributions coarse-grained onto k + 1 outcomes — the k tokens and one tail bucket:

    KL_k = Σ_{i∈topk} p_i (log p_i − log q_i) + p_tail (log p_tail − log q_tail)

where q_tail is the student's mass outside the teacher's top k. KL_k ≤ KL (coarse-graining
never increases KL); the gap is p_tail · KL(p|tail ‖ q|tail), i.e. only how the student
distributes the tail mass *within* the tail is not supervised. With k = V it is exact.
`Targets` without `ids` hold full-vocabulary log p (exact KL).

Shapes: B batch, T tokens, V vocab, K top-k.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class Targets:
    """Teacher (final-layer) distributions at temperature T.

    Attributes:
      log_probs: [B, T, K] log p of the top-k tokens, sorted descending (top-k targets),
        or [B, T, V] log p over the vocabulary (full targets, `ids` is None).
      ids: [B, T, K] int32 token ids of `log_probs`, or None for full targets.
      tail_log_prob: [B, T] log of the probability outside the top k (-inf when K = V),
        or None for full targets.
    """

    log_probs: jax.Array
    ids: jax.Array | None = None
    tail_log_prob: jax.Array | None = None

    @property
    def top1(self) -> jax.Array:
        """[B, T] the teacher's greedy token."""
        if self.ids is None:
            return jnp.argmax(self.log_probs, axis=-1).astype(jnp.int32)
        return self.ids[..., 0]


def make_targets(final_logits_BxTxV: jax.Array, temperature: float, top_k: int) -> Targets:
    """Targets from the final layer's logits; `top_k` = 0: full-vocabulary targets."""
    log_p = jax.nn.log_softmax(final_logits_BxTxV.astype(jnp.float32) / temperature, axis=-1)
    if top_k == 0:
        return Targets(log_probs=log_p)
    V = log_p.shape[-1]
    top_log_p, ids = jax.lax.top_k(log_p, min(top_k, V))
    ids = ids.astype(jnp.int32)
    if top_k >= V:
        tail = jnp.full(log_p.shape[:-1], -jnp.inf, jnp.float32)
    else:
        tail = jax.nn.logsumexp(jnp.where(_topk_mask(ids, V), -jnp.inf, log_p), axis=-1)
    return Targets(log_probs=top_log_p, ids=ids, tail_log_prob=tail)


def _topk_mask(ids_BxTxK: jax.Array, vocab_size: int) -> jax.Array:
    """[B, T, V] True at the ids (a scatter: no [B, T, K, V] one-hot)."""
    B, T, _ = ids_BxTxK.shape
    mask = jnp.zeros((B, T, vocab_size), bool)
    return mask.at[jnp.arange(B)[:, None, None], jnp.arange(T)[None, :, None], ids_BxTxK].set(True)


def kl_per_token(targets: Targets, student_logits_BxTxV: jax.Array,
                 temperature: float) -> jax.Array:
    """[B, T] KL(p ‖ q) at temperature T (unscaled); KL_k for top-k targets (module doc)."""
    log_q = jax.nn.log_softmax(student_logits_BxTxV.astype(jnp.float32) / temperature, axis=-1)
    if targets.ids is None:
        return jnp.sum(jnp.exp(targets.log_probs) * (targets.log_probs - log_q), axis=-1)
    V = log_q.shape[-1]
    log_q_top = jnp.take_along_axis(log_q, targets.ids, axis=-1)
    kl = jnp.sum(jnp.exp(targets.log_probs) * (targets.log_probs - log_q_top), axis=-1)
    if targets.ids.shape[-1] < V:  # static: with K = V there is no tail bucket
        log_q_tail = jax.nn.logsumexp(jnp.where(_topk_mask(targets.ids, V), -jnp.inf, log_q),
                                      axis=-1)
        p_tail = jnp.exp(targets.tail_log_prob)
        # A teacher tail of exactly 0 contributes 0 (and no NaN from 0 · -inf).
        safe_tail = jnp.where(p_tail > 0, targets.tail_log_prob, 0.0)
        kl = kl + jnp.where(p_tail > 0, p_tail * (safe_tail - log_q_tail), 0.0)
    return kl


def distill_loss(targets: Targets, student_logits_BxTxV: jax.Array, temperature: float,
                 mask_BxT: jax.Array | None = None) -> jax.Array:
    """T² · KL(final ‖ exit), averaged over (unmasked) tokens: a scalar."""
    kl = kl_per_token(targets, student_logits_BxTxV, temperature)
    return temperature**2 * _mean(kl, mask_BxT)


def hard_loss(targets: Targets, student_logits_BxTxV: jax.Array,
              mask_BxT: jax.Array | None = None) -> jax.Array:
    """Cross-entropy of the exit (temperature 1) against the final layer's greedy token,
    averaged over (unmasked) tokens: hard distillation, the objective greedy acceptance
    scores (the exit's argmax must be the final layer's), where KL also matches the rest of
    the distribution."""
    log_q = jax.nn.log_softmax(student_logits_BxTxV.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(log_q, targets.top1[..., None], axis=-1)[..., 0]
    return _mean(nll, mask_BxT)


def top1_agreement(targets: Targets, student_logits_BxTxV: jax.Array,
                   mask_BxT: jax.Array | None = None) -> jax.Array:
    """Fraction of tokens where the exit's greedy token is the final layer's (acceptance rate)."""
    agree = jnp.argmax(student_logits_BxTxV, axis=-1).astype(jnp.int32) == targets.top1
    return _mean(agree.astype(jnp.float32), mask_BxT)


def _mean(x_BxT: jax.Array, mask_BxT: jax.Array | None) -> jax.Array:
    if mask_BxT is None:
        return jnp.mean(x_BxT)
    mask = mask_BxT.astype(jnp.float32)
    return jnp.sum(x_BxT * mask) / jnp.maximum(jnp.sum(mask), 1.0)
