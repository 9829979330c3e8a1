"""`generate_stream`: one prompt's continuation as text deltas, while it is decoded.

The prompt runs in a one-slot `SlotEngine` (slots.py) with the shapes offline `generate`
would use; after every speculation round the tokens the top level accepted are turned into
text (`detok.TextDeltas`: only text that later tokens cannot change) and yielded. The tokens
are those of `generate` with the same arguments (greedy and, for a seed, sampling).

    stream = generate_stream(model, "Hello", method="hispec", max_new_tokens=64)
    for delta in stream:
        print(delta, end="", flush=True)
    stream.result.stats["decode_tokens_per_second"], stream.result.stats["time_to_first_token"]

`warm_up_stream` (same arguments) compiles what such a stream runs before anyone waits for
it (`hispec chat` calls it while it starts).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterator, NamedTuple

from hispec_jax.decoding import chat as chat_lib
from hispec_jax.decoding import method_spec
from hispec_jax.decoding import methods as methods_lib
from hispec_jax.decoding.generate import (GenerationResult, _is_int, model_name, plan_shapes,
                                          spec_stats, tokenize)
from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.models import sharding
from hispec_jax.models.model import place_on_mesh
from hispec_jax.planner import tune as tune_lib
from hispec_jax.serving import detok as detok_lib
from hispec_jax.decoding import slots as slots_lib


class Resolved(NamedTuple):
    """What a method resolves to: the decoder, its spec (None for a hand-built `Decoder`),
    why it runs (`method_spec.resolve`), and the saved plan behind method "auto"."""

    decoder: methods_lib.Decoder
    spec: object
    reason: str
    plan: object = None


def make_decoder(model, method, greedy: bool, method_options: dict) -> Resolved:
    """The decoder of `method` as `generate` takes it (`method_spec.resolve`: a spec, a
    method name and its options, "auto" or None: the model's default plan), or of a
    `methods.Decoder` (with the acceptance rule of a greedy or sampling engine:
    `methods.for_engine`), checked as `generate` checks them."""
    if isinstance(method, methods_lib.Decoder):
        if method_options:
            raise ValueError("method options are part of a Decoder; pass none with one")
        return Resolved(methods_lib.for_engine(method, greedy), None, method_spec.GIVEN)
    spec, reason = method_spec.resolve(method, method_options, model_path=model.path,
                                       num_layers=model.cfg.num_layers,
                                       has_draft=model.draft is not None)
    if spec == "auto":
        decoder, plan = tune_lib.auto_decoder(model, 1, greedy=greedy)
        return Resolved(decoder, plan.spec(), reason, plan)
    return Resolved(methods_lib.make_method(model, spec, greedy=greedy), spec, reason)


class TextStream:
    """An iterator over text deltas; after it ends, `result` is the `GenerationResult`
    (token ids, the whole text, stats: method, tokens_per_second, time_to_first_token...)."""

    def __init__(self, deltas: Iterator[str]):
        self._deltas = deltas
        self.result: GenerationResult | None = None

    def __iter__(self):
        return self

    def __next__(self) -> str:
        return next(self._deltas)

    def close(self) -> None:
        """Stops decoding (the rest of the answer is not computed; `result` stays None
        unless it had finished)."""
        close = getattr(self._deltas, "close", None)
        if close is not None:
            close()


def prompt_length(model, prompt, chat: bool = False) -> int:
    """Tokens of one prompt as `generate_stream` takes it."""
    (ids,) = tokenize(model, chat_lib.chat_prompt_ids(model, prompt) if chat else prompt)
    return len(ids)


@dataclasses.dataclass
class _Setup:
    """What one streamed prompt runs on: its one-slot engine and request."""

    engine: slots_lib.SlotEngine
    request: slots_lib.SlotRequest
    plan: object
    capacity: int
    method_name: str
    spec_stats: dict


def _setup(model, prompt, *, method, max_new_tokens, ignore_eos, temperature, top_k, top_p,
           seed, max_cache_len, chat, mesh, method_options) -> _Setup:
    """Checks the arguments and builds the slot engine and request of one prompt (on a
    mesh: an engine of as many slots as the data axis has devices, the prompt in slot 0)."""
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if model.tokenizer is None:
        raise ValueError("generate_stream needs a model with a tokenizer (it yields text)")
    decoder, spec, reason, plan = make_decoder(model, method, sampling.greedy, method_options)
    all_ids = tokenize(model, chat_lib.chat_prompt_ids(model, prompt) if chat else prompt)
    if len(all_ids) != 1:
        raise ValueError(f"generate_stream takes one prompt, got {len(all_ids)} (use generate "
                         "for a batch)")
    prompt_ids = all_ids[0]
    _, capacity = plan_shapes(len(prompt_ids), int(max_new_tokens), decoder.lookahead(),
                              model.cfg.max_position_embeddings, max_cache_len)
    eos = () if ignore_eos else model.eos_token_ids
    if chat and not ignore_eos:
        eos = tuple(dict.fromkeys(eos + chat_lib.end_of_turn_ids(model)))
    model = place_on_mesh(model, mesh)  # no-op without a mesh or on the model's own
    engine = slots_lib.SlotEngine(model, decoder, slots=sharding.axis_size(model.mesh, "data"),
                                  capacity=capacity, greedy=sampling.greedy, eos_ids=eos)
    request = slots_lib.SlotRequest(tuple(prompt_ids), int(max_new_tokens), sampling)
    return _Setup(engine, request, plan, capacity,
                  "auto" if method == "auto" else "custom" if spec is None else spec.method,
                  spec_stats(spec, reason))


def warm_up_stream(model, prompt, *, on_phase=None, method=None, max_new_tokens: int = 64,
                   ignore_eos: bool = False, temperature: float = 0.0, top_k: int = 0,
                   top_p: float = 1.0, seed: int = 0, max_cache_len: int | None = None,
                   chat: bool = False, mesh=None, **method_options) -> int:
    """Compiles the programs `generate_stream` with these arguments runs (the slot
    engine's fixed set: `SlotEngine.warm_up`); returns the compilations it ran. With a
    fixed `max_cache_len` the engine's shapes do not depend on the prompt, so a later
    `generate_stream` of any prompt that fits compiles nothing. `on_phase(text)` hears
    what it is doing."""
    phase = on_phase or (lambda text: None)
    before = slots_lib.backend_compiles()
    phase("preparing the decoding state")
    setup = _setup(model, prompt, method=method, max_new_tokens=max_new_tokens,
                   ignore_eos=ignore_eos, temperature=temperature, top_k=top_k, top_p=top_p,
                   seed=seed, max_cache_len=max_cache_len, chat=chat, mesh=mesh,
                   method_options=method_options)
    setup.engine.warm_up(on_phase=phase)
    return slots_lib.backend_compiles() - before


def generate_stream(model, prompt, *, method=None, max_new_tokens: int = 64,
                    ignore_eos: bool = False, temperature: float = 0.0, top_k: int = 0,
                    top_p: float = 1.0, seed: int = 0, max_cache_len: int | None = None,
                    chat: bool = False, mesh=None, **method_options) -> TextStream:
    """Streams the continuation of one prompt (a string, token ids, or with `chat=True` a
    conversation) as text deltas. Arguments as `generate`'s (`mesh`: a device mesh with axes
    ("data", "model") to decode over; default: the model's own); everything is checked
    before this returns (a bad setting raises here, not at the first delta). `method`
    None: the model's default plan, as `generate`'s (`method_spec.resolve`).

    Yields only text that is final (an incomplete multi-byte character or a trailing space
    waits for the next token); the deltas join to `generate(...).texts[0]`.
    """
    compiles_before = slots_lib.backend_compiles()
    setup = _setup(model, prompt, method=method, max_new_tokens=max_new_tokens,
                   ignore_eos=ignore_eos, temperature=temperature, top_k=top_k, top_p=top_p,
                   seed=seed, max_cache_len=max_cache_len, chat=chat, mesh=mesh,
                   method_options=method_options)
    engine, request, plan, capacity = setup.engine, setup.request, setup.plan, setup.capacity
    prompt_ids = request.prompt_ids
    stream = TextStream(iter(()))

    def deltas():
        detok = detok_lib.TextDeltas(model.tokenizer)
        t0 = time.perf_counter()
        first = None
        engine.insert(0, request)
        done = False
        while not done:
            for update in engine.generate(1):
                done = update.done
                if update.new_token_ids and first is None:
                    first = time.perf_counter() - t0
                delta = detok.push(update.new_token_ids)
                if delta:
                    yield delta
        tail = detok.finish()
        seconds = time.perf_counter() - t0
        new = len(detok.token_ids)
        stream.result = GenerationResult(
            token_ids=[detok.token_ids], texts=[detok.text], prompt_token_ids=[list(prompt_ids)],
            stats={"method": setup.method_name,
                   "model": model_name(model), "model_path": model.path,
                   **({"plan": plan.name()} if plan is not None else {}),
                   **setup.spec_stats,
                   "new_tokens": new, "seconds": seconds,
                   "tokens_per_second": new / seconds if seconds > 0 else 0.0,
                   "time_to_first_token": first,
                   # after the first token: the decode loop alone (prefill and every
                   # compilation happen before the first token)
                   "decode_tokens_per_second": ((new - 1) / (seconds - first)
                                                if first is not None and new > 1
                                                and seconds > first else None),
                   "compile_count": slots_lib.backend_compiles() - compiles_before,
                   "cache_capacity": capacity,
                   **methods_lib.summarize_counters(engine.engine.hierarchy,
                                                    [engine.counters()], [1], model)})
        if tail:
            yield tail

    stream._deltas = deltas()
    return stream
