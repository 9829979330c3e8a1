"""Verification-length policies: when a level verifies (fixed windows, HiSpec App. J).

Windows are per-sequence arrays in the loop state (`WindowState`), so changing them
(adaptively, or per call) never recompiles. Level k (1..K-1) verifies once the positions
its input holds reach `windows_BxK1[:, k - 1] + 1`: `draft_len + 1` for the first verifier
(Nd drafts plus the position whose prediction is the bonus candidate) and
`verify_window + 1` above it (Ni tokens plus the bonus candidate).

Static block lengths bound how many positions a verification can see:
    block[0] = T_0,max,      block[k] = T_k,max - 1 + block[k - 1]
because level k's pending count is below T_k before its last growth, and one round adds
at most block[k - 1] positions to it (the draft phase of a round runs at most block[0]
draft steps).
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

# Paper App. J ranges and thresholds.
DRAFT_LEN_RANGE = (1, 3)
VERIFY_WINDOW_RANGE = (3, 8)
DRAFT_UP, DRAFT_DOWN = 0.8, 0.5
VERIFY_UP, VERIFY_DOWN = 0.8, 0.3
EMA_DECAY = 0.5  # weight of the newest verification's acceptance in the running rate


def block_lengths(max_thresholds: tuple[int, ...]) -> tuple[int, ...]:
    """Static block length of every verifying level (index k: level k + 1's block)."""
    blocks = []
    for k, t in enumerate(max_thresholds):
        blocks.append(t if k == 0 else t - 1 + blocks[-1])
    return tuple(blocks)


@flax.struct.dataclass
class WindowState:
    """A verification-length policy's per-sequence state (part of the engine state).

    Attributes:
      windows_BxK1: [B, K - 1] int32, current windows: draft_len (Nd) for level 1, then the
        verify window (Ni) of every intermediate level.
      rates_BxK1: [B, K - 1] float32, running acceptance rate of levels 1..K-1.
    """

    windows_BxK1: jax.Array
    rates_BxK1: jax.Array


@dataclasses.dataclass(frozen=True)
class FixedWindows:
    """Verification-length policy: level k verifies once its input holds `window + 1`
    positions (the engine also verifies early when the pending tokens cover the budget).

    The policy seam of the engine: `init` builds the state kept in the loop state,
    `ready` says which sequences' level-k input is ready, `update` sees every verification
    outcome. Adaptive windows (App. J) override `update`; SV's verification lengths are a
    companion (`policies.Companion`), not a window policy.
    """

    def init(self, windows_K1: jax.Array, batch: int) -> WindowState:
        K1 = windows_K1.shape[0]
        return WindowState(
            windows_BxK1=jnp.broadcast_to(windows_K1.astype(jnp.int32), (batch, K1)),
            rates_BxK1=jnp.ones((batch, K1), jnp.float32))

    def ready(self, state: WindowState, k: int, pending_B: jax.Array) -> jax.Array:
        """[B] bool: level k (1..K-1) may verify the `pending_B` positions below it."""
        return pending_B >= state.windows_BxK1[:, k - 1] + 1

    def update(self, state: WindowState, k: int, num_levels: int, accepted_B: jax.Array,
               proposed_B: jax.Array, verified_B: jax.Array) -> WindowState:
        """After level k verified `proposed_B` tokens (where `verified_B`) and kept
        `accepted_B`. Fixed windows never change."""
        del k, num_levels, accepted_B, proposed_B, verified_B
        return state


@dataclasses.dataclass(frozen=True)
class AdaptiveWindows(FixedWindows):
    """App. J: adjust Nd from the first verifier's acceptance and the window below the top
    level from the final acceptance, per sequence, clamped to the paper's ranges."""

    def update(self, state, k, num_levels, accepted_B, proposed_B, verified_B):
        verified_B = verified_B & (proposed_B > 0)
        rate_B = ema(state.rates_BxK1[:, k - 1], accepted_B, proposed_B, verified_B)
        windows = state.windows_BxK1
        if k == 1:
            windows = windows.at[:, 0].set(jnp.where(
                verified_B, self.update_draft(rate_B, windows[:, 0]), windows[:, 0]))
        if k == num_levels - 1 and num_levels >= 3:
            windows = windows.at[:, k - 1].set(jnp.where(
                verified_B, self.update_verify(rate_B, windows[:, k - 1]), windows[:, k - 1]))
        return WindowState(windows_BxK1=windows,
                           rates_BxK1=state.rates_BxK1.at[:, k - 1].set(rate_B))

    def update_draft(self, rate_B, draft_len_B):
        up = jnp.minimum(draft_len_B + 1, DRAFT_LEN_RANGE[1])
        down = jnp.maximum(draft_len_B - 1, DRAFT_LEN_RANGE[0])
        return jnp.where(rate_B >= DRAFT_UP, up, jnp.where(rate_B < DRAFT_DOWN, down, draft_len_B))

    def update_verify(self, rate_B, window_B):
        up = jnp.minimum(window_B + 1, VERIFY_WINDOW_RANGE[1])
        down = jnp.maximum(window_B - 1, VERIFY_WINDOW_RANGE[0])
        return jnp.where(rate_B >= VERIFY_UP, up, jnp.where(rate_B < VERIFY_DOWN, down, window_B))


def ema(rate_B, accepted_B, proposed_B, mask_B):
    """Running acceptance rate, updated only where `mask_B` (a verification happened)."""
    new = accepted_B / jnp.maximum(proposed_B, 1)
    return jnp.where(mask_B, (1 - EMA_DECAY) * rate_B + EMA_DECAY * new, rate_B)


def power_of_two_blocks(block: int) -> tuple[int, ...]:
    """The block lengths a pass of at most `block` positions is compiled at, one
    `lax.switch` branch each (the levels above a lookup drafter, SV's top level): powers of
    two below `block`, then `block` (1, 2, 4, 8 for 8; 1, 2, 4, 8, 11 for 11)."""
    sizes, t = [], 1
    while t < block:
        sizes.append(t)
        t *= 2
    return tuple(sizes) + (block,)
