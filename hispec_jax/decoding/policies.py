"""The engine's policy seams, as typed contracts: read this first.

Every decoding method is one compiled loop (`engine/`) over an exit hierarchy
e_0 < e_1 < ... < e_{K-1} = L. What differs between methods is a few small, frozen (so
hashable: part of the compile key) policy objects held by `engine.Hierarchy`:

    round of the loop                                  policy asked
    -----------------                                  ------------
    draft: level 0 proposes tokens                ...  Drafter.draft / .ready
             (an exit drafter: how deep each runs)...  DraftExitPolicy.draft / .stops
    a level k >= 1 may verify its pending input?  ...  WindowPolicy.ready
    level 1 starts from / divides by              ...  Drafter.verify_input / .proposal_logq
    level k checks the tokens below it            ...  AcceptanceRule.accept
                     (SV's level 1 instead)       ...  Companion.select, .passed_up,
                                                              .passed_dists
    after each verification                       ...  WindowPolicy.update, Drafter.record

                  e_0            e_1                 L
      tokens ──▶ [draft] ─────▶ [verify 1] ─ ... ─▶ [verify K-1] ──▶ emitted
                  Drafter        Acceptance /        AcceptanceRule
                  (DraftExit)    Companion           (the top level)
                       WindowPolicy: when each verify runs

Implementations (what each method is made of, `methods.make_method`):

    Drafter           engine.ExitDrafter (an exit of the model: every method but lookup;
                      its acceptance gate shortens windows that do not pay, `gate.py`),
                      engine.LookupDrafter (prompt lookup, `lookup.py`),
                      engine.DraftModelDrafter (a draft model, `engine/draft_model.py`)
    DraftExitPolicy   draft.StaticDraftExit (every draft exits at e_0), draft.DynamicDraftExit
                      (SpecBound: each draft exits at its first confident layer)
    WindowPolicy      windows.FixedWindows (ar, layerskip, hispec), windows.AdaptiveWindows
                      (--adaptive, HiSpec App. J)
    AcceptanceRule    acceptance.GreedyAcceptance (greedy: keep the leading run equal to the
                      level's argmax), acceptance.TokenwiseRejection, BlockwiseVerification
                      (sampling: exact, HiSpec App. G / blockwise verification)
    Companion         sv.SVSelector (SV: how many drafts the final layer verifies)

A new drafter (a suffix tree, another model) is a new `Drafter` class, a new
verification-length signal a new `Companion`: the round asks them and holds no code of
its own for either. A policy's per-sequence state lives in the loop state (`WindowState`,
the drafter's state); every array argument carries its shape in its name (B batch, T block
length, V vocab, K levels). The shapes below are the contracts; `tests/test_policies.py`
checks that every implementation has exactly these methods and parameters.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax

from hispec_jax.decoding.acceptance import Verdict
from hispec_jax.decoding.draft import DraftInput, DraftOutput
from hispec_jax.decoding.windows import WindowState
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVCache


@runtime_checkable
class Drafter(Protocol):
    """Level 0 of a hierarchy: what it proposes each round, how many positions level 1's
    pass then holds, where level 1 starts from, and how it adapts to what level 1 kept.

    The `rnd` argument is the round (`engine.Round`: params, heads, cfg, hierarchy `h`,
    `greedy`, request `req`, per-pass PRNG `keys`), `state` the loop state
    (`engine.EngineState`); the methods that take a state return the updated state.
    `runs_layers`: level 0 runs layers [0, e_0) and buffers their states for level 1
    (False: it runs none, sits at exit e_0 = 0; level 1 starts from the token embeddings,
    level 0 keeps no ring of states). `block_passes`: its proposals reach level 1 as blocks
    of several positions at once (the rounds then compile with the platform's plain XLA
    options). `draws`: when sampling, its proposals are draws from a distribution q that it
    keeps in the engine's ring `dists[0]` (False: deterministic proposals, no ring).

    Besides the round, a drafter describes itself (`label`, `describe`, `plan_options`,
    `gated`), says whether a prefill chunk can ride a round (`carries_prefill`), and owns
    its counters (`init_counters`, kept in `Counters.drafter`), their stats (`stats`) and
    what it proposed for /metrics (`proposals`). docs/engine.md, "Adding a drafter", builds
    one in a few dozen lines.
    """

    runs_layers: bool
    block_passes: bool
    draws: bool

    def label(self, h) -> str:
        """A short name for metrics: "exit4", "lookup"."""

    def describe(self) -> str:
        """Its settings in a few words for the server's plan line ("lookup k=8 ngram<=4"),
        "" when the hierarchy's exits and windows say it all."""

    def plan_options(self) -> dict:
        """The method options that rebuild it on top of the exits (`planner.plan.Plan`)."""

    @property
    def gated(self) -> bool:
        """Whether an acceptance gate priced by the request's pass costs chooses its
        proposals (`gate.py`)."""

    def carries_prefill(self, h) -> bool:
        """Whether each round of `h` is one pass over every cached layer from layer 0."""

    def init_counters(self, num_layers: int) -> Any:
        """Its counters at zero: a pytree of int32 arrays, summed over the batch."""

    def stats(self, h, total: Any) -> dict:
        """Its entries of `generate`'s stats from the summed `Counters` `total`."""

    def proposals(self, drafter_counters: Any) -> tuple[Any, Any] | None:
        """(tokens it proposed, tokens level 1 kept) from its counters; None: level 1's own
        counts (`Counters.proposed_K[1]`, `accepted_K[1]`) say it."""

    # Optional: `events(drafter_counters) -> dict[str, count]`, its own counts that
    # /metrics reports as hispec:spec_decode_drafter_events_total{event=...} (a draft
    # model's passes, for one; `serving/metrics.py`).
    # Optional: `idle(rnd, state) -> [B] bool`, the sequences whose next round drafts
    # nothing, with `close_idle(rnd, state, part_B) -> state`, that round's drafting: under
    # two levels, rounds in which every active sequence is idle run as AR's step
    # (`Round.plain`; a draft model's window 0).

    def check(self, h) -> None:
        """Raises ValueError when the hierarchy `h` cannot have this drafter as level 0."""

    def block(self, max_window: int) -> int:
        """The most positions level 1's input holds, given level 1's largest window."""

    def level_blocks(self, block: int) -> tuple[int, ...]:
        """The block lengths every level above is compiled at, `block` its static one
        (empty: that one block; else the verification runs the shortest that holds it)."""

    def steps(self, block: int) -> int:
        """The most draft steps one round runs (static)."""

    def init(self, batch: int, ring: int, capacity: int) -> Any:
        """The drafter's per-sequence state (a pytree; `ring` = the hierarchy's ring size,
        `capacity` = S, the positions each sequence's buffers hold)."""

    def ready(self, state: Any, window_ready_B: jax.Array, pending_B: jax.Array) -> jax.Array:
        """[B] bool: level 1 verifies the `pending_B` positions (`window_ready_B`: the window
        policy's answer, or the budget is covered)."""

    def draft(self, rnd: Any, state: Any, part_B: jax.Array) -> Any:
        """One draft step for the sequences in `part_B`: writes the proposed tokens after
        c_0 and advances c_0 past them."""

    def verify_input(self, rnd: Any, state: Any, positions_BxT: jax.Array,
                     valid_BxT: jax.Array, write_cache: bool) -> tuple:
        """(level 1's input states [B, T, D], state, the layer they enter, layer passes and
        layer x token evaluations spent getting them there)."""

    def proposal_logq(self, rnd: Any, state: Any, proposed_pos_BxT: jax.Array,
                      proposed_BxT: jax.Array) -> jax.Array | None:
        """[B, T, V] log q of the proposals at `proposed_pos_BxT` (None: not kept)."""

    def record(self, rnd: Any, state: Any, part_B: jax.Array, accepted_B: jax.Array) -> Any:
        """After level 1 kept `accepted_B` of the proposals (where `part_B`)."""


@runtime_checkable
class WindowPolicy(Protocol):
    """When a verifying level k (1..K-1) runs: once its input holds window + 1 positions."""

    def init(self, windows_K1: jax.Array, batch: int) -> WindowState:
        """The state for a batch, from the initial windows [K - 1] (Nd, Ni, ...)."""

    def ready(self, state: WindowState, k: int, pending_B: jax.Array) -> jax.Array:
        """[B] bool: level k may verify the `pending_B` positions below it."""

    def update(self, state: WindowState, k: int, num_levels: int, accepted_B: jax.Array,
               proposed_B: jax.Array, verified_B: jax.Array) -> WindowState:
        """After level k verified `proposed_B` tokens (where `verified_B`), keeping
        `accepted_B` of them."""


@runtime_checkable
class DraftExitPolicy(Protocol):
    """How deep each draft token of an exit drafter (`engine.ExitDrafter`) runs before
    level 0 proposes it."""

    def init(self, batch: int, ring: int) -> Any:
        """The policy's per-sequence state (a pytree; `ring` = the hierarchy's ring size)."""

    def stops(self, state: Any, newest_B: jax.Array, pending_B: jax.Array) -> jax.Array:
        """[B] bool: drafting ends this round for these sequences."""

    def draft(self, params, heads, cfg: ModelConfig, inp: DraftInput, cache: KVCache,
              exit_layer: int, state: Any, backbone: Any) -> DraftOutput:
        """One draft step for the sequences in `inp.part_B`: the next token's logits (the
        model's functions are `backbone`'s: `decoding/backbone.py`)."""

    def align(self, params, cfg: ModelConfig, x_BxTxD: jax.Array, positions_BxT: jax.Array,
              valid_BxT: jax.Array, cache: KVCache, state: Any, lo: int, backbone: Any) -> Any:
        """Before level 1 continues from layer `lo`: bring drafts that exited elsewhere to
        it (None: every draft already is at `lo`)."""


@runtime_checkable
class AcceptanceRule(Protocol):
    """Which of the proposed tokens a level keeps, and what it emits after them.

    `needs_proposal_dists`: whether the rule reads the proposals' distributions (sampling
    rules; then the engine keeps them per level)."""

    needs_proposal_dists: bool

    def accept(self, target_BxTxV: jax.Array, proposal_logp_BxTxV: jax.Array,
               proposed_BxT: jax.Array, num_proposed_B: jax.Array,
               key_Bx2: jax.Array) -> Verdict:
        """The verdict on `num_proposed_B` proposals `proposed_BxT`, given this level's
        logits (or log-probabilities) `target_BxTxV` and the proposals' log-distribution."""


@runtime_checkable
class Companion(Protocol):
    """A verification-length signal at level 1 (SV's companion): instead of accepting or
    rejecting, level 1 scores the drafts and passes a prefix of them to the top level.
    Everything the engine does differently at such a level, it asks the companion.

    `keeps_draft_dists`: greedy decoding keeps the drafts' distributions too (the
    companion's signals read them). `rejects`: whether a cut is a rejection that the top
    level checks (the true-reject rate; SV's cut is not: level 1 never replaces a token)."""

    keeps_draft_dists: bool
    rejects: bool

    def select(self, companion_BxTxV: jax.Array, draft_logp_BxTxV: jax.Array,
               proposed_BxT: jax.Array, num_proposed_B: jax.Array, greedy: bool) -> Verdict:
        """gamma per sequence as a `Verdict` (gamma - 1 accepted + x_gamma as the
        replacement, or all n kept)."""

    def passed_up(self, verdict: Verdict, num_proposed_B: jax.Array) -> jax.Array:
        """[B] tokens the verdict passes to the top level."""

    def passed_dists(self, companion_BxTxV: jax.Array,
                     draft_logp_BxTxV: jax.Array) -> jax.Array:
        """[B, T, V] the distributions the top level verifies the passed tokens against
        (its `q`), from level 1's own output and the drafts' log-distributions."""
