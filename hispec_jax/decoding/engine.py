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

Every loop iteration performs one action for the whole batch (lockstep schedule, each
sequence with its own positions and counts):

    draft (level 0):     run token at c_0 through [0, e_0), exit e_0 proposes c_0 + 1
    verify (level k>0):  continue the buffered layer-e_{k-1} states of positions
                         [c_k, c_{k-1}) through [e_{k-1}, e_k); exit e_k checks the tokens
                         at c_k + 1 .. c_{k-1} (acceptance rule); at the first rejection its
                         own token replaces the proposal and every lower level rolls back
                         to that position

    tokens   . . . . A A A A D D D D D ?        A: accepted by level 1,  D: drafts
    c_2 (top) ------^       |         |         (K = 3)
    c_1 ---------------------^         |
    c_0 --------------------------------^       ? = newest draft (unprocessed)

The action is the highest level k whose input holds at least `window + 1` positions (or
covers the rest of the budget) for some active sequence (`windows.py`); otherwise the draft
level drafts one token. Who takes part is `Hierarchy.schedule`: every unfinished sequence
("sync", greedy) or only the sequences that wanted this action ("own", sampling, so that a
sequence's random draws never depend on the rest of the batch). A level
never processes a position twice while its token stays valid: verification continues the
lower level's buffered hidden states (ring buffers of the last W positions per level), and
KV entries of rolled-back positions are simply overwritten later (causal masking by
absolute position makes stale slots harmless; see `kv_cache.py`). The top level's
accepted tokens are emitted with EOS and budget cuts (`emit.py`).

Sampling mode: each level samples from / verifies against its own filtered distribution
(`sampling.filtered_logprobs`), and keeps the distributions of the tokens it passes up in a
ring buffer, because they are the `q` the level above divides by (`acceptance.py`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from hispec_jax.decoding import emit
from hispec_jax.decoding import windows as windows_lib
from hispec_jax.decoding.acceptance import GreedyAcceptance
from hispec_jax.decoding.prefill import block_positions, prefill
from hispec_jax.decoding.request import Request
from hispec_jax.decoding.sampling import choose_tokens, filtered_logprobs
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVBlock, KVCache
from hispec_jax.models.transformer import embed, run_layers


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """Static description of an exit hierarchy (a `jit` static argument).

    Attributes:
      exits: (e_0, ..., e_{K-1}), strictly increasing; e_{K-1} is the top level.
      max_windows: per verifying level k = 1..K-1, the largest window its input may be
        given (draft_len for k = 1, verify_window above); sizes the static blocks.
      adaptive: adjust draft_len and the window below the top level (App. J).
      rule: the acceptance rule (greedy, token-wise rejection or blockwise verification).
      schedule: who takes part in an action. "sync": every unfinished sequence (keeps the
        batch in phase; used for greedy decoding, whose output does not depend on the
        schedule). "own": only the sequences that chose that action themselves, so every
        sequence follows exactly the schedule it would follow alone and its random draws
        do not depend on the rest of the batch (sampling).
    """

    exits: tuple[int, ...]
    max_windows: tuple[int, ...] = ()
    adaptive: bool = False
    rule: Any = GreedyAcceptance()
    schedule: str = "sync"

    @property
    def num_levels(self) -> int:
        return len(self.exits)

    @property
    def blocks(self) -> tuple[int, ...]:
        """Static block length of each verifying level's pass (index k - 1 for level k)."""
        return windows_lib.block_lengths(tuple(w + 1 for w in self.max_windows))

    @property
    def max_block(self) -> int:
        """The longest block any action processes (drafts process 1 position)."""
        return max(self.blocks, default=1)

    @property
    def ring(self) -> int:
        """W: positions each hidden-state ring buffer holds."""
        return max(self.blocks, default=1) + 1

    @property
    def lookahead(self) -> int:
        """How far past the committed length tokens and KV entries may be written."""
        return sum(self.blocks) + 1

    def layer_range(self, level: int) -> tuple[int, int]:
        return (self.exits[level - 1] if level else 0), self.exits[level]


@flax.struct.dataclass
class Counters:
    """Cost and acceptance counters, summed over the batch (K = number of levels).

    Attributes:
      actions_K: [K] loop iterations spent at each level (level 0: draft steps).
      layer_passes: [] sequential layer passes (each action adds its level's depth once).
      layer_token_evals: [] layers x valid tokens actually computed (decode, not prefill).
      verifications_K: [K] (sequence, verification) pairs with something to verify.
      proposed_K: [K] tokens submitted to each verifying level.
      accepted_K: [K] of those, tokens the level accepted.
      emitted: [] tokens the top level emitted (after EOS and budget cuts).
      reject_checks: [] rejections by the level below the top, later checked by the top.
      true_rejects: [] of those, rejections the top level agreed with.
    """

    actions_K: jax.Array
    layer_passes: jax.Array
    layer_token_evals: jax.Array
    verifications_K: jax.Array
    proposed_K: jax.Array
    accepted_K: jax.Array
    emitted: jax.Array
    reject_checks: jax.Array
    true_rejects: jax.Array

    @classmethod
    def zeros(cls, K: int) -> "Counters":
        z = jnp.zeros((), jnp.int32)
        zk = jnp.zeros((K,), jnp.int32)
        return cls(zk, z, z, zk, zk, zk, z, z, z)


@flax.struct.dataclass
class EngineState:
    """The while-loop state.

    Attributes:
      out: output buffer; `out.tokens_BxS` also holds tentative tokens past the committed
        length (slot == position).
      cache: KV cache [L', B, K, S, H] of layers [0, top).
      processed_BxK: [B, K] int32, c_k per level.
      hidden: K - 1 ring buffers [B, W, D]; entry k holds layer-e_k states of positions
        [c_{k+1}, c_k) at slot position % W.
      rejected_pos_BxW, rejected_tok_BxW: [B, W] int32, the drafts the level below the top
        rejected, by position % W (position -1: none), for the true-reject rate.
      windows_BxK1: [B, K - 1] int32, current windows (draft_len, verify windows).
      rates_BxK1: [B, K - 1] float32, running acceptance rate of levels 1..K-1 (adaptive).
      dists: sampling rules only: K - 1 ring buffers [B, W, V] float32; entry k holds level
        k's log-distribution for the tokens it passed up (positions (c_{k+1}, c_k]), the `q`
        of the level above. Empty for greedy decoding.
      draws_B: [B] int32, actions each sequence took part in; with the sequence's key it
        seeds every random draw, so draws never repeat and never depend on other sequences.
      counters: `Counters`.
    """

    out: emit.Output
    cache: KVCache
    processed_BxK: jax.Array
    hidden: tuple[jax.Array, ...]
    rejected_pos_BxW: jax.Array
    rejected_tok_BxW: jax.Array
    windows_BxK1: jax.Array
    rates_BxK1: jax.Array
    dists: tuple[jax.Array, ...]
    draws_B: jax.Array
    counters: Counters


def _gather_positions(tokens_BxS, positions_BxT):
    S = tokens_BxS.shape[1]
    return jnp.take_along_axis(tokens_BxS, jnp.clip(positions_BxT, 0, S - 1), axis=1)


def _scatter_tokens(tokens_BxS, positions_B, values_B, mask_B):
    S = tokens_BxS.shape[1]
    positions_B = jnp.where(mask_B, positions_B, S)
    return tokens_BxS.at[jnp.arange(tokens_BxS.shape[0]), positions_B].set(values_B, mode="drop")


class _Step:
    """The actions of one compiled loop (closes over static settings and loop inputs)."""

    def __init__(self, params, heads, req: Request, cfg: ModelConfig, h: Hierarchy, greedy: bool):
        self.params, self.heads, self.req, self.cfg, self.h, self.greedy = (
            params, heads, req, cfg, h, greedy)

    # ---- readiness and schedule ------------------------------------------------------
    def action(self, state: EngineState) -> tuple[jax.Array, jax.Array]:
        """(level to run, [B] which sequences take part).

        Each unfinished sequence wants the highest level k whose input (level k-1's
        processed-but-unverified positions) holds `window + 1` positions, or covers what is
        left of its budget; else it wants to draft. The batch runs the highest wanted level.
        """
        K = self.h.num_levels
        c = state.processed_BxK
        out = state.out
        active_B = ~out.done_B
        remaining_B = self.req.max_new_B - out.num_new_B
        wants_B = jnp.zeros_like(remaining_B)
        for k in range(1, K):
            pending_B = c[:, k - 1] - c[:, k]
            # Tokens already accepted at level k-1 beyond the committed length: once they
            # cover the remaining budget, drafting further is wasted work.
            ahead_B = c[:, k - 1] + 1 - out.lengths_B
            ready_B = (pending_B >= state.windows_BxK1[:, k - 1] + 1) | (
                (ahead_B >= remaining_B) & (pending_B > 0))
            wants_B = jnp.where(ready_B, k, wants_B)
        level = jnp.max(jnp.where(active_B, wants_B, 0))
        if self.h.schedule == "own":
            return level, active_B & (wants_B == level)
        return level, active_B

    def keys(self, state: EngineState, purpose: int) -> jax.Array:
        """Per-sequence PRNG keys for this action's draws (fresh for every action)."""
        keys_Bx2 = jax.vmap(jax.random.fold_in)(self.req.sequence_keys_Bx2, state.draws_B)
        return jax.vmap(lambda k: jax.random.fold_in(k, purpose))(keys_Bx2)

    def kv_update(self, kv: KVBlock, positions_BxT, start: int) -> tuple[KVBlock, jax.Array]:
        """Pads a level's new keys/values to every cached layer and the largest block, so all
        branches return one shape; layers and entries outside get the sentinel position."""
        L, T = self.h.exits[-1], self.h.max_block
        n, B, t = kv.k.shape[:3]
        S = self.req.tokens_BxS.shape[1]
        pad = lambda a: jnp.zeros((L, B, T) + a.shape[3:], a.dtype).at[start:start + n, :, :t].set(a)
        positions_LxBxT = jnp.full((L, B, T), S, jnp.int32).at[start:start + n, :, :t].set(
            jnp.broadcast_to(positions_BxT, (n, B, t)))
        return KVBlock(k=pad(kv.k), v=pad(kv.v)), positions_LxBxT

    def _ring_write(self, ring_BxWx, positions_BxT, values_BxTx, mask_BxT):
        W = self.h.ring
        slots_BxT = jnp.where(mask_BxT, positions_BxT % W, W)
        return ring_BxWx.at[jnp.arange(ring_BxWx.shape[0])[:, None], slots_BxT].set(
            values_BxTx.astype(ring_BxWx.dtype), mode="drop")

    def _ring_read(self, ring_BxWx, positions_BxT):
        return ring_BxWx[jnp.arange(ring_BxWx.shape[0])[:, None], positions_BxT % self.h.ring]

    # ---- level 0: draft one token -----------------------------------------------------
    def draft(self, state: EngineState, cache: KVCache, part_B: jax.Array):
        cfg, h = self.cfg, self.h
        out, c = state.out, state.processed_BxK
        S = out.tokens_BxS.shape[1]
        pos_B = c[:, 0]
        token_B = _gather_positions(out.tokens_BxS, pos_B[:, None])[:, 0]
        positions_Bx1 = jnp.where(part_B, pos_B, S)[:, None]
        hi = h.exits[0]
        with jax.named_scope("draft"):
            h_Bx1xD, kv = run_layers(self.params, cfg, embed(self.params, token_B[:, None]),
                                     positions_Bx1, cache, 0, hi)
            logits_BxV = exit_logits(self.params, self.heads, cfg, h_Bx1xD, hi)[:, 0]
            if self.greedy:
                next_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
            else:
                logp_BxV = filtered_logprobs(logits_BxV, self.req.sampling)
                next_B = jax.vmap(jax.random.categorical)(self.keys(state, 0), logp_BxV)
                next_B = next_B.astype(jnp.int32)
        hidden, dists = state.hidden, state.dists
        if h.num_levels > 1:
            hidden = (self._ring_write(hidden[0], pos_B[:, None], h_Bx1xD, part_B[:, None]),) + hidden[1:]
            if dists:
                dists = (self._ring_write(dists[0], pos_B[:, None] + 1, logp_BxV[:, None],
                                          part_B[:, None]),) + dists[1:]
        tokens_BxS = _scatter_tokens(out.tokens_BxS, pos_B + 1, next_B, part_B)
        out = out.replace(tokens_BxS=tokens_BxS)
        counters = state.counters
        if h.num_levels == 1:  # the draft level is the top level: emit directly
            out, emitted_B = emit.append_block(out, next_B[:, None], part_B.astype(jnp.int32),
                                               self.req.eos_ids_E, self.req.max_new_B)
            counters = counters.replace(emitted=counters.emitted + jnp.sum(emitted_B))
        c = c.at[:, 0].add(part_B.astype(jnp.int32))
        counters = counters.replace(
            actions_K=counters.actions_K.at[0].add(1),
            layer_passes=counters.layer_passes + hi,
            layer_token_evals=counters.layer_token_evals + hi * jnp.sum(part_B))
        state = state.replace(out=out, processed_BxK=c, hidden=hidden, dists=dists,
                              draws_B=state.draws_B + part_B, counters=counters)
        return state, self.kv_update(kv, positions_Bx1, 0)

    # ---- level k > 0: verify the level below --------------------------------------------
    def verify(self, state: EngineState, cache: KVCache, part_B: jax.Array, k: int):
        cfg, h = self.cfg, self.h
        K, W = h.num_levels, h.ring
        T = h.blocks[k - 1]
        lo, hi = h.layer_range(k)
        out, c = state.out, state.processed_BxK
        S = out.tokens_BxS.shape[1]
        B = c.shape[0]
        start_B = c[:, k]
        n_B = jnp.where(part_B, c[:, k - 1] - start_B, 0)
        j_T = jnp.arange(T)
        valid_BxT = j_T[None, :] < n_B[:, None]
        positions_BxT = block_positions(start_B, n_B, T, S)
        proposed_pos_BxT = start_B[:, None] + 1 + j_T[None, :]
        batch_Bx1 = jnp.arange(B)[:, None]
        with jax.named_scope(f"verify_level{k}"):
            x_BxTxD = self._ring_read(state.hidden[k - 1], positions_BxT)
            h_BxTxD, kv = run_layers(self.params, cfg, x_BxTxD, positions_BxT, cache, lo, hi)
            logits_BxTxV = exit_logits(self.params, self.heads, cfg, h_BxTxD, hi)
            proposed_BxT = _gather_positions(out.tokens_BxS, proposed_pos_BxT)
            if self.greedy:
                target_BxTxV, proposal_BxTxV = logits_BxTxV, None
            else:
                target_BxTxV = filtered_logprobs(logits_BxTxV, self.req.sampling)
                proposal_BxTxV = self._ring_read(state.dists[k - 1], proposed_pos_BxT)
            verdict = h.rule.accept(target_BxTxV, proposal_BxTxV, proposed_BxT, n_B,
                                    self.keys(state, k))
        m_B = verdict.num_accepted_B
        rejected_B = part_B & (m_B < n_B)
        reject_pos_B = start_B + m_B + 1
        hidden, dists = list(state.hidden), list(state.dists)
        if k < K - 1:  # buffer this level's states (and distributions) for the level above
            hidden[k] = self._ring_write(hidden[k], positions_BxT, h_BxTxD, valid_BxT)
            if dists:
                dists[k] = self._ring_write(dists[k], proposed_pos_BxT, target_BxTxV, valid_BxT)
        tokens_BxS = _scatter_tokens(out.tokens_BxS, reject_pos_B, verdict.next_token_B, rejected_B)
        new_ck_B = jnp.where(rejected_B, reject_pos_B, c[:, k - 1])
        new_ck_B = jnp.where(part_B, new_ck_B, start_B)
        c = c.at[:, k].set(new_ck_B)
        for lower in range(k):  # roll lower levels back to the corrected position
            c = c.at[:, lower].set(jnp.where(rejected_B, reject_pos_B, c[:, lower]))
        out = out.replace(tokens_BxS=tokens_BxS)

        counters = state.counters
        rej_pos, rej_tok = state.rejected_pos_BxW, state.rejected_tok_BxW
        if K >= 3 and k == K - 2:  # record this level's rejections for the true-reject rate
            record_BxT = valid_BxT & (j_T[None, :] == m_B[:, None]) & rejected_B[:, None]
            rec_slots_BxT = jnp.where(valid_BxT, proposed_pos_BxT % W, W)
            rej_pos = rej_pos.at[batch_Bx1, rec_slots_BxT].set(
                jnp.where(record_BxT, proposed_pos_BxT, -1), mode="drop")
            rej_tok = rej_tok.at[batch_Bx1, rec_slots_BxT].set(proposed_BxT, mode="drop")
        if K >= 3 and k == K - 1:  # check recorded rejections where the prefix was accepted
            checked_BxT = valid_BxT & (j_T[None, :] <= m_B[:, None])
            rec_slots_BxT = proposed_pos_BxT % W
            has_rec_BxT = checked_BxT & (rej_pos[batch_Bx1, rec_slots_BxT] == proposed_pos_BxT)
            agree_BxT = verdict.predictions_BxT != rej_tok[batch_Bx1, rec_slots_BxT]
            counters = counters.replace(
                reject_checks=counters.reject_checks + jnp.sum(has_rec_BxT),
                true_rejects=counters.true_rejects + jnp.sum(has_rec_BxT & agree_BxT))

        if k == K - 1:  # top level: emit what it accepted
            count_B = jnp.where(part_B, new_ck_B - start_B, 0)
            block_BxT = _gather_positions(tokens_BxS, proposed_pos_BxT)
            out, emitted_B = emit.append_block(out, block_BxT, count_B, self.req.eos_ids_E,
                                               self.req.max_new_B)
            counters = counters.replace(emitted=counters.emitted + jnp.sum(emitted_B))

        windows_BxK1, rates_BxK1 = state.windows_BxK1, state.rates_BxK1
        if h.adaptive:
            rate_B = windows_lib.ema(rates_BxK1[:, k - 1], m_B, n_B, n_B > 0)
            rates_BxK1 = rates_BxK1.at[:, k - 1].set(rate_B)
            policy = windows_lib.AdaptiveWindows()
            if k == 1:
                windows_BxK1 = windows_BxK1.at[:, 0].set(policy.update_draft(rate_B, windows_BxK1[:, 0]))
            if k == K - 1 and K >= 3:
                windows_BxK1 = windows_BxK1.at[:, K - 2].set(
                    policy.update_verify(rate_B, windows_BxK1[:, K - 2]))
        depth = hi - lo
        counters = counters.replace(
            actions_K=counters.actions_K.at[k].add(1),
            layer_passes=counters.layer_passes + depth,
            layer_token_evals=counters.layer_token_evals + depth * jnp.sum(n_B),
            verifications_K=counters.verifications_K.at[k].add(jnp.sum(n_B > 0)),
            proposed_K=counters.proposed_K.at[k].add(jnp.sum(n_B)),
            accepted_K=counters.accepted_K.at[k].add(jnp.sum(jnp.where(part_B, m_B, 0))))
        state = state.replace(out=out, processed_BxK=c, hidden=tuple(hidden), dists=tuple(dists),
                              rejected_pos_BxW=rej_pos, rejected_tok_BxW=rej_tok,
                              windows_BxK1=windows_BxK1, rates_BxK1=rates_BxK1,
                              draws_B=state.draws_B + part_B, counters=counters)
        return state, self.kv_update(kv, positions_BxT, lo)


@functools.partial(jax.jit, static_argnames=("cfg", "hierarchy", "greedy", "prompt_block"))
def run_hierarchy(params, heads, req: Request, cache: KVCache, windows_K1: jax.Array, *,
                  cfg: ModelConfig, hierarchy: Hierarchy, greedy: bool,
                  prompt_block: int) -> EngineState:
    """Prefill, then the draft / verify state machine until every sequence is done.

    Args:
      params, heads: model parameters and exit heads.
      req: the batch (prompts, budgets, EOS ids, PRNG keys, sampling settings).
      cache: an empty cache with at least `hierarchy.exits[-1]` layers.
      windows_K1: [K - 1] int32 initial windows (draft_len, then verify windows); arrays,
        so changing them does not recompile.
      cfg, hierarchy, greedy, prompt_block: static.
    """
    h = hierarchy
    K, top = h.num_levels, h.exits[-1]
    B = req.prompt_lens_B.shape[0]
    if not greedy and K > 1 and not h.rule.needs_proposal_dists:
        raise ValueError("sampling with a speculative hierarchy needs a sampling acceptance rule")
    with jax.named_scope("prefill"):
        h_BxD, cache = prefill(params, cfg, req.tokens_BxS[:, :prompt_block], req.prompt_lens_B,
                               cache, top)
        logits_BxV = exit_logits(params, heads, cfg, h_BxD[:, None], top)[:, 0]
        first_keys = jax.vmap(jax.random.fold_in)(req.sequence_keys_Bx2, jnp.full((B,), -1))
        first_B = choose_tokens(logits_BxV, greedy, req.sampling, first_keys)
        out = emit.start_output(req.tokens_BxS, req.prompt_lens_B, req.max_new_B)
        out, _ = emit.append_block(out, first_B[:, None], jnp.ones_like(first_B), req.eos_ids_E,
                                   req.max_new_B)
    dtype = jnp.dtype(cfg.dtype)
    sampled_dists = not greedy and K > 1
    state = EngineState(
        out=out,
        cache=cache,
        processed_BxK=jnp.broadcast_to(req.prompt_lens_B[:, None], (B, K)).astype(jnp.int32),
        hidden=tuple(jnp.zeros((B, h.ring, cfg.hidden_size), dtype) for _ in range(K - 1)),
        rejected_pos_BxW=jnp.full((B, h.ring), -1, jnp.int32),
        rejected_tok_BxW=jnp.zeros((B, h.ring), jnp.int32),
        windows_BxK1=jnp.broadcast_to(windows_K1.astype(jnp.int32), (B, K - 1)),
        rates_BxK1=jnp.ones((B, K - 1), jnp.float32),
        dists=tuple(jnp.full((B, h.ring, cfg.vocab_size), -jnp.inf, jnp.float32)
                    for _ in range(K - 1)) if sampled_dists else (),
        draws_B=jnp.zeros((B,), jnp.int32),
        counters=Counters.zeros(K),
    )
    step = _Step(params, heads, req, cfg, h, greedy)
    branches = [step.draft] + [functools.partial(step.verify, k=k) for k in range(1, K)]

    def body(state: EngineState) -> EngineState:
        # The cache is only read inside the branches; the chosen action's new keys/values
        # are written here, outside control flow, so XLA updates the cache in place.
        cache, rest = state.cache, state.replace(cache=None)
        level, part_B = step.action(rest)
        if K == 1:
            rest, (kv, positions_LxBxT) = step.draft(rest, cache, part_B)
        else:
            rest, (kv, positions_LxBxT) = jax.lax.switch(level, branches, rest, cache, part_B)
        return rest.replace(cache=cache.write_all_layers(positions_LxBxT, kv))

    return jax.lax.while_loop(lambda s: jnp.any(~s.out.done_B), body, state)
