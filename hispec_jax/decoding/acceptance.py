"""Acceptance rules: how a verifying level decides which proposed tokens to keep.

A rule sees one verification block of a level and the tokens proposed for the next
positions, and returns how many leading proposals it accepts plus the token it puts at the
first rejected position. Rules are small frozen dataclasses, testable alone.

    block position j:        0       1       2      ...  n-1
    input token at:          c       c+1     c+2         c+n-1
    level's distribution p:  c+1     c+2     c+3         c+n
    proposed token x at:     c+1     c+2     c+3         c+n      (drawn from the lower
                                                                   level's distribution q)

    accepted = the number of leading proposals kept (0..n)
    next     = the level's replacement at position c+1+accepted (used when accepted < n)

There is no separate bonus token: the block's last proposal is the position whose
prediction would be the bonus, so "all accepted" simply defers it to the next round (the
engine's drafts run one position further instead). This keeps every level's pass a pure
function of positions it has processed.

Sampling rules are written as an exact *outcome distribution* (probability of stopping at
each position, and the replacement distribution there) followed by one draw from it. The
distribution is what the exactness tests enumerate; the draw is what decoding uses.
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
    predictions_BxT: jax.Array  # [B, T] int32, the level's own most likely token per position


@dataclasses.dataclass(frozen=True)
class Outcomes:
    """The exact distribution of a sampling rule's result for one block.

    Attributes:
      stop_probs_BxT: [B, T] P(the first rejected position is j); 0 for j >= n.
      all_prob_B: [B] P(all n proposals accepted).
      residual_logp_BxTxV: [B, T, V] log of the replacement distribution at each j.
    """

    stop_probs_BxT: jax.Array
    all_prob_B: jax.Array
    residual_logp_BxTxV: jax.Array


def leading_run(keep_BxT: jax.Array, num_proposed_B: jax.Array) -> jax.Array:
    """Length of the leading run of True among the first `num_proposed_B` entries."""
    T = keep_BxT.shape[1]
    keep_BxT = keep_BxT & (jnp.arange(T)[None, :] < num_proposed_B[:, None])
    return jnp.sum(jnp.cumprod(keep_BxT.astype(jnp.int32), axis=1), axis=1)


def _at(x_BxT, j_B):
    return jnp.take_along_axis(x_BxT, jnp.minimum(j_B, x_BxT.shape[1] - 1)[:, None], axis=1)[:, 0]


@dataclasses.dataclass(frozen=True)
class GreedyAcceptance:
    """LeadingSubstringVerify (HiSpec Alg. 2): keep proposals equal to the level's argmax.

    Lossless for greedy decoding: every token a level keeps or emits equals its own argmax
    given the prefix, so the top level's output is its autoregressive greedy output.
    """

    needs_proposal_dists = False

    def accept(self, target_BxTxV, proposal_logp_BxTxV, proposed_BxT, num_proposed_B,
               key_Bx2) -> Verdict:
        del proposal_logp_BxTxV, key_Bx2
        predictions_BxT = jnp.argmax(target_BxTxV, axis=-1).astype(jnp.int32)
        accepted_B = leading_run(predictions_BxT == proposed_BxT, num_proposed_B)
        return Verdict(accepted_B, _at(predictions_BxT, accepted_B), predictions_BxT)


def _proposal_logps(target_logp_BxTxV, proposal_logp_BxTxV, proposed_BxT):
    """log p(x_j) and log q(x_j) of the proposed tokens."""
    x = proposed_BxT[..., None]
    logp = jnp.take_along_axis(target_logp_BxTxV, x, axis=-1)[..., 0]
    logq = jnp.take_along_axis(proposal_logp_BxTxV, x, axis=-1)[..., 0]
    return logp, logq


def _log_positive_part(a_BxTxV, b_BxTxV):
    """log(max(0, a - b)) for a, b >= 0 (-inf where a <= b)."""
    diff = a_BxTxV - b_BxTxV
    return jnp.where(diff > 0, jnp.log(jnp.where(diff > 0, diff, 1.0)), -jnp.inf)


@dataclasses.dataclass(frozen=True)
class _SamplingRule:
    """Shared sampling of an `Outcomes` distribution (subclasses define `outcomes`)."""

    needs_proposal_dists = True

    def outcomes(self, target_logp_BxTxV, proposal_logp_BxTxV, proposed_BxT,
                 num_proposed_B) -> Outcomes:
        raise NotImplementedError

    def accept(self, target_logp_BxTxV, proposal_logp_BxTxV, proposed_BxT, num_proposed_B,
               key_Bx2) -> Verdict:
        o = self.outcomes(target_logp_BxTxV, proposal_logp_BxTxV, proposed_BxT, num_proposed_B)
        T = proposed_BxT.shape[1]
        # Category j < T: stop at j; category T: all accepted.
        probs_BxT1 = jnp.concatenate([o.stop_probs_BxT, o.all_prob_B[:, None]], axis=1)
        stop_key, token_key = jax.vmap(lambda k: tuple(jax.random.split(k)))(key_Bx2)
        choice_B = jax.vmap(jax.random.categorical)(stop_key, jnp.log(jnp.maximum(probs_BxT1, 0.0)))
        accepted_B = jnp.where(choice_B == T, num_proposed_B, choice_B)
        residual_BxV = jnp.take_along_axis(
            o.residual_logp_BxTxV, jnp.minimum(accepted_B, T - 1)[:, None, None], axis=1)[:, 0]
        # A zero residual can only be picked when p == q exactly; then sample from p.
        target_BxV = jnp.take_along_axis(
            target_logp_BxTxV, jnp.minimum(accepted_B, T - 1)[:, None, None], axis=1)[:, 0]
        residual_BxV = jnp.where(jnp.any(jnp.isfinite(residual_BxV), axis=-1, keepdims=True),
                                 residual_BxV, target_BxV)
        next_B = jax.vmap(jax.random.categorical)(token_key, residual_BxV).astype(jnp.int32)
        predictions_BxT = jnp.argmax(target_logp_BxTxV, axis=-1).astype(jnp.int32)
        return Verdict(accepted_B.astype(jnp.int32), next_B, predictions_BxT)


@dataclasses.dataclass(frozen=True)
class TokenwiseRejection(_SamplingRule):
    """Speculative sampling per token (HiSpec App. G): accept x_j with probability
    min(1, p_j(x_j) / q_j(x_j)); at the first rejection replace it from
    norm(max(0, p_j - q_j))."""

    def outcomes(self, target_logp_BxTxV, proposal_logp_BxTxV, proposed_BxT, num_proposed_B):
        T = proposed_BxT.shape[1]
        valid_BxT = jnp.arange(T)[None, :] < num_proposed_B[:, None]
        logp, logq = _proposal_logps(target_logp_BxTxV, proposal_logp_BxTxV, proposed_BxT)
        accept_BxT = jnp.where(valid_BxT, jnp.exp(jnp.minimum(logp - logq, 0.0)), 1.0)
        survive_BxT = jnp.cumprod(accept_BxT, axis=1)  # P(x_0..x_j all accepted)
        before_BxT = jnp.concatenate([jnp.ones_like(survive_BxT[:, :1]), survive_BxT[:, :-1]], axis=1)
        stop_BxT = jnp.where(valid_BxT, before_BxT * (1 - accept_BxT), 0.0)
        residual = _log_positive_part(jnp.exp(target_logp_BxTxV), jnp.exp(proposal_logp_BxTxV))
        return Outcomes(stop_BxT, survive_BxT[:, -1], residual)


@dataclasses.dataclass(frozen=True)
class BlockwiseVerification(_SamplingRule):
    """Sequence-level verification with capped prefix ratios (identical in distribution to
    Sun et al. 2024 blockwise verification), in log space.

        R_t = prod_{i<=t} p_i(x_i)/q_i(x_i),  rho_t = R_t / max(1, R_1..R_t),  rho_0 = 1
        w_t = max(0, rho_{t-1} p_t - q_t),  s_t = sum(w_t),  h_t = s_t / (s_t + 1 - rho_{t-1})
        all accepted with probability rho_n; else stop at tau with probability
        h_tau * prod_{t > tau} (1 - h_t) and replace x_tau from w_tau / s_tau.

    `capped=False` is the uncapped variant (rho_t = min(1, R_t)) from the paper's released
    code; it does NOT preserve the target distribution and exists only as the exactness
    tests' negative control.
    """

    capped: bool = True

    def outcomes(self, target_logp_BxTxV, proposal_logp_BxTxV, proposed_BxT, num_proposed_B):
        T = proposed_BxT.shape[1]
        valid_BxT = jnp.arange(T)[None, :] < num_proposed_B[:, None]
        logp, logq = _proposal_logps(target_logp_BxTxV, proposal_logp_BxTxV, proposed_BxT)
        log_r = jnp.where(valid_BxT, logp - logq, 0.0)
        log_R = jnp.cumsum(log_r, axis=1)
        if self.capped:
            log_rho = log_R - jnp.maximum(0.0, jax.lax.cummax(log_R, axis=1))
        else:
            log_rho = jnp.minimum(log_R, 0.0)
        log_rho_prev = jnp.concatenate([jnp.zeros_like(log_rho[:, :1]), log_rho[:, :-1]], axis=1)
        rho_prev_BxT = jnp.exp(log_rho_prev)
        w = jnp.maximum(0.0, rho_prev_BxT[..., None] * jnp.exp(target_logp_BxTxV)
                        - jnp.exp(proposal_logp_BxTxV))
        s_BxT = jnp.sum(w, axis=-1)
        denom = s_BxT + 1 - rho_prev_BxT
        h_BxT = jnp.where(denom > 0, s_BxT / jnp.where(denom > 0, denom, 1.0), 0.0)
        h_BxT = h_BxT.at[:, 0].set(1.0)
        h_BxT = jnp.where(valid_BxT, h_BxT, 0.0)
        # P(tau = t) = h_t * prod_{t < j < n} (1 - h_j), scaled by P(not all accepted).
        keep_after_BxT = jnp.flip(jnp.cumprod(jnp.flip(1 - h_BxT, axis=1), axis=1), axis=1)
        keep_after_BxT = jnp.concatenate([keep_after_BxT[:, 1:], jnp.ones_like(h_BxT[:, :1])], axis=1)
        rho_n_B = jnp.exp(jnp.take_along_axis(
            log_rho, jnp.maximum(num_proposed_B - 1, 0)[:, None], axis=1)[:, 0])
        rho_n_B = jnp.where(num_proposed_B > 0, rho_n_B, 1.0)
        stop_BxT = (1 - rho_n_B)[:, None] * h_BxT * keep_after_BxT
        residual = jnp.where(w > 0, jnp.log(jnp.where(w > 0, w, 1.0)), -jnp.inf)
        return Outcomes(stop_BxT, rho_n_B, residual)


RULES = {"tokenwise": TokenwiseRejection(), "blockwise": BlockwiseVerification()}
