"""Acceptance rules: how a verifying level decides which proposed tokens to keep.

A rule sees one verification block of a level (its logits at every block position) and the
tokens proposed for the next positions, and returns how many leading proposals it accepts
plus the token it puts at the first rejected position. Rules are small frozen dataclasses,
testable alone; the engine calls them through `accept`.

    block position j:        0       1       2      ...  n-1
    input token at:          c       c+1     c+2         c+n-1
    level's prediction for:  c+1     c+2     c+3         c+n
    proposed token at:       c+1     c+2     c+3         c+n      (the lower level's tokens)

    accepted = length of the leading run of positions where the rule keeps the proposal
    next     = the level's own token for position c+1+accepted (used only when accepted < n)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A rule's decision for one block, per sequence."""

    num_accepted_B: jax.Array  # [B] int32, 0 <= accepted <= n
    next_token_B: jax.Array  # [B] int32, the replacement at position c + 1 + accepted
    predictions_BxT: jax.Array  # [B, T] int32, the level's own choice at every block position


def leading_run(keep_BxT: jax.Array, num_proposed_B: jax.Array) -> jax.Array:
    """Length of the leading run of True among the first `num_proposed_B` entries."""
    T = keep_BxT.shape[1]
    keep_BxT = keep_BxT & (jnp.arange(T)[None, :] < num_proposed_B[:, None])
    return jnp.sum(jnp.cumprod(keep_BxT.astype(jnp.int32), axis=1), axis=1)


@dataclasses.dataclass(frozen=True)
class GreedyAcceptance:
    """LeadingSubstringVerify (HiSpec Alg. 2): keep proposals equal to the level's argmax.

    Lossless for greedy decoding: every token a level keeps or emits equals its own argmax
    given the prefix, so the top level's output is its autoregressive greedy output.
    """

    def accept(self, logits_BxTxV: jax.Array, proposed_BxT: jax.Array,
               num_proposed_B: jax.Array) -> Verdict:
        predictions_BxT = jnp.argmax(logits_BxTxV, axis=-1).astype(jnp.int32)
        accepted_B = leading_run(predictions_BxT == proposed_BxT, num_proposed_B)
        next_B = jnp.take_along_axis(
            predictions_BxT, jnp.minimum(accepted_B, proposed_BxT.shape[1] - 1)[:, None], axis=1)[:, 0]
        return Verdict(num_accepted_B=accepted_B, next_token_B=next_B, predictions_BxT=predictions_BxT)
