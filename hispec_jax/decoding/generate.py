"""`generate`: the host side of decoding.

Validates everything before any compilation, tokenizes, splits prompts into batches, and
runs each batch on the slot engine every entry point runs (`slots.SlotEngine`: the batch
inserted at once, then rounds until every sequence is done; batch padded with free slots;
its programs compiled once per process, timed and counted); returns token ids, texts and
stats.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Sequence

import numpy as np

from hispec_jax.decoding import chat as chat_lib
from hispec_jax.decoding import method_spec
from hispec_jax.decoding import methods as methods_lib
from hispec_jax.decoding import options as options_lib
from hispec_jax.decoding import slots as slots_lib
from hispec_jax.decoding import suffix_store
from hispec_jax.decoding.engine import compile_cache
from hispec_jax.decoding.prefill import MIN_PROMPT_BLOCK, PREFILL_CHUNK
from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.models import sharding
from hispec_jax.models.model import Model, place_on_mesh

CAPACITY_MULTIPLE = 64


@dataclasses.dataclass
class GenerationResult:
    """What `generate` returns.

    Attributes:
      token_ids: new token ids per prompt (EOS included when emitted, nothing after it).
      texts: decoded new tokens per prompt (None without a tokenizer).
      prompt_token_ids: the tokenized prompts.
      stats: model (its directory or file name), model_path, num_layers, method,
        tokens_per_second (new tokens / wall time of the compiled runs, compilation
        excluded), compile_seconds, compile_count, program_source ("cache", "stored" or
        "jit": how the loop is made, docs/statistics.md), decode_seconds, new_tokens, and
        the method's own counters.
    """

    token_ids: list[list[int]]
    texts: list[str] | None
    prompt_token_ids: list[list[int]]
    stats: dict[str, Any]


def tokenize(model: Model, prompts) -> list[list[int]]:
    """Prompts (strings or token-id lists) -> token-id lists, validated against the vocab."""
    if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts
                                    and _is_int(prompts[0])):
        prompts = [prompts]
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError("prompts: expected a non-empty list of strings or token-id lists")
    out = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if model.tokenizer is None:
                raise ValueError(f"prompts[{i}] is a string but the model has no tokenizer; "
                                 "pass token ids")
            ids = list(model.tokenizer(prompt)["input_ids"])
        elif isinstance(prompt, (Sequence, np.ndarray)) and all(
                _is_int(t) for t in np.asarray(prompt, dtype=object).reshape(-1)):
            ids = [int(t) for t in np.asarray(prompt, dtype=object).reshape(-1)]
        else:
            raise ValueError(f"prompts[{i}] must be a string or a list of integer token ids, "
                             f"got {prompt!r}")
        if len(ids) == 0:
            raise ValueError(f"prompts[{i}] is empty (no tokens)")
        bad = [t for t in ids if not 0 <= t < model.cfg.vocab_size]
        if bad:
            raise ValueError(f"prompts[{i}] has token id {bad[0]} outside the vocabulary "
                             f"[0, {model.cfg.vocab_size})")
        out.append(ids)
    return out


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def plan_shapes(max_prompt_len: int, max_new_tokens: int, lookahead: int, max_len: int,
                max_cache_len: int | None) -> tuple[int, int]:
    """(prefill chunk T, cache capacity S); raises ValueError when the request does not fit.

    T is the power-of-two bucket of the longest prompt, at most `PREFILL_CHUNK`; the
    capacity is planned from the bucket (one compilation per bucket and budget).

    `lookahead` is how many positions past the last emitted token a method may write
    (drafts beyond the budget), so the cache needs that much room.
    """
    if max_cache_len is not None and not (isinstance(max_cache_len, int) and 1 <= max_cache_len <= max_len):
        raise ValueError(f"max_cache_len={max_cache_len!r} must be an integer in [1, {max_len}] "
                         "(the model's max_position_embeddings)")
    limit = max_len if max_cache_len is None else max_cache_len
    need = max_prompt_len + max_new_tokens + lookahead
    if need > limit:
        raise ValueError(
            f"prompt length {max_prompt_len} + max_new_tokens {max_new_tokens}"
            + (f" + method lookahead {lookahead}" if lookahead else "")
            + f" = {need} exceeds the cache capacity {limit}"
            + (" (max_cache_len)" if max_cache_len is not None and max_cache_len < max_len
               else " (model max_position_embeddings)"))
    block = max(MIN_PROMPT_BLOCK, 1 << (max_prompt_len - 1).bit_length())
    if max_cache_len is not None:
        capacity = limit  # a fixed capacity: one compilation for any request that fits
    else:
        capacity = min(limit, _round_up(block + max_new_tokens + lookahead, CAPACITY_MULTIPLE))
    return min(block, PREFILL_CHUNK, capacity), max(capacity, need)


def generate(model: Model, prompts, *, method=None, max_new_tokens: int = 64,
             batch_size: int | None = None, ignore_eos: bool = False, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, max_cache_len: int | None = None,
             chat: bool = False, mesh=None, lookup_cost=None, draft: Model | None = None,
             cross_request=False, **method_options) -> GenerationResult:
    """Generates continuations of `prompts` with a decoding method.

    Args:
      model: a loaded `Model`.
      prompts: a string, a list of strings, or a list of token-id lists.
      method: a method spec (`method_spec`: `AR()`, `Lookup(k=8)`, `HiSpec(...)`, ...), or
        its name with its options as keyword arguments: "ar" (autoregressive), "exit"
        (early-exit inference from `exit_layer`), "layerskip", "hispec", "sv",
        "specbound", "lookup" or "draft" (see `methods.make_method`); or a hand-built
        `methods.Decoder`. None: the model's default plan, as on the command line
        (`method_spec.resolve`: the draft model's where one is given, else the model's
        recommended plan, else gated prompt lookup); "ar" for plain decoding. ("auto",
        the plan `hispec tune` saved, is resolved above decoding: `hispec_jax.generate`.)
      max_new_tokens: per-sequence budget of new tokens (>= 1).
      batch_size: split prompts into batches of this many (default: one batch).
      ignore_eos: keep generating past EOS.
      temperature, top_k, top_p, seed: sampling (temperature 0 = greedy).
      max_cache_len: a fixed KV-cache capacity (positions per sequence). Default: the prompt
        bucket + max_new_tokens (+ the method's lookahead), rounded up to a multiple of 64,
        at most the model's context length.
      chat: render each prompt (a user message, or a list of {"role", "content"} messages)
        with the model's chat template and also stop at its end-of-turn token (`chat.py`).
      mesh: a `jax.sharding.Mesh` with axes ("data", "model") to decode over (default: the
        model's own, `load_model(..., mesh=)`; None there too: one device). Sequences split
        over "data", the model and KV heads over "model" (`models/sharding.py`); a batch
        that "data" does not divide is padded with finished rows, never dropped. The tokens
        are those of unsharded decoding.
      lookup_cost: the pass costs the lookup drafter's acceptance gate weighs (a
        `gate.PassCost`, e.g. `gate.measure_pass_cost(model)`; default: this host's stored
        measurement of the model's passes, else the backend's: `device_costs.for_model`).
        Arrays: a new value never recompiles.
      cross_request: with a prompt-lookup drafter, also draft from the prompts and outputs
        of the batches before (a `suffix_store.SuffixStore`, kept in memory; True: a new
        one of `suffix_store.DEFAULT_STORE_TOKENS`; pass one store to several calls to
        share it): one instruction over many inputs repeats what earlier answers said.
        Outputs never change (it only proposes); with `batch_size=1` every prompt drafts
        from all earlier ones.
      draft: a draft model (a smaller `Model` with the target's vocabulary) as level 0:
        method "draft" verifies its drafts with the final layer, "layerskip" / "hispec"
        with their exits first (`Model.with_draft`; checked before anything compiles); or
        two, the smaller first, which drafts for the larger (`draft_k=(k', k)`).
      **method_options: the method's settings (e.g. exit_layer, draft_exit, verify_exits,
        draft_len, verify_window, adaptive, acceptance="tokenwise"|"blockwise").

    The steps, each checking its inputs before anything compiles: `check_request` (budget
    and sampling), `method_decoder` (the method and its options), `prompt_token_ids`
    (prompts, chat template), `check_batch_size`, then `decode` (shapes, the compiled loop,
    the runs, stats).
    """
    sampling, max_new_tokens = check_request(max_new_tokens, temperature, top_k, top_p, seed)
    model = with_draft(model, draft)
    decoder, spec, reason = method_decoder(model, method, sampling, method_options)
    store = check_cross_request(cross_request, decoder)
    prompt_ids = prompt_token_ids(model, prompts, chat)
    batch_size = check_batch_size(batch_size, len(prompt_ids))
    return decode(model, prompt_ids, decoder, sampling, store=store,
                  method_name=spec.method if spec is not None else "custom",
                  max_new_tokens=max_new_tokens, batch_size=batch_size, ignore_eos=ignore_eos,
                  max_cache_len=max_cache_len, chat=chat, mesh=mesh,
                  reuse_compiled=spec is not None, lookup_cost=lookup_cost,
                  extra_stats=spec_stats(spec, reason))


def check_cross_request(cross_request, decoder: methods_lib.Decoder
                        ) -> suffix_store.SuffixStore | None:
    """The store `cross_request` asks for (False: none; True: a new one; or the store
    given), refused where no drafter reads one (only prompt lookup does)."""
    if cross_request is False or cross_request is None:
        return None
    if cross_request is not True and not isinstance(cross_request, suffix_store.SuffixStore):
        raise ValueError(f"cross_request must be True, False or a SuffixStore, got "
                         f"{cross_request!r}")
    if not getattr(decoder.hierarchy.drafter, "reads_store", False):
        raise ValueError("cross_request needs a prompt-lookup drafter (method 'lookup', or "
                         "lookup=K under layerskip, hispec or a draft model), which drafts "
                         "from the store")
    return suffix_store.SuffixStore() if cross_request is True else cross_request


def spec_stats(spec, reason: str) -> dict[str, Any]:
    """The stats naming what ran: the method spec's JSON form and why it ran (the model's
    default plan, a saved plan, or "given")."""
    if spec is None:
        return {}
    return {"method_spec": spec.to_json(), "plan_reason": reason}


def with_draft(model: Model, draft) -> Model:
    """`model` with `draft` as its draft model (None: `model`). `draft`: a `Model`, or two
    (smaller first: HSD's two draft models, the smaller drafting for the larger)."""
    if isinstance(draft, (tuple, list)):
        if not 1 <= len(draft) <= 2:
            raise ValueError(f"draft: one or two draft models (the smaller first), got "
                             f"{len(draft)}")
        draft = draft[0] if len(draft) == 1 else draft[1].with_draft(draft[0])
    return model if draft is None else model.with_draft(draft)


def check_request(max_new_tokens, temperature, top_k, top_p, seed) -> tuple[SamplingParams, int]:
    """The sampling settings and the token budget (`options.py`'s rules); ValueError."""
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    return sampling, options_lib.check_positive_int("max_new_tokens", max_new_tokens)


def method_decoder(model: Model, method, sampling: SamplingParams, method_options: dict[str, Any]
                   ) -> tuple[methods_lib.Decoder, "method_spec.MethodSpec | None", str]:
    """(decoder, spec, why it runs) of `method` as `generate` takes it (`method_spec.resolve`:
    a spec, a method name and its options, or None: the model's default plan), or of a
    hand-built `Decoder` (it takes no options; spec None) with the acceptance rule of
    greedy or sampling decoding (`methods.for_engine`)."""
    if isinstance(method, methods_lib.Decoder):  # a hand-built hierarchy (advanced use)
        if method_options:
            raise ValueError("method options are part of a Decoder; pass none with one")
        return methods_lib.for_engine(method, sampling.greedy), None, method_spec.GIVEN
    spec, reason = method_spec.resolve(method, method_options, model_path=model.path,
                                       num_layers=model.cfg.num_layers,
                                       has_draft=model.draft is not None)
    if spec == "auto":
        raise ValueError("method 'auto' (a tuned plan) is resolved by hispec_jax.generate, "
                         "not by hispec_jax.decoding.generate")
    return methods_lib.make_method(model, spec, greedy=sampling.greedy), spec, reason


def prompt_token_ids(model: Model, prompts, chat: bool = False) -> list[list[int]]:
    """The prompts as token-id lists (rendered with the chat template first for `chat`)."""
    return tokenize(model, chat_lib.chat_prompt_ids(model, prompts) if chat else prompts)


def stop_token_ids(model: Model, chat: bool = False) -> tuple[int, ...]:
    """The tokens a sequence stops at (unless `ignore_eos`): the model's EOS ids and, for
    prompts rendered with the chat template (`chat`), its end-of-turn tokens."""
    if not chat:
        return model.eos_token_ids
    return tuple(dict.fromkeys(model.eos_token_ids + chat_lib.end_of_turn_ids(model)))


def check_batch_size(batch_size, num_prompts: int) -> int:
    """`batch_size`, or every prompt in one batch for None."""
    if batch_size is None:
        return num_prompts
    return options_lib.check_positive_int("batch_size", batch_size)


def decode(model: Model, prompt_ids: list[list[int]], decoder: methods_lib.Decoder,
           sampling: SamplingParams, *, method_name: str, max_new_tokens: int, batch_size: int,
           ignore_eos: bool = False, max_cache_len: int | None = None, chat: bool = False,
           mesh=None, reuse_compiled: bool = True,
           extra_stats: dict[str, Any] | None = None, lookup_cost=None,
           store: suffix_store.SuffixStore | None = None) -> GenerationResult:
    """Runs checked prompts through `decoder`'s compiled loop, batch by batch.

    `reuse_compiled`: run in an already compiled loop of this model and these shapes whose
    window bounds are larger, when its (longer) lookahead still fits the cache (named
    methods; a hand-built `Decoder` runs exactly its own hierarchy). `extra_stats` go into
    the stats after `num_layers` (e.g. the tuned plan's name). `store`: earlier requests'
    tokens the lookup drafter also drafts from; each batch's prompts and outputs enter it
    before the next batch runs (one scope: `SuffixStore.scope_of(None)`).
    """
    model = place_on_mesh(model, mesh)  # no-op without a mesh or on the model's own
    # Batch-padding rows (free slots) fill the data axis; results skip them.
    loop_batch = _round_up(batch_size, sharding.axis_size(model.mesh, "data"))
    max_prompt_len = max(len(p) for p in prompt_ids)
    block, capacity = plan_shapes(max_prompt_len, max_new_tokens, decoder.lookahead(),
                                  model.cfg.max_position_embeddings, max_cache_len)
    eos = () if ignore_eos else stop_token_ids(model, chat)
    if reuse_compiled:  # a compiled loop of larger window bounds whose lookahead still fits
        covering = compile_cache.covering(slots_lib.engine_of(
            model, decoder.hierarchy, slots=loop_batch, capacity=capacity,
            greedy=sampling.greedy, eos_ids=eos))
        if max_prompt_len + max_new_tokens + covering.hierarchy.lookahead <= capacity:
            decoder = dataclasses.replace(decoder, hierarchy=covering.hierarchy)
    slots = slots_lib.SlotEngine(model, decoder, slots=loop_batch, capacity=capacity,
                                 greedy=sampling.greedy, eos_ids=eos, prefill_chunk=block,
                                 store=store, empty_state=False)
    if lookup_cost is not None:
        slots.use_pass_cost(lookup_cost, "given")
    compiled_before = compile_cache.compilations
    compile_seconds, program_source = slots.compile_batch()
    compile_count = compile_cache.compilations - compiled_before

    token_ids: list[list[int]] = []
    scope = suffix_store.NO_SCOPE if store is None else store.scope_of(None)
    run_seconds = 0.0
    method_stats, batch_sequences = [], []
    for start in range(0, len(prompt_ids), batch_size):
        batch = prompt_ids[start:start + batch_size]
        requests = [slots_lib.SlotRequest(tuple(ids), max_new_tokens, sampling,
                                          sequence_index=start + b, scope=scope)
                    for b, ids in enumerate(batch)]
        t0 = time.perf_counter()
        slots.insert_batch(requests)
        new = {b: [] for b in range(len(batch))}
        for update in slots.run_to_end():  # the tokens of each slot, and its first one
            new[update.slot] += update.new_token_ids
        run_seconds += time.perf_counter() - t0
        token_ids += [new[b] for b in range(len(batch))]
        method_stats.append(slots.counters())
        batch_sequences.append(len(batch))
    new_tokens = sum(len(t) for t in token_ids)
    stats = {
        "method": method_name,
        "model": model_name(model),
        "model_path": model.path,
        "num_layers": model.cfg.num_layers,
        **({"hierarchy_source": decoder.source} if decoder.source else {}),
        **(extra_stats or {}),
        "new_tokens": new_tokens,
        "tokens_per_second": new_tokens / run_seconds if run_seconds > 0 else 0.0,
        "decode_seconds": run_seconds,
        "compile_seconds": compile_seconds,
        "compile_count": compile_count,
        "program_seconds": slots.batch_programs_seconds(),
        "program_source": program_source,
        "program_memory_bytes": program_bytes(slots.memory_analysis()),
        "batches": len(method_stats),
        "batch_size": batch_size,
        **({"mesh": sharding.describe(model.mesh)} if model.mesh is not None else {}),
        "prompt_block": block,
        "cache_capacity": capacity,
        "pass_cost_source": slots.pass_cost_source,
        **({"cross_request_store": store.describe()} if store is not None else {}),
        **methods_lib.summarize_counters(slots.engine.hierarchy, method_stats, batch_sequences,
                                         model),
    }
    texts = None
    if model.tokenizer is not None:
        texts = [model.tokenizer.decode(t, skip_special_tokens=True) for t in token_ids]
    return GenerationResult(token_ids=token_ids, texts=texts, prompt_token_ids=prompt_ids,
                            stats=stats)


def program_bytes(m) -> int:
    """Bytes of XLA's memory analysis `m`: arguments (weights, cache, request) + outputs +
    temporaries, a donated buffer counted once: on CPU the peak the programs can reach;
    accelerators report the same analysis."""
    return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
               + m.temp_size_in_bytes)


def model_name(model: Model) -> str:
    """A short name for summaries: the model's directory or file name."""
    if model.path is None:
        return f"in-memory {model.cfg.model_type} model"
    return os.path.basename(os.path.normpath(model.path))
