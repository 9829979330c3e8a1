"""Prompt-lookup (n-gram) drafting: a drafter that runs no layer (docs/algorithms.md).

With the sequence so far x_0..x_c (prompt, output, and tokens the levels above have
tentatively accepted), take its last n tokens (n = max_ngram down to 1), find their most
recent earlier occurrence ending at position j < c, and propose x_{j+1}..x_{j+m} at the
positions c+1..c+m, m = min(k, c - j): the copy stops at the newest token.

    positions      0 1 2 3 4 5 6 7 8 9 10        n = 2, k = 3
    tokens         a b c d e f g a b ? ?         suffix (a, b) = x_7 x_8, c = 8
    occurrence       ^^^ j = 1                   most recent earlier end: j = 1
    proposal                         c d e       x_2 x_3 x_4 at positions 9, 10, 11

Everything is a few integer ops on the token buffer, inside the compiled loop: one
comparison of the buffer with each suffix token, shifted (N x [B, S]), a running AND over
n, and a max over positions. Shapes are fixed: the proposal is a [B, k] block with a
per-sequence length.

No match (not even the newest token occurred before) leaves the verifier nothing to check,
yet its pass over the newest token must still run (it is an AR step). The drafter then
proposes one placeholder token, the newest token repeated: the verifier's pass is exactly
the AR step (one position), and the placeholder is accepted only where it is the
verifier's own choice (greedy), or with probability p(x) (sampling). Any deterministic
proposal (q one-hot, `one_hot_logq`) keeps the output exact under token-wise rejection and
blockwise verification: docs/algorithms.md "Acceptance rules". The counters count only real matches.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hispec_jax.decoding.options import (DEFAULT_LOOKUP, DEFAULT_MAX_NGRAM, MAX_LOOKUP,
                                         MAX_NGRAM)


NGRAM_FULL = 5  # a match of this many tokens or more proposes all k (`ngram_tokens`)


@dataclasses.dataclass(frozen=True)
class Proposal:
    """A lookup's result for one round.

    Attributes:
      tokens_BxK: [B, k] int32, the proposed tokens for positions c+1..c+k (valid up to
        `length_B`).
      length_B: [B] int32, tokens proposed: the match's length (>= 1), or 1 for the
        placeholder when there is no match.
      matched_B: [B] bool, a real match (False: the placeholder).
      ngram_B: [B] int32, the n of the match (0: none).
    """

    tokens_BxK: jax.Array
    length_B: jax.Array
    matched_B: jax.Array
    ngram_B: jax.Array


@dataclasses.dataclass(frozen=True)
class PromptLookup:
    """The lookup drafter's static settings (part of the compile key).

    The most tokens a match proposes grows with its n (`ngram_tokens`): the longer the
    suffix that matched, the likelier its continuation holds. A match of `NGRAM_FULL` (or
    `max_ngram`, if fewer) tokens or more proposes all k, a shorter one k / 2, a 1-gram
    k / 4 (at the defaults, k = 16 and 8-grams: 16 / 8 / 4 tokens). A proposal of m tokens
    costs a pass over m positions, dearer than the one-position pass (the AR step) by what
    the host's pass costs say (`gate.PassCost`, docs/lookup.md). (Schedules that moved k
    between rounds, "fixed", "probe" and "halving", were A/B variants none adopted: in git
    at commit 5ede6bf.)

    Attributes:
      max_tokens: k_max, the static bound of tokens one lookup proposes (its block).
      max_ngram: N, the longest suffix matched (n = N down to 1).
      gate: the acceptance gate (`gate.py`, on by default): within `ngram_tokens`' limit,
        each round proposes only as many tokens as the sequence's estimated acceptance for
        matches of this n pays for at this device's pass costs and the batch's size, down
        to 1 token (an AR step). Off: `ngram_tokens`' limit, every round.
    """

    max_tokens: int = DEFAULT_LOOKUP
    max_ngram: int = DEFAULT_MAX_NGRAM
    gate: bool = True

    def ngram_tokens(self, ngram_B):
        """The most tokens a match of `ngram_B` (>= 1) suffix tokens may propose: a full
        match, n >= min(`NGRAM_FULL`, max_ngram), proposes k; a shorter one k / 2, or k / 4
        when n = 1 (each at least 1). `ngram_B` an int array, or a Python int (the planner's
        replay)."""
        k = self.max_tokens
        full = min(NGRAM_FULL, self.max_ngram)
        quarter, half = max(k // 4, 1), max(k // 2, 1)
        return ((ngram_B >= full) * k + ((ngram_B < full) & (ngram_B < 2)) * quarter
                + ((ngram_B < full) & (ngram_B >= 2)) * half)

    def __post_init__(self):
        if not 1 <= self.max_tokens <= MAX_LOOKUP:
            raise ValueError(f"lookup={self.max_tokens} is outside [1, {MAX_LOOKUP}]")
        if not 1 <= self.max_ngram <= MAX_NGRAM:
            raise ValueError(f"max_ngram={self.max_ngram} is outside [1, {MAX_NGRAM}]")

    def propose(self, tokens_BxS: jax.Array, newest_B: jax.Array, limit_B: jax.Array) -> Proposal:
        """The n-gram proposal of every sequence.

        Args:
          tokens_BxS: [B, S] int32 token buffer (slot == position); positions <= newest_B
            are the context, later slots are ignored.
          newest_B: [B] int32, c: the newest token's position.
          limit_B: [B] int32 >= 1, the most tokens to propose per sequence (<= max_tokens);
            a match proposes at most `ngram_tokens` of its n too.
        """
        B, S = tokens_BxS.shape
        N, k = self.max_ngram, self.max_tokens
        j_S = jnp.arange(S)
        batch_B = jnp.arange(B)
        # match_S[j] (for n = i + 1): x_{j-i'} == x_{c-i'} for every i' <= i, i.e. the last
        # n tokens occur ending at j.
        match_BxS = jnp.ones((B, S), bool)
        best_end_B = jnp.full((B,), -1, jnp.int32)
        ngram_B = jnp.zeros((B,), jnp.int32)
        for i in range(N):
            suffix_B = tokens_BxS[batch_B, jnp.maximum(newest_B - i, 0)]
            shifted_BxS = jnp.pad(tokens_BxS, ((0, 0), (i, 0)), constant_values=-1)[:, :S]
            match_BxS &= shifted_BxS == suffix_B[:, None]
            # an earlier occurrence (ends before c) that lies inside the sequence (j >= i),
            # of a suffix the sequence has (c >= i)
            ok_BxS = (match_BxS & (j_S[None, :] < newest_B[:, None]) & (j_S[None, :] >= i)
                      & (newest_B[:, None] >= i))
            end_B = jnp.max(jnp.where(ok_BxS, j_S[None, :], -1), axis=1).astype(jnp.int32)
            found_B = end_B >= 0  # a longer n that matches overrides a shorter one
            best_end_B = jnp.where(found_B, end_B, best_end_B)
            ngram_B = jnp.where(found_B, i + 1, ngram_B)
        matched_B = best_end_B >= 0
        limit_B = jnp.minimum(limit_B, self.ngram_tokens(ngram_B))
        length_B = jnp.where(matched_B, jnp.minimum(newest_B - best_end_B, limit_B), 1)
        length_B = jnp.clip(length_B, 1, k).astype(jnp.int32)
        start_B = jnp.where(matched_B, best_end_B + 1, newest_B)  # placeholder: x_c again
        tokens_BxK = jnp.take_along_axis(
            tokens_BxS, jnp.clip(start_B[:, None] + jnp.arange(k)[None, :], 0, S - 1), axis=1)
        return Proposal(tokens_BxK=tokens_BxK, length_B=length_B, matched_B=matched_B,
                        ngram_B=ngram_B)


def one_hot_logq(proposed_BxT: jax.Array, vocab_size: int) -> jax.Array:
    """log q [B, T, V] of a deterministic proposal: 0 at the proposed token, -inf elsewhere
    (what the sampling rules divide by: accept x with probability min(1, p(x) / 1))."""
    hit_BxTxV = proposed_BxT[..., None] == jnp.arange(vocab_size)[None, None, :]
    return jnp.where(hit_BxTxV, 0.0, -jnp.inf).astype(jnp.float32)
