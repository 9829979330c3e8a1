"""Slots: the one engine every entry point runs (offline `generate`, `generate_stream`,
`hispec chat`, `hispec serve`), whose B sequences take requests independently (the
prefill / insert / generate split of JetStream-style engines, on top of
`decoding.engine.Engine`).

    insert_batch  (offline `generate`) every slot free: each request into its own slot at
               once, one program prefilling the whole batch (`prefill.prefill`: the same
               chunk rule) and building every slot's state; then `run_to_end`: the rounds
               over all B rows until every slot is done
    admit      a prompt claims a free slot; it waits there to be prefilled
    prefill    one chunk of a waiting prompt goes into its slot's cache rows (C positions,
               or t = C / 4 for the last ones, as offline prefill: `prefill.chunk_counts`;
               `prefill.prefill_chunk` with the chunk's start as an array: two compilations
               serve every prompt length and chunk); after its last chunk, "finish" builds the
               slot's per-sequence state (`Engine.state_from_prefill`: first token, output
               buffer, c_k, rings, windows, drafter state) and writes it at the slot's row
    generate   `Engine.run_rounds`: at most R speculation rounds for the decoding slots (R
               is an array: one compilation for every R), over the first r rows of the
               batch only: r the smallest of `active_rows(B)` (1, 2, 4, ..., B) that holds
               every decoding slot (a request takes the lowest free slot)
    ride       (`generate(ride=True)`, an engine built with `ride_prefill`) where a round
               is one pass over every layer (AR, prompt lookup:
               `Hierarchy.carries_prefill`), the next chunk of the oldest waiting prompt (t
               positions, or C as `prefill` would run it) rides the first round's pass
               (`transformer.Rider`): one read of the weights for both instead of a pass of
               its own
    cancel     a slot stops at once (its client went away, a stop string matched)

    slot 0  [A A A A A done]   [D1 | D2 | D3 + finish] D D D D ...
    slot 1  [B B B B B B B B B B B B B B B B B B B B B B B B B B B B ...
    slot 2  [C C C done] (free)
            time ->   D's chunks run between B's rounds (or ride them); C's slot waits

A free slot, and a slot whose prompt is still being prefilled, is a done sequence: it takes
part in no round, so the other slots' tokens do not change. Every draw is keyed by the
request's own key and its own pass count, and the finish step rewrites every per-sequence
leaf of the slot's row, so a request's tokens do not depend on the other slots (greedy: the
tokens of offline `generate`; sampling: those of `generate` with the same seed).

Why only the first r rows: every row of a pass costs compute whether its slot is busy or
not (the shapes are fixed), so a server with one client among 8 slots would decode 8 rows
for one answer. The rounds loop of r < B rows slices rows [0, r) of the state (the cache
included), runs an engine of batch r on them and writes them back: r / B of the cache is
copied in and out per call, against the B - r rows of every pass it saves. The speculation
gates then price the pass the round really runs (`gate.choose`: a batch of r), so
speculation shrinks towards AR steps as slots fill and comes back as they empty, with no
recompilation. Outputs do not change: a greedy sequence's tokens are AR's whatever the
batch, and a sampling sequence's draws and gate never depend on the rest of the batch.

A riding chunk costs the streams its extra compute, not a pass of its own (measured in
docs/serving.md, "Resumable runs and slots"). Which of the two chunk sizes rides is the
scheduler's choice (its time budget).

The compiled programs of an engine are a fixed set, whatever the prompts: the empty state,
the two prefill chunks, finish, a rounds loop per row count, a round over all B rows with a
chunk of each size riding it (where rounds can carry one), and cancel
(`SlotEngine.warm_up` compiles them).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import os
import threading
import time
import types
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.decoding import device_costs
from hispec_jax.decoding import engine as engine_lib
from hispec_jax.decoding import methods as methods_lib
from hispec_jax.decoding import suffix_store
from hispec_jax.decoding.engine import compile_cache
from hispec_jax.decoding.prefill import (MAX_SMALL, MIN_PROMPT_BLOCK, block_positions,
                                         prefill_chunk, small_chunk)
from hispec_jax.decoding.request import Request
from hispec_jax.decoding.sampling import SamplingArrays, SamplingParams, sequence_keys
from hispec_jax.models import sharding
from hispec_jax.models.transformer import Rider, embed

# ---- compilations, counted for the whole process (warm-up checks, `hispec bench --serve`)
_compile_lock = threading.Lock()
_backend_compiles = 0


def _on_event(name: str, *_args, **_kwargs) -> None:
    global _backend_compiles
    if name == "/jax/core/compile/backend_compile_duration":
        with _compile_lock:
            _backend_compiles += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


def backend_compiles() -> int:
    """XLA compilations this process has run so far (every jitted program, however small)."""
    return _backend_compiles


def engine_of(model, hierarchy, *, slots: int, capacity: int, greedy: bool,
              eos_ids: tuple[int, ...]) -> engine_lib.Engine:
    """The `Engine` a `SlotEngine` of these settings runs (its programs' static argument)."""
    shapes = engine_lib.Shapes(batch=slots, capacity=capacity, prompt_block=MIN_PROMPT_BLOCK,
                               num_eos=max(1, len(eos_ids)))
    return engine_lib.Engine.for_model(model, hierarchy, shapes, greedy)


@functools.lru_cache(maxsize=64)
def _empty_shapes(engine: engine_lib.Engine):
    """`_empty`'s (state, request) for `engine` as shapes: traced once per engine and
    process, not at every `SlotEngine` (offline `generate` makes one per call)."""
    params, heads = engine.abstract_arguments()[:2]
    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
    return jax.eval_shape(functools.partial(_empty, engine), params, heads,
                          i32(engine.shapes.num_eos), i32(engine.hierarchy.num_levels - 1))


# Prompt positions per prefill chunk. The longest pause a prompt entering a slot puts
# between two rounds of the other slots is one chunk's pass; a chunk still spreads its read
# of every weight over many positions.
PREFILL_CHUNK = 64


@dataclasses.dataclass(frozen=True)
class SlotRequest:
    """One request as a slot takes it.

    Attributes:
      prompt_ids: the prompt's token ids (already rendered by a chat template if any).
      max_new_tokens: the budget of new tokens (>= 1).
      sampling: temperature / top-k / top-p / seed (temperature 0 on a greedy engine).
      sequence_index: the request's index for its PRNG key (`sampling.sequence_keys`): 0
        gives the draws of offline `generate` of this one prompt with this seed.
      ignore_eos: EOS does not end it (its slot's EOS list is empty): it runs to its
        budget, EOS tokens included, as offline `generate(ignore_eos=True)`.
      min_tokens: its EOS is suppressed (never drawn nor accepted: `emit.suppress_eos`)
        until it has this many new tokens; 0: from the first.
      scope: with a store of earlier requests (`SlotEngine(store=...)`), the scope it drafts
        from and its tokens enter (`SuffixStore.scope_of`); `suffix_store.NO_SCOPE`: neither.
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    sequence_index: int = 0
    ignore_eos: bool = False
    min_tokens: int = 0
    scope: int = suffix_store.NO_SCOPE


@flax.struct.dataclass
class _Rows:
    """Requests as the per-slot arrays a program takes (host arrays, [B, ...] each row a
    slot; a row past the requests: a free slot, budget 0)."""

    prompt_BxS: Any  # int32, the prompt right-padded into the capacity S
    prompt_len_B: Any  # int32
    max_new_B: Any  # int32
    key_Bx2: Any  # uint32, the request's PRNG key (`sampling.sequence_keys`)
    sampling: SamplingArrays  # [B] each
    eos_BxE: Any  # int32, the engine's EOS ids (all -1 where the request ignores EOS)
    min_new_B: Any  # int32
    scope_B: Any  # int32, its scope in the store of earlier requests

    @classmethod
    def of(cls, requests, batch: int, capacity: int, eos_ids_E) -> "_Rows":
        """`requests` (`SlotRequest`s, at most `batch`) in rows 0, 1, ...; `eos_ids_E`: the
        engine's EOS ids."""
        B = batch
        i32 = lambda fill: np.full((B,), fill, np.int32)
        prompt = np.zeros((B, capacity), np.int32)
        prompt_len, max_new, min_new = i32(1), i32(0), i32(0)
        keys, scope = np.zeros((B, 2), np.uint32), i32(suffix_store.NO_SCOPE)
        temperature, top_k, top_p = np.ones((B,), np.float32), i32(0), np.ones((B,), np.float32)
        eos = np.tile(np.asarray(eos_ids_E, np.int32), (B, 1))
        rows_of_seed: dict[int, list[int]] = {}
        for b, r in enumerate(requests):
            s = r.sampling
            prompt[b, :len(r.prompt_ids)], prompt_len[b] = r.prompt_ids, len(r.prompt_ids)
            max_new[b], min_new[b], scope[b] = r.max_new_tokens, r.min_tokens, r.scope
            temperature[b], top_k[b], top_p[b] = max(s.temperature, 1e-6), s.top_k, s.top_p
            rows_of_seed.setdefault(s.seed, []).append(b)
            if r.ignore_eos:
                eos[b] = -1
        for seed, rows in rows_of_seed.items():  # one call per seed, not per request
            keys[rows] = np.asarray(sequence_keys(
                seed, [requests[b].sequence_index for b in rows]))
        return cls(prompt, prompt_len, max_new, keys,
                   SamplingArrays(temperature=temperature, top_k=top_k, top_p=top_p), eos,
                   min_new, scope)

    def request(self, lookup_cost, store=None) -> Request:
        """These rows as a `Request` (prompts in `tokens_BxS`)."""
        return Request(tokens_BxS=self.prompt_BxS, prompt_lens_B=self.prompt_len_B,
                       max_new_B=self.max_new_B, eos_ids_E=self.eos_BxE,
                       sequence_keys_Bx2=self.key_Bx2, sampling=self.sampling,
                       lookup_cost=lookup_cost, min_new_B=self.min_new_B, store=store)


def _merge_row(big, small, slot, batch: int):
    """`big` with its batch row `slot` replaced by `small`'s only row. The batch axis of a
    leaf is the one axis where the shapes differ (B against 1); leaves of equal shape are
    batch-wide (e.g. counters) and stay, unless the batch itself has one row."""
    diff = [a for a, (m, n) in enumerate(zip(big.shape, small.shape)) if m != n]
    if not diff:
        return small if batch == 1 else big
    (axis,) = diff
    return jax.lax.dynamic_update_slice_in_dim(big, small.astype(big.dtype), slot, axis)


def active_rows(slots: int, step: int = 1) -> tuple[int, ...]:
    """The row counts the rounds loop is compiled for: `step` times the powers of two below
    B, and B (`step`: the mesh's data axis, so that every count splits evenly over it)."""
    rows = [step]
    while rows[-1] * 2 < slots:
        rows.append(rows[-1] * 2)
    return tuple(r for r in rows if r < slots) + (slots,)


def batch_layout(big, one) -> tuple[tuple[int, int] | None, ...]:
    """Per leaf of the pytree `big` (batch B > 1): (its batch axis, that axis's size per
    sequence), read from `one`, the same pytree's shapes at batch 1; None for a batch-wide
    leaf (the counters, the EOS ids). Static: the argument `_first_rows` slices with."""
    layout = []
    for b, o in zip(jax.tree.leaves(big), jax.tree.leaves(one), strict=True):
        diff = [a for a, (m, n) in enumerate(zip(b.shape, o.shape)) if m != n]
        layout.append((diff[0], o.shape[diff[0]]) if diff else None)
    return tuple(layout)


def _first_rows(tree, layout, rows: int):
    """`tree` cut to its first `rows` sequences (`layout`: `batch_layout`)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef.unflatten([
        x if where is None else jax.lax.slice_in_dim(x, 0, rows * where[1], axis=where[0])
        for x, where in zip(leaves, layout, strict=True)])


def _put_first_rows(tree, small, layout):
    """`tree` with its first sequences replaced by `small` (batch-wide leaves: `small`'s)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef.unflatten([
        s if where is None else jax.lax.dynamic_update_slice_in_dim(x, s, 0, where[0])
        for x, s, where in zip(leaves, jax.tree.leaves(small), layout, strict=True)])


def _on_first_rows(engine: engine_lib.Engine, rows: int, layout, req: Request,
                   state: engine_lib.EngineState, run):
    """`run(engine, req, state) -> (state, extra)` over rows [0, `rows`) of the batch, as an
    engine of batch `rows`; the other rows (free or prefilling slots: done sequences) stay
    as they are. `layout`: `batch_layout` of (state, req). Returns (state, extra)."""
    if rows == engine.shapes.batch:
        return run(engine, req, state)
    small = dataclasses.replace(engine, shapes=dataclasses.replace(engine.shapes, batch=rows))
    state_r, req_r = _first_rows((state, req), layout, rows)
    state_r, extra = run(small, req_r, state_r)
    state_layout = layout[:len(jax.tree.leaves(state))]
    return _put_first_rows(state, state_r, state_layout), extra


def _rounds_rows(engine: engine_lib.Engine, rows: int, layout, params, heads, req: Request,
                 state: engine_lib.EngineState, rounds):
    """`Engine.run_rounds` over rows [0, `rows`) of the batch (`_on_first_rows`)."""
    run = lambda eng, req, state: (eng.run_rounds(params, heads, req, state, rounds), None)
    return _on_first_rows(engine, rows, layout, req, state, run)[0]


def _round_with_chunk(engine: engine_lib.Engine, rows: int, layout, params, heads,
                      req: Request, state: engine_lib.EngineState, slot, tokens_1xC, start,
                      prompt_len_1):
    """One round over rows [0, `rows`) (`_on_first_rows`) with a prefill chunk riding its
    pass (`transformer.Rider`): positions [start, start + C) of the prompt in row `slot`
    (< rows, a done sequence in the round). Returns (state, the chunk's top-layer hidden
    state [1, D] at the prompt's last position, valid when that position is in the chunk:
    what `_chunk` returns). Static: the engine, `rows`, `layout` and C."""
    C = tokens_1xC.shape[1]
    n_1 = jnp.clip(prompt_len_1 - start, 0, C)
    positions_1xC = block_positions(jnp.full((1,), start, jnp.int32), n_1, C,
                                    engine.shapes.capacity)
    rider = Rider(x_1xCxD=embed(params, tokens_1xC), positions_1xC=positions_1xC, row=slot)

    def run(eng, req, state):
        state = eng.step(params, heads, req, state.replace(rider=rider))
        return state.replace(rider=None), state.rider.x_1xCxD

    state, x_1xCxD = _on_first_rows(engine, rows, layout, req, state, run)
    offset = jnp.clip(prompt_len_1[0] - 1 - start, 0, C - 1)
    return state, jax.lax.dynamic_index_in_dim(x_1xCxD, offset, axis=1, keepdims=False)


def _cache_batch_axis(cache) -> int:
    return 0 if cache.per_layer else 1  # [B, K, S, H] per layer, or [L', B, K, S, H]


def _chunk(cfg, stop: int, params, cache, slot, tokens_1xC, start, prompt_len_1):
    """Caches layers [0, stop) of positions [start, start + C) of one prompt in row `slot`
    of the cache; returns the cache and the layer-`stop` hidden state [1, D] at the
    prompt's last position (valid when that position is in this chunk). Static: the model
    architecture and `stop` only, so the greedy and sampling engines of one model share it."""
    axis = _cache_batch_axis(cache)
    row = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, slot, 1, axis), cache)
    h_1xD, _, row = prefill_chunk(params, cfg, tokens_1xC, start, prompt_len_1, row, stop)
    cache = jax.tree.map(lambda x, r: jax.lax.dynamic_update_slice_in_dim(x, r, slot, axis),
                         cache, row)
    return cache, h_1xD


def _finish(engine: engine_lib.Engine, params, heads, state: engine_lib.EngineState,
            req: Request, slot, h_1xD, row: "_Rows", windows_K1):
    """Writes the per-sequence state of a prefilled prompt (`Engine.state_from_prefill`
    as a batch of one; `row`: its request, one row) into row `slot` of the state and of the
    request (output buffer, c_k, rings, windows, drafter state, keys, its EOS ids and
    `min_tokens`...); the cache rows are the chunks'."""
    one = dataclasses.replace(engine, shapes=dataclasses.replace(engine.shapes, batch=1))
    req_1 = row.request(req.lookup_cost)
    fresh = one.state_from_prefill(params, heads, req_1, h_1xD, None, windows_K1)
    B = engine.shapes.batch
    merged = jax.tree.map(lambda b, s: _merge_row(b, s, slot, B),
                          state.replace(counters=(), cache=None), fresh.replace(counters=()))
    merged = merged.replace(counters=state.counters, cache=state.cache)
    put = lambda b, s: b.at[slot].set(s[0])
    req = req.replace(
        max_new_B=put(req.max_new_B, req_1.max_new_B),
        prompt_lens_B=put(req.prompt_lens_B, req_1.prompt_lens_B),
        sequence_keys_Bx2=put(req.sequence_keys_Bx2, req_1.sequence_keys_Bx2),
        eos_ids_E=put(req.eos_ids_E, req_1.eos_ids_E),
        min_new_B=put(req.min_new_B, req_1.min_new_B),
        sampling=jax.tree.map(put, req.sampling, req_1.sampling))
    if req.store is not None:  # the scope it drafts from
        req = req.replace(store=req.store.replace(scope_B=put(req.store.scope_B, row.scope_B)))
    return merged, req


def _insert_all(engine: engine_lib.Engine, chunk: int, params, heads, rows: "_Rows",
                windows_K1, lookup_cost, store):
    """Every slot's prompt prefilled together (each chunk one pass over the batch:
    `prefill.prefill` in chunks of `chunk` positions, the small ones last, as the slots'
    own chunks run) into a new cache, and every slot's state built from it
    (`Engine.state_from_prefill`); rows past the requests (budget 0) are free slots.
    Returns (state, request). Static: the engine and `chunk`."""
    req = rows.request(lookup_cost, store)
    h_BxD, cache = engine.prefill_prompts(params, req, engine.empty_cache(), chunk)
    state = engine.state_from_prefill(params, heads, req, h_BxD, cache, windows_K1)
    tokens_BxT = jnp.zeros((engine.shapes.batch, engine.shapes.prompt_block), jnp.int32)
    return state, req.replace(tokens_BxS=tokens_BxT)


def _cancel(state: engine_lib.EngineState, slot) -> engine_lib.EngineState:
    out = state.out
    return state.replace(out=out.replace(done_B=out.done_B.at[slot].set(True)))


def _empty(engine: engine_lib.Engine, params, heads, eos_ids_E, windows_K1):
    """A state and request with every slot free (done from the start); each slot with its
    own EOS list ([B, E]: `eos_ids_E` until a request says otherwise) and `min_tokens`."""
    B, S, T = engine.shapes.batch, engine.shapes.capacity, engine.shapes.prompt_block
    req = Request(tokens_BxS=jnp.zeros((B, S), jnp.int32),
                  prompt_lens_B=jnp.ones((B,), jnp.int32), max_new_B=jnp.zeros((B,), jnp.int32),
                  eos_ids_E=jnp.broadcast_to(eos_ids_E, (B,) + eos_ids_E.shape),
                  min_new_B=jnp.zeros((B,), jnp.int32),
                  sequence_keys_Bx2=jnp.zeros((B, 2), jnp.uint32),
                  sampling=SamplingArrays(temperature=jnp.ones((B,), jnp.float32),
                                          top_k=jnp.zeros((B,), jnp.int32),
                                          top_p=jnp.ones((B,), jnp.float32)))
    h_BxD = jnp.zeros((B, engine.cfg.hidden_size), params["embed"].dtype)
    state = engine.state_from_prefill(params, heads, req, h_BxD, engine.empty_cache(),
                                      windows_K1)
    return state, req.replace(tokens_BxS=jnp.zeros((B, T), jnp.int32))


def _call(program, args: tuple, mesh=None):
    """`program(*args)`; on a mesh, the arguments placed as the program takes them first
    (nothing moves for those already placed so; `sharding.shard_arrays`: on several
    processes each places its own shards of a host value). An argument the program does
    not read (its sharding None: weights `_empty` never touches) stays as it is."""
    if mesh is not None:
        leaves, treedef = jax.tree.flatten(args)
        shardings = treedef.flatten_up_to(program.executable.input_shardings[0])
        args = treedef.unflatten([x if s is None else sharding.shard_arrays(x, s)
                                  for x, s in zip(leaves, shardings, strict=True)])
    return program(*args)


@dataclasses.dataclass
class _Prefill:
    """A prompt waiting in its slot: the next chunk's start and, after the chunk that
    holds its last position, the hidden state there."""

    slot: int
    request: SlotRequest
    start: int = 0
    h_1xD: Any = None


@dataclasses.dataclass
class SlotUpdate:
    """What one slot produced in a `generate` call.

    Attributes:
      slot: the slot index.
      new_token_ids: the tokens it emitted since the last call (EOS included when emitted).
      done: the request finished (EOS, budget, or cancelled).
      hit_eos: it finished by emitting an EOS / end-of-turn token.
    """

    slot: int
    new_token_ids: list[int]
    done: bool
    hit_eos: bool


class SlotEngine:
    """A decoding engine with `slots` sequences that take requests independently.

    Not thread-safe: one thread (the server's engine thread, or a streaming generator)
    drives it. Every compiled program is shared by engines of equal description.

    Args:
      model: a loaded `Model`. On its device mesh (`Model.mesh`), the slots split over
        "data" (`slots` must be a multiple of it) and the weights and KV heads over "model",
        as offline `generate` splits its batch (`decoding/mesh.py`).
      decoder: a `methods.Decoder` (`methods.make_method`).
      slots: B, sequences decoded together.
      capacity: S, cache positions per slot (prompt + budget + the method's lookahead).
      greedy: argmax decoding (static); False: every slot samples with its own settings.
      eos_ids: token ids that end a request (EOS, end-of-turn markers).
      prefill_chunk: C, prompt positions per full prefill chunk (at most S). As offline
        `generate`'s prefill (`prefill.chunk_counts`), a prompt runs full chunks while more
        than two small chunks of t = C / 4 positions (at least 16) are left, then small
        ones, the last one padded: two compiled chunk programs, and a short prompt costs
        t positions, not C.
      ride_prefill: let a prefill chunk ride a round (`generate(ride=True)`) where the
        engine's round is one pass over every layer (AR, prompt lookup); a compiled
        program more per chunk size, the round over all B rows with such a chunk riding it.
      store: a `suffix_store.SuffixStore` of earlier requests' tokens (shared by the
        process's engines) that a drafter reading one (`Drafter.reads_store`: prompt
        lookup) drafts from, and that every request finished here (EOS or budget) with a
        scope enters; None, or a drafter that reads none: no store.
      empty_state: make the slots' state (every slot free) now, so that every process of a
        multi-host server runs that program at the same point; False: at first need, for
        an engine that `insert_batch` fills first (offline `generate`: that program then
        never runs).
    """

    def __init__(self, model, decoder: methods_lib.Decoder, *, slots: int, capacity: int,
                 greedy: bool, eos_ids: tuple[int, ...], prefill_chunk: int = PREFILL_CHUNK,
                 ride_prefill: bool = False, store: suffix_store.SuffixStore | None = None,
                 empty_state: bool = True):
        if not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be an integer >= 1, got {prefill_chunk!r}")
        data = sharding.axis_size(model.mesh, "data")
        if slots % data:
            raise ValueError(f"slots={slots} is not a multiple of the mesh's data axis ({data})")
        self.model, self.decoder, self.mesh = model, decoder, model.mesh
        self.eos_ids = tuple(eos_ids)
        self.prefill_chunk = min(prefill_chunk, capacity)
        small = small_chunk(self.prefill_chunk)
        self._small_chunk = small
        self._small_tail = min(MAX_SMALL, (self.prefill_chunk - 1) // small) * small
        self.engine = engine_of(model, decoder.hierarchy, slots=slots, capacity=capacity,
                                greedy=greedy, eos_ids=self.eos_ids)
        self._eos_ids_E = jnp.asarray(list(self.eos_ids) or [-1], jnp.int32)
        self._windows_K1 = decoder.windows_array()
        if not getattr(decoder.hierarchy.drafter, "reads_store", False):
            store = None
        self.store, self._store_version = store, None
        self._scope = np.full((slots,), suffix_store.NO_SCOPE, np.int64)
        # the pass costs the lookup gate weighs: this host's measurement if stored; a new
        # one (`use_pass_cost`, from any thread) takes effect at the next `generate`
        self._lookup_cost, self.pass_cost_source = device_costs.for_model(model)
        self._new_pass_cost: tuple | None = None
        self.pass_cost_pending = False  # a measurement for this engine is under way
        self.active_rows = active_rows(slots, data)
        # the state and request of the slots: every slot free (`_empty`), made now or at
        # first use (`insert_batch` makes its own)
        self._state = self._req = None
        empty = lambda eng, batch: self._with_store(_empty_shapes(eng), batch)
        state, req = empty(self.engine, slots)
        req = req.replace(lookup_cost=self._lookup_cost)
        self._layout = None
        if slots > 1:  # the batch axis of every leaf, from the shapes of a one-slot state
            one = dataclasses.replace(self.engine, shapes=dataclasses.replace(
                self.engine.shapes, batch=1))
            self._layout = batch_layout((state, req), empty(one, 1))
        if empty_state:
            self.state
        self.last_rows = slots  # the rows the last `generate` ran
        # the rounds loops compiled so far, by row count (`_program`s: at first use, or ahead
        # of time by `compile_rounds`, from any thread)
        self._rounds: dict[int, Any] = {}
        # rows whose loop is not compiled yet: compile at first use (True), or run the
        # smallest compiled row count above instead (False: a server, where nothing compiles
        # on a request)
        self.compile_on_demand = True
        # shapes only: `compile_rounds` may run in another thread while this one decodes
        self._abstract = compile_cache.structs((req, state), self.mesh, slots)
        # the rounds with a prefill chunk riding their pass, by (row count, chunk size)
        # (`_round_with_chunk`; where the engine's round is one pass over every layer, and
        # another slot can decode beside a prompt). Only over all B rows: each is a program
        # as large as a rounds loop (a lookup loop's takes about a gigabyte of memory on
        # XLA:CPU), and over B rows a riding round still costs about what a round over
        # fewer rows and a chunk of its own cost together.
        rides = self.engine.hierarchy.carries_prefill and slots > 1 and ride_prefill
        self.ride_rows: tuple[int, ...] = (slots,) if rides else ()
        self._riding: dict[tuple[int, int], Any] = {}
        self.last_rider: int | None = None  # positions of the chunk the last generate carried
        self._prompt_len = np.zeros((slots,), np.int64)
        self._reported = np.zeros((slots,), np.int64)  # new tokens already handed out
        self._ignore_eos = [False] * slots  # a slot's request runs past EOS (its last
        # token may be an EOS without having ended it)
        self._prefills: list[_Prefill] = []  # admitted prompts not yet prefilled, oldest first
        self.busy = [False] * slots

    @property
    def slots(self) -> int:
        return self.engine.shapes.batch

    @property
    def state(self) -> engine_lib.EngineState:
        """The slots' loop state (every slot free until a request is inserted)."""
        if self._state is None:
            self._state, self._req = self._run(_empty, (self.engine,), (), (
                self.model.params, self.model.heads, self._eos_ids_E, self._windows_K1))
            self._req = self._with_store((None, self._req), self.slots)[1].replace(
                lookup_cost=self._lookup_cost)
        return self._state

    @state.setter
    def state(self, state: engine_lib.EngineState) -> None:
        self._state = state

    @property
    def req(self) -> Request:
        """The slots' request: each slot's prompt length, budget, EOS ids, key, sampling
        settings, and the store and pass costs every slot shares."""
        self.state  # made with the state
        return self._req

    @req.setter
    def req(self, req: Request) -> None:
        self._req = req

    def _with_store(self, state_req, batch: int):
        """(state, request) with an empty store for `batch` sequences if the engine has one."""
        state, req = state_req
        if self.store is None:
            return state, req
        return state, req.replace(store=suffix_store.empty_arrays(self.store.size, batch))

    def _program_of(self, fn, static: tuple, donate: tuple[int, ...], args):
        """`fn(*static, *args)` compiled for this engine's device or mesh
        (`compile_cache.program`)."""
        return compile_cache.program(fn, static, donate, args, self.mesh, self.slots)

    def _run(self, fn, static: tuple, donate: tuple[int, ...], args: tuple):
        """`fn(*static, *args)`, compiled by `_program_of`."""
        return _call(self._program_of(fn, static, donate, args), args, self.mesh)

    @property
    def gated(self) -> bool:
        """Whether the plan's drafter has an acceptance gate (whose proposals the pass
        costs price: `Drafter.gated`)."""
        return self.engine.hierarchy.drafter.gated

    def use_pass_cost(self, cost, source: str) -> None:
        """The lookup gate weighs `cost` (a `gate.PassCost`; `source`: where it comes from)
        from the next `generate` on; callable from any thread (arrays: nothing recompiles)."""
        self._new_pass_cost = (cost, source)

    def _take_pass_cost(self) -> bool:
        """Adopts the pass cost `use_pass_cost` left waiting, if any (True: one was)."""
        if self._new_pass_cost is None:
            return False
        self._lookup_cost, self.pass_cost_source = self._new_pass_cost
        self._new_pass_cost = None
        return True

    @property
    def rides(self) -> bool:
        """Whether a prefill chunk can ride this engine's rounds (`ride_rows` not empty)."""
        return bool(self.ride_rows)

    @property
    def capacity(self) -> int:
        return self.engine.shapes.capacity

    @property
    def greedy(self) -> bool:
        return self.engine.greedy

    @property
    def lookahead(self) -> int:
        return self.engine.hierarchy.lookahead

    def fits(self, prompt_len: int, max_new_tokens: int) -> bool:
        """Whether a request fits a slot's cache (prompt + budget + lookahead <= S)."""
        return prompt_len + max_new_tokens + self.lookahead <= self.capacity

    def free_slots(self) -> list[int]:
        return [b for b, busy in enumerate(self.busy) if not busy]

    @property
    def prefilling(self) -> list[int]:
        """Slots whose prompt waits to be prefilled (admitted, not yet decoding)."""
        return [p.slot for p in self._prefills]

    @property
    def decoding(self) -> list[int]:
        """Busy slots past their prefill (those a `generate` call advances)."""
        waiting = set(self.prefilling)
        return [b for b, busy in enumerate(self.busy) if busy and b not in waiting]

    def admit(self, slot: int, request: SlotRequest) -> None:
        """Gives `slot` (which must be free) to `request`; its prompt enters the slot's
        cache chunk by chunk in `prefill` calls, and the slot decodes after the last."""
        if self.busy[slot]:
            raise ValueError(f"slot {slot} is busy")
        self._check(request)
        self._prefills.append(_Prefill(slot, request))
        self.busy[slot] = True

    def prefill(self, max_chunks: int | None = None, small: bool = False) -> int:
        """Runs at most `max_chunks` prefill chunks (None: every waiting prompt whole), of
        the oldest waiting prompt first; a prompt whose last chunk ran starts decoding (its
        first token is emitted here and handed out by the next `generate`). Returns the
        chunks run.

        `small`: every chunk of t positions (the small chunk program), not C: a chunk
        between two rounds of decoding slots then pauses their streams for a pass of t
        positions, at the price of more passes for the prompt (a longer time to its first
        token). The chunk boundaries do not change the prompt's cache beyond float
        rounding (each position attends to the same cached keys)."""
        ran = 0
        while self._prefills and (max_chunks is None or ran < max_chunks):
            p = self._prefills[0]
            if p.start < len(p.request.prompt_ids):
                self._run_chunk(p, small)
                ran += 1
            if p.start >= len(p.request.prompt_ids):
                self._finish(self._prefills.pop(0))
        return ran

    def insert_batch(self, requests) -> None:
        """Request i into slot i, for every request at once; every slot must be free. One
        program (`_insert_all`) prefills every prompt together, a chunk at a time over the
        whole batch, and builds each slot's state; the slots past the requests stay free.
        Offline `generate` is this, then `generate` until every slot is done."""
        if any(self.busy):
            raise ValueError("insert_batch needs every slot free")
        if not 1 <= len(requests) <= self.slots:
            raise ValueError(f"{len(requests)} requests for {self.slots} slots")
        for r in requests:
            self._check(r)
        rows = _Rows.of(requests, self.slots, self.capacity, np.asarray(self._eos_ids_E))
        store = None
        if self.store is not None:
            self._store_version = self.store.version
            tokens_R, scope_R = self.store.host_arrays()
            store = suffix_store.StoreArrays(tokens_R=tokens_R, scope_R=scope_R,
                                             scope_B=rows.scope_B)
        self._take_pass_cost()
        self._state = self._req = None  # the old cache freed before the new one is made
        self._state, self._req = self._run(*self._insert_call(rows, store))
        for b, r in enumerate(requests):
            self._prompt_len[b], self._reported[b] = len(r.prompt_ids), 0
            self._ignore_eos[b], self._scope[b], self.busy[b] = r.ignore_eos, r.scope, True

    def _insert_call(self, rows: _Rows, store):
        """(fn, static, donate, args) of `insert_batch`'s program."""
        return (_insert_all, (self.engine, self.prefill_chunk), (), (
            self.model.params, self.model.heads, rows, self._windows_K1, self._lookup_cost, store))

    def _insert_program(self):
        """`insert_batch`'s program, compiled ahead of time where needed (from its argument
        shapes: any requests run it)."""
        rows = _Rows.of((), self.slots, self.capacity, np.asarray(self._eos_ids_E))
        store = None if self.store is None else suffix_store.empty_arrays(self.store.size,
                                                                          self.slots)
        return self._program_of(*self._insert_call(rows, store))

    def compile_batch(self) -> tuple[float, str]:
        """Compiles what offline `generate` runs (`insert_batch`'s program and the rounds
        over every row), each loaded from the program cache where stored, side by side.
        Returns (the seconds it took, 0 where this process held both already; how they
        were made: "cache" where both were read from the program cache, "stored" where one
        was compiled and written there, "jit" where one compiled without being stored; a
        program held already says how it was made first)."""
        t0, before = time.perf_counter(), compile_cache.compilations
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            made = [pool.submit(self._insert_program),
                    pool.submit(self.compile_rounds, self.slots)]
            insert = made[0].result()
            made[1].result()
        seconds = time.perf_counter() - t0 if compile_cache.compilations > before else 0.0
        sources = {insert.source, self._rounds[self.slots].source}
        return seconds, next(s for s in ("jit", "stored", "cache") if s in sources)

    def _check(self, request: SlotRequest) -> None:
        """ValueError where `request` cannot take a slot of this engine."""
        n = len(request.prompt_ids)
        if n < 1 or not self.fits(n, request.max_new_tokens):
            raise ValueError(f"prompt length {n} + max_new_tokens {request.max_new_tokens} + "
                             f"lookahead {self.lookahead} does not fit the slot capacity "
                             f"{self.capacity}")
        if request.sampling.greedy != self.greedy:
            raise ValueError(f"a {'greedy' if request.sampling.greedy else 'sampling'} request "
                             f"on a {'greedy' if self.greedy else 'sampling'} engine")

    def insert(self, slot: int, request: SlotRequest) -> None:
        """Admits `request` into `slot` and prefills it (with any prompt admitted before
        it) at once."""
        self.admit(slot, request)
        self.prefill()

    def next_chunk(self, small: bool = False) -> int | None:
        """Positions of the chunk the next `prefill(1, small)` runs (None: no prompt waits)."""
        for p in self._prefills:
            rest = len(p.request.prompt_ids) - p.start
            if rest > 0:
                return self.chunk_size(rest, small)
        return None

    def chunk_size(self, rest: int, small: bool = False) -> int:
        """The size of the next chunk of a prompt with `rest` positions left: C while
        more than the small chunks' tail is left, else (or when `small`) t."""
        return (self.prefill_chunk if rest > self._small_tail and not small
                else self._small_chunk)

    def _run_chunk(self, p: _Prefill, small: bool = False) -> None:
        ids = p.request.prompt_ids
        C = self.chunk_size(len(ids) - p.start, small)
        tokens = np.zeros((1, C), np.int32)
        piece = ids[p.start:p.start + C]
        tokens[0, :len(piece)] = piece
        cache, h_1xD = self._run(*self._chunk_call(p.slot, tokens, p.start, len(ids)))
        self.state = self.state.replace(cache=cache)
        p.start += C
        if p.start >= len(ids):
            p.h_1xD = h_1xD

    def _chunk_call(self, slot: int, tokens_1xC, start: int, prompt_len: int):
        """(fn, static, donate, args) of the prefill chunk `_run_chunk` runs."""
        return (_chunk, (self.engine.cfg, self.engine.cache_layers), (1,),
                (self.model.params, self.state.cache, np.int32(slot), tokens_1xC,
                 np.int32(start), np.asarray([prompt_len], np.int32)))

    def _finish(self, p: _Prefill) -> None:
        self.state, self.req = self._run(*self._finish_call(p.slot, p.request, p.h_1xD))
        self._prompt_len[p.slot], self._reported[p.slot] = len(p.request.prompt_ids), 0
        self._ignore_eos[p.slot] = p.request.ignore_eos
        self._scope[p.slot] = p.request.scope

    def _finish_call(self, slot: int, request: SlotRequest, h_1xD):
        """(fn, static, donate, args) of the finish step `_finish` runs."""
        row = _Rows.of((request,), 1, self.capacity, np.asarray(self._eos_ids_E))
        return (_finish, (self.engine,), (2, 3),
                (self.model.params, self.model.heads, self.state, self.req, np.int32(slot),
                 h_1xD, row, self._windows_K1))

    def cancel(self, slot: int) -> None:
        """Stops `slot` now and frees it (its unreported tokens, or the rest of its
        prefill, are dropped)."""
        if slot in self.prefilling:  # its row is still a done sequence
            self._prefills = [p for p in self._prefills if p.slot != slot]
            self.busy[slot] = False
        elif self.busy[slot]:
            self.state = self._run(*self._cancel_call(slot))
            self.busy[slot] = False

    def _cancel_call(self, slot: int):
        """(fn, static, donate, args) of the cancel step."""
        return _cancel, (), (0,), (self.state, np.int32(slot))

    def generate(self, max_rounds: int, ride: bool = False, small: bool = True,
                 rows: tuple[int | None, int] | None = None) -> list[SlotUpdate]:
        """Runs at most `max_rounds` rounds (fewer when every slot finishes) and returns the
        decoding slots' new tokens; finished slots become free. Slots still prefilling take
        no part.

        `ride`: where `riding_rows()` says so, the next chunk of the oldest waiting prompt
        (`next_chunk(small)` positions) rides the first round's pass (`transformer.Rider`),
        as `prefill(1, small)` would cache it beside the round (a prompt whose last chunk
        rode starts decoding, as after `prefill`). `last_rider` says which rode.

        `rows`: the rows of the round a chunk rides (None: none rides) and of the rounds
        loop, as `rows_planned(ride)` chooses them (the default). Which programs are
        compiled so far decides that choice, so a follower of a multi-host server takes
        process 0's (`serving/follower.py`)."""
        decoding = self.decoding
        if not decoding:
            return []
        riding, rounds_rows = self.rows_planned(ride) if rows is None else rows
        if self._take_pass_cost():
            self.req = self.req.replace(lookup_cost=self._lookup_cost)
        if self.store is not None and self._store_version != self.store.version:
            self._store_version = self.store.version  # a new copy: same shapes, no compile
            # placed once, as the rounds take them (replicated over a mesh): a host array
            # argument is moved at every call, which cost a served round at one client
            # about 6 ms of 33 on the 2-core CPU
            tokens_R, scope_R = self.store.host_arrays()
            if self.mesh is None:
                tokens_R, scope_R = jax.device_put((tokens_R, scope_R))
            else:
                tokens_R, scope_R = sharding.shard_arrays(
                    (tokens_R, scope_R), sharding.replicated((tokens_R, scope_R), self.mesh))
            self.req = self.req.replace(store=self.req.store.replace(
                tokens_R=tokens_R, scope_R=scope_R))
        self.last_rider = None
        if riding is not None:
            self._run_round_with_chunk(riding, self.next_chunk(small))
            max_rounds -= 1
        if max_rounds > 0:
            self._run_rounds(rounds_rows, max_rounds)
        # on several hosts the slots' rows are spread over the processes: gathered (every
        # process runs this same call)
        tokens_BxS, num_new_B, done_B = sharding.host_values(
            (self.state.out.tokens_BxS, self.state.out.num_new_B, self.state.out.done_B))
        updates = []
        for b in decoding:
            p, seen, n = self._prompt_len[b], self._reported[b], int(num_new_B[b])
            new = tokens_BxS[b, p + seen:p + n].tolist()
            self._reported[b] = n
            done = bool(done_B[b])
            hit_eos = (done and n > 0 and not self._ignore_eos[b]
                       and int(tokens_BxS[b, p + n - 1]) in self.eos_ids)
            if done:
                self.busy[b] = False
                if self.store is not None:
                    self.store.add(int(self._scope[b]), tokens_BxS[b, :p].tolist(),
                                   tokens_BxS[b, p:p + n].tolist())
            updates.append(SlotUpdate(slot=b, new_token_ids=new, done=done, hit_eos=hit_eos))
        return updates

    def run_to_end(self) -> list[SlotUpdate]:
        """Rounds over every row until every slot is done (the one rounds program of B rows,
        whichever slots decode): what offline `generate` runs after `insert_batch`."""
        return self.generate(np.iinfo(np.int32).max, rows=(None, self.slots))

    def batch_programs_seconds(self) -> float:
        """Seconds this process spent making what offline `generate` runs (`compile_batch`'s
        programs: compiling or loading them), in this call or an earlier one."""
        return (compile_cache.seconds_of(self._insert_program())
                + compile_cache.seconds_of(self._rounds[self.slots]))

    def memory_analysis(self):
        """Per field of XLA's memory analysis, the largest over `insert_batch`'s program and
        the rounds loops compiled so far (the weights and the cache are arguments of each):
        the peak of an offline batch. Compiles `insert_batch`'s program where needed."""
        programs = [self._insert_program(), *self._rounds.values()]
        analyses = [p.memory_analysis for p in programs]
        return types.SimpleNamespace(**{f: max(getattr(a, f) for a in analyses) for f in (
            "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes", "generated_code_size_in_bytes")})

    def riding_rows(self) -> int | None:
        """The rows of the round that the next `generate(ride=True)` carries a prefill chunk
        on: the smallest of `ride_rows` above every decoding slot and the oldest waiting
        prompt's slot whose programs (a chunk of each size riding) are compiled (with
        `compile_on_demand`: any). None when no chunk would ride: the engine's round is not
        one pass over every layer (`Hierarchy.carries_prefill`), no prompt waits, no slot
        decodes, or no such program is compiled yet."""
        decoding = self.decoding
        if not (self.rides and decoding and self._prefills):
            return None
        last = max(max(decoding), self._prefills[0].slot)
        return next((r for r in self.ride_rows if r > last and (
            self.compile_on_demand or self._riding_compiled(r))), None)

    def rows_planned(self, ride: bool = False) -> tuple[int | None, int]:
        """(the rows of the round a chunk rides, None where none does; the rows of the
        rounds loop) that the next `generate(ride=ride)` runs (`riding_rows`, `rows_for`)."""
        decoding = self.decoding
        return (self.riding_rows() if ride else None,
                self.rows_for(max(decoding)) if decoding else self.slots)

    def _riding_compiled(self, rows: int) -> bool:
        return all((rows, C) in self._riding for C in self._chunks())

    def _run_round_with_chunk(self, rows: int, C: int) -> None:
        p = self._prefills[0]
        ids = p.request.prompt_ids
        tokens = np.zeros((1, C), np.int32)
        piece = ids[p.start:p.start + C]
        tokens[0, :len(piece)] = piece
        args = (self.model.params, self.model.heads, self.req, self.state, np.int32(p.slot),
                tokens, np.int32(p.start), np.asarray([len(ids)], np.int32))
        program = self._riding.get((rows, C)) or self._riding.setdefault(
            (rows, C), self._program_of(_round_with_chunk, self._rounds_static(rows), (3,), args))
        self.state, h_1xD = _call(program, args, self.mesh)
        self.last_rows, self.last_rider = rows, C
        p.start += C
        if p.start >= len(ids):
            p.h_1xD = h_1xD
            self._finish(self._prefills.pop(0))

    def compile_riding(self, rows: int, chunk: int | None = None) -> None:
        """Compiles the round over `rows` rows with a prefill chunk of `chunk` positions
        (None: of each size, `_chunks`) riding it ahead of time (from any thread);
        `generate(ride=True)` uses them once all are compiled. Nothing where the engine's
        round cannot carry one, or over rows not in `ride_rows`."""
        if rows not in self.ride_rows:
            return
        for C in self._chunks() if chunk is None else (chunk,):
            if (rows, C) not in self._riding:
                self._riding.setdefault((rows, C), self._program_of(
                    _round_with_chunk, self._rounds_static(rows), (3,), self._riding_structs(C)))

    def _riding_structs(self, C: int) -> tuple:
        """`_round_with_chunk`'s arguments as shapes (the rounds loop's, without the
        bound, then slot, chunk tokens [1, C], start, prompt length [1])."""
        i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
        return compile_cache.structs(self._rounds_structs()[:4] + (i32(), i32(1, C), i32(), i32(1)),
                        self.mesh, self.slots)

    @property
    def compiled_rows(self) -> tuple[int, ...]:
        """The row counts whose rounds loop is compiled."""
        return tuple(sorted(self._rounds))

    def rows_for(self, last_slot: int) -> int:
        """The rows the rounds loop runs to reach slot `last_slot`: the smallest of
        `active_rows` above it (without `compile_on_demand`: the smallest compiled one, B
        if none)."""
        return next(r for r in self.active_rows if r > last_slot and (
            self.compile_on_demand or r in self._rounds or r == self.slots))

    def _run_rounds(self, rows: int, max_rounds: int) -> None:
        args = (self.model.params, self.model.heads, self.req, self.state, np.int32(max_rounds))
        program = self._rounds.get(rows) or self._rounds.setdefault(
            rows, self._program_of(_rounds_rows, self._rounds_static(rows), (3,), args))
        self.state = _call(program, args, self.mesh)
        self.last_rows = rows

    def compile_rounds(self, rows: int) -> None:
        """Compiles the rounds loop over `rows` rows ahead of time (from any thread: it reads
        only the state's shapes); `generate` uses it from then on."""
        if rows not in self._rounds:
            self._rounds.setdefault(rows, self._program_of(
                _rounds_rows, self._rounds_static(rows), (3,), self._rounds_structs()))

    def _rounds_static(self, rows: int) -> tuple:
        return self.engine, rows, self._layout

    def _rounds_structs(self) -> tuple:
        """The rounds loop's arguments as shapes (params, heads, request, state, rounds)."""
        req, state = self._abstract
        return compile_cache.structs((self.model.params, self.model.heads, req, state,
                         jax.ShapeDtypeStruct((), jnp.int32)), self.mesh, self.slots)

    def _chunks(self) -> tuple[int, ...]:
        """The chunk sizes prompts run: the small chunk, and the full one where a prompt
        longer than the small chunks' tail fits the slot."""
        longest = self.capacity - self.lookahead - 1  # the longest prompt that fits
        full = self._small_tail + 1  # the shortest prompt that runs a full chunk
        return ((self.prefill_chunk,) if full <= longest and self.prefill_chunk != self._small_chunk
                else ()) + (self._small_chunk,)

    def prepare(self, rows: tuple[int, ...] | None = None, on_ready=None,
                riding: tuple[int, ...] | None = None) -> None:
        """Loads from the program cache, or compiles, every program `warm_up` runs, all at
        once in a thread pool, from their argument shapes (nothing runs). Loading an
        executable releases the GIL, so on two cores the programs of a later start load in
        about half the time one after another takes (docs/startup.md); compiles that store
        an executable still take turns (`program_cache.compile_cached`). `on_ready(k, n)`
        hears, in this thread, that k of the n programs are ready. `riding`: the row counts
        whose rounds a chunk (of each size) rides it prepares (None: those of `rows` in
        `ride_rows`)."""
        sampling = SamplingParams() if self.greedy else SamplingParams(temperature=1.0)
        calls = [self._chunk_call(0, np.zeros((1, C), np.int32), 0, 1) for C in self._chunks()]
        rows = self.active_rows if rows is None else rows
        riding = tuple(r for r in rows if r in self.ride_rows) if riding is None else riding
        workers = max(1, min(len(calls) + len(rows) + len(riding) + 2, os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            # the rounds loops first: the largest programs, the longest to load
            futures = [pool.submit(self.compile_rounds, r) for r in sorted(rows, reverse=True)]
            futures += [pool.submit(self.compile_riding, r, C)
                        for r in sorted(riding, reverse=True) for C in self._chunks()]
            chunks = [pool.submit(self._program_of, fn, static, donate, args)
                      for fn, static, donate, args in calls]

            def finish():  # its hidden-state argument is the chunk's output
                h_1xD = chunks[0].result().out_info[1]
                return self._program_of(
                    *self._finish_call(0, SlotRequest((0,), 1, sampling), h_1xD))

            futures += chunks + [pool.submit(finish),
                                 pool.submit(self._program_of, *self._cancel_call(0))]
            for k, future in enumerate(concurrent.futures.as_completed(futures), 1):
                future.result()
                if on_ready is not None:
                    on_ready(k, len(futures))

    def rounds_stored(self, rows: int) -> bool:
        """Whether the rounds loop over `rows` rows is compiled in this process or stored in
        the program cache (compiling it is then a load of about a second, not a compile)."""
        return rows in self._rounds or compile_cache.is_stored(
            _rounds_rows, self._rounds_static(rows), self._rounds_structs())

    def riding_stored(self, rows: int) -> bool:
        """Whether the rounds over `rows` rows that a chunk (of each size) rides are compiled
        in this process or stored in the program cache (True where it does not ride: not in
        `ride_rows`)."""
        return rows not in self.ride_rows or all(
            (rows, C) in self._riding or compile_cache.is_stored(
                _round_with_chunk, self._rounds_static(rows), self._riding_structs(C))
            for C in self._chunks())

    def rows_to_compile(self) -> list[int]:
        """The row counts whose rounds loop, or round a chunk rides, is not compiled yet."""
        return [r for r in self.active_rows if r not in self._rounds or (
            r in self.ride_rows and not self._riding_compiled(r))]

    def warm_up(self, rows: tuple[int, ...] | None = None, on_phase=None,
                riding: tuple[int, ...] | None = None) -> int:
        """Compiles every program this engine runs (the small and the full prefill chunk,
        finish, the rounds loop over each of `rows` rows (None: every count of
        `active_rows`) and the round a chunk of each size rides over each of `riding` rows
        (None: those of `rows` in `ride_rows`), cancel): `prepare`, then runs them on two
        short requests in slot 0, which must be free; returns the compilations it ran. Afterwards no
        prompt of any length compiles anything, nor does any slot where `rows` are all of
        `active_rows`. `on_phase(text)` hears what it is doing (a progress line)."""
        phase = on_phase or (lambda text: None)
        before = backend_compiles()
        rows = self.active_rows if rows is None else rows
        riding = tuple(r for r in rows if r in self.ride_rows) if riding is None else riding
        what = "the prefill and the decode loop" + (
            f" ({', '.join(map(str, rows))} of {self.slots} slots)" if self.slots > 1 else "")
        phase(f"compiling {what}")
        self.prepare(rows, lambda k, n: phase(f"compiling {what}: {k} of {n} programs ready"),
                     riding)
        phase("running the programs once")
        sampling = SamplingParams() if self.greedy else SamplingParams(temperature=1.0)
        self.insert(0, SlotRequest((0,), 1, sampling))  # a small chunk
        self.cancel(0)  # decoding: its first token is out, its budget not yet seen
        full = self._small_tail + 1  # the shortest prompt that runs a full chunk
        self.insert(0, SlotRequest((0,) * (full if len(self._chunks()) > 1 else 1), 1, sampling))
        for r in rows:  # slot 0 is done after a round
            self._run_rounds(r, 1)
        for r, C in itertools.product(riding, self._chunks()):
            # a chunk of no position (prompt length 0) in free slot 0's row
            self.state, _ = _call(self._riding[r, C], (
                self.model.params, self.model.heads, self.req, self.state,
                *(np.zeros(a.shape, a.dtype) for a in self._riding_structs(C)[4:])), self.mesh)
        while self.busy[0]:
            self.generate(1)
        self.counters()
        return backend_compiles() - before

    def counters(self) -> Any:
        """The engine's counters (summed over every request so far), on the host (on several
        hosts a collective: every process calls it)."""
        return sharding.host_values(self.state.counters)
