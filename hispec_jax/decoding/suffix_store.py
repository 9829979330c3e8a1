"""Drafts from earlier requests: a store of their tokens that the compiled lookup searches
beside the sequence's own context (docs/lookup.md, "Drafts from earlier requests").

SuffixDecoding (Oliveira et al., "SuffixDecoding: Extreme Speculative Decoding for
Emerging AI Applications", arXiv 2411.04975) drafts from a suffix tree over earlier
outputs on the host. Here the earlier tokens stay on the device as one fixed-shape buffer,
and the round searches it as prompt lookup searches the sequence (`lookup.py`): the same
vectorised comparisons, over R positions instead of S. No host round trip, and a new
buffer of the same shape never recompiles.

    store tokens_R   | p p p a b c d e | p p a b c x y | a b c x z | ...   (oldest first)
                     entry: the prompt's last tokens, the output, then SENTINEL (|)
    scope_R          | 0 0 0 0 0 0 0 0 | 1 1 1 1 1 1 1 | 1 1 1 1 1 | ...   (tenant of each)
    sequence         ... q r a b c ?                    suffix (a, b, c), n = 3
    match            the longest suffix that occurs in the store within the sequence's
                     scope, followed by a token; of its (up to 16 most recent)
                     occurrences, the most frequent continuation: scope 1's x (2 votes),
                     then z (a tie, the newer) -- up to k, never past an entry's SENTINEL

The sentinel (-1) equals no token, so no match crosses two entries; a sequence whose scope
is `NO_SCOPE` (a request that opted out) never matches. The match's n is the confidence
the acceptance gate buckets by, in buckets of its own (`LookupDrafter.bucket`: a store
match's N + n, apart from an own match's n), and the round uses the store's proposal where
it is worth more than the sequence's own at those buckets' estimates
(`LookupDrafter.worth_more`, `gate.proposal_value`; `prefer`): a store match that holds
less often than the sequence's own no longer displaces it for being longer.

`SuffixStore` is the host side, one per server process: finished requests' tokens enter a
ring of R tokens (the oldest evicted), and `arrays()` hands the engine a new device copy.
It lives in memory only.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Hashable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.decoding import lookup as lookup_lib
from hispec_jax.decoding.options import MAX_STORE_TOKENS

SENTINEL = -1  # separates entries; equals no token
NO_SCOPE = -1  # a sequence with this scope drafts nothing from the store
DEFAULT_STORE_TOKENS = 16384  # R
MIN_STORE_NGRAM = 2  # a store match of fewer suffix tokens is not used (a 1-gram is noise)
STORE_CANDIDATES = 16  # M: the most recent occurrences the most frequent continuation counts


@flax.struct.dataclass
class StoreArrays:
    """The store as the compiled round reads it (`Request.store`).

    Attributes:
      tokens_R: [R] int32, earlier requests' tokens, oldest first, entries separated by
        `SENTINEL` (free positions hold it too).
      scope_R: [R] int32, the scope (tenant) each token belongs to; `NO_SCOPE` at free
        positions.
      scope_B: [B] int32, each sequence's scope: it matches only tokens of its own
        (`NO_SCOPE`: none).
    """

    tokens_R: jax.Array
    scope_R: jax.Array
    scope_B: jax.Array


def empty_arrays(size: int, batch: int) -> StoreArrays:
    """An empty store of `size` tokens for a batch of `batch` sequences (no scope)."""
    return StoreArrays(tokens_R=jnp.full((size,), SENTINEL, jnp.int32),
                       scope_R=jnp.full((size,), NO_SCOPE, jnp.int32),
                       scope_B=jnp.full((batch,), NO_SCOPE, jnp.int32))


def propose(lookup: lookup_lib.PromptLookup, store: StoreArrays, tokens_BxS: jax.Array,
            newest_B: jax.Array, limit_B: jax.Array) -> lookup_lib.Proposal:
    """Each sequence's proposal from the store: the longest suffix of its context (n =
    `MIN_STORE_NGRAM` .. `lookup.max_ngram`) that occurs in the store within its scope and
    is followed there by a token, and the most frequent continuation of its occurrences
    (`most_frequent_continuation`, over the `STORE_CANDIDATES` most recent). Proposes up
    to `limit_B` and the schedule's share for n (`PromptLookup.ngram_tokens`) tokens, never
    past an entry's end. No match: `matched_B` False (the caller keeps its own proposal).

    Args:
      lookup: the drafter's settings (k, N, schedule).
      store: the store (`StoreArrays`).
      tokens_BxS: [B, S] int32, the sequences' token buffers.
      newest_B: [B] int32, c: each sequence's newest position.
      limit_B: [B] int32 >= 1, the most tokens to propose.
    """
    B = tokens_BxS.shape[0]
    R = store.tokens_R.shape[0]
    N, k = lookup.max_ngram, lookup.max_tokens
    j_R = jnp.arange(R, dtype=jnp.int32)
    batch_B = jnp.arange(B)
    # a match may end at j only where a token of the same entry follows it
    follows_R = jnp.pad(store.tokens_R[1:], (0, 1), constant_values=SENTINEL) != SENTINEL
    usable_BxR = ((store.scope_R[None, :] == store.scope_B[:, None])
                  & (store.scope_B[:, None] != NO_SCOPE) & follows_R[None, :])
    # n_BxR: how many of the sequence's last tokens (up to N) end at j, from a running AND
    # over the shifts; the longest n is one max over [B, R]
    match_BxR = usable_BxR
    n_BxR = jnp.zeros((B, R), jnp.int32)
    for i in range(N):
        suffix_B = tokens_BxS[batch_B, jnp.maximum(newest_B - i, 0)]
        shifted_R = jnp.pad(store.tokens_R, (i, 0), constant_values=SENTINEL)[:R]
        match_BxR &= (shifted_R[None, :] == suffix_B[:, None]) & (newest_B[:, None] >= i)
        n_BxR += match_BxR
    ngram_B = jnp.max(n_BxR, axis=1)
    ngram_B = jnp.where(ngram_B >= MIN_STORE_NGRAM, ngram_B, 0).astype(jnp.int32)
    matched_B = ngram_B > 0
    # the M most recent ends of the longest match (the store is oldest first); -1: none.
    # approx_max_k: a sort on CPU and GPU (exact, and 10x faster there than lax.top_k over
    # R = 16384), TPU's approximate top-k (recall 0.95) there: a missed occurrence changes
    # what is proposed, never what is output. Ends below 2^24 are exact in float32.
    M = min(STORE_CANDIDATES, R)
    key_BxR = jnp.where(matched_B[:, None] & (n_BxR == ngram_B[:, None]), j_R[None, :], -1)
    ends_BxM = jax.lax.approx_max_k(key_BxR.astype(jnp.float32), M)[0].astype(jnp.int32)
    tokens_BxK, run_B = most_frequent_continuation(store.tokens_R, ends_BxM, k)
    limit_B = jnp.minimum(limit_B, lookup.ngram_tokens(ngram_B))
    length_B = jnp.clip(jnp.minimum(run_B, limit_B), 1, k).astype(jnp.int32)
    return lookup_lib.Proposal(tokens_BxK=tokens_BxK, length_B=length_B,
                               matched_B=matched_B, ngram_B=ngram_B)


def most_frequent_continuation(tokens_R: jax.Array, ends_BxM: jax.Array,
                               k: int) -> tuple[jax.Array, jax.Array]:
    """SuffixDecoding's greedy walk down a suffix tree's counts, over M occurrences of the
    matched suffix: at each depth t the token that most of the occurrences still on the
    walk continue with (ties: the most recent occurrence's), which keeps only those.

        occurrence (newest first)   t = 0  1  2
        ends_BxM[0]                     x  y  |        depth 0: x 3 votes, u 1 -> x
        ends_BxM[1]                     x  z  w        depth 1: y 1, z 2 -> z (on: 1, 3)
        ends_BxM[2]                     u  v  w        depth 2: w 1, q 1 -> w (the newer)
        ends_BxM[3]                     x  z  q        proposal x z w, run 3

    The walk stops where no occurrence on it has a next token before its entry's
    `SENTINEL` (or the store's end). With every occurrence's continuation distinct it is
    the most recent occurrence's continuation.

    Args:
      tokens_R: [R] int32, the store's tokens.
      ends_BxM: [B, M] int32, each sequence's occurrences' end positions, most recent
        first; -1: none.
      k: the most tokens to walk.

    Returns:
      tokens_BxK: [B, k] int32, the walk's tokens (0 past its run).
      run_B: [B] int32, how many tokens it walked (0: no occurrence).
    """
    R = tokens_R.shape[0]
    at_BxMxK = ends_BxM[:, :, None] + 1 + jnp.arange(k)[None, None, :]
    next_BxMxK = jnp.where((ends_BxM[:, :, None] >= 0) & (at_BxMxK < R),
                           tokens_R[jnp.clip(at_BxMxK, 0, R - 1)], SENTINEL)
    # an occurrence's continuation: its tokens up to its entry's SENTINEL
    inside_BxMxK = jnp.cumprod(next_BxMxK != SENTINEL, axis=2).astype(bool)

    def depth(on_BxM, t):
        next_BxM, inside_BxM = next_BxMxK[:, :, t], inside_BxMxK[:, :, t]
        voter_BxM = on_BxM & inside_BxM
        votes_BxM = jnp.sum((next_BxM[:, :, None] == next_BxM[:, None, :])
                            & voter_BxM[:, None, :], axis=2)
        best_B = jnp.argmax(jnp.where(voter_BxM, votes_BxM, -1), axis=1)  # first: newest
        token_B = jnp.take_along_axis(next_BxM, best_B[:, None], axis=1)[:, 0]
        walked_B = jnp.any(voter_BxM, axis=1)
        return voter_BxM & (next_BxM == token_B[:, None]), (jnp.maximum(token_B, 0), walked_B)

    _, (tokens_KxB, walked_KxB) = jax.lax.scan(depth, ends_BxM >= 0, jnp.arange(k))
    run_B = jnp.sum(jnp.cumprod(walked_KxB, axis=0), axis=0).astype(jnp.int32)
    return tokens_KxB.T, run_B


def prefer(own: lookup_lib.Proposal, earlier: lookup_lib.Proposal,
           use_B: jax.Array) -> tuple[lookup_lib.Proposal, jax.Array]:
    """Per sequence, the store's proposal where `use_B` (and it matched), else the own
    context's. Returns (the proposal, [B] bool: it came from the store)."""
    use_B = use_B & earlier.matched_B
    pick = lambda a, b: jnp.where(use_B.reshape(use_B.shape + (1,) * (a.ndim - 1)), b, a)
    return lookup_lib.Proposal(**{f.name: pick(getattr(own, f.name), getattr(earlier, f.name))
                                  for f in dataclasses.fields(own)}), use_B


class SuffixStore:
    """The host side of the store: a ring of `size` tokens of finished requests (each
    entry the last `prompt_tail` prompt tokens, the output, and a `SENTINEL`), the oldest
    evicted first, each token tagged with its request's scope. One per server process, in
    memory only; thread-safe. `arrays(batch)`, a new device copy, changes only when a
    request was added (`version`).

    Scopes: `scope_of(tenant)` maps a tenant (the server's: the request's API key digest
    and `user` field) to a small integer; a sequence drafts only from entries of its own
    scope.
    """

    def __init__(self, size: int = DEFAULT_STORE_TOKENS, prompt_tail: int = 8):
        if not isinstance(size, int) or not 2 <= size <= MAX_STORE_TOKENS:
            raise ValueError(f"the store holds 2 to {MAX_STORE_TOKENS} tokens, got {size!r}")
        self.size, self.prompt_tail = size, prompt_tail
        self._tokens = np.full((size,), SENTINEL, np.int32)
        self._scope = np.full((size,), NO_SCOPE, np.int32)
        self._cursor = 0  # the next position to write (the oldest token)
        self._scopes: dict[str | None, int] = {}
        self._lock = threading.Lock()
        self.version = 0  # requests added
        self.tokens_added = 0

    def scope_of(self, tenant: Hashable) -> int:
        """The scope of requests of this `tenant` (the server's: API key digest and `user`
        field; None for requests that name neither)."""
        with self._lock:
            return self._scopes.setdefault(tenant, len(self._scopes))

    def add(self, scope: int, prompt_ids, output_ids) -> None:
        """A finished request's tokens: the last `prompt_tail` of its prompt, then its
        output (an output longer than the store keeps its end)."""
        if scope == NO_SCOPE or not len(output_ids):
            return
        tail = list(prompt_ids)[-self.prompt_tail:] if self.prompt_tail else []
        entry = np.asarray(tail + list(output_ids) + [SENTINEL], np.int32)[-self.size:]
        with self._lock:
            at = (self._cursor + np.arange(len(entry))) % self.size
            self._tokens[at], self._scope[at] = entry, scope
            self._scope[at[-1]] = NO_SCOPE
            self._cursor = int((self._cursor + len(entry)) % self.size)
            self.version += 1
            self.tokens_added += len(entry) - 1

    def host_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, scopes) oldest first."""
        with self._lock:
            return (np.roll(self._tokens, -self._cursor), np.roll(self._scope, -self._cursor))

    def describe(self) -> dict:
        """For /health: its size and what it holds (no tokens)."""
        with self._lock:
            return {"tokens": self.size, "requests_added": self.version,
                    "tokens_added": self.tokens_added, "scopes": len(self._scopes)}
