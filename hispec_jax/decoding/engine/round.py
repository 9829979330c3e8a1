"""One speculation round: one trip of the engine's `lax.while_loop` for the whole batch.

    draft         level 0 (the drafter, `drafters.py`) proposes tokens until every
                  sequence's level-1 input is ready
    verify 1      level 1 continues level 0's proposals through [e_0, e_1) and checks them
    verify k > 1  the same one level up, under `lax.cond`, when some sequence's level-k
                  input is ready

A verification is five small steps, each its own method and named scope: forward,
accept, rollback, emit (top level only), record. Everything that differs between methods is
asked of a policy (`policies.py`): the drafter, the window policy, the acceptance rule,
the companion. docs/engine.md describes the whole loop.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from hispec_jax.decoding import emit
from hispec_jax.decoding import policies
from hispec_jax.decoding.acceptance import Verdict
from hispec_jax.decoding.backbone import TRANSFORMER, Backbone
from hispec_jax.decoding.engine.hierarchy import Hierarchy
from hispec_jax.decoding.engine.state import (EngineState, gather_positions, ring_read,
                                              ring_write, scatter_tokens)
from hispec_jax.decoding.prefill import block_positions
from hispec_jax.decoding.request import Request
from hispec_jax.decoding.sampling import filtered_logprobs
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVBlock


@dataclasses.dataclass(frozen=True)
class Forward:
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


class Round:
    """The passes of one speculation round (closes over the static settings and the loop's
    inputs; every method maps an `EngineState` to an `EngineState`).

    Per sequence, c_k = `processed_BxK[:, k]`: positions < c_k have been run through level
    k's layers. Tokens up to position c_k are accepted by level k; the token at c_k itself
    is level k's newest choice (a draft, or a verifier's correction or bonus), not yet
    processed by level k. c_0 >= c_1 >= ... >= c_{K-1}; the committed length is
    c_{K-1} + 1.

        tokens   . . . . A A A A D D D D D ?        A: accepted by level 1,  D: drafts
        c_2 (top) ------^       |         |         (K = 3)
        c_1 ---------------------^         |
        c_0 --------------------------------^       ? = newest draft (unprocessed)

    Level k's input is [c_k, c_{k-1}): `pending(state, k)` = c_{k-1} - c_k positions.
    """

    def __init__(self, params, heads, req: Request, cfg: ModelConfig, h: Hierarchy,
                 greedy: bool, backbone: Backbone = TRANSFORMER):
        self.params, self.heads, self.req, self.cfg, self.h, self.greedy = (
            params, heads, req, cfg, h, greedy)
        self.backbone = backbone  # the model's functions (`decoding/backbone.py`)

    # ---- readiness --------------------------------------------------------------------
    def pending(self, state: EngineState, k: int) -> jax.Array:
        """[B] positions level k - 1 processed that level k has not verified."""
        c = state.processed_BxK
        return c[:, k - 1] - c[:, k]

    def ready(self, state: EngineState, k: int) -> jax.Array:
        """[B] bool: level k's input is ready (its window is full, or the tokens accepted by
        level k - 1 beyond the committed length cover the rest of the budget: drafting
        further would be wasted work). Level 1's readiness is the drafter's to say."""
        out, pending_B = state.out, self.pending(state, k)
        ahead_B = state.processed_BxK[:, k - 1] + 1 - out.lengths_B
        remaining_B = self.req.max_new_B - out.num_new_B
        ready_B = (self.h.window_policy.ready(state.windows, k, pending_B)
                   | ((ahead_B >= remaining_B) & (pending_B > 0)))
        if k == 1:
            return self.h.drafter.ready(state, ready_B, pending_B)
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

    # ---- the round ----------------------------------------------------------------------
    def __call__(self, state: EngineState) -> EngineState:
        K = self.h.num_levels
        state = state.replace(counters=state.counters.replace(
            rounds=state.counters.rounds + 1))
        if K == 1:  # the only level drafts and emits one token per round
            with jax.named_scope("draft"):
                return self.h.drafter.draft(self, state, ~state.out.done_B)
        with jax.named_scope("draft"):
            state = self.draft_phase(state)
        state = self.verify_at_shortest_block(state, 1, self.participants(state, 1))
        for k in range(2, K):
            part_B = self.participants(state, k)
            if self.h.schedule == "sync":  # run only if some sequence's input is ready
                run = jnp.any(part_B & self.ready(state, k))
            else:
                run = jnp.any(part_B)
            state = jax.lax.cond(run, functools.partial(self.verify_at_shortest_block, k=k,
                                                        part_B=part_B),
                                 lambda s: s, state)
        return state

    # ---- a round without drafts ---------------------------------------------------------
    @property
    def has_plain(self) -> bool:
        """Whether rounds without drafts run as `plain` rounds: two levels, and a drafter that
        says which sequences draft nothing (`idle`)."""
        return self.h.num_levels == 2 and hasattr(self.h.drafter, "idle")

    def all_idle(self, state: EngineState) -> jax.Array:
        """[] bool: no active sequence drafts in the next round (`has_plain` only)."""
        return jnp.all(state.out.done_B | self.h.drafter.idle(self, state))

    def plain(self, state: EngineState) -> EngineState:
        """A round in which no sequence drafts (`all_idle`): the drafter closes each block
        with its placeholder alone (`close_idle`) and the top level verifies that one
        position in a pass that writes the cache as it goes, outside any branch: AR's step.
        The same round through `verify_at_shortest_block` would run level 1's pass in a
        branch that only reads the cache and attends to the cache and the block apart, which
        cost a round at window 0 6-10 % more CPU time than AR's step on CPU. `Engine` runs
        plain rounds in a loop of their own after each round that drafts."""
        state = state.replace(counters=state.counters.replace(
            rounds=state.counters.rounds + 1))
        with jax.named_scope("draft"):
            state = self.h.drafter.close_idle(self, state, ~state.out.done_B)
        return self.verify(state, 1, self.participants(state, 1), T=1)

    def draft_phase(self, state: EngineState) -> EngineState:
        """Draft steps until every sequence's level-1 input is ready (steps after the first
        run under `lax.cond`, only if some sequence drafts). A sequence whose input to a
        higher level is already ready does not draft (that level verifies first)."""
        drafter, K = self.h.drafter, self.h.num_levels
        active_B = ~state.out.done_B
        higher_ready_B = jnp.zeros_like(active_B)
        for k in range(2, K):
            higher_ready_B |= self.ready(state, k)
        for step in range(drafter.steps(self.h.blocks[0])):
            part_B = active_B & ~higher_ready_B & ~self.ready(state, 1)
            if step == 0:
                state = drafter.draft(self, state, part_B)
            else:
                state = jax.lax.cond(jnp.any(part_B),
                                     functools.partial(drafter.draft, self, part_B=part_B),
                                     lambda s: s, state)
        return state

    def verify_at_shortest_block(self, state: EngineState, k: int,
                                 part_B: jax.Array) -> EngineState:
        """Level k's verification, run at the shortest compiled block that holds every
        participant's pending tokens.

        A pass costs by its block length, and what reaches a level varies from round to
        round: SV's top level verifies a chosen prefix of the drafts, and every level above
        a lookup drafter gets as many tokens as the lookup matched. Such a level is compiled
        at several lengths (`Hierarchy.level_blocks`, one `lax.switch` branch each), so a
        short verification costs a short pass (a round without a lookup match: one
        position, an AR step). A level with one static block runs it directly."""
        blocks = self.h.level_blocks(k)
        if not blocks:
            return self.verify(state, k, part_B)
        sizes = jnp.asarray(blocks, jnp.int32)
        longest = jnp.max(jnp.where(part_B, self.pending(state, k), 0))
        # (the first block >= longest: a count, where searchsorted is a loop of XLA ops)
        index = jnp.minimum(jnp.sum(sizes < longest), len(blocks) - 1)
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
        positions_BxT, kv, rider = jax.lax.optimization_barrier((positions_BxT, kv, state.rider))
        lo, _ = self.h.layer_range(k)
        cache = cache.write_block(lo, positions_BxT, kv)
        if rider is not None:  # a prefill chunk rode the pass: its keys/values, in its row
            cache = cache.write_block(lo, rider.positions_1xC, rider.kv, row=rider.row)
            rider = rider.replace(kv=None)
        return state.replace(cache=cache, rider=rider)

    # ---- level k > 0: verify the level below --------------------------------------------
    def verify(self, state: EngineState, k: int, part_B: jax.Array,
               T: int | None = None, pad_kv_to: int | None = None):
        """Forward (over a block of T positions, default the level's static block),
        acceptance, rollback, emit (top level), then policy and counters.

        With `pad_kv_to` (a `lax.switch` branch of `verify_at_shortest_block`) the pass only
        reads the cache and returns (state, the block's positions [B, pad_kv_to] (padding:
        S), its keys/values as a `KVBlock` padded to pad_kv_to) for the caller to write."""
        with jax.named_scope(f"verify_level{k}"):
            with jax.named_scope("forward"):
                fwd, state = self.forward(state, k, part_B, T, write_cache=pad_kv_to is None)
            with jax.named_scope("accept"):
                verdict = self.accept(state, k, fwd)
            with jax.named_scope("rollback"):
                state = self.rollback(state, k, part_B, fwd, verdict)
            if k == self.h.num_levels - 1:
                with jax.named_scope("emit"):
                    state = self.emit_accepted(state, part_B, fwd)
            with jax.named_scope("record"):
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
        """Continues the layer-e_{k-1} states of [c_k, c_{k-1}) through level k's layers
        (writing their keys/values; `write_cache` False: only reading the cache and keeping
        them in `Forward.kv`) and computes level k's exit. Level 1 starts from what the
        drafter says (`Drafter.verify_input`), a level above from the ring of the level
        below.

            positions   c_k  c_k+1 ... c_{k-1}-1  S S      (T slots, n_B valid)
            checks      x at c_k+1 ... c_{k-1}             (each slot's exit predicts the next)
        """
        cfg, T = self.cfg, T or self.h.blocks[k - 1]
        lo, hi = self.h.layer_range(k)
        c, tokens_BxS = state.processed_BxK, state.out.tokens_BxS
        S = tokens_BxS.shape[1]
        start_B = c[:, k]
        n_B = jnp.where(part_B, c[:, k - 1] - start_B, 0)
        positions_BxT = block_positions(start_B, n_B, T, S)
        proposed_pos_BxT = start_B[:, None] + 1 + jnp.arange(T)[None, :]
        valid_BxT = jnp.arange(T)[None, :] < n_B[:, None]
        if k == 1:
            x_BxTxD, state, lo, passes, evals = self.h.drafter.verify_input(
                self, state, positions_BxT, valid_BxT, write_cache)
        else:
            x_BxTxD, passes, evals = ring_read(state.hidden[k - 1], positions_BxT), 0, 0
        passes, evals = passes + hi - lo, evals + (hi - lo) * jnp.sum(n_B)
        kv, rider = None, state.rider if k == 1 else None  # a prefill chunk rides level 1
        if write_cache:
            result = self.backbone.run_layers_cached(self.params, cfg, x_BxTxD, positions_BxT,
                                                     state.cache, lo, hi, rider=rider)
            h_BxTxD, cache = result[:2]
        else:
            result = self.backbone.run_layers(self.params, cfg, x_BxTxD, positions_BxT,
                                              state.cache, lo, hi, split_context=True,
                                              rider=rider)
            (h_BxTxD, kv), cache = result[:2], state.cache
        if rider is not None:
            state = state.replace(rider=result[2])
        with jax.named_scope("head"):
            logits_BxTxV = self.backbone.exit_logits(self.params, self.heads, cfg, h_BxTxD, hi)
        if k == self.h.num_levels:  # the top level decides: no EOS before min_new_B
            logits_BxTxV = emit.suppress_eos(
                logits_BxTxV, self.req.eos_ids_E,
                proposed_pos_BxT - self.req.prompt_lens_B[:, None], self.req.min_new_B)
        target_BxTxV = (logits_BxTxV if self.greedy
                        else filtered_logprobs(logits_BxTxV, self.req.sampling))
        fwd = Forward(start_B=start_B, n_B=n_B, positions_BxT=positions_BxT,
                      proposed_pos_BxT=proposed_pos_BxT,
                      proposed_BxT=gather_positions(tokens_BxS, proposed_pos_BxT),
                      h_BxTxD=h_BxTxD, target_BxTxV=target_BxTxV, layer_passes=passes,
                      layer_token_evals=evals, kv=kv)
        return fwd, state.replace(cache=cache)

    def accept(self, state: EngineState, k: int, fwd: Forward) -> Verdict:
        """The acceptance rule on the block (the level below's distributions as `q`); a level
        with a companion (SV's level 1) asks it how many drafts to pass up instead."""
        if k == 1:
            proposal_BxTxV = self.h.drafter.proposal_logq(self, state, fwd.proposed_pos_BxT,
                                                          fwd.proposed_BxT)
        else:
            proposal_BxTxV = (ring_read(state.dists[k - 1], fwd.proposed_pos_BxT)
                              if state.dists else None)
        if self.companion(k) is not None:
            return self.companion(k).select(fwd.target_BxTxV, proposal_BxTxV, fwd.proposed_BxT,
                                            fwd.n_B, self.greedy)
        return self.h.rule.accept(fwd.target_BxTxV, proposal_BxTxV, fwd.proposed_BxT, fwd.n_B,
                                  self.keys(state, k))

    def rollback(self, state: EngineState, k: int, part_B: jax.Array, fwd: Forward,
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
            hidden[k] = ring_write(hidden[k], fwd.positions_BxT, fwd.h_BxTxD, valid_BxT)
            if dists:
                passed_BxTxV = fwd.target_BxTxV
                if self.companion(k) is not None:  # the companion says which q goes up
                    passed_BxTxV = self.companion(k).passed_dists(
                        fwd.target_BxTxV, ring_read(dists[0], fwd.proposed_pos_BxT))
                dists[k] = ring_write(dists[k], fwd.proposed_pos_BxT, passed_BxTxV, valid_BxT)
        tokens_BxS = scatter_tokens(out.tokens_BxS, reject_pos_B, verdict.next_token_B,
                                    rejected_B)
        new_ck_B = jnp.where(rejected_B, reject_pos_B, c[:, k - 1])
        c = c.at[:, k].set(jnp.where(part_B, new_ck_B, fwd.start_B))
        for lower in range(k):
            c = c.at[:, lower].set(jnp.where(rejected_B, reject_pos_B, c[:, lower]))
        return state.replace(out=out.replace(tokens_BxS=tokens_BxS), processed_BxK=c,
                             hidden=tuple(hidden), dists=tuple(dists))

    def emit_accepted(self, state: EngineState, part_B: jax.Array, fwd: Forward) -> EngineState:
        """The top level emits the tokens it accepted plus its correction (EOS/budget cuts)."""
        K = self.h.num_levels
        count_B = jnp.where(part_B, state.processed_BxK[:, K - 1] - fwd.start_B, 0)
        block_BxT = gather_positions(state.out.tokens_BxS, fwd.proposed_pos_BxT)
        out, emitted_B = emit.append_block(state.out, block_BxT, count_B, self.req.eos_ids_E,
                                           self.req.max_new_B)
        counters = state.counters
        return state.replace(out=out, counters=counters.replace(
            emitted=counters.emitted + jnp.sum(emitted_B)))

    def record(self, state: EngineState, k: int, part_B: jax.Array, fwd: Forward,
               verdict: Verdict) -> EngineState:
        """Window policy and drafter updates, true-reject bookkeeping (App. H) and
        counters."""
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
        counters = counters.replace(
            actions_K=counters.actions_K.at[k].add(1),
            block_passes_KxT=counters.block_passes_KxT.at[k, T].add(1),
            layer_passes=counters.layer_passes + fwd.layer_passes,
            layer_token_evals=counters.layer_token_evals + fwd.layer_token_evals,
            head_evals_E=counters.head_evals_E.at[self.h.exits[k]].add(1),
            verifications_K=counters.verifications_K.at[k].add(jnp.sum(n_B > 0)),
            proposed_K=counters.proposed_K.at[k].add(jnp.sum(n_B)),
            accepted_K=counters.accepted_K.at[k].add(jnp.sum(jnp.where(part_B, passed_B, 0))))
        state = state.replace(rejected_pos_BxW=rej_pos, rejected_tok_BxW=rej_tok,
                              windows=windows, draws_B=state.draws_B + part_B,
                              counters=counters)
        if k == 1:  # the drafter adapts to what level 1 kept
            state = self.h.drafter.record(self, state, part_B, m_B)
        return state
