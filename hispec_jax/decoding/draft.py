"""Draft-exit policies: how deep the draft level runs each draft token.

The engine's draft step embeds the newest token of every drafting sequence and asks the
policy for (the hidden state it hands to the first verifier, the draft logits, the
updated cache). The policy's state lives in the engine state (`EngineState.draft_state`).

    StaticDraftExit     every draft token exits at e_0 (LayerSkip, HiSpec, HSD)

A dynamic-exit policy (SpecBound: exit at the first layer whose annealed confidence clears
a threshold, up to a depth bound) plugs in here: it runs the layers one at a time with
`run_layers_cached(..., stop_BxT=...)` (a per-token stop layer, so tokens of different
depths share one pass), records each position's depth in its state, and reports the
layer passes it ran.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.transformer import run_layers_cached


@dataclasses.dataclass(frozen=True)
class DraftOutput:
    """What a draft step produced for a [B, 1] block of newest tokens.

    Attributes:
      h_Bx1xD: layer-e_0 hidden states (what the first verifier continues from).
      logits_BxV: float32 draft logits for the next position.
      cache: the cache with the draft layers' keys/values written.
      layer_passes: [] int32 sequential layer passes this step ran.
      state: the policy's new state.
    """

    h_Bx1xD: jax.Array
    logits_BxV: jax.Array
    cache: KVCache
    layer_passes: Any
    state: Any


@dataclasses.dataclass(frozen=True)
class StaticDraftExit:
    """Every draft token runs layers [0, e_0) and exits at e_0."""

    def init(self, batch: int) -> Any:
        del batch
        return ()

    def draft(self, params, heads, cfg: ModelConfig, x_Bx1xD: jax.Array,
              positions_Bx1: jax.Array, cache: KVCache, exit_layer: int,
              state: Any) -> DraftOutput:
        h_Bx1xD, cache = run_layers_cached(params, cfg, x_Bx1xD, positions_Bx1, cache, 0,
                                           exit_layer)
        logits_BxV = exit_logits(params, heads, cfg, h_Bx1xD, exit_layer)[:, 0]
        return DraftOutput(h_Bx1xD, logits_BxV, cache, exit_layer, state)
