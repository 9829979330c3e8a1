"""The hierarchical speculative decoding engine: one compiled state machine for every exit
hierarchy `e_0 < e_1 < ... < e_{K-1} = top` (0-based levels here; SPEC.md numbers them 1..K).

    K = 1: autoregressive (top = L), or early-exit inference (top = e < L)
    K = 2: single-layer self-speculation (LayerSkip)
    K = 3: HiSpec (draft exit Ld, intermediate verifier Li, full model L)
    K > 3: several intermediate verifiers

Level k owns layers [e_{k-1}, e_k) (e_{-1} = 0) and its exit head e_k. Per sequence the
state keeps `processed[k]` = c_k: positions < c_k have been run through level k's layers.
Tokens up to position c_k are *accepted by level k*; the token at c_k itself is level k's
newest choice (a draft, or a verifier's correction/bonus) and has not been processed by
level k yet. c_0 >= c_1 >= ... >= c_{K-1}, and the committed length is c_{K-1} + 1.

    tokens   . . . . A A A A D D D D D ?        A: accepted by level 1,  D: drafts
    c_2 (top) ------^       |         |         (K = 3)
    c_1 ---------------------^         |
    c_0 --------------------------------^       ? = newest draft (unprocessed)

One `lax.while_loop` trip is one speculation round for the whole batch (`Engine.step`):

    draft phase   up to block[0] = Nd_max + 1 draft steps (a static, unrolled loop; steps
                  after the first run under `lax.cond` only if some sequence drafts). A
                  sequence drafts while its level-1 input holds fewer than Nd + 1 positions:
                  run the token at c_0 through [0, e_0), exit e_0 proposes c_0 + 1. Each
                  draft step writes its keys/values before the next one reads them.
    verify 1      the first verifier continues the buffered layer-e_0 states of positions
                  [c_1, c_0) through [e_0, e_1); exit e_1 checks the tokens at
                  c_1 + 1 .. c_0 (acceptance rule); at the first rejection its own token
                  replaces the proposal and every lower level rolls back to that position.
    verify k > 1  the same one level up, under `lax.cond`, when some sequence's level-k
                  input is ready (its window policy says so, or the pending tokens cover
                  what is left of its budget).

The top level emits what it accepts (EOS and budget cuts: `emit.py`). For K = 1 a round is
one step of the only level, which emits directly. Who takes part in a verification is
`Hierarchy.schedule`: "sync" (greedy) verifies every unfinished sequence with something
pending once the pass runs anyway (keeps the batch in phase; greedy output does not depend
on it); "own" (sampling) only the sequences whose own input is ready, so a sequence's
actions and random draws never depend on the rest of the batch.

Work is never repeated: a level never processes a position twice while its token stays
valid (verification continues the lower level's buffered hidden states, kept in ring
buffers of the last W positions per level), each layer writes its keys/values into the
cache in place as it runs (`run_layers_cached`), and KV entries of rolled-back positions
are simply overwritten later (causal masking by absolute position makes stale slots
harmless; see `kv_cache.py`).

A drafter that is not an exit: with `Hierarchy.lookup` set, level 0 is the prompt-lookup
(n-gram) drafter (`lookup.py`; e_0 = 0, no layers). One lookup per round proposes up to k
tokens at once (`_Round.lookup_draft`); level 1 embeds them and verifies them in one pass,
at the shortest compiled block that holds them (`Hierarchy.level_blocks`; every level
above it runs so), so a round without a match is a one-position pass: an AR step for
`method="lookup"`, the draft exit's own draft step under layerskip / hispec.

Seams: `Hierarchy.window_policy` (when a level verifies: fixed windows, App. J adaptive
windows; `windows.py`), `Hierarchy.draft_exit` (how deep a draft runs: `draft.py`) and
`Hierarchy.rule` (which tokens a level keeps: `acceptance.py`), each with its state in the
engine state. A verification is four small steps: forward, acceptance, rollback, emit.

Sampling mode: each level samples from / verifies against its own filtered distribution
(`sampling.filtered_logprobs`), and keeps the distributions of the tokens it passes up in a
ring buffer, because they are the `q` the level above divides by (`acceptance.py`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from hispec_jax.decoding import draft as draft_lib
from hispec_jax.decoding import emit
from hispec_jax.decoding import gate as gate_lib
from hispec_jax.decoding import lookup as lookup_lib
from hispec_jax.decoding import policies
from hispec_jax.decoding import windows as windows_lib
from hispec_jax.decoding.acceptance import GreedyAcceptance, Verdict
from hispec_jax.decoding.draft import StaticDraftExit
from hispec_jax.decoding.prefill import block_positions, prefill
from hispec_jax.decoding.request import Request
from hispec_jax.decoding.sampling import SamplingArrays, choose_tokens, filtered_logprobs
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.heads import exit_logits
from hispec_jax.models import sharding
from hispec_jax.models.kv_cache import KVBlock, KVCache
from hispec_jax.models.transformer import embed, run_layers, run_layers_cached


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """Static description of an exit hierarchy (part of the compile key).

    Attributes:
      exits: (e_0, ..., e_{K-1}), strictly increasing; e_{K-1} is the top level.
      max_windows: per verifying level k = 1..K-1, the largest window its input may be
        given (draft_len for k = 1, verify_window above); sizes the static blocks.
      window_policy: when a level verifies (`windows.FixedWindows`, `AdaptiveWindows`).
      rule: the acceptance rule (greedy, token-wise rejection or blockwise verification).
      schedule: who takes part in a verification. "sync": every unfinished sequence with
        something pending (greedy). "own": only the sequences whose own input is ready
        (sampling: a sequence's draws never depend on the rest of the batch).
      draft_exit: how deep each draft token runs (`draft.StaticDraftExit`, or SpecBound's
        `draft.DynamicDraftExit`).
      companion: None, or a verification-length selector for level 1 (SV, `sv.py`): level 1
        then only scores the drafts and passes a prefix of them, with the draft's
        distributions, to the top level (K = 3).
      top_blocks: the block lengths the top level's pass is compiled at (ascending, the
        last one `blocks[-1]`); each verification runs the shortest that holds every
        participant's pending tokens (`lax.switch`). Empty: one block, `blocks[-1]`.
      lookup: None, or the prompt-lookup drafter (`lookup.PromptLookup`) as level 0: then
        e_0 = 0 (it runs no layer), max_windows[0] is its k, each round it proposes up to k
        tokens at once, and level 1 embeds them itself. Every level's pass runs at the
        shortest power-of-two block that holds its input (`level_blocks`), so a round
        without a match costs one position's pass, and a level above level 1 (HiSpec's
        intermediate and top) pays for what arrived, not for k + its window.
    """

    exits: tuple[int, ...]
    max_windows: tuple[int, ...] = ()
    window_policy: policies.WindowPolicy = windows_lib.FixedWindows()
    rule: policies.AcceptanceRule = GreedyAcceptance()
    schedule: str = "sync"
    draft_exit: policies.DraftExitPolicy = StaticDraftExit()
    companion: policies.Companion | None = None
    top_blocks: tuple[int, ...] = ()
    lookup: lookup_lib.PromptLookup | None = None

    def __post_init__(self):
        if self.schedule not in ("sync", "own"):
            raise ValueError(f"schedule={self.schedule!r} is not 'sync' or 'own'")
        if len(self.max_windows) != len(self.exits) - 1:
            raise ValueError(f"max_windows={self.max_windows} needs one entry per verifying "
                             f"level ({len(self.exits) - 1} for exits {self.exits})")
        if self.companion is not None and len(self.exits) != 3:
            raise ValueError(f"a level-1 companion needs exactly 3 levels, got exits {self.exits}")
        if self.top_blocks and (list(self.top_blocks) != sorted(set(self.top_blocks))
                                or self.top_blocks[-1] != self.blocks[-1]
                                or self.top_blocks[0] < 1):
            raise ValueError(f"top_blocks={self.top_blocks} must be ascending, >= 1 and end "
                             f"at the top level's block {self.blocks[-1]}")
        if (self.lookup is not None) != (self.exits[0] == 0):
            raise ValueError(f"exits {self.exits}: exit 0 is the lookup drafter's level, "
                             "present exactly when `lookup` is set")
        if self.lookup is not None and (len(self.exits) < 2 or self.companion is not None
                                        or self.adaptive
                                        or not isinstance(self.draft_exit, StaticDraftExit)
                                        or self.max_windows[0] != self.lookup.max_tokens):
            raise ValueError("a lookup level needs a verifier above it, max_windows[0] == its "
                             "k, fixed windows, a static draft exit and no SV companion")

    @property
    def num_levels(self) -> int:
        return len(self.exits)

    @property
    def adaptive(self) -> bool:
        return isinstance(self.window_policy, windows_lib.AdaptiveWindows)

    @property
    def blocks(self) -> tuple[int, ...]:
        """Static block length of each verifying level's pass (index k - 1 for level k);
        blocks[0] is also the most draft steps a round runs."""
        thresholds = [w + 1 for w in self.max_windows]
        if self.lookup is not None and thresholds:  # one lookup: at most k positions
            thresholds[0] = self.max_windows[0]
        return windows_lib.block_lengths(tuple(thresholds))

    def level_blocks(self, k: int) -> tuple[int, ...]:
        """The block lengths level k's pass is compiled at (one `lax.switch` branch each;
        empty: the one static block `blocks[k - 1]`)."""
        if k == self.num_levels - 1 and self.top_blocks:
            return self.top_blocks
        if self.lookup is not None:  # every level above it: how much arrives varies
            return windows_lib.power_of_two_blocks(self.blocks[k - 1])
        return ()

    @property
    def keeps_dists(self) -> bool:
        """Whether levels keep the distributions of the tokens they pass up even in greedy
        decoding (a companion that reads the drafts' distributions; sampling always keeps
        them)."""
        return (self.num_levels > 1 and self.companion is not None
                and self.companion.keeps_draft_dists)

    @property
    def ring(self) -> int:
        """W: positions each hidden-state ring buffer holds."""
        return max(self.blocks, default=1) + 1

    @property
    def lookahead(self) -> int:
        """How far past the committed length tokens and KV entries may be written."""
        return sum(self.blocks) + 1 if self.num_levels > 1 else 0

    @property
    def first_embeds(self) -> bool:
        """Level 1 starts at layer 0 from the token embeddings (a lookup level below it)."""
        return self.lookup is not None

    def layer_range(self, level: int) -> tuple[int, int]:
        return (self.exits[level - 1] if level else 0), self.exits[level]

    def covers(self, other: "Hierarchy") -> bool:
        """Whether a loop compiled for this hierarchy can run `other`'s windows (the same
        hierarchy with window bounds at least as large)."""
        if len(self.max_windows) != len(other.max_windows):
            return False
        if self.top_blocks or other.top_blocks or self.lookup or other.lookup:
            return self == other  # block lengths are part of the policy (SV, lookup)
        return (dataclasses.replace(self, max_windows=other.max_windows) == other
                and all(a >= b for a, b in zip(self.max_windows, other.max_windows)))


@flax.struct.dataclass
class Counters:
    """Cost and acceptance counters, summed over the batch (K = number of levels).

    Attributes:
      rounds: [] loop trips (speculation rounds).
      actions_K: [K] passes run at each level (level 0: draft steps).
      layer_passes: [] sequential layer passes (each pass adds its depth once).
      layer_token_evals: [] layers x valid tokens actually computed (decode, not prefill).
      head_evals_E: [L + 1] sequential exit-head evaluations by exit layer (a pass's head
        counts once whatever its block length, like `layer_passes`): with the heads' costs
        in layer equivalents, the work a method did (`methods.summarize_counters`).
      verifications_K: [K] (sequence, verification) pairs with something to verify.
      proposed_K: [K] tokens submitted to each verifying level.
      accepted_K: [K] of those, tokens the level accepted.
      emitted: [] tokens the top level emitted (after EOS and budget cuts).
      reject_checks: [] rejections by the level below the top, later checked by the top.
      true_rejects: [] of those, rejections the top level agreed with.
      verified_hist: [blocks[-1] + 1] top-level verifications by how many tokens each
        sequence submitted (SV's verified lengths).
      draft_depth_hist: [L + 1] draft tokens by the layer they exited at (SpecBound).
      lookup_matches: [] (sequence, round) pairs whose n-gram lookup matched.
      lookup_proposed: [] tokens the lookup drafter proposed (matches only; the no-match
        placeholder is not counted).
      lookup_accepted: [] of those, tokens level 1 accepted.
    """

    rounds: jax.Array
    actions_K: jax.Array
    layer_passes: jax.Array
    layer_token_evals: jax.Array
    head_evals_E: jax.Array
    verifications_K: jax.Array
    proposed_K: jax.Array
    accepted_K: jax.Array
    emitted: jax.Array
    reject_checks: jax.Array
    true_rejects: jax.Array
    verified_hist: jax.Array
    draft_depth_hist: jax.Array
    lookup_matches: jax.Array
    lookup_proposed: jax.Array
    lookup_accepted: jax.Array

    @classmethod
    def zeros(cls, K: int, max_verified: int = 0, num_layers: int = 0) -> "Counters":
        z = jnp.zeros((), jnp.int32)
        zk = jnp.zeros((K,), jnp.int32)
        return cls(z, zk, z, z, jnp.zeros((num_layers + 1,), jnp.int32), zk, zk, zk, z, z, z,
                   jnp.zeros((max_verified + 1,), jnp.int32),
                   jnp.zeros((num_layers + 1,), jnp.int32), z, z, z)


@flax.struct.dataclass
class EngineState:
    """The while-loop state.

    Attributes:
      out: output buffer; `out.tokens_BxS` also holds tentative tokens past the committed
        length (slot == position).
      cache: KV cache [L', B, K, S, H] of layers [0, top), written in place.
      processed_BxK: [B, K] int32, c_k per level.
      hidden: K - 1 ring buffers [B, W, D]; entry k holds layer-e_k states of positions
        [c_{k+1}, c_k) at slot position % W.
      rejected_pos_BxW, rejected_tok_BxW: [B, W] int32, the drafts the level below the top
        rejected, by position % W (position -1: none), for the true-reject rate.
      windows: the window policy's state (`windows.WindowState`).
      draft_state: the draft-exit policy's state (empty for a static exit).
      dists: sampling rules only: K - 1 ring buffers [B, W, V] float32; entry k holds level
        k's log-distribution for the tokens it passed up (positions (c_{k+1}, c_k]), the `q`
        of the level above. Empty for greedy decoding.
      draws_B: [B] int32, passes each sequence took part in; with the sequence's key it
        seeds every random draw, so draws never repeat and never depend on other sequences.
      lookup_len_B: [B] int32, tokens the lookup drafter proposed for level 1's pending
        block (0: no match, or no lookup level).
      lookup_gate: the lookup drafter's acceptance estimates (`gate.GateState`, [B, N]).
      counters: `Counters`.
    """

    out: emit.Output
    cache: KVCache
    processed_BxK: jax.Array
    hidden: tuple[jax.Array, ...]
    rejected_pos_BxW: jax.Array
    rejected_tok_BxW: jax.Array
    windows: windows_lib.WindowState
    draft_state: Any
    dists: tuple[jax.Array, ...]
    draws_B: jax.Array
    lookup_len_B: jax.Array
    lookup_gate: gate_lib.GateState
    counters: Counters


@dataclasses.dataclass(frozen=True)
class _Forward:
    """A verification's forward pass over its block of T positions.

    Attributes:
      start_B: [B] c_k, the block's first position.
      n_B: [B] positions in the block (0 for sequences not taking part).
      positions_BxT: [B, T] block positions (padding: S).
      proposed_pos_BxT: [B, T] positions of the checked tokens (start + 1 + j).
      proposed_BxT: [B, T] the tokens proposed by the level below.
      h_BxTxD: layer-e_k hidden states.
      target_BxTxV: logits (greedy) or filtered log-probabilities (sampling) of level k.
      layer_passes: [] sequential layer passes the pass ran.
      layer_token_evals: [] layers x valid tokens it computed.
      kv: None (the pass wrote its keys/values into the cache), or the block's keys/values
        of layers [e_{k-1}, e_k) (`KVBlock`), for the caller to write.
    """

    start_B: jax.Array
    n_B: jax.Array
    positions_BxT: jax.Array
    proposed_pos_BxT: jax.Array
    proposed_BxT: jax.Array
    h_BxTxD: jax.Array
    target_BxTxV: jax.Array
    layer_passes: Any
    layer_token_evals: Any
    kv: KVBlock | None = None


def _gather_positions(tokens_BxS, positions_BxT):
    S = tokens_BxS.shape[1]
    return jnp.take_along_axis(tokens_BxS, jnp.clip(positions_BxT, 0, S - 1), axis=1)


def _scatter_tokens(tokens_BxS, positions_B, values_B, mask_B):
    S = tokens_BxS.shape[1]
    positions_B = jnp.where(mask_B, positions_B, S)
    return tokens_BxS.at[jnp.arange(tokens_BxS.shape[0]), positions_B].set(values_B, mode="drop")


class _Round:
    """The passes of one speculation round (closes over the static settings and the loop's
    inputs; every method maps an `EngineState` to an `EngineState`)."""

    def __init__(self, params, heads, req: Request, cfg: ModelConfig, h: Hierarchy,
                 greedy: bool):
        self.params, self.heads, self.req, self.cfg, self.h, self.greedy = (
            params, heads, req, cfg, h, greedy)

    # ---- readiness --------------------------------------------------------------------
    def pending(self, state: EngineState, k: int) -> jax.Array:
        """[B] positions level k - 1 processed that level k has not verified."""
        c = state.processed_BxK
        return c[:, k - 1] - c[:, k]

    def ready(self, state: EngineState, k: int) -> jax.Array:
        """[B] bool: level k's input is ready (its window is full, or the tokens accepted by
        level k - 1 beyond the committed length cover the rest of the budget: drafting
        further would be wasted work)."""
        out, pending_B = state.out, self.pending(state, k)
        ahead_B = state.processed_BxK[:, k - 1] + 1 - out.lengths_B
        remaining_B = self.req.max_new_B - out.num_new_B
        ready_B = (self.h.window_policy.ready(state.windows, k, pending_B)
                   | ((ahead_B >= remaining_B) & (pending_B > 0)))
        if k == 1 and self.h.lookup is not None:  # one lookup a round: always ready
            return pending_B > 0
        if k == 1:  # the draft policy may end drafting early (SpecBound's hard token)
            ready_B |= self.h.draft_exit.stops(state.draft_state, state.processed_BxK[:, 0],
                                               pending_B)
        return ready_B

    def participants(self, state: EngineState, k: int) -> jax.Array:
        active_B = ~state.out.done_B
        if self.h.schedule == "own":
            return active_B & self.ready(state, k)
        return active_B & (self.pending(state, k) > 0)

    def companion(self, k: int) -> policies.Companion | None:
        """Level k's companion (only level 1 may have one: SV), or None."""
        return self.h.companion if k == 1 else None

    def keys(self, state: EngineState, purpose: int) -> jax.Array:
        """Per-sequence PRNG keys for this pass's draws (fresh for every pass)."""
        keys_Bx2 = jax.vmap(jax.random.fold_in)(self.req.sequence_keys_Bx2, state.draws_B)
        return jax.vmap(lambda k: jax.random.fold_in(k, purpose))(keys_Bx2)

    def _ring_write(self, ring_BxWx, positions_BxT, values_BxTx, mask_BxT):
        W = self.h.ring
        slots_BxT = jnp.where(mask_BxT, positions_BxT % W, W)
        return ring_BxWx.at[jnp.arange(ring_BxWx.shape[0])[:, None], slots_BxT].set(
            values_BxTx.astype(ring_BxWx.dtype), mode="drop")

    def _ring_read(self, ring_BxWx, positions_BxT):
        return ring_BxWx[jnp.arange(ring_BxWx.shape[0])[:, None], positions_BxT % self.h.ring]

    # ---- the round ----------------------------------------------------------------------
    def __call__(self, state: EngineState) -> EngineState:
        K = self.h.num_levels
        state = state.replace(counters=state.counters.replace(
            rounds=state.counters.rounds + 1))
        if K == 1:  # the only level drafts and emits one token per round
            return self.draft(state, ~state.out.done_B)
        state = self.draft_phase(state)
        state = self.verify_top_or_not(state, 1, self.participants(state, 1))
        for k in range(2, K):
            part_B = self.participants(state, k)
            if self.h.schedule == "sync":  # run only if some sequence's input is ready
                run = jnp.any(part_B & self.ready(state, k))
            else:
                run = jnp.any(part_B)
            state = jax.lax.cond(run, functools.partial(self.verify_top_or_not, k=k,
                                                        part_B=part_B),
                                 lambda s: s, state)
        return state

    def draft_phase(self, state: EngineState) -> EngineState:
        """Drafts until every sequence's level-1 input is ready. A sequence whose input to a
        higher level is already ready does not draft (that level verifies first)."""
        K = self.h.num_levels
        active_B = ~state.out.done_B
        higher_ready_B = jnp.zeros_like(active_B)
        for k in range(2, K):
            higher_ready_B |= self.ready(state, k)
        if self.h.lookup is not None:  # one lookup proposes the whole block
            return self.lookup_draft(state, active_B & ~higher_ready_B & ~self.ready(state, 1))
        for step in range(self.h.blocks[0]):
            part_B = active_B & ~higher_ready_B & ~self.ready(state, 1)
            if step == 0:
                state = self.draft(state, part_B)
            else:
                state = jax.lax.cond(jnp.any(part_B), functools.partial(self.draft, part_B=part_B),
                                     lambda s: s, state)
        return state

    def verify_top_or_not(self, state: EngineState, k: int, part_B: jax.Array) -> EngineState:
        """Level k's verification; where the level has several compiled block lengths
        (`Hierarchy.level_blocks`: the top level's `top_blocks`, the levels above a lookup
        drafter) it runs at the shortest that holds every participant's pending tokens (one
        `lax.switch` branch per length)."""
        blocks = self.h.level_blocks(k)
        if not blocks:
            return self.verify(state, k, part_B)
        sizes = jnp.asarray(blocks, jnp.int32)
        longest = jnp.max(jnp.where(part_B, self.pending(state, k), 0))
        index = jnp.minimum(jnp.searchsorted(sizes, longest), len(blocks) - 1)
        # The cache is only read inside the branches, and the block's keys/values are
        # written after the switch: a branch that updates the cache makes XLA copy all of
        # it (in the branch and again in the loop body) every round.
        cache = state.cache

        def branch(s, T):
            s, positions_BxT, kv = self.verify(s.replace(cache=cache), k, part_B, T,
                                               pad_kv_to=blocks[-1])
            return s.replace(cache=None), positions_BxT, kv

        branches = [functools.partial(branch, T=T) for T in blocks]
        state, positions_BxT, kv = jax.lax.switch(index, branches, state.replace(cache=None))
        # (the barrier keeps XLA from moving the writes back into every branch)
        positions_BxT, kv = jax.lax.optimization_barrier((positions_BxT, kv))
        lo, _ = self.h.layer_range(k)
        return state.replace(cache=cache.write_block(lo, positions_BxT, kv))

    # ---- level 0 as a lookup drafter: propose up to k tokens at once -------------------
    def lookup_draft(self, state: EngineState, part_B: jax.Array) -> EngineState:
        """Writes each drafting sequence's n-gram proposal (`lookup.py`) at c_0 + 1 .. and
        moves c_0 past it; no layer runs (level 1 embeds the tokens itself).

            before   c_1 = c_0                       (level 1 verified everything)
                     x_c ? ? ?
            after    c_1   c_0 = c_1 + m             (m proposed tokens, m <= k)
                     x_c  y1 y2 y3
        """
        out, c, k = state.out, state.processed_BxK, self.h.lookup.max_tokens
        S = out.tokens_BxS.shape[1]
        # Never more than the budget still needs (the top level emits at most the proposals).
        remaining_B = self.req.max_new_B - out.num_new_B - (c[:, 0] + 1 - out.lengths_B)
        limit_B = jnp.clip(jnp.minimum(state.windows.windows_BxK1[:, 0], remaining_B), 1, k)
        with jax.named_scope("lookup"):
            prop = self.h.lookup.propose(out.tokens_BxS, c[:, 0], limit_B)
            length_B = prop.length_B
            if self.h.lookup.gate:  # greedy: one block for the batch; sampling: each alone
                length_B = gate_lib.choose(
                    state.lookup_gate.of_match(prop.ngram_B), length_B, prop.matched_B, part_B,
                    self.h.level_blocks(1), self.req.lookup_cost, joint=self.h.schedule == "sync")
        n_B = jnp.where(part_B, length_B, 0)
        j_K = jnp.arange(k)
        slots_BxK = jnp.where(j_K[None, :] < n_B[:, None], c[:, :1] + 1 + j_K[None, :], S)
        tokens_BxS = out.tokens_BxS.at[jnp.arange(c.shape[0])[:, None], slots_BxK].set(
            prop.tokens_BxK, mode="drop")
        matched_B = part_B & prop.matched_B
        counters = state.counters
        counters = counters.replace(
            actions_K=counters.actions_K.at[0].add(1),
            lookup_matches=counters.lookup_matches + jnp.sum(matched_B),
            lookup_proposed=counters.lookup_proposed + jnp.sum(jnp.where(matched_B, n_B, 0)))
        return state.replace(
            out=out.replace(tokens_BxS=tokens_BxS), processed_BxK=c.at[:, 0].add(n_B),
            lookup_len_B=jnp.where(part_B, jnp.where(matched_B, n_B, 0), state.lookup_len_B),
            lookup_gate=state.lookup_gate.replace(
                ngram_B=jnp.where(part_B, prop.ngram_B, state.lookup_gate.ngram_B)),
            counters=counters)

    # ---- level 0: draft one token -----------------------------------------------------
    def draft(self, state: EngineState, part_B: jax.Array) -> EngineState:
        cfg, h = self.cfg, self.h
        out, c = state.out, state.processed_BxK
        S = out.tokens_BxS.shape[1]
        pos_B = c[:, 0]
        token_B = _gather_positions(out.tokens_BxS, pos_B[:, None])[:, 0]
        K = h.num_levels
        with jax.named_scope("draft"):
            d = h.draft_exit.draft(self.params, self.heads, cfg, draft_lib.DraftInput(
                x_Bx1xD=embed(self.params, token_B[:, None]), position_B=pos_B, part_B=part_B,
                pending_start_B=c[:, 1] if K > 1 else pos_B,
                ring_BxWxD=state.hidden[0] if K > 1 else None, capacity=S,
                block=h.blocks[0] if K > 1 else 1), state.cache, h.exits[0], state.draft_state)
            if self.greedy:
                next_B = jnp.argmax(d.logits_BxV, axis=-1).astype(jnp.int32)
                logp_BxV = None
            else:
                logp_BxV = filtered_logprobs(d.logits_BxV, self.req.sampling)
                next_B = jax.vmap(jax.random.categorical)(self.keys(state, 0), logp_BxV)
                next_B = next_B.astype(jnp.int32)
        hidden, dists = state.hidden, state.dists
        if K > 1:
            ring = (d.ring_BxWxD if d.ring_BxWxD is not None
                    else self._ring_write(hidden[0], pos_B[:, None], d.h_Bx1xD, part_B[:, None]))
            hidden = (ring,) + hidden[1:]
            if dists:
                if logp_BxV is None:  # greedy, kept for a companion's signals
                    logp_BxV = jax.nn.log_softmax(d.logits_BxV, axis=-1)
                dists = (self._ring_write(dists[0], pos_B[:, None] + 1, logp_BxV[:, None],
                                          part_B[:, None]),) + dists[1:]
        out = out.replace(tokens_BxS=_scatter_tokens(out.tokens_BxS, pos_B + 1, next_B, part_B))
        counters = state.counters
        if h.num_levels == 1:  # the draft level is the top level: emit directly
            out, emitted_B = emit.append_block(out, next_B[:, None], part_B.astype(jnp.int32),
                                               self.req.eos_ids_E, self.req.max_new_B)
            counters = counters.replace(emitted=counters.emitted + jnp.sum(emitted_B))
        counters = counters.replace(
            actions_K=counters.actions_K.at[0].add(1),
            layer_passes=counters.layer_passes + d.layer_passes,
            layer_token_evals=counters.layer_token_evals + d.layer_token_evals,
            head_evals_E=(counters.head_evals_E.at[h.exits[0]].add(1) if d.head_evals_E is None
                          else counters.head_evals_E + d.head_evals_E),
            draft_depth_hist=counters.draft_depth_hist.at[
                jnp.where(part_B, d.depth_B, counters.draft_depth_hist.shape[0])].add(
                    1, mode="drop"))
        return state.replace(out=out, cache=d.cache, hidden=hidden, dists=dists,
                             processed_BxK=c.at[:, 0].add(part_B.astype(jnp.int32)),
                             draft_state=d.state, draws_B=state.draws_B + part_B,
                             counters=counters)

    # ---- level k > 0: verify the level below --------------------------------------------
    def verify(self, state: EngineState, k: int, part_B: jax.Array,
               T: int | None = None, pad_kv_to: int | None = None):
        """Forward (over a block of T positions, default the level's static block),
        acceptance, rollback, emit (top level), then policy and counters.

        With `pad_kv_to` (a `lax.switch` branch of `verify_top_or_not`) the pass only reads
        the cache and returns (state, the block's positions [B, pad_kv_to] (padding: S), its
        keys/values as a `KVBlock` padded to pad_kv_to) for the caller to write."""
        with jax.named_scope(f"verify_level{k}"):
            fwd, state = self.forward(state, k, part_B, T, write_cache=pad_kv_to is None)
            verdict = self.accept(state, k, fwd)
            state = self.rollback(state, k, part_B, fwd, verdict)
            if k == self.h.num_levels - 1:
                state = self.emit_accepted(state, part_B, fwd)
            state = self.record(state, k, part_B, fwd, verdict)
        if pad_kv_to is None:
            return state
        pad = pad_kv_to - fwd.positions_BxT.shape[1]
        S = state.out.tokens_BxS.shape[1]
        positions_BxT = jnp.pad(fwd.positions_BxT, ((0, 0), (0, pad)), constant_values=S)
        pad_kv = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0), (0, 0)))
        return state, positions_BxT, KVBlock(k=pad_kv(fwd.kv.k), v=pad_kv(fwd.kv.v))

    def forward(self, state: EngineState, k: int, part_B: jax.Array, T: int | None = None,
                write_cache: bool = True):
        """Continues the buffered layer-e_{k-1} states of [c_k, c_{k-1}) through level k's
        layers (writing their keys/values; `write_cache` False: only reading the cache and
        keeping them in `_Forward.kv`) and computes level k's exit. Above a dynamic draft
        exit (k = 1), each position starts at its own draft depth."""
        cfg, T = self.cfg, T or self.h.blocks[k - 1]
        lo, hi = self.h.layer_range(k)
        c, tokens_BxS = state.processed_BxK, state.out.tokens_BxS
        S = tokens_BxS.shape[1]
        start_B = c[:, k]
        n_B = jnp.where(part_B, c[:, k - 1] - start_B, 0)
        positions_BxT = block_positions(start_B, n_B, T, S)
        proposed_pos_BxT = start_B[:, None] + 1 + jnp.arange(T)[None, :]
        if k == 1 and self.h.first_embeds:  # above a lookup level: start from the tokens
            x_BxTxD = embed(self.params, _gather_positions(tokens_BxS, positions_BxT))
        else:
            x_BxTxD = self._ring_read(state.hidden[k - 1], positions_BxT)
        valid_BxT = jnp.arange(T)[None, :] < n_B[:, None]
        passes, evals = hi - lo, (hi - lo) * jnp.sum(n_B)
        if k == 1:
            aligned = self.h.draft_exit.align(self.params, cfg, x_BxTxD, positions_BxT, valid_BxT,
                                              state.cache, state.draft_state, lo)
            if aligned is not None:  # dynamic depths: bring every position up to layer lo
                if not write_cache:
                    raise ValueError("a dynamic draft exit writes the cache in its pass")
                x_BxTxD, cache, lo, passes, evals = aligned
                state = state.replace(cache=cache)
                passes, evals = passes + hi - lo, evals + (hi - lo) * jnp.sum(n_B)
        kv = None
        if write_cache:
            h_BxTxD, cache = run_layers_cached(self.params, cfg, x_BxTxD, positions_BxT,
                                               state.cache, lo, hi)
        else:
            h_BxTxD, kv = run_layers(self.params, cfg, x_BxTxD, positions_BxT, state.cache, lo,
                                     hi, split_context=True)
            cache = state.cache
        logits_BxTxV = exit_logits(self.params, self.heads, cfg, h_BxTxD, hi)
        target_BxTxV = (logits_BxTxV if self.greedy
                        else filtered_logprobs(logits_BxTxV, self.req.sampling))
        fwd = _Forward(start_B=start_B, n_B=n_B, positions_BxT=positions_BxT,
                       proposed_pos_BxT=proposed_pos_BxT,
                       proposed_BxT=_gather_positions(tokens_BxS, proposed_pos_BxT),
                       h_BxTxD=h_BxTxD, target_BxTxV=target_BxTxV, layer_passes=passes,
                       layer_token_evals=evals, kv=kv)
        return fwd, state.replace(cache=cache)

    def accept(self, state: EngineState, k: int, fwd: _Forward) -> Verdict:
        """The acceptance rule on the block (the level below's distributions as `q`); a level
        with a companion (SV's level 1) asks it how many drafts to pass up instead."""
        if k == 1 and self.h.lookup is not None:  # deterministic proposals: q one-hot
            proposal_BxTxV = (None if self.greedy
                              else lookup_lib.one_hot_logq(fwd.proposed_BxT, self.cfg.vocab_size))
        else:
            proposal_BxTxV = (self._ring_read(state.dists[k - 1], fwd.proposed_pos_BxT)
                              if state.dists else None)
        if self.companion(k) is not None:
            return self.companion(k).select(fwd.target_BxTxV, proposal_BxTxV, fwd.proposed_BxT,
                                            fwd.n_B, self.greedy)
        return self.h.rule.accept(fwd.target_BxTxV, proposal_BxTxV, fwd.proposed_BxT, fwd.n_B,
                                  self.keys(state, k))

    def rollback(self, state: EngineState, k: int, part_B: jax.Array, fwd: _Forward,
                 verdict: Verdict) -> EngineState:
        """Advances c_k past the accepted prefix; at a rejection, writes level k's token at
        the rejected position and rolls every lower level back to it. Buffers this level's
        states (and distributions) for the level above.

            before   c_k                 c_{k-1}          (level k checks x1..x5)
                     |  x1 x2 x3 x4 x5   |
            reject   c_k       r          -> c_k = c_{k-1} = ... = c_0 = pos(r)
            at x3                            (r = level k's token replaces x3)
        """
        K = self.h.num_levels
        c, out = state.processed_BxK, state.out
        valid_BxT = jnp.arange(fwd.positions_BxT.shape[1])[None, :] < fwd.n_B[:, None]
        m_B = verdict.num_accepted_B
        rejected_B = part_B & (m_B < fwd.n_B)
        reject_pos_B = fwd.start_B + m_B + 1
        hidden, dists = list(state.hidden), list(state.dists)
        if k < K - 1:
            hidden[k] = self._ring_write(hidden[k], fwd.positions_BxT, fwd.h_BxTxD, valid_BxT)
            if dists:
                passed_BxTxV = fwd.target_BxTxV
                if self.companion(k) is not None:  # the companion says which q goes up
                    passed_BxTxV = self.companion(k).passed_dists(
                        fwd.target_BxTxV, self._ring_read(dists[0], fwd.proposed_pos_BxT))
                dists[k] = self._ring_write(dists[k], fwd.proposed_pos_BxT, passed_BxTxV,
                                            valid_BxT)
        tokens_BxS = _scatter_tokens(out.tokens_BxS, reject_pos_B, verdict.next_token_B,
                                     rejected_B)
        new_ck_B = jnp.where(rejected_B, reject_pos_B, c[:, k - 1])
        c = c.at[:, k].set(jnp.where(part_B, new_ck_B, fwd.start_B))
        for lower in range(k):
            c = c.at[:, lower].set(jnp.where(rejected_B, reject_pos_B, c[:, lower]))
        return state.replace(out=out.replace(tokens_BxS=tokens_BxS), processed_BxK=c,
                             hidden=tuple(hidden), dists=tuple(dists))

    def emit_accepted(self, state: EngineState, part_B: jax.Array, fwd: _Forward) -> EngineState:
        """The top level emits the tokens it accepted plus its correction (EOS/budget cuts)."""
        K = self.h.num_levels
        count_B = jnp.where(part_B, state.processed_BxK[:, K - 1] - fwd.start_B, 0)
        block_BxT = _gather_positions(state.out.tokens_BxS, fwd.proposed_pos_BxT)
        out, emitted_B = emit.append_block(state.out, block_BxT, count_B, self.req.eos_ids_E,
                                           self.req.max_new_B)
        counters = state.counters
        return state.replace(out=out, counters=counters.replace(
            emitted=counters.emitted + jnp.sum(emitted_B)))

    def record(self, state: EngineState, k: int, part_B: jax.Array, fwd: _Forward,
               verdict: Verdict) -> EngineState:
        """Window policy update, true-reject bookkeeping (App. H) and counters."""
        K, W = self.h.num_levels, self.h.ring
        m_B, n_B = verdict.num_accepted_B, fwd.n_B
        T = fwd.positions_BxT.shape[1]
        j_T = jnp.arange(T)
        valid_BxT = j_T[None, :] < n_B[:, None]
        batch_Bx1 = jnp.arange(n_B.shape[0])[:, None]
        counters = state.counters
        rej_pos, rej_tok = state.rejected_pos_BxW, state.rejected_tok_BxW
        below_top = self.companion(K - 2)  # a companion below the top may not reject
        tracks_rejects = K >= 3 and (below_top is None or below_top.rejects)
        if tracks_rejects and k == K - 2:  # record this level's rejections (true-reject rate)
            rejected_B = part_B & (m_B < n_B)
            record_BxT = valid_BxT & (j_T[None, :] == m_B[:, None]) & rejected_B[:, None]
            slots_BxT = jnp.where(valid_BxT, fwd.proposed_pos_BxT % W, W)
            rej_pos = rej_pos.at[batch_Bx1, slots_BxT].set(
                jnp.where(record_BxT, fwd.proposed_pos_BxT, -1), mode="drop")
            rej_tok = rej_tok.at[batch_Bx1, slots_BxT].set(fwd.proposed_BxT, mode="drop")
        if tracks_rejects and k == K - 1:  # check recorded rejections (prefix accepted)
            checked_BxT = valid_BxT & (j_T[None, :] <= m_B[:, None])
            slots_BxT = fwd.proposed_pos_BxT % W
            has_rec_BxT = checked_BxT & (rej_pos[batch_Bx1, slots_BxT] == fwd.proposed_pos_BxT)
            agree_BxT = verdict.predictions_BxT != rej_tok[batch_Bx1, slots_BxT]
            counters = counters.replace(
                reject_checks=counters.reject_checks + jnp.sum(has_rec_BxT),
                true_rejects=counters.true_rejects + jnp.sum(has_rec_BxT & agree_BxT))
        passed_B = m_B
        if self.companion(k) is not None:  # e.g. SV passes its cut token x_gamma up too
            passed_B = self.companion(k).passed_up(verdict, n_B)
        if k == K - 1:
            hist = counters.verified_hist
            counters = counters.replace(verified_hist=hist.at[
                jnp.where(part_B & (n_B > 0), n_B, hist.shape[0])].add(1, mode="drop"))
        windows = self.h.window_policy.update(state.windows, k, K, m_B, n_B, part_B)
        if k == 1 and self.h.lookup is not None:
            looked_B = jnp.where(part_B, state.lookup_len_B, 0)
            kept_B = jnp.minimum(m_B, looked_B)
            counters = counters.replace(
                lookup_accepted=counters.lookup_accepted + jnp.sum(kept_B))
            windows = windows.replace(windows_BxK1=windows.windows_BxK1.at[:, 0].set(
                self.h.lookup.adapt(windows.windows_BxK1[:, 0], looked_B, kept_B)))
            state = state.replace(lookup_gate=state.lookup_gate.record(looked_B, kept_B))
        counters = counters.replace(
            actions_K=counters.actions_K.at[k].add(1),
            layer_passes=counters.layer_passes + fwd.layer_passes,
            layer_token_evals=counters.layer_token_evals + fwd.layer_token_evals,
            head_evals_E=counters.head_evals_E.at[self.h.exits[k]].add(1),
            verifications_K=counters.verifications_K.at[k].add(jnp.sum(n_B > 0)),
            proposed_K=counters.proposed_K.at[k].add(jnp.sum(n_B)),
            accepted_K=counters.accepted_K.at[k].add(jnp.sum(jnp.where(part_B, passed_B, 0))))
        return state.replace(rejected_pos_BxW=rej_pos, rejected_tok_BxW=rej_tok,
                             windows=windows, draws_B=state.draws_B + part_B,
                             counters=counters)


# ---------------------------------------------------------------------------- the Engine
@dataclasses.dataclass(frozen=True)
class Shapes:
    """The static shapes of one compiled loop.

    Attributes:
      batch: B, sequences per loop (padding rows included).
      capacity: S, cache positions per sequence.
      prompt_block: T, the prefill chunk (a power of two; `prefill.py`): prompts of any
        length run full chunks of T positions, the rest in at most two small chunks of
        T / 4 (`prefill.chunk_counts`).
      num_eos: E, EOS ids (padded with -1; at least 1).
    """

    batch: int
    capacity: int
    prompt_block: int
    num_eos: int = 1


def _signature(tree) -> tuple:
    """A hashable description of a pytree of arrays: structure, shapes and dtypes."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(x.shape), jnp.dtype(x.dtype).name) for x in leaves)


def _structs(signature) -> Any:
    treedef, leaves = signature
    return jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(s, d) for s, d in leaves])


@dataclasses.dataclass(frozen=True)
class Engine:
    """One compiled decoding loop: a model's architecture and parameter layout, an exit
    hierarchy and the shapes (gemma's sampler pattern: a frozen description with
    `init_state` / `step` / `run`, and one compile cache keyed by the object itself).

    Attributes:
      cfg: the model architecture.
      hierarchy: the exit hierarchy and its policies.
      shapes: batch, cache capacity, prompt block, EOS count.
      greedy: argmax decoding (static: removes sorting from the loop).
      params_signature, heads_signature: structure, shapes and dtypes of the model's
        parameters and exit heads (the layer layout and trained heads are part of the key).
      shardings: how `run` is partitioned over a device mesh (`decoding.mesh.LoopShardings`,
        hashable: in/out shardings and the mesh it is lowered under); None: one device.
    """

    cfg: ModelConfig
    hierarchy: Hierarchy
    shapes: Shapes
    greedy: bool
    params_signature: tuple
    heads_signature: tuple
    shardings: Any = None

    @classmethod
    def for_model(cls, model, hierarchy: Hierarchy, shapes: Shapes, greedy: bool = True,
                  shardings=None) -> "Engine":
        """The engine for `model` (a `Model`; its arrays may be `jax.ShapeDtypeStruct`s)."""
        return cls(cfg=model.cfg, hierarchy=hierarchy, shapes=shapes, greedy=greedy,
                   params_signature=_signature(model.params),
                   heads_signature=_signature(model.heads), shardings=shardings)

    @property
    def cache_layers(self) -> int:
        return self.hierarchy.exits[-1]

    @property
    def per_layer_cache(self) -> bool:
        """The cache layout follows the layer layout: per-layer buffers for "unrolled"."""
        return isinstance(_structs(self.params_signature)["layers"], (tuple, list))

    def empty_cache(self) -> KVCache:
        return KVCache.zeros(self.cfg, self.shapes.batch, self.shapes.capacity, self.cache_layers,
                             per_layer=self.per_layer_cache)

    # ---- the loop, as pure functions -----------------------------------------------------
    def init_state(self, params, heads, req: Request, cache: KVCache,
                   windows_K1: jax.Array) -> EngineState:
        """Prefill the prompts, emit each sequence's first token, build the loop state.

        Args:
          req: the batch (prompts, budgets, EOS ids, PRNG keys, sampling settings).
          cache: an empty cache with at least `hierarchy.exits[-1]` layers.
          windows_K1: [K - 1] int32 initial windows (draft_len, then verify windows).
        """
        h, cfg, greedy = self.hierarchy, self.cfg, self.greedy
        K, top = h.num_levels, h.exits[-1]
        B = req.prompt_lens_B.shape[0]
        if not greedy and K > 1 and not h.rule.needs_proposal_dists:
            raise ValueError("sampling with a speculative hierarchy needs a sampling acceptance rule")
        with jax.named_scope("prefill"):
            h_BxD, cache = prefill(params, cfg, req.tokens_BxS, req.prompt_lens_B, cache, top,
                                   chunk=self.shapes.prompt_block)
            logits_BxV = exit_logits(params, heads, cfg, h_BxD[:, None], top)[:, 0]
            first_keys = jax.vmap(jax.random.fold_in)(req.sequence_keys_Bx2, jnp.full((B,), -1))
            first_B = choose_tokens(logits_BxV, greedy, req.sampling, first_keys)
            out = emit.start_output(req.tokens_BxS, req.prompt_lens_B, req.max_new_B)
            out, _ = emit.append_block(out, first_B[:, None], jnp.ones_like(first_B),
                                       req.eos_ids_E, req.max_new_B)
        dtype = jnp.dtype(cfg.dtype)
        return EngineState(
            out=out,
            cache=cache,
            processed_BxK=jnp.broadcast_to(req.prompt_lens_B[:, None], (B, K)).astype(jnp.int32),
            # (a lookup level keeps no states or distributions: its rings are empty)
            hidden=tuple(jnp.zeros((B, 0 if k == 0 and h.lookup else h.ring, cfg.hidden_size),
                                   dtype) for k in range(K - 1)),
            rejected_pos_BxW=jnp.full((B, h.ring), -1, jnp.int32),
            rejected_tok_BxW=jnp.zeros((B, h.ring), jnp.int32),
            windows=h.window_policy.init(windows_K1, B),
            draft_state=h.draft_exit.init(B, h.ring),
            dists=tuple(jnp.full((B, 0 if k == 0 and h.lookup else h.ring, cfg.vocab_size),
                                 -jnp.inf, jnp.float32)
                        for k in range(K - 1)) if (not greedy or h.keeps_dists) and K > 1 else (),
            draws_B=jnp.zeros((B,), jnp.int32),
            lookup_len_B=jnp.zeros((B,), jnp.int32),
            lookup_gate=gate_lib.GateState.init(B, h.lookup.max_ngram if h.lookup else 0),
            counters=Counters.zeros(K, max(h.blocks, default=0), cfg.num_layers),
        )

    def step(self, params, heads, req: Request, state: EngineState) -> EngineState:
        """One speculation round for the whole batch (one trip of the loop)."""
        return _Round(params, heads, req, self.cfg, self.hierarchy, self.greedy)(state)

    def run(self, params, heads, req: Request, cache: KVCache, windows_K1: jax.Array):
        """Prefill, then rounds until every sequence is done.

        Returns (output, counters, final cache); the cache is returned so that a donated
        input cache backs the loop's cache in place.
        """
        # On a mesh, every [B, ...] state array splits over "data" (a no-op on one device).
        on_mesh = functools.partial(sharding.constrain_state, batch=self.shapes.batch)
        state = on_mesh(self.init_state(params, heads, req, cache, windows_K1))
        state = jax.lax.while_loop(lambda s: jnp.any(~s.out.done_B),
                                   lambda s: on_mesh(self.step(params, heads, req, s)), state)
        return state.out, state.counters, state.cache

    def run_rounds(self, params, heads, req: Request, state: EngineState,
                   max_rounds: jax.Array) -> EngineState:
        """Continues `state` for at most `max_rounds` ([] int32, an array: any bound runs in
        one compiled loop) more rounds, stopping earlier when every sequence is done.

        Rounds are the same as `run`'s and every draw is keyed per sequence, so any split
        of a run into `run_rounds` calls produces the tokens of one uninterrupted run
        (serving/: streaming and continuous batching resume from the returned state).
        """
        on_mesh = functools.partial(sharding.constrain_state, batch=self.shapes.batch)

        def more(carry):
            s, trips = carry
            return jnp.any(~s.out.done_B) & (trips < max_rounds)

        def round_(carry):
            s, trips = carry
            return on_mesh(self.step(params, heads, req, s)), trips + 1

        state, _ = jax.lax.while_loop(more, round_, (on_mesh(state), jnp.zeros((), jnp.int32)))
        return state

    # ---- compilation -------------------------------------------------------------------
    def abstract_arguments(self) -> tuple:
        """`run`'s arguments as `jax.ShapeDtypeStruct`s (nothing allocated)."""
        B, S, E = self.shapes.batch, self.shapes.capacity, self.shapes.num_eos
        i32, f32 = jnp.int32, jnp.float32
        sds = jax.ShapeDtypeStruct
        req = Request(tokens_BxS=sds((B, S), i32), prompt_lens_B=sds((B,), i32),
                      max_new_B=sds((B,), i32), eos_ids_E=sds((E,), i32),
                      sequence_keys_Bx2=sds((B, 2), jnp.uint32),
                      sampling=SamplingArrays(sds((), f32), sds((), i32), sds((), f32)))
        cache = jax.eval_shape(self.empty_cache)
        windows = sds((self.hierarchy.num_levels - 1,), i32)
        return (_structs(self.params_signature), _structs(self.heads_signature), req, cache,
                windows)

    def lower(self) -> jax.stages.Lowered:
        """`run` lowered on abstract arguments (the cache argument is donated)."""
        if self.shardings is not None:  # over a device mesh (decoding/mesh.py)
            return self.shardings.lower(self.run, self.abstract_arguments(), donate_argnums=(3,))
        jitted = jax.jit(self.run, donate_argnums=(3,))
        return jitted.lower(*self.abstract_arguments())

    def compiled(self):
        """(the compiled `run`, seconds spent compiling: 0 when this process already
        compiled an equal engine). Least recently used executables beyond `MAX_COMPILED`,
        or while the process nears its memory-mapping limit (`make_room`), are dropped."""
        global compilations
        if self in _COMPILED:
            _COMPILED.move_to_end(self)
            return _COMPILED[self][0], 0.0
        make_room()
        t0 = time.perf_counter()
        executable = self.lower().compile(compiler_options=compiler_options() or None)
        seconds = time.perf_counter() - t0
        compilations += 1
        _COMPILED[self] = (executable, seconds)
        while len(_COMPILED) > MAX_COMPILED:
            _COMPILED.popitem(last=False)
        return executable, seconds

    def compile_seconds(self) -> float | None:
        """Seconds this process spent compiling this engine's loop (None: not compiled, or
        dropped from the cache)."""
        entry = _COMPILED.get(self)
        return None if entry is None else entry[1]

    def compiled_covering(self) -> "Engine":
        """An already compiled engine equal to this one except for larger window bounds
        (its loop runs these windows without a new compilation), else this engine."""
        for other in reversed(_COMPILED):
            if (dataclasses.replace(other, hierarchy=self.hierarchy) == self
                    and other.hierarchy.covers(self.hierarchy)):
                return other
        return self


# Engine -> (compiled executable, seconds it took), for this process (least recently used
# dropped first).
_COMPILED: collections.OrderedDict[Engine, tuple[Any, float]] = collections.OrderedDict()
MAX_COMPILED = 32
compilations = 0  # loops compiled by this process (tests check that bad input compiles none)
# XLA:CPU's JIT maps every compiled kernel's code and data sections separately: one decoding
# loop holds 1,000-3,000 memory mappings (a lookup loop, with a `lax.switch` branch per
# block, the most), and Linux refuses a process more than `vm.max_map_count` (65,530 by
# default): a process that had compiled some 25 loops died in LLVM with "Unable to allocate
# section memory" (a `bench --tasks --auto --auto-verify` run). Before compiling, the least
# recently used loops are dropped while the process holds more than this share of its limit.
MAP_BUDGET = 0.5


# XLA options every decoding loop is compiled with, by platform (`jax.default_backend()`),
# as `jax.stages.Lowered.compile(compiler_options=...)` takes them (XLA's `DebugOptions`
# field names; values as the `XLA_FLAGS` parser reads them). Per-compile options rather
# than `XLA_FLAGS`, so a library import changes nothing else in the process, and a probe
# can compile the same loop under several (benchmarks/results_accelerator/engine_variants.py;
# compiled loops are not keyed by the options: `clear_compiled()` after a change).
COMPILER_OPTIONS: dict[str, dict[str, Any]] = {}


def compiler_options() -> dict[str, Any]:
    """`COMPILER_OPTIONS` for the platform this process computes on."""
    return dict(COMPILER_OPTIONS.get(jax.default_backend(), {}))


def map_counts() -> tuple[int, int] | None:
    """(memory mappings this process holds, the most it may hold), or None where the
    system does not say (not Linux)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            held = sum(1 for _ in f)
        with open("/proc/sys/vm/max_map_count") as f:
            return held, int(f.read())
    except (OSError, ValueError):
        return None


def make_room() -> int:
    """Drops least recently used compiled loops while this process holds more than
    `MAP_BUDGET` of its memory-mapping limit (`map_counts`); returns how many it dropped.
    A dropped loop compiles again when it is next used."""
    dropped = 0
    while _COMPILED:
        counts = map_counts()
        if counts is None or counts[0] <= MAP_BUDGET * counts[1]:
            break
        _COMPILED.popitem(last=False)
        dropped += 1
    return dropped


def clear_compiled() -> None:
    """Drops every compiled loop of this process."""
    _COMPILED.clear()
