"""Level 0 as a draft model: a smaller model of the target's family drafts k tokens a round,
autoregressively, with its own KV cache, inside the compiled loop (HSD's draft level;
classic speculative decoding when the target's final layer verifies it directly).

The draft's weights are the target's `params["draft"]` (`models/draft_weights.py`); its KV
cache, how far that cache is written, the distributions it drew from (sampling) and its
acceptance gate live in the drafter's loop state (`DraftModelState`).

One round, for a sequence whose newest token x_c sits at c_0 = c_1 = c:

    draft step j (j = 1..w)   the draft model runs the token at c_0 (position c + j - 1),
                              writes its keys/values, proposes y_j at c + j; c_0 += 1
    level 1                   one pass of the target over the token embeddings of
                              positions [c, c + w) (x_c, y_1 .. y_{w-1}) checks y_1 .. y_w

The draft's cache holds positions < d (`cached_B`). Level 1 (or any level above) rolls c_0
back to a rejected position; d then exceeds c_0 and is cut to it at the next draft step
(keys/values past it are overwritten before anything reads them: every query sees only
positions <= its own). When d < c_0 (a new sequence's prompt; a draft window the gate
skipped), the first draft step catches up first: the draft model runs positions [d, c_0)
in chunks of `chunk` (`catch_up`), so prefill, the serving slots and the prefill riders
need to know nothing of the draft model.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from hispec_jax.decoding import gate as gate_lib
from hispec_jax.decoding.engine.state import (gather_positions, ring_read, ring_write,
                                              scatter_tokens)
from hispec_jax.decoding.prefill import block_positions
from hispec_jax.decoding.sampling import filtered_logprobs
from hispec_jax.decoding.windows import power_of_two_blocks
from hispec_jax.models import heads as heads_lib
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.transformer import embed, run_layers_cached


@flax.struct.dataclass
class DraftModelCounters:
    """The draft model drafter's counters (`Counters.drafter`), summed over the batch.

    Attributes:
      steps: [] (sequence, draft step) pairs: tokens the draft model drafted.
      proposed: [] drafted tokens level 1 checked.
      accepted: [] of those, tokens level 1 kept.
      caught_up: [] positions the draft model ran to catch up (prompts, skipped windows).
    """

    steps: jax.Array
    proposed: jax.Array
    accepted: jax.Array
    caught_up: jax.Array


@flax.struct.dataclass
class DraftModelState:
    """The draft model drafter's loop state.

    Attributes:
      cache: the draft model's KV cache (its own layers, heads and width; S as the target's).
      cached_B: [B] int32, d: the draft's cache holds positions < d of each sequence.
      checked_B: [B] int32, the drafts level 1's pending verification checks.
      estimate: with the gate, `gate.GateState` with one bucket (decayed counts of the
        drafts level 1 kept and of its rejections); else None.
      window_B: with the gate, [B] int32, the gated window W of the next round (W + 1
        drafts); else None.
    """

    cache: KVCache
    cached_B: jax.Array
    checked_B: jax.Array
    estimate: gate_lib.GateState | None = None
    window_B: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class DraftModelDrafter:
    """Level 0 as a draft model (module docstring). Each sequence drafts w tokens a round
    (its level-1 window: at most k = `max_windows[0]`), and level 1 verifies them from their
    token embeddings (exit e_0 = 0: the target runs no layer for the draft). With `gate`,
    the exit drafter's acceptance gate (`gate.choose_window`) picks each sequence's w in
    1 .. k from its estimated acceptance at the request's pass costs, a draft step priced
    at the draft model's share of a target pass (`pass_fractions`).

    Sampling: each draft is drawn from the draft model's filtered distribution q, kept in
    the engine's ring `dists[0]` for level 1's acceptance rule (exact: min(1, p/q), the
    residual on rejection).

    Attributes:
      cfg: the draft model's architecture (the weights: the target's `params["draft"]`).
      k: the most tokens it drafts a round (level 1's largest window, `max_windows[0]`).
      per_layer: its layers (and so its cache) are per-layer buffers ("unrolled" layout).
      gate: the acceptance gate (default on).
      chunk: positions per catch-up pass (a power of two).
    """

    cfg: ModelConfig
    k: int = 5
    per_layer: bool = True
    gate: bool = True
    chunk: int = 64

    runs_layers: ClassVar[bool] = False  # of the target: level 1 starts from the embeddings
    block_passes: ClassVar[bool] = True  # its drafts reach level 1 as blocks of positions
    draws: ClassVar[bool] = True  # sampling: its drafts are draws from q (`dists[0]`)

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
        return (f"draft model {c.model_type} {c.num_layers}x{c.hidden_size} k={self.k}"
                + ("" if self.gate else " ungated"))

    def plan_options(self) -> dict:
        """The method options that rebuild it over a model with this draft model."""
        return {"draft_k": self.k, **({} if self.gate else {"draft_gate": False})}

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
        return DraftModelCounters(steps=zero, proposed=zero, accepted=zero, caught_up=zero)

    def stats(self, h, total) -> dict:
        c = total.drafter
        proposed, accepted = int(c.proposed), int(c.accepted)
        return {"draft_model": {
            "layers": self.cfg.num_layers, "hidden_size": self.cfg.hidden_size,
            "k": self.k, "gate": self.gate,
            "draft_steps": int(c.steps), "proposed": proposed, "accepted": accepted,
            "acceptance_rate": accepted / proposed if proposed else None,
            "caught_up_positions": int(c.caught_up), "verified_by_exit": h.exits[1]}}

    def proposals(self, drafter_counters) -> tuple[Any, Any]:
        return drafter_counters.proposed, drafter_counters.accepted

    # ---- its shapes and state ------------------------------------------------------------
    def block(self, max_window: int) -> int:
        return max_window  # w drafts: level 1's pass holds their w predecessors

    def level_blocks(self, block: int) -> tuple[int, ...]:
        # the gate varies w: every level above pays for what arrived, not for its block
        return power_of_two_blocks(block) if self.gate else ()

    def steps(self, block: int) -> int:
        return block

    def init(self, batch: int, ring: int, capacity: int) -> DraftModelState:
        del ring
        state = DraftModelState(
            cache=KVCache.zeros(self.cfg, batch, capacity, per_layer=self.per_layer),
            cached_B=jnp.zeros((batch,), jnp.int32), checked_B=jnp.zeros((batch,), jnp.int32))
        if not self.gate:
            return state
        # the window policy's windows until a first verification
        return state.replace(
            estimate=gate_lib.GateState.init(batch, 1).replace(
                ngram_B=jnp.ones((batch,), jnp.int32)),
            window_B=jnp.full((batch,), jnp.iinfo(jnp.int32).max - 1, jnp.int32))

    # ---- the round -----------------------------------------------------------------------
    def ready(self, state, window_ready_B: jax.Array, pending_B: jax.Array) -> jax.Array:
        ready_B = window_ready_B | (pending_B >= state.windows.windows_BxK1[:, 0])
        window_B = state.draft_state.window_B
        if window_B is not None:  # the gate's window when it is the shorter one
            ready_B |= pending_B >= window_B + 1
        return ready_B

    def _weights(self, rnd):
        draft = rnd.params.get("draft") if isinstance(rnd.params, dict) else None
        if draft is None or draft.cfg != self.cfg:
            raise ValueError("the draft model drafter needs its draft model's weights in the "
                             "target's parameters (`Model.with_draft`)")
        return draft.params

    def catch_up(self, params, tokens_BxS: jax.Array, ds: DraftModelState, c0_B: jax.Array,
                 part_B: jax.Array) -> tuple[DraftModelState, jax.Array]:
        """Runs the draft model over positions [d, c_0) of the sequences in `part_B`, in
        chunks of `chunk` positions, until d = c_0 (no trip when every d already is).
        Returns the state and [] the positions run."""
        S, C = tokens_BxS.shape[1], self.chunk

        def behind(carry):
            ds, _ = carry
            return jnp.any(part_B & (ds.cached_B < c0_B))

        def chunk(carry):
            ds, ran = carry
            n_B = jnp.where(part_B, jnp.clip(c0_B - ds.cached_B, 0, C), 0)
            positions_BxC = block_positions(ds.cached_B, n_B, C, S)
            x_BxCxD = embed(params, gather_positions(tokens_BxS, positions_BxC))
            _, cache = run_layers_cached(params, self.cfg, x_BxCxD, positions_BxC, ds.cache, 0,
                                         self.cfg.num_layers)
            return ds.replace(cache=cache, cached_B=ds.cached_B + n_B), ran + jnp.sum(n_B)

        with jax.named_scope("draft_catch_up"):
            return jax.lax.while_loop(behind, chunk, (ds, jnp.zeros((), jnp.int32)))

    def draft(self, rnd, state, part_B: jax.Array):
        """One draft step: the draft model runs the token at c_0 (after catching up to it)
        and proposes the token at c_0 + 1."""
        params, cfg = self._weights(rnd), self.cfg
        out, c = state.out, state.processed_BxK
        S = out.tokens_BxS.shape[1]
        pos_B = c[:, 0]
        ds = state.draft_state
        ds = ds.replace(cached_B=jnp.minimum(ds.cached_B, pos_B))  # a level rolled back
        ds, ran = self.catch_up(params, out.tokens_BxS, ds, pos_B, part_B)
        positions_Bx1 = jnp.where(part_B, pos_B, S)[:, None]
        x_Bx1xD = embed(params, gather_positions(out.tokens_BxS, pos_B[:, None]))
        h_Bx1xD, cache = run_layers_cached(params, cfg, x_Bx1xD, positions_Bx1, ds.cache, 0,
                                           cfg.num_layers)
        logits_BxV = heads_lib.exit_logits(params, {}, cfg, h_Bx1xD, cfg.num_layers)[:, 0]
        dists = state.dists
        if rnd.greedy:
            next_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
        else:
            logq_BxV = filtered_logprobs(logits_BxV, rnd.req.sampling)
            next_B = jax.vmap(jax.random.categorical)(rnd.keys(state, 0), logq_BxV)
            next_B = next_B.astype(jnp.int32)
            dists = (ring_write(dists[0], pos_B[:, None] + 1, logq_BxV[:, None],
                                part_B[:, None]),) + dists[1:]
        counters = state.counters
        mine = counters.drafter
        counters = counters.replace(
            actions_K=counters.actions_K.at[0].add(1),
            drafter=mine.replace(steps=mine.steps + jnp.sum(part_B),
                                 caught_up=mine.caught_up + ran))
        ds = ds.replace(cache=cache, cached_B=jnp.where(part_B, pos_B + 1, ds.cached_B))
        return state.replace(
            out=out.replace(tokens_BxS=scatter_tokens(out.tokens_BxS, pos_B + 1, next_B, part_B)),
            processed_BxK=c.at[:, 0].add(part_B.astype(jnp.int32)), draft_state=ds,
            dists=dists, draws_B=state.draws_B + part_B, counters=counters)

    def verify_input(self, rnd, state, positions_BxT, valid_BxT, write_cache: bool):
        """The drafts' predecessors' token embeddings: level 1 starts at layer 0."""
        del write_cache
        lo, _ = rnd.h.layer_range(1)
        ds = state.draft_state.replace(checked_B=jnp.sum(valid_BxT, axis=1).astype(jnp.int32))
        tokens_BxT = gather_positions(state.out.tokens_BxS, positions_BxT)
        return embed(rnd.params, tokens_BxT), state.replace(draft_state=ds), lo, 0, 0

    def proposal_logq(self, rnd, state, proposed_pos_BxT, proposed_BxT):
        del proposed_BxT
        return None if rnd.greedy else ring_read(state.dists[0], proposed_pos_BxT)

    def record(self, rnd, state, part_B, accepted_B):
        """Counts the drafts level 1 checked and kept; with the gate, updates each verified
        sequence's acceptance estimate and picks its next window."""
        ds = state.draft_state
        checked_B = jnp.where(part_B, ds.checked_B, 0)
        kept_B = jnp.minimum(accepted_B, checked_B)
        counters = state.counters
        mine = counters.drafter
        state = state.replace(counters=counters.replace(drafter=mine.replace(
            proposed=mine.proposed + jnp.sum(checked_B),
            accepted=mine.accepted + jnp.sum(kept_B))))
        if ds.estimate is None:
            return state
        estimate = ds.estimate.record(checked_B, kept_B)
        draft_fraction, verify_fraction = self.pass_fractions(rnd)
        # the gate's window W means W + 1 drafts (an exit drafter's round: `choose_window`)
        window_B = gate_lib.choose_window(
            estimate.of_match(estimate.ngram_B), state.windows.windows_BxK1[:, 0] - 1,
            ~state.out.done_B, rnd.h.max_windows[0] - 1, draft_fraction, verify_fraction,
            rnd.req.lookup_cost, joint=rnd.h.schedule == "sync")
        return state.replace(draft_state=ds.replace(estimate=estimate, window_B=window_B))

    def pass_fractions(self, rnd) -> tuple[float, float]:
        """(f_0, f_1): a draft step's and level 1's pass per row, as shares of a target pass
        (layers and final head, by their weights' multiply-adds: `heads.layer_macs`,
        `heads.head_macs`): the whole draft model, then the target's layers [0, e_1) and
        head e_1."""
        cfg, e1 = rnd.cfg, rnd.h.exits[1]
        target = lambda e: e * heads_lib.layer_macs(cfg) + heads_lib.head_macs(cfg, rnd.heads, e)
        d = self.cfg
        draft = d.num_layers * heads_lib.layer_macs(d) + d.hidden_size * d.vocab_size
        return draft / target(cfg.num_layers), target(e1) / target(cfg.num_layers)
