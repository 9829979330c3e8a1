"""Level 0 as a draft model: a smaller model of the target's family drafts up to k tokens a
round, autoregressively, with its own KV cache, inside the compiled loop (HSD's draft
level; classic speculative decoding when the target's final layer verifies it directly).

The draft's weights are the target's `params["draft"]` (`models/draft_weights.py`); its KV
cache, how far that cache is written, the round's window and the distributions it drew from
(sampling) live in the drafter's loop state (`DraftModelState`) and the engine's ring.

One round of a sequence whose newest token x_c sits at c_0 = c_1 = c, at window w:

    draft step j = 1..w     the draft model runs position c + j - 1 (the first step also
                            c - 1 when its cache stops there: the last round's bonus),
                            writes its keys/values and proposes y_j at c + j
    the last step (or none  writes a placeholder at c + w + 1: level 1's block is complete
    when w = 0)
    level 1                 one pass of the target over positions [c, c + w] (x_c, y_1 ..
                            y_w) checks y_1 .. y_w and the placeholder: after a rejection
                            its correction, after w kept drafts its own next token (the
                            bonus) replaces the placeholder, so a round emits up to w + 1
                            tokens for w draft steps; w = 0 is an AR step

    positions    c    c+1  ...  c+w   c+w+1
    tokens       x_c  y_1  ...  y_w   ?        (? : placeholder, q one-hot)
    draft runs   c    c+1  ...  c+w-1          (its cache: positions < d = c + w)

The draft's cache holds positions < d (`cached_B`). A verifier rolls c_0 back to a rejected
position; d then exceeds c_0 and is cut to it at the next draft step (keys/values past it
are overwritten before anything reads them: every query sees only positions <= its own).
When d < c_0 - 1 (a new sequence's prompt; rounds the gate ran at w = 0), the first draft
step catches up first: the draft model runs positions [d, c_0 - 1) in chunks of `chunk`
(`catch_up`), so prefill, the serving slots and the prefill riders need to know nothing of
the draft model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from hispec_jax.decoding import acceptance as acceptance_lib
from hispec_jax.decoding import gate as gate_lib
from hispec_jax.decoding import lookup as lookup_lib
from hispec_jax.decoding import suffix_store
from hispec_jax.decoding.engine.state import (gather_positions, ring_read, ring_write,
                                              scatter_tokens)
from hispec_jax.decoding.prefill import block_positions
from hispec_jax.decoding.sampling import filtered_logprobs
from hispec_jax.decoding.windows import power_of_two_blocks
from hispec_jax.models import heads as heads_lib
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVBlock, KVCache
from hispec_jax.models.transformer import embed, run_layers, run_layers_cached


def catch_up(params, cfg: ModelConfig, chunk: int, tokens_BxS: jax.Array, cache: KVCache,
             cached_B: jax.Array, until_B: jax.Array, part_B: jax.Array):
    """Runs a draft model over positions [d, until) of the sequences in `part_B`, in chunks
    of `chunk` positions, until d = until (no trip when every d already is).
    Returns (cache, d [B], [] the positions run, [] the passes run)."""
    S = tokens_BxS.shape[1]

    def behind(carry):
        _, cached_B, _, _ = carry
        return jnp.any(part_B & (cached_B < until_B))

    def one_chunk(carry):
        cache, cached_B, ran, passes = carry
        n_B = jnp.where(part_B, jnp.clip(until_B - cached_B, 0, chunk), 0)
        positions_BxC = block_positions(cached_B, n_B, chunk, S)
        x_BxCxD = embed(params, gather_positions(tokens_BxS, positions_BxC))
        _, cache = run_layers_cached(params, cfg, x_BxCxD, positions_BxC, cache, 0,
                                     cfg.num_layers)
        return cache, cached_B + n_B, ran + jnp.sum(n_B), passes + 1

    zero = jnp.zeros((), jnp.int32)
    with jax.named_scope("draft_catch_up"):
        return jax.lax.while_loop(behind, one_chunk, (cache, cached_B, zero, zero))


def pass_macs(cfg: ModelConfig) -> int:
    """Multiply-adds per position of a draft model's pass: its layers and its head."""
    return cfg.num_layers * heads_lib.layer_macs(cfg) + cfg.hidden_size * cfg.vocab_size


def pass_logits(params, cfg: ModelConfig, cache: KVCache, tokens_BxT: jax.Array,
                positions_BxT: jax.Array, rows_BxR: jax.Array, write: bool = True):
    """One pass of a draft model over a block: the logits [B, R, V] of its rows `rows_BxR`
    (clipped into the block; the head runs on those rows only) and the cache with the
    block's keys and values (`write` False: the cache is only read, and the block's keys and
    values come back as a `KVBlock` for the caller to write)."""
    x_BxTxD = embed(params, tokens_BxT)
    if write:
        h_BxTxD, kv = run_layers_cached(params, cfg, x_BxTxD, positions_BxT, cache, 0,
                                        cfg.num_layers)
    else:
        h_BxTxD, kv = run_layers(params, cfg, x_BxTxD, positions_BxT, cache, 0, cfg.num_layers,
                                 split_context=True)
    rows_BxR = jnp.clip(rows_BxR, 0, tokens_BxT.shape[1] - 1)
    h_BxRxD = jnp.take_along_axis(h_BxTxD, rows_BxR[..., None], axis=1)
    return heads_lib.exit_logits(params, {}, cfg, h_BxRxD, cfg.num_layers), kv


@flax.struct.dataclass
class InnerState:
    """The smaller draft model's cache (HSD: the level below the draft model) and d [B]:
    it holds positions < d."""

    cache: KVCache
    cached_B: jax.Array


@dataclasses.dataclass(frozen=True)
class InnerDraftModel:
    """The smaller of two draft models (HSD's lowest level): before each pass of the draft
    model above it, it drafts up to `k` tokens autoregressively with its own cache, each a
    draw from its filtered distribution q' (greedy: its argmax), for the draft model to
    check as the target's levels check drafts (token-wise rejection with q'). Its weights
    are the draft model's `params["draft"]`.

    Attributes:
      cfg: its architecture.
      k: tokens it drafts per pass of the draft model above it (at most).
      per_layer: its layers (and cache) are per-layer buffers.
      chunk: positions per catch-up pass.
    """

    cfg: ModelConfig
    k: int = 3
    per_layer: bool = True
    chunk: int = 64

    def init(self, batch: int, capacity: int) -> InnerState:
        return InnerState(cache=KVCache.zeros(self.cfg, batch, capacity, per_layer=self.per_layer),
                          cached_B=jnp.zeros((batch,), jnp.int32))

    def propose(self, params, tokens_BxS, st: InnerState, pos_B, m_B, greedy: bool, sampling,
                key_Bx2):
        """Drafts m_B (<= k) tokens after position c = `pos_B`: runs x_c (with x_{c-1}
        when its cache stops there; first catching up to c - 1), then its own drafts; no
        pass where every m_B is 0. Its cache is written outside any `lax.cond`, as the
        draft model's (`DraftModelDrafter.draft`): the first pass only reads it in the
        switch that picks its block, and its keys/values are written after.
        Returns (tokens [B, k], log q' [B, k, V] or None (greedy), state, [] caught up)."""
        S, cfg, K = tokens_BxS.shape[1], self.cfg, self.k
        part_B = m_B > 0
        cached_B = jnp.minimum(st.cached_B, pos_B)
        cache, cached_B, ran, _ = catch_up(params, cfg, self.chunk, tokens_BxS, st.cache,
                                           cached_B, pos_B - 1, part_B)
        known_B = jnp.where(part_B, 1 + (cached_B < pos_B), 0)

        def first(T):
            def run():
                positions_BxT = block_positions(pos_B - known_B + 1, known_B, T, S)
                logits_Bx1xV, kv = pass_logits(
                    params, cfg, cache, gather_positions(tokens_BxS, positions_BxT),
                    positions_BxT, (known_B - 1)[:, None], write=False)
                pad_kv = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, 2 - T), (0, 0), (0, 0)))  # noqa: E731
                return (logits_Bx1xV[:, 0],
                        jnp.pad(positions_BxT, ((0, 0), (0, 2 - T)), constant_values=S),
                        KVBlock(k=pad_kv(kv.k), v=pad_kv(kv.v)))
            return run

        def no_pass():  # nothing drafts: the shapes of a pass, its positions all S (dropped)
            shapes = jax.eval_shape(first(2))
            zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
            return zeros[0], jnp.full_like(zeros[1], S), zeros[2]

        which = jnp.where(jnp.any(known_B == 2), 2, jnp.any(part_B).astype(jnp.int32))
        logits_BxV, positions_Bx2, kv = jax.lax.switch(which, [no_pass, first(1), first(2)])
        # (the barrier keeps XLA from moving the write back into every branch)
        positions_Bx2, kv = jax.lax.optimization_barrier((positions_Bx2, kv))
        cache = cache.write_block(0, positions_Bx2, kv)

        def choose(logits_BxV, j):
            if greedy:
                return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32), None
            logq_BxV = filtered_logprobs(logits_BxV, sampling)
            keys_Bx2 = jax.vmap(lambda k: jax.random.fold_in(k, 1000 + j))(key_Bx2)
            return jax.vmap(jax.random.categorical)(keys_Bx2, logq_BxV).astype(jnp.int32), logq_BxV

        y_B, logq_BxV = choose(logits_BxV, 0)
        tokens_BxK = jnp.zeros((pos_B.shape[0], K), jnp.int32).at[:, 0].set(y_B)
        logq_BxKxV = None if greedy else jnp.zeros(logq_BxV.shape[:1] + (K,) + logq_BxV.shape[1:],
                                                   jnp.float32).at[:, 0].set(logq_BxV)

        def step(j, carry):
            cache, tokens_BxK, logq_BxKxV = carry
            on_B = j < m_B
            positions_Bx1 = jnp.where(on_B, pos_B + j, S)[:, None]
            logits_Bx1xV, cache = pass_logits(params, cfg, cache, tokens_BxK[:, j - 1][:, None],
                                              positions_Bx1, jnp.zeros_like(positions_Bx1))
            logits_BxV = logits_Bx1xV[:, 0]
            y_B, logq_BxV = choose(logits_BxV, j)
            tokens_BxK = tokens_BxK.at[:, j].set(y_B)
            if logq_BxKxV is not None:
                logq_BxKxV = logq_BxKxV.at[:, j].set(logq_BxV)
            return cache, tokens_BxK, logq_BxKxV

        # steps only as far as some sequence drafts (a while loop: m_B is traced)
        cache, tokens_BxK, logq_BxKxV = jax.lax.fori_loop(1, jnp.max(m_B), step,
                                                          (cache, tokens_BxK, logq_BxKxV))
        # it ran positions c .. c + m - 1; `kept` fixes how many of them stay valid
        return tokens_BxK, logq_BxKxV, InnerState(cache=cache, cached_B=cached_B), ran

    @staticmethod
    def settle(st: InnerState, pos_B, m_B, kept_B) -> InnerState:
        """After the draft model kept `kept_B` of the m_B drafts after c: its cache holds the
        positions whose inputs stand, < min(c + m, c + 1 + kept)."""
        valid_B = jnp.minimum(pos_B + m_B, pos_B + 1 + kept_B)
        return st.replace(cached_B=jnp.where(m_B > 0, valid_B, st.cached_B))


@flax.struct.dataclass
class DraftModelCounters:
    """The draft model drafter's counters (`Counters.drafter`), summed over the batch.

    Attributes:
      steps: [] (sequence, draft step) pairs: passes of the draft model (catching up aside).
      drafted: [] tokens drafted (more than `steps` where a lookup's tokens were kept).
      proposed: [] drafted tokens level 1 checked.
      accepted: [] of those, tokens level 1 kept.
      caught_up: [] positions the draft model ran to catch up (prompts, skipped windows).
      catch_up_passes: [] the draft model's passes (of `chunk` positions) that caught up.
      below_proposed: [] with a lookup or a smaller draft model below the draft model, the
        tokens it proposed to the draft model.
      below_accepted: [] of those, tokens the draft model kept as its drafts.
      store_proposed, store_accepted: [] the part of `below_proposed` / `below_accepted`
        that the lookup below found in earlier requests' store (`Request.store`,
        `suffix_store.py`); 0 without one.
      wide_steps: [] of `steps`, those whose pass ran the block that holds the tokens from
        below (2 + their k positions: the planner prices them apart, `draft_plans`).
      plain_rounds: [] rounds in which no sequence drafted, run as AR's step
        (`Round.plain`; a round, not a sequence, counts one).
    """

    steps: jax.Array
    drafted: jax.Array
    proposed: jax.Array
    accepted: jax.Array
    caught_up: jax.Array
    catch_up_passes: jax.Array
    below_proposed: jax.Array
    below_accepted: jax.Array
    store_proposed: jax.Array
    store_accepted: jax.Array
    wide_steps: jax.Array
    plain_rounds: jax.Array


@flax.struct.dataclass
class DraftModelState:
    """The draft model drafter's loop state.

    Attributes:
      cache: the draft model's KV cache (its own layers, heads and width; S as the target's).
      cached_B: [B] int32, d: the draft's cache holds positions < d of each sequence.
      window_B: [B] int32, w: the drafts of the sequence's current round (set at its first
        draft step).
      sealed_B: [B] bool, the round's placeholder is written (level 1's block is complete).
      checked_B: [B] int32, the drafts level 1's pending verification checks.
      estimate: with the gate, `gate.GateState` with one bucket (decayed counts of the
        drafts level 1 kept and of its rejections); else None.
      gated_B: with the gate, [B] int32, its window for the next round; else None.
      idle_B: with the gate, [B] int32, rounds in a row at window 0 (after `PROBE_ROUNDS`
        times 2^misses the gate drafts one token, so that its estimate follows a draft that
        starts to agree); else None.
      misses_B: with the gate, [B] int32, rounds in a row whose drafts level 1 rejected
        all (at most `MAX_PROBE_DOUBLINGS`); else None.
      inner: with a smaller draft model below it, that model's state; else None.
    """

    cache: KVCache
    cached_B: jax.Array
    window_B: jax.Array
    sealed_B: jax.Array
    checked_B: jax.Array
    estimate: gate_lib.GateState | None = None
    gated_B: jax.Array | None = None
    idle_B: jax.Array | None = None
    misses_B: jax.Array | None = None
    inner: InnerState | None = None


# Rounds at window 0 after which the gate drafts one token again.
PROBE_ROUNDS = 16
# Each round in a row whose drafts were all rejected doubles the rounds before the next
# probe, up to this many times (PROBE_ROUNDS x 16 = 256 rounds): a draft that never agrees
# then costs a probe (and a catch-up of the positions skipped) about every 256 rounds.
MAX_PROBE_DOUBLINGS = 4
# The placeholder closing a round's block (any id: level 1 replaces it unless it is the
# token level 1 chooses there, which then stands as accepted).
PLACEHOLDER = 0


@dataclasses.dataclass(frozen=True)
class DraftModelDrafter:
    """Level 0 as a draft model (module docstring). Each sequence drafts w tokens a round
    (at most k = `max_windows[0]`, the window policy's window and what its budget still
    needs) and level 1 verifies them, with the placeholder its bonus replaces, from their
    token embeddings (exit e_0 = 0: the target runs no layer for the draft). With `gate`,
    the exit drafter's acceptance gate (`gate.choose_window`, with the bonus) picks each
    sequence's w in 0 .. k from its estimated acceptance at the request's pass costs, a draft
    step priced at the draft model's share of a target pass (`pass_fractions`); w = 0 is an
    AR step, and after `PROBE_ROUNDS` of them the gate drafts one token to look again (after
    PROBE_ROUNDS x 2^m where the last m drafting rounds kept nothing, m <= 4).

    Sampling: each draft is drawn from the draft model's filtered distribution q, kept in
    the engine's ring `dists[0]` for level 1's acceptance rule (exact: min(1, p/q), the
    residual on rejection); the placeholder's q is one-hot.

    With `lookup` (prompt lookup -> draft model -> target), each draft step also feeds the
    draft model the prompt lookup's tokens after c_0 (up to what the round still needs) and
    keeps those its own choice agrees with, as a verifying level keeps drafts (greedy: its
    argmax; sampling: token-wise rejection against the lookup's one-hot proposal, so each
    kept or replaced token is still a draw from q): one draft-model pass then drafts up to
    1 + m tokens. The gate prices a round as w passes all the same (a conservative price).
    Where the request holds earlier requests' store (`Request.store`), the lookup also
    searches it and the longer match proposes (`_below_lookup`).

    Attributes:
      cfg: the draft model's architecture (the weights: the target's `params["draft"]`).
      k: the most tokens it drafts a round (level 1's largest window, `max_windows[0]`).
      per_layer: its layers (and so its cache) are per-layer buffers ("unrolled" layout).
      gate: the acceptance gate (default on).
      chunk: positions per catch-up pass.
      lookup: prompt lookup below the draft model (its gate unused), or None.
      inner: a smaller draft model below it (HSD's two draft models), or None.
    """

    cfg: ModelConfig
    k: int = 5
    per_layer: bool = True
    gate: bool = True
    chunk: int = 64
    lookup: lookup_lib.PromptLookup | None = None
    inner: InnerDraftModel | None = None

    runs_layers: ClassVar[bool] = False  # of the target: level 1 starts from the embeddings
    # Its rounds are single-position decoding steps (the draft model's, and at w = 0 the
    # target's AR step), so they compile as AR's do (`compile_cache.rounds_options`): with
    # XLA:CPU's YNNPACK reductions where one attention span reads the cache, which made
    # its rounds about a tenth faster on CPU (docs/draft_model.md).
    block_passes: ClassVar[bool] = False
    draws: ClassVar[bool] = True  # sampling: its drafts are draws from q (`dists[0]`)

    @property
    def reads_store(self) -> bool:
        """Its lookup below also drafts from earlier requests' tokens where the request
        holds them (`Request.store`, `suffix_store.py`)."""
        return self.lookup is not None

    def check(self, h) -> None:
        if h.exits[0] != 0:
            raise ValueError(f"exits {h.exits}: the draft model's level runs none of the "
                             "target's layers, its exit must be 0")
        if (len(h.exits) < 2 or h.companion is not None or h.adaptive
                or h.max_windows[0] != self.k):
            raise ValueError("a draft model level needs a verifier above it, max_windows[0] "
                             "== its k, fixed windows and no SV companion")

    # ---- what it is, for people and the planner ------------------------------------------
    def label(self, h) -> str:
        del h
        return "draft"

    def describe(self) -> str:
        c = self.cfg
        below = ("" if self.lookup is None else
                 f" over lookup k={self.lookup.max_tokens} n<={self.lookup.max_ngram}")
        if self.inner is not None:
            i = self.inner.cfg
            below = f" over draft model {i.model_type} {i.num_layers}x{i.hidden_size} k={self.inner.k}"
        return (f"draft model {c.model_type} {c.num_layers}x{c.hidden_size} k={self.k}"
                + ("" if self.gate else " ungated") + below)

    def plan_options(self) -> dict:
        """The method options that rebuild it over a model with this draft model."""
        lookup = ({} if self.lookup is None else
                  {"lookup": self.lookup.max_tokens, "max_ngram": self.lookup.max_ngram})
        k = self.k if self.inner is None else (self.inner.k, self.k)
        return {"draft_k": k, **({} if self.gate else {"draft_gate": False}), **lookup}

    @property
    def gated(self) -> bool:
        return self.gate

    def carries_prefill(self, h) -> bool:
        del h
        return False  # a round runs the draft model's steps before any pass of the target

    # ---- its counters and stats ----------------------------------------------------------
    def init_counters(self, num_layers: int) -> DraftModelCounters:
        del num_layers
        zero = jnp.zeros((), jnp.int32)
        return DraftModelCounters(steps=zero, drafted=zero, proposed=zero, accepted=zero,
                                  caught_up=zero, catch_up_passes=zero, below_proposed=zero,
                                  below_accepted=zero, store_proposed=zero, store_accepted=zero,
                                  wide_steps=zero, plain_rounds=zero)

    def stats(self, h, total) -> dict:
        c = total.drafter
        proposed, accepted = int(c.proposed), int(c.accepted)
        return {"draft_model": {
            "layers": self.cfg.num_layers, "hidden_size": self.cfg.hidden_size,
            "k": self.k, "gate": self.gate,
            "draft_steps": int(c.steps), "drafted": int(c.drafted), "proposed": proposed,
            "accepted": accepted, "acceptance_rate": accepted / proposed if proposed else None,
            "caught_up_positions": int(c.caught_up), "catch_up_passes": int(c.catch_up_passes),
            "verified_by_exit": h.exits[1],
            "wide_steps": int(c.wide_steps), "plain_rounds": int(c.plain_rounds),
            **({} if self.lookup is None else {"lookup": {
                "k": self.lookup.max_tokens, "max_ngram": self.lookup.max_ngram,
                "proposed": int(c.below_proposed), "accepted": int(c.below_accepted),
                "from_earlier_requests": {"proposed": int(c.store_proposed),
                                          "accepted": int(c.store_accepted)}}}),
            **({} if self.inner is None else {"inner_draft_model": {
                "layers": self.inner.cfg.num_layers, "hidden_size": self.inner.cfg.hidden_size,
                "k": self.inner.k, "proposed": int(c.below_proposed),
                "accepted": int(c.below_accepted)}})}}

    def work_layers(self, target_cfg: ModelConfig, draft_passes: int, c) -> float:
        """Its passes' work in the target's layer equivalents (by multiply-adds, a pass
        counted once whatever its block, as `methods.work_stats` counts the target's):
        `draft_passes` passes of the draft model over the batch and its catch-up passes
        (`catch_up_passes`), and the smaller model's passes at the rate per draft step its
        proposals show (an estimate past batch 1; its catch-up left out)."""
        layer = heads_lib.layer_macs(target_cfg)
        work = (draft_passes + int(c.catch_up_passes)) * pass_macs(self.cfg) / layer
        if self.inner is not None and int(c.steps):
            work += (draft_passes * int(c.below_proposed) / int(c.steps)
                     * pass_macs(self.inner.cfg) / layer)
        return work

    def events(self, c) -> dict[str, Any]:
        """Its counts for /metrics (`hispec:spec_decode_drafter_events_total`)."""
        events = {"draft_passes": c.steps, "drafted": c.drafted, "caught_up": c.caught_up,
                  "plain_rounds": c.plain_rounds}
        if self.lookup is not None or self.inner is not None:
            events.update(below_proposed=c.below_proposed, below_accepted=c.below_accepted)
        if self.lookup is not None:
            events.update(below_store_proposed=c.store_proposed,
                          below_store_accepted=c.store_accepted)
        return events

    def proposals(self, drafter_counters) -> tuple[Any, Any]:
        return drafter_counters.proposed, drafter_counters.accepted

    # ---- its shapes and state ------------------------------------------------------------
    def block(self, max_window: int) -> int:
        return max_window + 1  # w drafts' predecessors and the last draft (the bonus)

    def level_blocks(self, block: int) -> tuple[int, ...]:
        # the gate varies w: every level above pays for what arrived, not for its block
        return power_of_two_blocks(block) if self.gate else ()

    def steps(self, block: int) -> int:
        del block
        return 1  # `draft` runs the round's draft steps itself (its cache written outside conds)

    def init(self, batch: int, ring: int, capacity: int) -> DraftModelState:
        del ring
        zeros = jnp.zeros((batch,), jnp.int32)
        state = DraftModelState(
            cache=KVCache.zeros(self.cfg, batch, capacity, per_layer=self.per_layer),
            cached_B=zeros, window_B=zeros, sealed_B=jnp.zeros((batch,), bool), checked_B=zeros,
            inner=None if self.inner is None else self.inner.init(batch, capacity))
        if not self.gate:
            return state
        # the window policy's windows until a first verification
        return state.replace(
            estimate=gate_lib.GateState.init(batch, 1).replace(
                ngram_B=jnp.ones((batch,), jnp.int32)),
            gated_B=jnp.full((batch,), self.k, jnp.int32), idle_B=zeros, misses_B=zeros)

    # ---- the round -----------------------------------------------------------------------
    def ready(self, state, window_ready_B: jax.Array, pending_B: jax.Array) -> jax.Array:
        del pending_B
        return window_ready_B | state.draft_state.sealed_B

    def _weights(self, rnd):
        draft = rnd.params.get("draft") if isinstance(rnd.params, dict) else None
        if draft is None or draft.cfg != self.cfg:
            raise ValueError("the draft model drafter needs its draft model's weights in the "
                             "target's parameters (`Model.with_draft`)")
        return draft.params

    def draft(self, rnd, state, part_B: jax.Array):
        """The round's draft steps of the sequences in `part_B` (all of them: `steps` is 1),
        then the placeholder of those whose drafts are complete.

        The draft's cache is written only here, outside any `lax.cond`: the prompts and
        skipped positions are caught up first (a `lax.while_loop`, no trip when no sequence
        is behind), then the steps run in a `lax.while_loop` (no trip when every window is
        0), each choosing its pass under `lax.cond` with the cache only read there, and
        writing the pass's keys/values after it. A branch that writes the cache makes XLA
        copy every cache buffer at each branch (docs/draft_model.md, "What a round costs
        the engine")."""
        out, c, ds = state.out, state.processed_BxK, state.draft_state
        window_B = jnp.where(part_B & (c[:, 0] == c[:, 1]), self._round_window(rnd, state),
                             ds.window_B)
        drafting = lambda s: (part_B & ~rnd.ready(s, 1)
                              & (s.processed_BxK[:, 0] - s.processed_BxK[:, 1] < window_B))
        # a level rolled back: the draft's cache stops at c_0; behind it, it catches up to
        # c_0 - 1 (the last round's last draft, at c_0 - 1, runs with the first step)
        pos_B = c[:, 0]
        ds = ds.replace(window_B=window_B, cached_B=jnp.minimum(ds.cached_B, pos_B))
        ds, ran, passes = self.catch_up(self._weights(rnd), out.tokens_BxS, ds, pos_B - 1,
                                        drafting(state))
        counters, mine = state.counters, state.counters.drafter
        state = state.replace(draft_state=ds, counters=counters.replace(drafter=mine.replace(
            caught_up=mine.caught_up + ran, catch_up_passes=mine.catch_up_passes + passes)))
        # (the target's cache stays out of the loop: no step reads it)
        cache = state.cache
        state = jax.lax.while_loop(lambda s: jnp.any(drafting(s)),
                                   lambda s: self._step(rnd, s, drafting(s)),
                                   state.replace(cache=None))
        return self._seal(rnd, state.replace(cache=cache), part_B)

    def _round_window(self, rnd, state) -> jax.Array:
        """[B] w in 0 .. k: the drafts of each sequence's round, were it to start now (with
        nothing pending): the window policy's, the gate's, and what its budget still needs
        (w drafts: w + 1 tokens)."""
        out, ds = state.out, state.draft_state
        remaining_B = (rnd.req.max_new_B - out.num_new_B
                       - (state.processed_BxK[:, 1] + 1 - out.lengths_B))
        w_B = jnp.minimum(state.windows.windows_BxK1[:, 0], remaining_B - 1)
        if ds.gated_B is not None:
            w_B = jnp.minimum(w_B, ds.gated_B)
        return jnp.clip(w_B, 0, self.k)

    # ---- a round without drafts ------------------------------------------------------------
    def idle(self, rnd, state) -> jax.Array:
        """[B] bool: the sequences whose next round drafts nothing (window 0: the gate's, or
        the budget's last token). Called between rounds, where nothing is pending."""
        return self._round_window(rnd, state) == 0

    def close_idle(self, rnd, state, part_B: jax.Array):
        """What `draft` does for the sequences in `part_B` at window 0 (every one of them
        `idle`), without its loops: the placeholder alone closes level 1's block (for
        `Round.plain`)."""
        ds, counters = state.draft_state, state.counters
        ds = ds.replace(window_B=jnp.where(part_B, 0, ds.window_B),
                        cached_B=jnp.minimum(ds.cached_B, state.processed_BxK[:, 0]))
        counters = counters.replace(drafter=counters.drafter.replace(
            plain_rounds=counters.drafter.plain_rounds + 1))
        return self._seal(rnd, state.replace(draft_state=ds, counters=counters), part_B)

    def _step(self, rnd, state, part_B: jax.Array):
        """The draft model runs the token at c_0 (with the one at c_0 - 1 where its cache
        stops there) for the sequences in `part_B` and proposes the token at c_0 + 1; with a
        lookup below it, also the lookup's tokens after c_0, keeping those its own choice
        agrees with (`_advance`); with a smaller draft model below it, that model's drafts
        (`_with_inner`). The passes only read the draft's cache (`lax.cond` picks one);
        their keys/values are written after."""
        c, ds = state.processed_BxK, state.draft_state
        pos_B, cache = c[:, 0], ds.cache
        known_B = jnp.where(part_B, 1 + (ds.cached_B < pos_B), 0)
        state = state.replace(draft_state=ds.replace(cache=None))
        below = (0 if self.lookup is None and self.inner is None else
                 self.lookup.max_tokens if self.inner is None else self.inner.k)
        pad = 2 + below  # the longest block a branch runs

        def advance(T, proposed_BxM=None, m_B=None, logq_BxMxV=None, store_B=None):
            if proposed_BxM is None:
                proposed_BxM, m_B = jnp.zeros((pos_B.shape[0], 0), jnp.int32), jnp.zeros_like(pos_B)
            return lambda s: self._advance(rnd, s, cache, part_B, known_B, proposed_BxM, m_B,
                                           T, pad, logq_BxMxV, store_B)

        plain = lambda s: jax.lax.cond(jnp.any(known_B == 2), advance(2), advance(1), s)
        left_B = ds.window_B - (pos_B - c[:, 1])  # drafts the round still needs, >= 1
        if self.inner is not None:
            # its drafts: what the round still needs after this step's own (outside the
            # cond, so that its cache is written outside every branch)
            m_B = jnp.where(part_B, jnp.clip(left_B - 1, 0, self.inner.k), 0)
            state, proposed_BxM, logq_BxMxV = self._inner_proposal(rnd, state, m_B)
            branch = jax.lax.cond(jnp.any(m_B > 0),
                                  advance(2 + self.inner.k, proposed_BxM, m_B, logq_BxMxV),
                                  plain, state)
        elif self.lookup is not None:
            p, from_store_B = self._below_lookup(rnd, state.out.tokens_BxS, pos_B, left_B)
            m_B = jnp.where(part_B & p.matched_B, jnp.minimum(p.length_B, left_B - 1), 0)
            branch = jax.lax.cond(jnp.any(m_B > 0),
                                  advance(pad, p.tokens_BxK, m_B, store_B=from_store_B),
                                  plain, state)
        else:
            branch = plain(state)
        state, positions_BxT, kv = branch
        # (the barrier keeps XLA from moving the writes back into every branch)
        positions_BxT, kv = jax.lax.optimization_barrier((positions_BxT, kv))
        ds = state.draft_state
        return state.replace(draft_state=ds.replace(cache=cache.write_block(0, positions_BxT, kv)))

    def _below_lookup(self, rnd, tokens_BxS, pos_B, left_B):
        """The lookup's proposal after c_0, at most the drafts the round still needs after
        this step's own: from the sequence's own context, or from earlier requests' store
        (`Request.store`) where that match is the longer (a store match only where the own
        has none, or its n is larger). Under a draft model a lookup token costs a row of
        the draft model's pass, which checks it before any target pass does, so the longer
        match, proposing more, is the better bet; the lookup drafter alone weighs the two at
        the gate's estimates instead (`LookupDrafter.worth_more`). Returns (the proposal,
        [B] bool: it came from the store)."""
        limit_B = jnp.maximum(left_B - 1, 1)
        own = self.lookup.propose(tokens_BxS, pos_B, limit_B)
        if rnd.req.store is None:
            return own, jnp.zeros_like(own.matched_B)
        earlier = suffix_store.propose(self.lookup, rnd.req.store, tokens_BxS, pos_B, limit_B)
        return suffix_store.prefer(own, earlier, ~own.matched_B | (earlier.ngram_B > own.ngram_B))

    def _inner_proposal(self, rnd, state, m_B):
        """The smaller draft model drafts m_B tokens (`InnerDraftModel.propose`) for the
        draft model's pass to check: (state, tokens [B, k'], log q' [B, k', V] or None)."""
        ds = state.draft_state
        params = self._weights(rnd)
        proposed_BxM, logq_BxMxV, inner, ran = self.inner.propose(
            params["draft"].params, state.out.tokens_BxS, ds.inner, state.processed_BxK[:, 0],
            m_B, rnd.greedy, rnd.req.sampling, rnd.keys(state, 1))
        counters = state.counters
        state = state.replace(draft_state=ds.replace(inner=inner), counters=counters.replace(
            drafter=counters.drafter.replace(caught_up=counters.drafter.caught_up + ran)))
        return state, proposed_BxM, logq_BxMxV

    def _advance(self, rnd, state, cache: KVCache, part_B, known_B, proposed_BxM, m_B, T: int,
                 pad: int, proposal_logq_BxMxV=None, store_B=None):
        """One pass of the draft model over each sequence's `known_B` tokens ending at c_0
        and its `m_B` lookup tokens after c_0 (a block of T >= known + m positions), and the
        drafts it yields: the lookup tokens its own choice keeps (greedy: its argmax;
        sampling: min(1, q(x)) against the lookup's one-hot proposal, so every draft is a
        draw from q) and its own token after them (`store_B`: [B] bool, the lookup tokens
        came from earlier requests' store; None: none did). Sets d = c_0 + 1 + kept. The
        pass only reads `cache`; returns (state, the block's positions [B, pad] (padding: S), its
        keys/values as a `KVBlock` padded to `pad`) for the caller to write.

            block     x_{c-1}?  x_c    l_1     ...  l_m        (l: lookup tokens)
            rows                q_1    q_2     ...  q_{m+1}    (the draft model's q at
            drafts              y_1    y_2     ...  y_{m+1}     c+1 .. c+m+1)
        """
        params, cfg = self._weights(rnd), self.cfg
        out, c, ds = state.out, state.processed_BxK, state.draft_state
        S, M = out.tokens_BxS.shape[1], proposed_BxM.shape[1]
        pos_B = c[:, 0]
        start_B = pos_B - known_B + 1
        positions_BxT = block_positions(start_B, known_B + m_B, T, S)
        tokens_BxT = gather_positions(out.tokens_BxS, positions_BxT)
        if M:
            after_BxT = positions_BxT - pos_B[:, None] - 1  # index into the lookup's tokens
            tokens_BxT = jnp.where(
                after_BxT >= 0,
                jnp.take_along_axis(proposed_BxM, jnp.clip(after_BxT, 0, M - 1), axis=1),
                tokens_BxT)
        rows_BxR = (known_B - 1).clip(0)[:, None] + jnp.arange(M + 1)[None, :]
        logits_BxRxV, kv = pass_logits(params, cfg, cache, tokens_BxT, positions_BxT, rows_BxR,
                                       write=False)
        proposed_BxR = jnp.pad(proposed_BxM, ((0, 0), (0, 1)))
        logq_BxRxV = None
        if not rnd.greedy:
            logq_BxRxV = filtered_logprobs(logits_BxRxV, rnd.req.sampling)
        if not M:  # the draft model's own token only
            if rnd.greedy:
                next_B = jnp.argmax(logits_BxRxV[:, 0], axis=-1)
            else:
                next_B = jax.vmap(jax.random.categorical)(rnd.keys(state, 0), logq_BxRxV[:, 0])
            verdict = acceptance_lib.Verdict(jnp.zeros_like(pos_B), next_B.astype(jnp.int32),
                                             None)
        elif rnd.greedy:
            verdict = acceptance_lib.GreedyAcceptance().accept(
                logits_BxRxV, None, proposed_BxR, m_B, None)
        else:
            R = M + 1
            if proposal_logq_BxMxV is None:  # the lookup's: one-hot
                below_BxRxV = lookup_lib.one_hot_logq(proposed_BxR, logq_BxRxV.shape[-1])
            else:
                below_BxRxV = jnp.pad(proposal_logq_BxMxV, ((0, 0), (0, 1), (0, 0)))
            below_BxRxV = jnp.where((jnp.arange(R)[None, :] < m_B[:, None])[..., None],
                                    below_BxRxV, -jnp.inf)  # no proposal: a draw from q itself
            verdict = acceptance_lib.TokenwiseRejection().accept(
                logq_BxRxV, below_BxRxV, proposed_BxR, m_B, rnd.keys(state, 0))
        kept_B = jnp.where(part_B, verdict.num_accepted_B, 0)
        n_B = jnp.where(part_B, kept_B + 1, 0)  # drafts this step adds
        j_R = jnp.arange(M + 1)
        drafts_BxR = jnp.where(j_R[None, :] < kept_B[:, None], proposed_BxR,
                               verdict.next_token_B[:, None])
        new_BxR = j_R[None, :] < n_B[:, None]
        at_BxR = jnp.where(new_BxR, pos_B[:, None] + 1 + j_R[None, :], S)
        batch_Bx1 = jnp.arange(pos_B.shape[0])[:, None]
        tokens_BxS = out.tokens_BxS.at[batch_Bx1, at_BxR].set(drafts_BxR, mode="drop")
        dists = state.dists
        if logq_BxRxV is not None:
            dists = (ring_write(dists[0], pos_B[:, None] + 1 + j_R[None, :], logq_BxRxV, new_BxR),
                     ) + dists[1:]
        counters = state.counters
        mine = counters.drafter
        stored_B = jnp.zeros_like(part_B) if store_B is None else store_B
        counters = counters.replace(
            actions_K=counters.actions_K.at[0].add(1),
            drafter=mine.replace(steps=mine.steps + jnp.sum(part_B),
                                 drafted=mine.drafted + jnp.sum(n_B),
                                 below_proposed=mine.below_proposed + jnp.sum(m_B * part_B),
                                 below_accepted=mine.below_accepted + jnp.sum(kept_B),
                                 store_proposed=mine.store_proposed + jnp.sum(
                                     jnp.where(stored_B, m_B * part_B, 0)),
                                 store_accepted=mine.store_accepted + jnp.sum(
                                     jnp.where(stored_B, kept_B, 0)),
                                 wide_steps=mine.wide_steps + (jnp.sum(part_B) if M else 0)))
        ds = ds.replace(cached_B=jnp.where(part_B, pos_B + 1 + kept_B, ds.cached_B))
        if ds.inner is not None and M:
            ds = ds.replace(inner=InnerDraftModel.settle(ds.inner, pos_B, m_B, kept_B))
        state = state.replace(
            out=out.replace(tokens_BxS=tokens_BxS), processed_BxK=c.at[:, 0].add(n_B),
            draft_state=ds, dists=dists, draws_B=state.draws_B + part_B, counters=counters)
        positions_BxP = jnp.pad(positions_BxT, ((0, 0), (0, pad - T)), constant_values=S)
        pad_kv = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, pad - T), (0, 0), (0, 0)))
        return state, positions_BxP, KVBlock(k=pad_kv(kv.k), v=pad_kv(kv.v))

    def _seal(self, rnd, state, part_B: jax.Array):
        """The placeholder after the round's last draft (q one-hot), which completes level
        1's block: level 1's token replaces it (the bonus) unless it is that token."""
        c, ds = state.processed_BxK, state.draft_state
        sealing_B = part_B & ~ds.sealed_B & (c[:, 0] - c[:, 1] >= ds.window_B)
        pos_B = c[:, 0] + 1
        tokens_BxS = scatter_tokens(state.out.tokens_BxS, pos_B,
                                    jnp.full_like(pos_B, PLACEHOLDER), sealing_B)
        dists = state.dists
        if not rnd.greedy:
            one_hot_Bx1xV = lookup_lib.one_hot_logq(jnp.full_like(pos_B, PLACEHOLDER)[:, None],
                                                    rnd.cfg.vocab_size)
            dists = (ring_write(dists[0], pos_B[:, None], one_hot_Bx1xV, sealing_B[:, None]),
                     ) + dists[1:]
        return state.replace(out=state.out.replace(tokens_BxS=tokens_BxS),
                             processed_BxK=c.at[:, 0].add(sealing_B.astype(jnp.int32)),
                             draft_state=ds.replace(sealed_B=ds.sealed_B | sealing_B),
                             dists=dists)

    def catch_up(self, params, tokens_BxS: jax.Array, ds: DraftModelState, until_B: jax.Array,
                 part_B: jax.Array) -> tuple[DraftModelState, jax.Array, jax.Array]:
        """The draft model's `catch_up` to `until_B`: the state, [] the positions and [] the
        passes run."""
        cache, cached_B, ran, passes = catch_up(params, self.cfg, self.chunk, tokens_BxS,
                                                ds.cache, ds.cached_B, until_B, part_B)
        return ds.replace(cache=cache, cached_B=cached_B), ran, passes

    def verify_input(self, rnd, state, positions_BxT, valid_BxT, write_cache: bool):
        """The token embeddings of the block's positions: level 1 starts at layer 0."""
        del write_cache
        ds = state.draft_state
        n_B = jnp.sum(valid_BxT, axis=1).astype(jnp.int32)
        ds = ds.replace(checked_B=jnp.maximum(n_B - ds.sealed_B, 0))  # drafts, not the placeholder
        tokens_BxT = gather_positions(state.out.tokens_BxS, positions_BxT)
        lo, _ = rnd.h.layer_range(1)
        return rnd.backbone.embed(rnd.params, tokens_BxT), state.replace(draft_state=ds), lo, 0, 0

    def proposal_logq(self, rnd, state, proposed_pos_BxT, proposed_BxT):
        del proposed_BxT
        return None if rnd.greedy else ring_read(state.dists[0], proposed_pos_BxT)

    def record(self, rnd, state, part_B, accepted_B):
        """Counts the drafts level 1 checked and kept, opens the next round; with the gate,
        updates each verified sequence's acceptance estimate and picks its next window."""
        ds = state.draft_state
        checked_B = jnp.where(part_B, ds.checked_B, 0)
        kept_B = jnp.minimum(accepted_B, checked_B)
        counters = state.counters
        mine = counters.drafter
        state = state.replace(counters=counters.replace(drafter=mine.replace(
            proposed=mine.proposed + jnp.sum(checked_B),
            accepted=mine.accepted + jnp.sum(kept_B))))
        ds = ds.replace(sealed_B=ds.sealed_B & ~part_B)
        if ds.estimate is None:
            return state.replace(draft_state=ds)
        estimate = ds.estimate.record(checked_B, kept_B)
        draft_fraction, verify_fraction = self.pass_fractions(rnd)
        gated_B = gate_lib.choose_window(
            estimate.of_match(estimate.ngram_B), state.windows.windows_BxK1[:, 0],
            ~state.out.done_B, self.k, draft_fraction, verify_fraction, rnd.req.lookup_cost,
            joint=rnd.h.schedule == "sync", bonus=True)
        # a sequence at window 0 drafts one token after PROBE_ROUNDS x 2^misses of them
        drafted_B = part_B & (checked_B > 0)
        misses_B = jnp.where(drafted_B, jnp.where(kept_B > 0, 0, jnp.minimum(
            ds.misses_B + 1, MAX_PROBE_DOUBLINGS)), ds.misses_B)
        idle_B = jnp.where(part_B, jnp.where(gated_B == 0, ds.idle_B + 1, 0), ds.idle_B)
        probe_B = idle_B > PROBE_ROUNDS * (1 << misses_B)
        gated_B = jnp.where(part_B, jnp.where(probe_B, 1, gated_B), ds.gated_B)
        return state.replace(draft_state=ds.replace(
            estimate=estimate, gated_B=gated_B, idle_B=jnp.where(probe_B, 0, idle_B),
            misses_B=misses_B))

    def pass_fractions(self, rnd) -> tuple[float, float]:
        """(f_0, f_1): a draft step's and level 1's pass per row, as shares of a target pass
        (layers and final head, by their weights' multiply-adds: `heads.layer_macs`,
        `heads.head_macs`): the whole draft model, then the target's layers [0, e_1) and
        head e_1."""
        cfg, e1 = rnd.cfg, rnd.h.exits[1]
        target = lambda e: e * heads_lib.layer_macs(cfg) + heads_lib.head_macs(cfg, rnd.heads, e)
        return pass_macs(self.cfg) / target(cfg.num_layers), target(e1) / target(cfg.num_layers)
