"""Draft-exit policies: how deep an exit drafter runs each draft token.

The exit drafter's draft step (`engine.ExitDrafter`) embeds the newest token of every
drafting sequence and asks the policy for the draft logits, the hidden state the first
verifier continues from and the updated cache. The policy's state lives in the engine state
(`EngineState.draft_state`).

    StaticDraftExit     every draft token exits at e_0 (LayerSkip, HiSpec, HSD, SV)
    DynamicDraftExit    SpecBound (docs/algorithms.md): a draft token exits at the first layer
                        whose annealed confidence clears tau, up to a depth bound D;
                        a token that reaches D unconfident is "hard" and ends drafting

Dynamic depths, with fixed shapes. The exit depth of each draft position is data (a ring
of depths beside the engine's ring of hidden states), never shape. A draft step runs the
pending draft positions [c_1, c_0] as one block, one layer at a time:

    layer l runs for: the new token (while it has not exited) and every earlier pending
                      position whose depth is l (lazy fill: a later token that goes deeper
                      needs their keys/values at layer l)

    positions  c_1        c_1+1      c_1+2 = c_0 (new)
    depth      2          4          0 -> exits at 5 once confident
    layer 2    runs       -          runs
    layer 3    runs       -          runs
    layer 4    runs       runs       runs            (all three now at depth 5)

Verification (`align`) then brings every pending position from its own depth up to D (one
masked pass per layer in [min exit, D), skipped where no position needs it) and the top
level runs [D, L) once for the whole block. Every layer runs once per position: the keys and
values a position writes at a layer never depend on when they were computed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from hispec_jax.decoding.backbone import TRANSFORMER, Backbone
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVCache


@dataclasses.dataclass(frozen=True)
class DraftInput:
    """What the engine hands a draft step (B sequences, one new token each).

    Attributes:
      x_Bx1xD: embedding of the newest token (at `position_B`).
      position_B: [B] c_0, the newest token's position.
      part_B: [B] bool, the sequences that draft in this step.
      pending_start_B: [B] c_1, the first position the first verifier has not processed
        (c_0 itself when there is no verifier).
      ring_BxWxD: the engine's ring of draft-level hidden states (None for K = 1).
      capacity: S, the cache capacity (the position of padding entries).
      block: the static number of positions [c_1, c_0] a draft step may see.
      rider: a prefill chunk riding the step's pass (`transformer.Rider`; a static draft
        exit only), or None.
    """

    x_Bx1xD: jax.Array
    position_B: jax.Array
    part_B: jax.Array
    pending_start_B: jax.Array
    ring_BxWxD: jax.Array | None
    capacity: int
    block: int
    rider: Any = None


@dataclasses.dataclass(frozen=True)
class DraftOutput:
    """What a draft step produced.

    Attributes:
      h_Bx1xD: the new token's hidden state at its exit (what the first verifier continues
        from).
      logits_BxV: float32 draft logits for the next position.
      cache: the cache with the draft layers' keys/values written.
      layer_passes: [] sequential layer passes this step ran.
      layer_token_evals: [] layers x tokens it computed.
      depth_B: [B] the layer each new token exited at.
      state: the policy's new state.
      ring_BxWxD: the updated ring of hidden states, when the policy wrote it itself (None:
        the engine writes `h_Bx1xD` at the new token's slot).
      head_evals_E: [L + 1] exit-head evaluations this step ran, by exit layer (None: one, at
        the draft exit).
      rider: the input's rider, leaving the pass (None without one).
    """

    h_Bx1xD: jax.Array
    logits_BxV: jax.Array
    cache: KVCache
    layer_passes: Any
    layer_token_evals: Any
    depth_B: jax.Array
    state: Any
    ring_BxWxD: jax.Array | None = None
    head_evals_E: jax.Array | None = None
    rider: Any = None


@dataclasses.dataclass(frozen=True)
class StaticDraftExit:
    """Every draft token runs layers [0, e_0) and exits at e_0."""

    def init(self, batch: int, ring: int) -> Any:
        del batch, ring
        return ()

    def stops(self, state, newest_B, pending_B) -> jax.Array:
        """[B] bool: drafting ends for these sequences this round (never, here)."""
        del state, newest_B
        return jnp.zeros_like(pending_B, dtype=bool)

    def draft(self, params, heads, cfg: ModelConfig, inp: DraftInput, cache: KVCache,
              exit_layer: int, state: Any, backbone: Backbone = TRANSFORMER) -> DraftOutput:
        positions_Bx1 = jnp.where(inp.part_B, inp.position_B, inp.capacity)[:, None]
        result = backbone.run_layers_cached(params, cfg, inp.x_Bx1xD, positions_Bx1, cache, 0,
                                            exit_layer, rider=inp.rider)
        (h_Bx1xD, cache), rider = result[:2], (None if inp.rider is None else result[2])
        with jax.named_scope("head"):
            logits_BxV = backbone.exit_logits(params, heads, cfg, h_Bx1xD, exit_layer)[:, 0]
        return DraftOutput(h_Bx1xD, logits_BxV.astype(jnp.float32), cache, exit_layer,
                           exit_layer * jnp.sum(inp.part_B),
                           jnp.full(inp.position_B.shape, exit_layer, jnp.int32), state,
                           rider=rider)

    def align(self, params, cfg, x_BxTxD, positions_BxT, valid_BxT, cache, state, lo,
              backbone: Backbone = TRANSFORMER):
        """Every draft position is at layer e_0 already: nothing to align."""
        return None


@flax.struct.dataclass
class DepthState:
    """DynamicDraftExit's state.

    Attributes:
      depth_BxW: [B, W] layers each ring slot's position has run (slot = position % W).
      hard_pos_B: [B] the position whose draft was hard (its proposal ends drafting), -1.
    """

    depth_BxW: jax.Array
    hard_pos_B: jax.Array


def annealed_temperature(layer: int, num_layers: int, anneal: float) -> float:
    """SpecBound's layer temperature T_l = 1 + alpha (1 - l / L) (rebuilt: docs/algorithms.md)."""
    return 1.0 + anneal * (1.0 - layer / num_layers)


@dataclasses.dataclass(frozen=True)
class DynamicDraftExit:
    """SpecBound drafting: exit at the first of `exits` whose annealed confidence
    max softmax(z_l / T_l) >= tau; a token still unconfident at `exits[-1]` (the depth bound
    D) is proposed from D and is the round's last draft (a hard token).

    Attributes:
      exits: the candidate exit layers, ascending; the last one is the depth bound D.
      tau: the confidence threshold, in (0, 1].
      anneal: alpha >= 0 of the temperature schedule (0: plain confidence).
      num_layers: L (the schedule's depth).
    """

    exits: tuple[int, ...]
    tau: float
    anneal: float
    num_layers: int

    @property
    def depth_bound(self) -> int:
        return self.exits[-1]

    def init(self, batch: int, ring: int) -> DepthState:
        return DepthState(depth_BxW=jnp.zeros((batch, ring), jnp.int32),
                          hard_pos_B=jnp.full((batch,), -1, jnp.int32))

    def stops(self, state: DepthState, newest_B, pending_B) -> jax.Array:
        return (state.hard_pos_B == newest_B - 1) & (pending_B > 0)

    def confident(self, logits_BxV: jax.Array, layer: int) -> jax.Array:
        """[B] bool: the annealed top-1 probability at exit `layer` clears tau."""
        T = annealed_temperature(layer, self.num_layers, self.anneal)
        # max softmax(z / T) = 1 / sum exp((z - max z) / T): no division over the vocabulary
        shifted_BxV = (logits_BxV - jnp.max(logits_BxV, axis=-1, keepdims=True)) / T
        return 1.0 / jnp.sum(jnp.exp(shifted_BxV), axis=-1) >= self.tau

    def draft(self, params, heads, cfg: ModelConfig, inp: DraftInput, cache: KVCache,
              exit_layer: int, state: DepthState,
              backbone: Backbone = TRANSFORMER) -> DraftOutput:
        del exit_layer  # = the depth bound
        B, T, S = inp.position_B.shape[0], inp.block, inp.capacity
        ring = inp.ring_BxWxD
        W = ring.shape[1]
        batch_Bx1 = jnp.arange(B)[:, None]
        positions_BxT = inp.pending_start_B[:, None] + jnp.arange(T)[None, :]
        valid_BxT = (positions_BxT <= inp.position_B[:, None]) & inp.part_B[:, None]
        new_BxT = valid_BxT & (positions_BxT == inp.position_B[:, None])
        slots_BxT = positions_BxT % W
        x_BxTxD = jnp.where(new_BxT[..., None], inp.x_Bx1xD.astype(ring.dtype),
                            ring[batch_Bx1, slots_BxT])
        depth_BxT = jnp.where(new_BxT, 0, state.depth_BxW[batch_Bx1, slots_BxT])
        write_BxT = jnp.where(valid_BxT, positions_BxT, S)
        new_index_B = jnp.clip(inp.position_B - inp.pending_start_B, 0, T - 1)

        going_B = inp.part_B
        logits_BxV = jnp.zeros((B, cfg.vocab_size), jnp.float32)
        exit_B = jnp.zeros((B,), jnp.int32)
        hard_B = jnp.zeros((B,), bool)
        passes = evals = jnp.zeros((), jnp.int32)
        heads_E = jnp.zeros((self.num_layers + 1,), jnp.int32)
        for layer in range(self.depth_bound):
            runs_BxT = valid_BxT & going_B[:, None] & (depth_BxT == layer)
            x_BxTxD, cache = jax.lax.cond(
                jnp.any(going_B), _one_layer(backbone, params, cfg, write_BxT, runs_BxT, layer),
                lambda xc: xc, (x_BxTxD, cache))
            passes += jnp.any(going_B).astype(jnp.int32)
            evals += jnp.sum(runs_BxT)
            depth_BxT = depth_BxT + runs_BxT
            e = layer + 1
            if e not in self.exits:
                continue
            h_Bx1xD = jnp.take_along_axis(x_BxTxD, new_index_B[:, None, None], axis=1)
            heads_E = heads_E.at[e].add(jnp.any(going_B).astype(jnp.int32))
            with jax.named_scope("head"):
                z_BxV = jax.lax.cond(
                    jnp.any(going_B),
                    lambda h: backbone.exit_logits(params, heads, cfg, h, e)[:, 0].astype(
                        jnp.float32),
                    lambda h: jnp.zeros((B, cfg.vocab_size), jnp.float32), h_Bx1xD)
            confident_B = self.confident(z_BxV, e)
            stop_B = going_B & (confident_B | (e == self.depth_bound))
            logits_BxV = jnp.where(stop_B[:, None], z_BxV, logits_BxV)
            exit_B = jnp.where(stop_B, e, exit_B)
            hard_B |= stop_B & ~confident_B
            going_B &= ~stop_B

        slots_BxT = jnp.where(valid_BxT, slots_BxT, W)  # write back valid positions only
        ring = ring.at[batch_Bx1, slots_BxT].set(x_BxTxD, mode="drop")
        depth_BxW = state.depth_BxW.at[batch_Bx1, slots_BxT].set(depth_BxT, mode="drop")
        hard_pos_B = jnp.where(inp.part_B, jnp.where(hard_B, inp.position_B, -1),
                               state.hard_pos_B)
        h_Bx1xD = jnp.take_along_axis(x_BxTxD, new_index_B[:, None, None], axis=1)
        return DraftOutput(h_Bx1xD, logits_BxV, cache, passes, evals, exit_B,
                           DepthState(depth_BxW, hard_pos_B), ring_BxWxD=ring,
                           head_evals_E=heads_E)

    def align(self, params, cfg, x_BxTxD, positions_BxT, valid_BxT, cache, state: DepthState,
              lo: int, backbone: Backbone = TRANSFORMER):
        """Brings every valid block position from its depth up to layer `lo` (= D).

        Returns (x, cache, lo, layer passes, layer x token evaluations)."""
        assert lo == self.depth_bound, (lo, self.depth_bound)
        W = state.depth_BxW.shape[1]
        batch_Bx1 = jnp.arange(x_BxTxD.shape[0])[:, None]
        depth_BxT = jnp.where(valid_BxT, state.depth_BxW[batch_Bx1, positions_BxT % W], lo)
        passes = evals = jnp.zeros((), jnp.int32)
        for layer in range(self.exits[0], lo):
            runs_BxT = valid_BxT & (depth_BxT <= layer)
            x_BxTxD, cache = jax.lax.cond(
                jnp.any(runs_BxT), _one_layer(backbone, params, cfg, positions_BxT, runs_BxT,
                                              layer),
                lambda xc: xc, (x_BxTxD, cache))
            passes += jnp.any(runs_BxT).astype(jnp.int32)
            evals += jnp.sum(runs_BxT)
        return x_BxTxD, cache, lo, passes, evals


def _one_layer(backbone: Backbone, params, cfg, positions_BxT, runs_BxT, layer):
    """(x, cache) -> (x, cache) after layer `layer` for the tokens in `runs_BxT` (the others
    pass through and write nothing)."""
    def run(x_and_cache):
        x_BxTxD, cache = x_and_cache
        return backbone.run_layers_cached(params, cfg, x_BxTxD, positions_BxT, cache, layer,
                                          layer + 1,
                                          stop_BxT=jnp.where(runs_BxT, layer + 1, layer))
    return run
