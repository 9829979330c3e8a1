"""The loop state of the engine: what one `lax.while_loop` trip reads and writes.

`EngineState` holds the output buffer, the KV cache, each level's progress c_k, the ring
buffers that carry hidden states (and, when sampling, distributions) from one level to the
next, and each policy's own state; `Counters` holds what the run reports. The ring helpers
at the bottom are the one way the round reads and writes those buffers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from hispec_jax.decoding import emit
from hispec_jax.decoding import windows as windows_lib
from hispec_jax.models.kv_cache import KVCache


@flax.struct.dataclass
class Counters:
    """Cost and acceptance counters, summed over the batch (K = number of levels).

    Attributes:
      rounds: [] loop trips (speculation rounds).
      actions_K: [K] passes run at each level (level 0: draft steps).
      block_passes_KxT: [K, blocks[-1] + 1] the passes of each verifying level k >= 1 by the
        block length T they ran at (what a pass costs: `costs.Costs.stage`).
      layer_passes: [] sequential layer passes (each pass adds its depth once).
      layer_token_evals: [] layers x valid tokens actually computed (decode, not prefill).
      head_evals_E: [L + 1] sequential exit-head evaluations by exit layer (a pass's head
        counts once whatever its block length, like `layer_passes`): with the heads' costs
        in layer equivalents, the work a method did (`methods.summarize_counters`).
      verifications_K: [K] (sequence, verification) pairs with something to verify.
      proposed_K: [K] tokens submitted to each verifying level.
      accepted_K: [K] of those, tokens the level accepted.
      emitted: [] tokens the top level emitted (after EOS and budget cuts).
      reject_checks: [] rejections by the level below the top, later checked by the top.
      true_rejects: [] of those, rejections the top level agreed with.
      verified_hist: [blocks[-1] + 1] top-level verifications by how many tokens each
        sequence submitted (SV's verified lengths).
      drafter: the drafter's own counters (`Drafter.init_counters`: a pytree of int32
        arrays, summed over the batch like the rest).
    """

    rounds: jax.Array
    actions_K: jax.Array
    block_passes_KxT: jax.Array
    layer_passes: jax.Array
    layer_token_evals: jax.Array
    head_evals_E: jax.Array
    verifications_K: jax.Array
    proposed_K: jax.Array
    accepted_K: jax.Array
    emitted: jax.Array
    reject_checks: jax.Array
    true_rejects: jax.Array
    verified_hist: jax.Array
    drafter: Any = ()

    @classmethod
    def zeros(cls, K: int, max_verified: int = 0, num_layers: int = 0,
              drafter: Any = ()) -> "Counters":
        """Every counter at 0: [K] per level, [L + 1] per exit layer, [max_verified + 1]
        per verified length, [] the rest; `drafter`: the drafter's own, as it made them."""
        shapes = {"actions_K": (K,), "block_passes_KxT": (K, max_verified + 1),
                  "verifications_K": (K,), "proposed_K": (K,),
                  "accepted_K": (K,), "head_evals_E": (num_layers + 1,),
                  "verified_hist": (max_verified + 1,)}
        return cls(**{f.name: jnp.zeros(shapes.get(f.name, ()), jnp.int32)
                      for f in dataclasses.fields(cls) if f.name != "drafter"},
                   drafter=drafter)


@flax.struct.dataclass
class EngineState:
    """The while-loop state.

    Attributes:
      out: output buffer; `out.tokens_BxS` also holds tentative tokens past the committed
        length (slot == position).
      cache: KV cache [L', B, K, S, H] of layers [0, top), written in place.
      processed_BxK: [B, K] int32, c_k per level.
      hidden: K - 1 ring buffers [B, W, D]; entry k holds layer-e_k states of positions
        [c_{k+1}, c_k) at slot position % W (entry 0 is [B, 0, D] under a drafter that
        runs no layer).
      rejected_pos_BxW, rejected_tok_BxW: [B, W] int32, the drafts the level below the top
        rejected, by position % W (position -1: none), for the true-reject rate.
      windows: the window policy's state (`windows.WindowState`).
      draft_state: the drafter's state (`policies.Drafter.init`: the exit drafter's
        `ExitDraftState`, its draft exit's state (a dynamic one's depths) and its gate's;
        the lookup drafter's `LookupState`).
      dists: sampling rules only: K - 1 ring buffers [B, W, V] float32; entry k holds level
        k's log-distribution for the tokens it passed up (positions (c_{k+1}, c_k]), the `q`
        of the level above. Empty for greedy decoding.
      draws_B: [B] int32, passes each sequence took part in; with the sequence's key it
        seeds every random draw, so draws never repeat and never depend on other sequences.
      counters: `Counters`.
      rider: None, or a prefill chunk of a slot's prompt riding this round's pass over
        every layer (`transformer.Rider`: the serving slots' fused step), leaving it with
        the chunk's last-layer states.
    """

    out: emit.Output
    cache: KVCache
    processed_BxK: jax.Array
    hidden: tuple[jax.Array, ...]
    rejected_pos_BxW: jax.Array
    rejected_tok_BxW: jax.Array
    windows: windows_lib.WindowState
    draft_state: Any
    dists: tuple[jax.Array, ...]
    draws_B: jax.Array
    counters: Counters
    rider: Any = None


# ---- the buffers, by position -------------------------------------------------------------
def ring_write(ring_BxWx: jax.Array, positions_BxT: jax.Array, values_BxTx: jax.Array,
               mask_BxT: jax.Array) -> jax.Array:
    """Writes `values_BxTx` at slot position % W where `mask_BxT` (other rows are dropped)."""
    W = ring_BxWx.shape[1]
    slots_BxT = jnp.where(mask_BxT, positions_BxT % W, W)
    return ring_BxWx.at[jnp.arange(ring_BxWx.shape[0])[:, None], slots_BxT].set(
        values_BxTx.astype(ring_BxWx.dtype), mode="drop")


def ring_read(ring_BxWx: jax.Array, positions_BxT: jax.Array) -> jax.Array:
    """The entries of `positions_BxT` (slot position % W)."""
    return ring_BxWx[jnp.arange(ring_BxWx.shape[0])[:, None], positions_BxT % ring_BxWx.shape[1]]


def gather_positions(tokens_BxS: jax.Array, positions_BxT: jax.Array) -> jax.Array:
    """The tokens at `positions_BxT` (clipped into the buffer)."""
    S = tokens_BxS.shape[1]
    return jnp.take_along_axis(tokens_BxS, jnp.clip(positions_BxT, 0, S - 1), axis=1)


def scatter_tokens(tokens_BxS: jax.Array, positions_B: jax.Array, values_B: jax.Array,
                   mask_B: jax.Array) -> jax.Array:
    """Writes one token per sequence at `positions_B` where `mask_B`."""
    S = tokens_BxS.shape[1]
    positions_B = jnp.where(mask_B, positions_B, S)
    return tokens_BxS.at[jnp.arange(tokens_BxS.shape[0]), positions_B].set(values_B, mode="drop")
