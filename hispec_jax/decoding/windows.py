"""Verification windows: when a level verifies, and the adaptive policy (HiSpec App. J).

Windows are per-sequence arrays in the loop state, so changing them (adaptively, or per
call) never recompiles. `thresholds_BxK1[:, k]` is how many processed-but-unverified
positions level k must hold before level k+1 verifies them: `draft_len + 1` for the draft
level (Nd drafts plus the position whose prediction is the bonus candidate) and
`verify_window + 1` for an intermediate verifier (Ni tokens plus the bonus candidate).

Static block lengths bound how many positions a verification can see:
    block[0] = T_0,max,      block[k] = T_k,max - 1 + block[k - 1]
because level k's pending count is below T_k before its last growth, and one action of
level k adds at most block[k - 1] positions.
"""

from __future__ import annotations

import dataclasses

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


@dataclasses.dataclass(frozen=True)
class AdaptiveWindows:
    """App. J: adjust Nd from the first verifier's acceptance and the window below the top
    level from the final acceptance, per sequence, clamped to the paper's ranges."""

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
