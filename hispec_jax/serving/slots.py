"""Slots: one compiled engine whose B sequences take requests independently (the prefill /
insert / generate split of JetStream-style engines, on top of `decoding.engine.Engine`).

    insert     one prompt -> its slot's cache rows and per-sequence state: the prompt is
               prefilled as a batch of one (`Engine.init_state`, one compilation per prompt
               block bucket) and every [B, ...] leaf of the state takes it at the slot's row
    generate   `Engine.run_rounds`: at most R speculation rounds for the busy slots (R is an
               array: one compilation for every R)
    cancel     a slot stops at once (its client went away, a stop string matched)

    slot 0  [prompt A | A A A A A done]   [prompt D | D D D D ...
    slot 1  [prompt B | B B B B B B B B B B B B B B B B B B B B B B ...
    slot 2  [prompt C | C C C done] (free)
            time ->     D enters slot 0 while B keeps decoding; C's slot waits

A free or finished slot is a done sequence: it takes part in nothing. Every draw is keyed
by the request's own key and its own pass count, and a slot's rows are rewritten whole at
insertion, so a request's tokens do not depend on the other slots (greedy: the tokens of
offline `generate`; sampling: those of `generate` with the same seed).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.decoding import engine as engine_lib
from hispec_jax.decoding import methods as methods_lib
from hispec_jax.decoding.generate import MIN_PROMPT_BLOCK
from hispec_jax.decoding.request import Request
from hispec_jax.decoding.sampling import SamplingArrays, SamplingParams, sequence_keys

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


@dataclasses.dataclass(frozen=True)
class SlotRequest:
    """One request as a slot takes it.

    Attributes:
      prompt_ids: the prompt's token ids (already rendered by a chat template if any).
      max_new_tokens: the budget of new tokens (>= 1).
      sampling: temperature / top-k / top-p / seed (temperature 0 on a greedy engine).
      sequence_index: the request's index for its PRNG key (`sampling.sequence_keys`): 0
        gives the draws of offline `generate` of this one prompt with this seed.
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    sequence_index: int = 0


def prompt_block(prompt_len: int, capacity: int) -> int:
    """The prefill bucket of a prompt (as offline `generate`: a power of two >= 16)."""
    return min(max(MIN_PROMPT_BLOCK, 1 << (prompt_len - 1).bit_length()), capacity)


def _merge_row(big, small, slot, batch: int):
    """`big` with its batch row `slot` replaced by `small`'s only row. The batch axis of a
    leaf is the one axis where the shapes differ (B against 1); leaves of equal shape are
    batch-wide (e.g. counters) and stay, unless the batch itself has one row."""
    diff = [a for a, (m, n) in enumerate(zip(big.shape, small.shape)) if m != n]
    if not diff:
        return small if batch == 1 else big
    (axis,) = diff
    return jax.lax.dynamic_update_slice_in_dim(big, small.astype(big.dtype), slot, axis)


def _insert(engine: engine_lib.Engine, params, heads, state: engine_lib.EngineState,
            req: Request, slot, prompt_1xT, prompt_len_1, max_new_1, key_1x2,
            sampling_1: SamplingArrays, windows_K1):
    """Prefills one prompt (block T = its bucket) and writes it into row `slot` of the
    state and of the request (cache rows, output buffer, c_k, rings, windows, keys...)."""
    S, T = engine.shapes.capacity, prompt_1xT.shape[1]
    one = dataclasses.replace(engine, shapes=dataclasses.replace(
        engine.shapes, batch=1, prompt_block=T))
    tokens_1xS = jnp.zeros((1, S), jnp.int32).at[:, :T].set(prompt_1xT)
    req_1 = Request(tokens_BxS=tokens_1xS, prompt_lens_B=prompt_len_1, max_new_B=max_new_1,
                    eos_ids_E=req.eos_ids_E, sequence_keys_Bx2=key_1x2, sampling=sampling_1)
    fresh = one.init_state(params, heads, req_1, one.empty_cache(), windows_K1)
    B = engine.shapes.batch
    merged = jax.tree.map(lambda b, s: _merge_row(b, s, slot, B),
                          state.replace(counters=()), fresh.replace(counters=()))
    merged = merged.replace(counters=state.counters)
    req = req.replace(
        max_new_B=req.max_new_B.at[slot].set(max_new_1[0]),
        prompt_lens_B=req.prompt_lens_B.at[slot].set(prompt_len_1[0]),
        sequence_keys_Bx2=req.sequence_keys_Bx2.at[slot].set(key_1x2[0]),
        sampling=jax.tree.map(lambda b, s: b.at[slot].set(s[0]), req.sampling, sampling_1))
    return merged, req


def _cancel(state: engine_lib.EngineState, slot) -> engine_lib.EngineState:
    out = state.out
    return state.replace(out=out.replace(done_B=out.done_B.at[slot].set(True)))


def _empty(engine: engine_lib.Engine, params, heads, eos_ids_E, windows_K1):
    """A state and request with every slot free (done from the start)."""
    B, S, T = engine.shapes.batch, engine.shapes.capacity, engine.shapes.prompt_block
    req = Request(tokens_BxS=jnp.zeros((B, S), jnp.int32),
                  prompt_lens_B=jnp.ones((B,), jnp.int32), max_new_B=jnp.zeros((B,), jnp.int32),
                  eos_ids_E=eos_ids_E, sequence_keys_Bx2=jnp.zeros((B, 2), jnp.uint32),
                  sampling=SamplingArrays(temperature=jnp.ones((B,), jnp.float32),
                                          top_k=jnp.zeros((B,), jnp.int32),
                                          top_p=jnp.ones((B,), jnp.float32)))
    state = engine.init_state(params, heads, req, engine.empty_cache(), windows_K1)
    return state, req.replace(tokens_BxS=jnp.zeros((B, T), jnp.int32))


_insert_jit = jax.jit(_insert, static_argnums=(0,), donate_argnums=(3, 4))
_cancel_jit = jax.jit(_cancel, donate_argnums=(0,))
_empty_jit = jax.jit(_empty, static_argnums=(0,))
_rounds_jit = jax.jit(lambda engine, params, heads, req, state, rounds:
                      engine.run_rounds(params, heads, req, state, rounds),
                      static_argnums=(0,), donate_argnums=(4,))


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
      model: a loaded `Model` (one device; a mesh is not used here).
      decoder: a `methods.Decoder` (`methods.make_method`).
      slots: B, sequences decoded together.
      capacity: S, cache positions per slot (prompt + budget + the method's lookahead).
      greedy: argmax decoding (static); False: every slot samples with its own settings.
      eos_ids: token ids that end a request (EOS, end-of-turn markers).
    """

    def __init__(self, model, decoder: methods_lib.Decoder, *, slots: int, capacity: int,
                 greedy: bool, eos_ids: tuple[int, ...]):
        self.model, self.decoder = model, decoder
        self.eos_ids = tuple(eos_ids)
        shapes = engine_lib.Shapes(batch=slots, capacity=capacity, prompt_block=MIN_PROMPT_BLOCK,
                                   num_eos=max(1, len(self.eos_ids)))
        self.engine = engine_lib.Engine.for_model(model, decoder.hierarchy, shapes, greedy)
        self._eos_ids_E = jnp.asarray(list(self.eos_ids) or [-1], jnp.int32)
        self._windows_K1 = decoder.windows_array()
        self.state, self.req = _empty_jit(self.engine, model.params, model.heads,
                                          self._eos_ids_E, self._windows_K1)
        self._prompt_len = np.zeros((slots,), np.int64)
        self._reported = np.zeros((slots,), np.int64)  # new tokens already handed out
        self.busy = [False] * slots

    @property
    def slots(self) -> int:
        return self.engine.shapes.batch

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

    def insert(self, slot: int, request: SlotRequest) -> None:
        """Prefills `request` into `slot` (which must be free); its first token is emitted
        by the prefill and handed out by the next `generate`."""
        n = len(request.prompt_ids)
        if self.busy[slot]:
            raise ValueError(f"slot {slot} is busy")
        if n < 1 or not self.fits(n, request.max_new_tokens):
            raise ValueError(f"prompt length {n} + max_new_tokens {request.max_new_tokens} + "
                             f"lookahead {self.lookahead} does not fit the slot capacity "
                             f"{self.capacity}")
        if request.sampling.greedy != self.greedy:
            raise ValueError(f"a {'greedy' if request.sampling.greedy else 'sampling'} request "
                             f"on a {'greedy' if self.greedy else 'sampling'} engine")
        T = prompt_block(n, self.capacity)
        prompt = np.zeros((1, T), np.int32)
        prompt[0, :n] = request.prompt_ids
        s = request.sampling
        sampling_1 = SamplingArrays(
            temperature=np.asarray([max(s.temperature, 1e-6)], np.float32),
            top_k=np.asarray([s.top_k], np.int32), top_p=np.asarray([s.top_p], np.float32))
        key_1x2 = np.asarray(sequence_keys(s.seed, [request.sequence_index]))
        self.state, self.req = _insert_jit(
            self.engine, self.model.params, self.model.heads, self.state, self.req,
            np.int32(slot), prompt, np.asarray([n], np.int32),
            np.asarray([request.max_new_tokens], np.int32), key_1x2, sampling_1,
            self._windows_K1)
        self._prompt_len[slot], self._reported[slot] = n, 0
        self.busy[slot] = True

    def cancel(self, slot: int) -> None:
        """Stops `slot` now and frees it (its unreported tokens are dropped)."""
        if self.busy[slot]:
            self.state = _cancel_jit(self.state, np.int32(slot))
            self.busy[slot] = False

    def generate(self, max_rounds: int) -> list[SlotUpdate]:
        """Runs at most `max_rounds` rounds (fewer when every slot finishes) and returns the
        busy slots' new tokens; finished slots become free."""
        if any(self.busy):
            self.state = _rounds_jit(self.engine, self.model.params, self.model.heads, self.req,
                                     self.state, np.int32(max_rounds))
        tokens_BxS, num_new_B, done_B = jax.device_get(
            (self.state.out.tokens_BxS, self.state.out.num_new_B, self.state.out.done_B))
        updates = []
        for b in range(self.slots):
            if not self.busy[b]:
                continue
            p, seen, n = self._prompt_len[b], self._reported[b], int(num_new_B[b])
            new = tokens_BxS[b, p + seen:p + n].tolist()
            self._reported[b] = n
            done = bool(done_B[b])
            hit_eos = done and n > 0 and int(tokens_BxS[b, p + n - 1]) in self.eos_ids
            if done:
                self.busy[b] = False
            updates.append(SlotUpdate(slot=b, new_token_ids=new, done=done, hit_eos=hit_eos))
        return updates

    def counters(self) -> Any:
        """The engine's counters (summed over every request so far), on the host."""
        return jax.device_get(self.state.counters)
