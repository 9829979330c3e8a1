"""Level 0 of a hierarchy: the drafters (`policies.Drafter`).

A drafter says what level 0 proposes each round, how many positions level 1's pass then
holds, where level 1 starts from, which distribution the proposals were drawn from, and how
it adapts to what level 1 kept; it brings its own settings (the object's fields), loop state
(`init`), counters (`init_counters`, kept in `Counters.drafter`), stats and description.
The round (`round.py`), the counters, the stats (`methods.summarize_counters`), the
server's description and metrics ask it and hold no drafter-specific code: a new drafter (a
suffix tree, a draft model) is a new class, here or in the user's own module
(docs/engine.md, "Adding a drafter").

    ExitDrafter     an early exit of the model itself (LayerSkip, HiSpec, SpecBound, SV, AR):
                    one token per draft step, up to blocks[0] steps a round (fewer where
                    its acceptance gate says the drafts do not pay)
    LookupDrafter   prompt lookup (n-gram, `lookup.py`): one lookup a round proposes up to k
                    tokens at once, and runs no layer
    DraftModelDrafter  a smaller model of the same vocabulary (`draft_model.py`): one token
                    per draft step with its own KV cache, up to k steps a round

Each method takes the round (`round.Round`: params, heads, cfg, hierarchy `h`, `greedy`,
request `req`, per-pass PRNG `keys`) and the loop state (`state.EngineState`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

import flax.struct
import jax
import jax.numpy as jnp

from hispec_jax.decoding import draft as draft_lib
from hispec_jax.decoding import emit
from hispec_jax.decoding import gate as gate_lib
from hispec_jax.decoding import lookup as lookup_lib
from hispec_jax.decoding import policies
from hispec_jax.decoding import suffix_store
from hispec_jax.decoding.draft import StaticDraftExit
from hispec_jax.decoding.engine.state import (gather_positions, ring_read, ring_write,
                                              scatter_tokens)
from hispec_jax.decoding.sampling import filtered_logprobs
from hispec_jax.decoding.windows import power_of_two_blocks
from hispec_jax.models.heads import head_cost_layers


@flax.struct.dataclass
class ExitGateState:
    """The exit drafter's acceptance gate (`gate.py`), per sequence.

    Attributes:
      estimate: `gate.GateState` with one bucket: decayed counts of the drafts level 1 kept
        and of its rejections.
      checked_B: [B] int32, the drafts level 1's pending verification checks.
      window_B: [B] int32, the gated window of the next round (level 1 verifies once its
        input holds window_B + 1 positions, or the window policy's window + 1 if fewer).
    """

    estimate: gate_lib.GateState
    checked_B: jax.Array
    window_B: jax.Array


@flax.struct.dataclass
class ExitDraftCounters:
    """The exit drafter's counters (`Counters.drafter`), summed over the batch.

    Attributes:
      depth_hist_E: [L + 1] draft tokens by the layer they exited at (SpecBound).
    """

    depth_hist_E: jax.Array


@flax.struct.dataclass
class ExitDraftState:
    """The exit drafter's loop state.

    Attributes:
      exit: the draft-exit policy's state (`policies.DraftExitPolicy.init`).
      gate: an `ExitGateState` when the gate is on, else None.
    """

    exit: Any
    gate: ExitGateState | None


@dataclasses.dataclass(frozen=True)
class ExitDrafter:
    """Level 0 as an exit e_0 of the model: a draft step runs the token at c_0 through
    layers [0, e_0) (as deep as the draft-exit policy says: `draft.py`), writes its
    keys/values before the next step reads them, and exit e_0 proposes the token at
    c_0 + 1. A sequence drafts while its level-1 input holds fewer than Nd + 1 positions, so
    a round runs up to blocks[0] = Nd_max + 1 steps. Level 1 continues the buffered layer-e_0
    states.

    With `gate`, each sequence's window is also bounded by what its drafts pay for
    (`gate.choose_window`): after each level-1 verification the drafter updates the
    sequence's acceptance estimate and picks the next round's window among 0 .. Nd_max at
    the request's pass costs (`Request.lookup_cost`); a sequence whose drafts do not pay
    drafts one token a round. The window depends on the past only: greedy output stays
    AR's and sampling stays exact. The drafter's state is an `ExitDraftState`."""

    draft_exit: policies.DraftExitPolicy = StaticDraftExit()
    gate: bool = False

    runs_layers: ClassVar[bool] = True
    block_passes: ClassVar[bool] = False
    draws: ClassVar[bool] = True  # sampling: its drafts are draws from exit e_0's q

    def check(self, h) -> None:
        if h.exits[0] < 1:
            raise ValueError(f"exits {h.exits}: an exit drafter needs e_0 >= 1 (exit 0 runs "
                             "no layer: only a drafter that is not an exit sits there)")
        if self.gate and (h.companion is not None
                          or not isinstance(self.draft_exit, StaticDraftExit)):
            raise ValueError("the exit drafter's gate needs a static draft exit and no SV "
                             "companion (they choose the verification length themselves)")

    # ---- what it is, for people and the planner ------------------------------------------
    def label(self, h) -> str:
        return f"exit{h.exits[0]}"

    def describe(self) -> str:
        return ""  # the exits and windows say it all

    def plan_options(self) -> dict:
        return {}

    @property
    def gated(self) -> bool:
        return self.gate

    def carries_prefill(self, h) -> bool:
        return h.num_levels == 1 and isinstance(self.draft_exit, StaticDraftExit)

    # ---- its counters and stats ----------------------------------------------------------
    def init_counters(self, num_layers: int) -> "ExitDraftCounters":
        return ExitDraftCounters(depth_hist_E=jnp.zeros((num_layers + 1,), jnp.int32))

    def stats(self, h, total) -> dict:
        """The layer each draft token exited at (SpecBound's depths; one bar for a static
        exit)."""
        del h
        return {"draft_exit_histogram": {int(e): int(n) for e, n in
                                         enumerate(np.asarray(total.drafter.depth_hist_E)) if n}}

    def proposals(self, drafter_counters) -> tuple[Any, Any] | None:
        del drafter_counters
        return None  # level 1's own proposed / accepted counts

    def block(self, max_window: int) -> int:
        return max_window + 1  # Nd drafts and the position whose prediction is the bonus

    def level_blocks(self, block: int) -> tuple[int, ...]:
        del block
        return ()

    def steps(self, block: int) -> int:
        return block

    def init(self, batch: int, ring: int, capacity: int) -> ExitDraftState:
        del capacity
        gate = None
        if self.gate:  # the window policy's windows until a first verification
            gate = ExitGateState(
                estimate=gate_lib.GateState.init(batch, 1).replace(
                    ngram_B=jnp.ones((batch,), jnp.int32)),
                checked_B=jnp.zeros((batch,), jnp.int32),
                window_B=jnp.full((batch,), jnp.iinfo(jnp.int32).max - 1, jnp.int32))
        return ExitDraftState(exit=self.draft_exit.init(batch, ring), gate=gate)

    def ready(self, state, window_ready_B: jax.Array, pending_B: jax.Array) -> jax.Array:
        ds = state.draft_state
        # the draft policy may end drafting early (SpecBound's hard token)
        ready_B = window_ready_B | self.draft_exit.stops(ds.exit, state.processed_BxK[:, 0],
                                                         pending_B)
        if ds.gate is not None:  # the gate's window when it is the shorter one
            ready_B |= pending_B >= ds.gate.window_B + 1
        return ready_B

    def draft(self, rnd, state, part_B: jax.Array):
        cfg, h = rnd.cfg, rnd.h
        out, c = state.out, state.processed_BxK
        S = out.tokens_BxS.shape[1]
        pos_B = c[:, 0]
        token_B = gather_positions(out.tokens_BxS, pos_B[:, None])[:, 0]
        K = h.num_levels
        d = self.draft_exit.draft(rnd.params, rnd.heads, cfg, draft_lib.DraftInput(
            x_Bx1xD=rnd.backbone.embed(rnd.params, token_B[:, None]), position_B=pos_B,
            part_B=part_B,
            pending_start_B=c[:, 1] if K > 1 else pos_B,
            ring_BxWxD=state.hidden[0] if K > 1 else None, capacity=S,
            block=h.blocks[0] if K > 1 else 1, rider=state.rider), state.cache, h.exits[0],
            state.draft_state.exit, backbone=rnd.backbone)
        logits_BxV = d.logits_BxV
        if K == 1:  # the draft level is the top level: no EOS before min_new_B
            logits_BxV = emit.suppress_eos(logits_BxV[:, None], rnd.req.eos_ids_E,
                                           (pos_B + 1 - rnd.req.prompt_lens_B)[:, None],
                                           rnd.req.min_new_B)[:, 0]
        if rnd.greedy:
            next_B = jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
            logp_BxV = None
        else:
            logp_BxV = filtered_logprobs(logits_BxV, rnd.req.sampling)
            next_B = jax.vmap(jax.random.categorical)(rnd.keys(state, 0), logp_BxV)
            next_B = next_B.astype(jnp.int32)
        hidden, dists = state.hidden, state.dists
        if K > 1:
            ring = (d.ring_BxWxD if d.ring_BxWxD is not None
                    else ring_write(hidden[0], pos_B[:, None], d.h_Bx1xD, part_B[:, None]))
            hidden = (ring,) + hidden[1:]
            if dists:
                if logp_BxV is None:  # greedy, kept for a companion's signals
                    logp_BxV = jax.nn.log_softmax(d.logits_BxV, axis=-1)
                dists = (ring_write(dists[0], pos_B[:, None] + 1, logp_BxV[:, None],
                                    part_B[:, None]),) + dists[1:]
        out = out.replace(tokens_BxS=scatter_tokens(out.tokens_BxS, pos_B + 1, next_B, part_B))
        counters = state.counters
        if K == 1:  # the draft level is the top level: emit directly
            out, emitted_B = emit.append_block(out, next_B[:, None], part_B.astype(jnp.int32),
                                               rnd.req.eos_ids_E, rnd.req.max_new_B)
            counters = counters.replace(emitted=counters.emitted + jnp.sum(emitted_B))
        hist_E = counters.drafter.depth_hist_E
        counters = counters.replace(
            actions_K=counters.actions_K.at[0].add(1),
            layer_passes=counters.layer_passes + d.layer_passes,
            layer_token_evals=counters.layer_token_evals + d.layer_token_evals,
            head_evals_E=(counters.head_evals_E.at[h.exits[0]].add(1) if d.head_evals_E is None
                          else counters.head_evals_E + d.head_evals_E),
            drafter=ExitDraftCounters(depth_hist_E=hist_E.at[
                jnp.where(part_B, d.depth_B, hist_E.shape[0])].add(1, mode="drop")))
        return state.replace(out=out, cache=d.cache, hidden=hidden, dists=dists,
                             processed_BxK=c.at[:, 0].add(part_B.astype(jnp.int32)),
                             draft_state=state.draft_state.replace(exit=d.state),
                             draws_B=state.draws_B + part_B,
                             counters=counters, rider=d.rider)

    def verify_input(self, rnd, state, positions_BxT, valid_BxT, write_cache: bool):
        """The buffered layer-e_0 states; above a dynamic draft exit, each position is first
        brought up from its own draft depth to layer e_0 (= the depth bound)."""
        lo, _ = rnd.h.layer_range(1)
        ds = state.draft_state
        if ds.gate is not None:  # what this verification checks, for `record`
            state = state.replace(draft_state=ds.replace(gate=ds.gate.replace(
                checked_B=jnp.sum(valid_BxT, axis=1).astype(jnp.int32))))
        x_BxTxD = ring_read(state.hidden[0], positions_BxT)
        aligned = self.draft_exit.align(rnd.params, rnd.cfg, x_BxTxD, positions_BxT,
                                        valid_BxT, state.cache, ds.exit, lo,
                                        backbone=rnd.backbone)
        if aligned is None:
            return x_BxTxD, state, lo, 0, 0
        if not write_cache:
            raise ValueError("a dynamic draft exit writes the cache in its pass")
        x_BxTxD, cache, lo, passes, evals = aligned
        return x_BxTxD, state.replace(cache=cache), lo, passes, evals

    def proposal_logq(self, rnd, state, proposed_pos_BxT, proposed_BxT):
        del rnd, proposed_BxT
        return ring_read(state.dists[0], proposed_pos_BxT) if state.dists else None

    def record(self, rnd, state, part_B, accepted_B):
        """With the gate: updates each verified sequence's acceptance estimate with what
        level 1 kept of its drafts, and picks the next round's windows."""
        ds = state.draft_state
        if ds.gate is None:
            return state
        proposed_B = jnp.where(part_B, ds.gate.checked_B, 0)
        estimate = ds.gate.estimate.record(proposed_B, jnp.minimum(accepted_B, proposed_B))
        draft_fraction, verify_fraction = self.pass_fractions(rnd)
        window_B = gate_lib.choose_window(
            estimate.of_match(estimate.ngram_B), state.windows.windows_BxK1[:, 0],
            ~state.out.done_B, rnd.h.max_windows[0], draft_fraction, verify_fraction,
            rnd.req.lookup_cost, joint=rnd.h.schedule == "sync")
        return state.replace(draft_state=ds.replace(gate=ds.gate.replace(
            estimate=estimate, window_B=window_B)))

    @staticmethod
    def pass_fractions(rnd) -> tuple[float, float]:
        """(f_0, f_1): the shares of a full pass (layers and the final head, in layer
        equivalents: `heads.head_cost_layers`) one row of a draft step and of level 1's pass
        runs: layers [0, e_0) and head e_0, layers [e_0, e_1) and head e_1."""
        cfg, e0, e1 = rnd.cfg, rnd.h.exits[0], rnd.h.exits[1]
        head = lambda e: head_cost_layers(cfg, rnd.heads, e)
        full = cfg.num_layers + head(cfg.num_layers)
        return (e0 + head(e0)) / full, (e1 - e0 + head(e1)) / full


@flax.struct.dataclass
class LookupCounters:
    """The lookup drafter's counters (`Counters.drafter`), summed over the batch.

    Attributes:
      matches: [] (sequence, round) pairs whose n-gram lookup matched.
      proposed: [] tokens it proposed (matches only; the no-match placeholder is not
        counted).
      accepted: [] of those, tokens level 1 accepted.
      store_matches, store_proposed, store_accepted: [] the part of each that came from
        earlier requests (`Request.store`, `suffix_store.py`); 0 without a store.
    """

    matches: jax.Array
    proposed: jax.Array
    accepted: jax.Array
    store_matches: jax.Array
    store_proposed: jax.Array
    store_accepted: jax.Array


@flax.struct.dataclass
class LookupState:
    """The lookup drafter's loop state.

    Attributes:
      proposed_B: [B] int32, the tokens a match proposed for level 1's pending block (0: no
        match).
      gate: `gate.GateState`: each sequence's acceptance estimates per bucket (the n-gram
        length of the match and its source: `LookupDrafter.bucket`) and per whether it is
        on a run, and the bucket behind its pending proposal.
      from_store_B: [B] bool, the pending proposal came from earlier requests' tokens.
    """

    proposed_B: jax.Array
    gate: gate_lib.GateState
    from_store_B: jax.Array


@dataclasses.dataclass(frozen=True)
class LookupDrafter:
    """Level 0 as the prompt-lookup (n-gram) drafter (`lookup.py`; e_0 = 0, no layers).
    One lookup per round proposes up to k tokens at once; level 1 embeds them and verifies
    them in one pass, at the shortest compiled block that holds them (`level_blocks`: every
    level above it runs so), so a round without a match is a one-position pass: an AR step
    for `method="lookup"`, the draft exit's own draft step under layerskip / hispec. The
    proposals are deterministic (q one-hot), and the acceptance gate (`gate.py`,
    `PromptLookup.gate`) shortens a proposal to what its estimated acceptance pays for at
    the request's pass costs (`Request.lookup_cost`), estimated apart for matches in the
    sequence's own context and in earlier requests' store (`bucket`). The drafter's state
    is a `LookupState`."""

    lookup: lookup_lib.PromptLookup

    runs_layers: ClassVar[bool] = False
    # its proposals reach level 1 as blocks of positions (the rounds compile with the
    # platform's plain XLA options: `compile_cache.rounds_options`)
    block_passes: ClassVar[bool] = True
    draws: ClassVar[bool] = False  # deterministic proposals: q one-hot
    # it also drafts from earlier requests' tokens where the request holds them
    # (`Request.store`, `suffix_store.py`): the server keeps such a store for it
    reads_store: ClassVar[bool] = True

    def check(self, h) -> None:
        if h.exits[0] != 0:
            raise ValueError(f"exits {h.exits}: the lookup drafter's level runs no layer, "
                             "its exit must be 0")
        if (len(h.exits) < 2 or h.companion is not None or h.adaptive
                or h.max_windows[0] != self.lookup.max_tokens):
            raise ValueError("a lookup level needs a verifier above it, max_windows[0] == its "
                             "k, fixed windows and no SV companion")

    # ---- what it is, for people and the planner ------------------------------------------
    def label(self, h) -> str:
        del h
        return "lookup"

    def describe(self) -> str:
        return f"lookup k={self.lookup.max_tokens} ngram<={self.lookup.max_ngram}"

    def plan_options(self) -> dict:
        """The method options that rebuild it (`planner.plan.Plan`)."""
        return {"lookup": self.lookup.max_tokens}

    @property
    def gated(self) -> bool:
        return self.lookup.gate

    def carries_prefill(self, h) -> bool:
        return h.num_levels == 2  # level 1 is one pass over every layer from the embeddings

    # ---- its counters and stats ----------------------------------------------------------
    def init_counters(self, num_layers: int) -> LookupCounters:
        del num_layers
        zero = jnp.zeros((), jnp.int32)
        return LookupCounters(matches=zero, proposed=zero, accepted=zero, store_matches=zero,
                              store_proposed=zero, store_accepted=zero)

    def stats(self, h, total) -> dict:
        """What it proposed and what level 1 kept."""
        c = total.drafter
        proposed, accepted = int(c.proposed), int(c.accepted)
        return {"lookup": {
            "k": self.lookup.max_tokens, "max_ngram": self.lookup.max_ngram,
            "lookups": int(total.actions_K[0]), "matches": int(c.matches),
            "proposed": proposed, "accepted": accepted,
            "acceptance_rate": accepted / proposed if proposed else None,
            "verified_by_exit": h.exits[1],
            "from_earlier_requests": {"matches": int(c.store_matches),
                                      "proposed": int(c.store_proposed),
                                      "accepted": int(c.store_accepted)}}}

    def proposals(self, drafter_counters) -> tuple[Any, Any]:
        """(proposed, accepted) tokens: the matches' (a round without one is level 1's AR
        step, not a draft)."""
        return drafter_counters.proposed, drafter_counters.accepted

    def sources(self, drafter_counters) -> dict[str, tuple[Any, Any]]:
        """(proposed, accepted) tokens by where the match was: the sequence's own prompt
        and output, or earlier requests (the server's store)."""
        c = drafter_counters
        return {"context": (c.proposed - c.store_proposed, c.accepted - c.store_accepted),
                "earlier_requests": (c.store_proposed, c.store_accepted)}

    def block(self, max_window: int) -> int:
        return max_window  # one lookup: at most k positions

    def level_blocks(self, block: int) -> tuple[int, ...]:
        # how much arrives varies: every level above pays for what arrived, not for its block
        return power_of_two_blocks(block)

    def steps(self, block: int) -> int:
        del block
        return 1

    def bucket(self, ngram_B: jax.Array, from_store_B: jax.Array) -> jax.Array:
        """[B] the gate's bucket of a match: its n for one in the sequence's own context,
        N + n for one in earlier requests' store (N = max_ngram), whose continuations hold
        at other rates than the sequence's own."""
        return ngram_B + self.lookup.max_ngram * from_store_B.astype(ngram_B.dtype)

    def worth_more(self, rnd, gate, earlier, own) -> jax.Array:
        """[B] bool: the store's proposal `earlier` is worth more than the own context's
        `own` (`gate.proposal_value` at each one's bucket estimate: a sequence whose store
        matches keep few tokens goes on drafting from its own context; ties: the own)."""
        blocks, cost = rnd.h.level_blocks(1), rnd.req.lookup_cost
        value = lambda p, store: gate_lib.proposal_value(
            gate.of_match(self.bucket(p.ngram_B, jnp.full_like(p.matched_B, store))),
            p.length_B, p.matched_B, blocks, cost)
        return value(earlier, True) > value(own, False)

    def init(self, batch: int, ring: int, capacity: int) -> LookupState:
        del ring, capacity
        return LookupState(proposed_B=jnp.zeros((batch,), jnp.int32),
                           gate=gate_lib.GateState.init(batch, 2 * self.lookup.max_ngram,
                                                       runs=True),
                           from_store_B=jnp.zeros((batch,), bool))

    def ready(self, state, window_ready_B, pending_B):
        del state, window_ready_B
        return pending_B > 0  # one lookup a round: always ready

    def draft(self, rnd, state, part_B: jax.Array):
        """Writes each drafting sequence's n-gram proposal at c_0 + 1 .. and moves c_0 past
        it; no layer runs (level 1 embeds the tokens itself).

            before   c_1 = c_0                       (level 1 verified everything)
                     x_c ? ? ?
            after    c_1   c_0 = c_1 + m             (m proposed tokens, m <= k)
                     x_c  y1 y2 y3
        """
        out, c, k = state.out, state.processed_BxK, self.lookup.max_tokens
        S = out.tokens_BxS.shape[1]
        ds = state.draft_state
        # Never more than the budget still needs (the top level emits at most the proposals).
        remaining_B = rnd.req.max_new_B - out.num_new_B - (c[:, 0] + 1 - out.lengths_B)
        limit_B = jnp.clip(jnp.minimum(state.windows.windows_BxK1[:, 0], remaining_B), 1, k)
        with jax.named_scope("lookup"):
            prop = self.lookup.propose(out.tokens_BxS, c[:, 0], limit_B)
            from_store_B = jnp.zeros_like(prop.matched_B)
            if rnd.req.store is not None:  # earlier requests' tokens: the match worth more
                earlier = suffix_store.propose(self.lookup, rnd.req.store, out.tokens_BxS,
                                               c[:, 0], limit_B)
                prop, from_store_B = suffix_store.prefer(prop, earlier, self.worth_more(
                    rnd, ds.gate, earlier, prop))
            length_B = prop.length_B
            bucket_B = self.bucket(prop.ngram_B, from_store_B)
            if self.lookup.gate:  # greedy: one block for the batch; sampling: each alone
                length_B = gate_lib.choose(
                    ds.gate.of_match(bucket_B), length_B, prop.matched_B, part_B,
                    rnd.h.level_blocks(1), rnd.req.lookup_cost, joint=rnd.h.schedule == "sync")
        n_B = jnp.where(part_B, length_B, 0)
        j_K = jnp.arange(k)
        slots_BxK = jnp.where(j_K[None, :] < n_B[:, None], c[:, :1] + 1 + j_K[None, :], S)
        tokens_BxS = out.tokens_BxS.at[jnp.arange(c.shape[0])[:, None], slots_BxK].set(
            prop.tokens_BxK, mode="drop")
        matched_B = part_B & prop.matched_B
        stored_B = matched_B & from_store_B
        counters, mine = state.counters, state.counters.drafter
        counters = counters.replace(
            actions_K=counters.actions_K.at[0].add(1),
            drafter=mine.replace(
                matches=mine.matches + jnp.sum(matched_B),
                proposed=mine.proposed + jnp.sum(jnp.where(matched_B, n_B, 0)),
                store_matches=mine.store_matches + jnp.sum(stored_B),
                store_proposed=mine.store_proposed + jnp.sum(jnp.where(stored_B, n_B, 0))))
        ds = ds.replace(
            proposed_B=jnp.where(part_B, jnp.where(matched_B, n_B, 0), ds.proposed_B),
            gate=ds.gate.replace(ngram_B=jnp.where(part_B, bucket_B, ds.gate.ngram_B)),
            from_store_B=jnp.where(part_B, stored_B, ds.from_store_B))
        return state.replace(
            out=out.replace(tokens_BxS=tokens_BxS), processed_BxK=c.at[:, 0].add(n_B),
            draft_state=ds, counters=counters)

    def verify_input(self, rnd, state, positions_BxT, valid_BxT, write_cache: bool):
        """The proposals' token embeddings: level 1 starts at layer 0."""
        del valid_BxT, write_cache
        lo, _ = rnd.h.layer_range(1)
        tokens_BxT = gather_positions(state.out.tokens_BxS, positions_BxT)
        return rnd.backbone.embed(rnd.params, tokens_BxT), state, lo, 0, 0

    def proposal_logq(self, rnd, state, proposed_pos_BxT, proposed_BxT):
        """Deterministic proposals: q one-hot (greedy rules read no q)."""
        del state, proposed_pos_BxT
        return None if rnd.greedy else lookup_lib.one_hot_logq(proposed_BxT,
                                                               rnd.cfg.vocab_size)

    def record(self, rnd, state, part_B, accepted_B):
        """Counts the lookup tokens level 1 kept and updates each sequence's acceptance
        estimate for the n of the match."""
        del rnd
        ds = state.draft_state
        looked_B = jnp.where(part_B, ds.proposed_B, 0)
        kept_B = jnp.minimum(accepted_B, looked_B)
        counters = state.counters
        mine = counters.drafter
        return state.replace(
            counters=counters.replace(drafter=mine.replace(
                accepted=mine.accepted + jnp.sum(kept_B),
                store_accepted=mine.store_accepted + jnp.sum(
                    jnp.where(ds.from_store_B, kept_B, 0)))),
            draft_state=ds.replace(gate=ds.gate.record(looked_B, kept_B)))
