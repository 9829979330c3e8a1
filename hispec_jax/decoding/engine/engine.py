"""The `Engine`: one decoding loop, described by a frozen, hashable object (the model's
architecture and parameter layout, an exit hierarchy, the shapes), with the loop as pure
functions `prefill_prompts` / `state_from_prefill` / `step` / `run_rounds` (gemma's
sampler pattern). The programs that run are built from them by the slot engine
(`decoding/slots.py`), for offline `generate`, streaming and serving alike, and kept in the
process-wide compile cache (`compile_cache.py`). `run` is the whole loop as one function,
for reading what it compiles to: `lower` (ahead-of-time compiles, the HLO checks).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from hispec_jax.decoding import emit
from hispec_jax.decoding.backbone import TRANSFORMER, Backbone
from hispec_jax.decoding.engine.hierarchy import Hierarchy
from hispec_jax.decoding.engine.round import Round
from hispec_jax.decoding.engine.state import Counters, EngineState
from hispec_jax.decoding.request import Request
from hispec_jax.decoding.sampling import SamplingArrays, choose_tokens
from hispec_jax.decoding.suffix_store import StoreArrays
from hispec_jax.models import sharding
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVCache


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The static shapes of one compiled loop.

    Attributes:
      batch: B, sequences per loop (padding rows included).
      capacity: S, cache positions per sequence.
      prompt_block: T, the prefill chunk (a power of two; `prefill.py`): prompts of any
        length run full chunks of T positions, the rest in at most two small chunks of
        T / 4 (`prefill.chunk_counts`).
      num_eos: E, EOS ids (padded with -1; at least 1).
      store_tokens: R, the tokens of earlier requests' store the lookup drafter also
        drafts from (`Request.store`, `suffix_store.py`); 0: none.
    """

    batch: int
    capacity: int
    prompt_block: int
    num_eos: int = 1
    store_tokens: int = 0


def _trace_settings() -> str:
    """The module settings a trace reads, for the program keys."""
    return f"sharding_rules={sorted(sharding.RULES.items())}"


def _signature(tree) -> tuple:
    """A hashable description of a pytree of arrays: structure, shapes and dtypes."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(x.shape), jnp.dtype(x.dtype).name) for x in leaves)


def _structs(signature) -> Any:
    treedef, leaves = signature
    return jax.tree.unflatten(treedef, [jax.ShapeDtypeStruct(s, d) for s, d in leaves])


@dataclasses.dataclass(frozen=True)
class Engine:
    """One compiled decoding loop: a model's architecture and parameter layout, an exit
    hierarchy and the shapes (gemma's sampler pattern: a frozen description with
    `init_state` / `step` / `run`, and one compile cache keyed by the object itself).

    Attributes:
      cfg: the model architecture.
      hierarchy: the exit hierarchy and its policies.
      shapes: batch, cache capacity, prompt block, EOS count.
      greedy: argmax decoding (static: removes sorting from the loop).
      params_signature, heads_signature: structure, shapes and dtypes of the model's
        parameters and exit heads (the layer layout and trained heads are part of the key).
      shardings: how `run` is partitioned over a device mesh (`decoding.mesh.LoopShardings`,
        hashable: in/out shardings and the mesh it is lowered under); None: one device.
      backbone: the model's functions the loop calls (`decoding/backbone.py`): the
        transformer, or the planner's trace model.
    """

    cfg: ModelConfig
    hierarchy: Hierarchy
    shapes: Shapes
    greedy: bool
    params_signature: tuple
    heads_signature: tuple
    shardings: Any = None
    backbone: Backbone = TRANSFORMER

    @classmethod
    def for_model(cls, model, hierarchy: Hierarchy, shapes: Shapes, greedy: bool = True,
                  shardings=None) -> "Engine":
        """The engine for `model` (a `Model`; its arrays may be `jax.ShapeDtypeStruct`s)."""
        return cls(cfg=model.cfg, hierarchy=hierarchy, shapes=shapes, greedy=greedy,
                   params_signature=_signature(model.params),
                   heads_signature=_signature(model.heads), shardings=shardings)

    @property
    def cache_layers(self) -> int:
        return self.hierarchy.exits[-1]

    @property
    def per_layer_cache(self) -> bool:
        """The cache layout follows the layer layout: per-layer buffers for "unrolled"."""
        return isinstance(_structs(self.params_signature)["layers"], (tuple, list))

    def empty_cache(self) -> KVCache:
        return KVCache.zeros(self.cfg, self.shapes.batch, self.shapes.capacity, self.cache_layers,
                             per_layer=self.per_layer_cache)

    # ---- the loop, as pure functions -----------------------------------------------------
    def init_state(self, params, heads, req: Request, cache: KVCache,
                   windows_K1: jax.Array) -> EngineState:
        """Prefill the prompts, emit each sequence's first token, build the loop state
        (`prefill_prompts`, then `state_from_prefill`).

        Args:
          req: the batch (prompts, budgets, EOS ids, PRNG keys, sampling settings).
          cache: an empty cache with at least `hierarchy.exits[-1]` layers.
          windows_K1: [K - 1] int32 initial windows (draft_len, then verify windows).
        """
        h_BxD, cache = self.prefill_prompts(params, req, cache)
        return self.state_from_prefill(params, heads, req, h_BxD, cache, windows_K1)

    def prefill_prompts(self, params, req: Request, cache: KVCache, chunk: int | None = None
                        ) -> tuple[jax.Array, KVCache]:
        """Caches layers [0, top) of every prompt position (`prefill.prefill`, in chunks of
        `chunk` positions; None: `shapes.prompt_block`); returns the layer-top hidden states
        [B, D] at each prompt's last position (in the embeddings' dtype, the residual
        stream's) and the cache."""
        with jax.named_scope("prefill"):
            h_BxD, cache = self.backbone.prefill(params, self.cfg, req.tokens_BxS,
                                                 req.prompt_lens_B, cache,
                                                 self.hierarchy.exits[-1],
                                                 chunk=chunk or self.shapes.prompt_block)
        return h_BxD.astype(params["embed"].dtype), cache

    def state_from_prefill(self, params, heads, req: Request, h_BxD: jax.Array, cache,
                           windows_K1: jax.Array) -> EngineState:
        """The loop state of prompts whose cache is written: each sequence's first token
        (drawn from `h_BxD`, the layer-top hidden state at its last prompt position), the
        output buffer holding the prompt (the lookup drafter's history), every level at c_k
        = the prompt length, empty rings and the policies' initial states. `cache` goes
        into the state as it is (any pytree: the slots pass a placeholder)."""
        h, cfg, greedy = self.hierarchy, self.cfg, self.greedy
        K, top = h.num_levels, h.exits[-1]
        B = req.prompt_lens_B.shape[0]
        if not greedy and K > 1 and not h.rule.needs_proposal_dists:
            raise ValueError("sampling with a speculative hierarchy needs a sampling acceptance rule")
        with jax.named_scope("first_token"):
            logits_BxV = emit.suppress_eos(self.backbone.exit_logits(params, heads, cfg,
                                                                     h_BxD[:, None], top),
                                           req.eos_ids_E, jnp.zeros((B, 1), jnp.int32),
                                           req.min_new_B)[:, 0]
            first_keys = jax.vmap(jax.random.fold_in)(req.sequence_keys_Bx2, jnp.full((B,), -1))
            first_B = choose_tokens(logits_BxV, greedy, req.sampling, first_keys)
            out = emit.start_output(req.tokens_BxS, req.prompt_lens_B, req.max_new_B)
            out, _ = emit.append_block(out, first_B[:, None], jnp.ones_like(first_B),
                                       req.eos_ids_E, req.max_new_B)
        dtype = jnp.dtype(cfg.dtype)
        # (a drafter that runs no layer keeps no states, one that does not draw keeps no
        # distributions: its rings are empty)
        S = req.tokens_BxS.shape[1]
        ring = lambda k, level_0: h.ring if k or level_0 else 0
        return EngineState(
            out=out,
            cache=cache,
            processed_BxK=jnp.broadcast_to(req.prompt_lens_B[:, None], (B, K)).astype(jnp.int32),
            hidden=tuple(jnp.zeros((B, ring(k, h.drafter.runs_layers), cfg.hidden_size), dtype)
                         for k in range(K - 1)),
            rejected_pos_BxW=jnp.full((B, h.ring), -1, jnp.int32),
            rejected_tok_BxW=jnp.zeros((B, h.ring), jnp.int32),
            windows=h.window_policy.init(windows_K1, B),
            draft_state=h.drafter.init(B, h.ring, S),
            dists=tuple(jnp.full((B, ring(k, h.drafter.draws), cfg.vocab_size), -jnp.inf,
                                 jnp.float32)
                        for k in range(K - 1)) if (not greedy or h.keeps_dists) and K > 1 else (),
            draws_B=jnp.zeros((B,), jnp.int32),
            counters=Counters.zeros(K, max(h.blocks, default=0), cfg.num_layers,
                                    h.drafter.init_counters(cfg.num_layers)),
        )

    def step(self, params, heads, req: Request, state: EngineState) -> EngineState:
        """One speculation round for the whole batch (one trip of the loop)."""
        return Round(params, heads, req, self.cfg, self.hierarchy, self.greedy,
                     self.backbone)(state)

    def run(self, params, heads, req: Request, cache: KVCache, windows_K1: jax.Array):
        """Prefill, then rounds until every sequence is done (`prefill_prompts`, then
        `rounds_from_prefill`: the two programs `compiled()` runs in turn).

        Returns (output, counters, final cache); the cache is returned so that a donated
        input cache backs the loop's cache in place.
        """
        h_BxD, cache = self.prefill_prompts(params, req, cache)
        return self.rounds_from_prefill(params, heads, req, h_BxD, cache, windows_K1)

    def rounds_from_prefill(self, params, heads, req: Request, h_BxD: jax.Array, cache: KVCache,
                            windows_K1: jax.Array):
        """`state_from_prefill`, then rounds until every sequence is done; returns (output,
        counters, final cache), as `run`."""
        # On a mesh, every [B, ...] state array splits over "data" (a no-op on one device).
        on_mesh = functools.partial(sharding.constrain_state, batch=self.shapes.batch)
        state = on_mesh(self.state_from_prefill(params, heads, req, h_BxD, cache, windows_K1))
        state = self._rounds(params, heads, req, state, None)
        return state.out, state.counters, state.cache

    def run_rounds(self, params, heads, req: Request, state: EngineState,
                   max_rounds: jax.Array) -> EngineState:
        """Continues `state` for at most `max_rounds` ([] int32, an array: any bound runs in
        one compiled loop) more rounds, stopping earlier when every sequence is done.

        Rounds are the same as `run`'s and every draw is keyed per sequence, so any split
        of a run into `run_rounds` calls produces the tokens of one uninterrupted run
        (serving/: streaming and continuous batching resume from the returned state).
        """
        on_mesh = functools.partial(sharding.constrain_state, batch=self.shapes.batch)
        return self._rounds(params, heads, req, on_mesh(state), max_rounds)

    def _rounds(self, params, heads, req: Request, state: EngineState,
                max_rounds: jax.Array | None) -> EngineState:
        """Rounds until every sequence is done or `max_rounds` (None: no bound) ran.

        Where the hierarchy has plain rounds (`Round.has_plain`: a draft model's window 0),
        the loop's body is a round followed by a loop of plain rounds while no sequence
        drafts, each AR's step; both count as rounds:

            while any sequence is active (and rounds < max_rounds):
                round                        (drafts, or the gate's probe)
                while no active sequence drafts (and rounds < max_rounds):
                    plain round              (AR's step)
        """
        on_mesh = functools.partial(sharding.constrain_state, batch=self.shapes.batch)
        rnd = Round(params, heads, req, self.cfg, self.hierarchy, self.greedy, self.backbone)

        def more(carry):
            s, trips = carry
            go = jnp.any(~s.out.done_B)
            return go if max_rounds is None else go & (trips < max_rounds)

        def round_(carry):
            s, trips = carry
            carry = on_mesh(rnd(s)), trips + 1
            if rnd.has_plain:
                carry = jax.lax.while_loop(
                    lambda c: more(c) & rnd.all_idle(c[0]),
                    lambda c: (on_mesh(rnd.plain(c[0])), c[1] + 1), carry)
            return carry

        state, _ = jax.lax.while_loop(more, round_, (state, jnp.zeros((), jnp.int32)))
        return state

    # ---- the whole loop, lowered for reading --------------------------------------------
    def abstract_arguments(self) -> tuple:
        """`run`'s arguments as `jax.ShapeDtypeStruct`s (nothing allocated)."""
        B, S, E = self.shapes.batch, self.shapes.capacity, self.shapes.num_eos
        i32, f32 = jnp.int32, jnp.float32
        sds = jax.ShapeDtypeStruct
        req = Request(tokens_BxS=sds((B, S), i32), prompt_lens_B=sds((B,), i32),
                      max_new_B=sds((B,), i32), eos_ids_E=sds((E,), i32),
                      sequence_keys_Bx2=sds((B, 2), jnp.uint32),
                      sampling=SamplingArrays(sds((), f32), sds((), i32), sds((), f32)))
        if self.shapes.store_tokens:
            R = self.shapes.store_tokens
            req = req.replace(store=StoreArrays(tokens_R=sds((R,), i32), scope_R=sds((R,), i32),
                                                scope_B=sds((B,), i32)))
        cache = jax.eval_shape(self.empty_cache)
        windows = sds((self.hierarchy.num_levels - 1,), i32)
        return (_structs(self.params_signature), _structs(self.heads_signature), req, cache,
                windows)

    DONATED = (3,)  # run's arguments donated to the loop: the cache

    def jitted(self):
        """`run` under `jax.jit`, the cache argument donated; over a device mesh with the
        loop's in/out shardings (`decoding/mesh.py`), to lower under the mesh."""
        if self.shardings is not None:
            return self.shardings.jit(self.run, donate_argnums=self.DONATED)
        return jax.jit(self.run, donate_argnums=self.DONATED)

    def lower(self) -> jax.stages.Lowered:
        """`run` lowered on abstract arguments (the cache argument is donated)."""
        if self.shardings is not None:
            return self.shardings.lower(self.run, self.abstract_arguments(),
                                        donate_argnums=self.DONATED)
        return self.jitted().lower(*self.abstract_arguments())

    def program_key(self) -> str:
        """The loop's key in the cross-process program cache: this engine's repr (its fields
        are frozen dataclasses, tuples, tree definitions and shardings: equal text across
        processes exactly when the engines are equal) and the module settings the trace
        reads (`sharding.RULES`)."""
        return f"{self!r}\n{_trace_settings()}"
