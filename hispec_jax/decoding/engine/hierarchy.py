"""The static description of an exit hierarchy: which levels, their windows and policies,
and the block lengths every pass is compiled at. Validated before anything compiles.

Level k of K owns layers [e_{k-1}, e_k) (e_{-1} = 0) and its exit head e_k; level 0 is the
drafter (`Hierarchy.drafter`, an object that brings its own settings, state, counters and
stats: `drafters.py`), each level k >= 1 verifies the one below, and the top level e_{K-1}
emits. See docs/engine.md for the round these levels take part in.
"""

from __future__ import annotations

import dataclasses

from hispec_jax.decoding import policies
from hispec_jax.decoding import windows as windows_lib
from hispec_jax.decoding.acceptance import GreedyAcceptance
from hispec_jax.decoding.draft import StaticDraftExit
from hispec_jax.decoding.engine.drafters import ExitDrafter


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
      companion: None, or a verification-length selector for level 1 (SV, `sv.py`): level 1
        then only scores the drafts and passes a prefix of them, with the draft's
        distributions, to the top level (K = 3).
      top_blocks: the block lengths the top level's pass is compiled at (ascending, the
        last one `blocks[-1]`); each verification runs the shortest that holds every
        participant's pending tokens (`lax.switch`). Empty: one block, `blocks[-1]`.
      drafter: level 0 (`policies.Drafter`): an exit of the model
        (`drafters.ExitDrafter`: its draft-exit policy, static or SpecBound's dynamic one,
        and its acceptance gate), or a drafter that runs no layer at exit e_0 = 0 (prompt
        lookup, `drafters.LookupDrafter`: max_windows[0] is then its k).
    """

    exits: tuple[int, ...]
    max_windows: tuple[int, ...] = ()
    window_policy: policies.WindowPolicy = windows_lib.FixedWindows()
    rule: policies.AcceptanceRule = GreedyAcceptance()
    schedule: str = "sync"
    companion: policies.Companion | None = None
    top_blocks: tuple[int, ...] = ()
    drafter: policies.Drafter = ExitDrafter(StaticDraftExit())

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
        self.drafter.check(self)

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
        if thresholds:  # what level 1's input holds at most is the drafter's to say
            thresholds[0] = self.drafter.block(self.max_windows[0])
        return windows_lib.block_lengths(tuple(thresholds))

    def level_blocks(self, k: int) -> tuple[int, ...]:
        """The block lengths level k's pass is compiled at (one `lax.switch` branch each;
        empty: the one static block `blocks[k - 1]`)."""
        if k == self.num_levels - 1 and self.top_blocks:
            return self.top_blocks
        return self.drafter.level_blocks(self.blocks[k - 1])

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
    def carries_prefill(self) -> bool:
        """Whether each round is one pass over every cached layer from layer 0 (an AR step:
        one level, a static exit; or prompt lookup's level 1 under the top level), so that
        a prefill chunk of another sequence can ride it (`EngineState.rider`): the drafter
        says (`Drafter.carries_prefill`)."""
        return self.drafter.carries_prefill(self)

    def layer_range(self, level: int) -> tuple[int, int]:
        return (self.exits[level - 1] if level else 0), self.exits[level]

    def covers(self, other: "Hierarchy") -> bool:
        """Whether a loop compiled for this hierarchy can run `other`'s windows (the same
        hierarchy with window bounds at least as large)."""
        if len(self.max_windows) != len(other.max_windows) or self.drafter != other.drafter:
            return False  # (a drafter may fix its window: a draft model's k is max_windows[0])
        if any(h.level_blocks(k) for h in (self, other) for k in range(1, h.num_levels)):
            return self == other  # block lengths are part of the policy (SV, lookup)
        return (dataclasses.replace(self, max_windows=other.max_windows) == other
                and all(a >= b for a, b in zip(self.max_windows, other.max_windows)))
