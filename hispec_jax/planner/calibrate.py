"""Measurement for the latency model: one pass on calibration prompts.

    acceptance   alpha(a, b) for every pair of exits on the model's own greedy continuations
                 of the calibration prompts (teacher-forced, every exit's head on its layer):
                 greedy: top-1 agreement; sampling: E[sum_v min(p_a(v), p_b(v))]
                 (1 - total variation) at the given temperature
    stage costs  wall seconds of `run_layers_cached` (one layer) and `exit_logits` + argmax
                 (one head) over blocks of T tokens at the batch size asked for, on a cache
                 of the engine's layout, jitted with the cache donated like the engine's loop
    loop costs   `generate` itself: AR at a budget of 1 token (prefill and host work) and of
                 n tokens (per-token AR time), and one LayerSkip run; with its counters
                 (passes) the two loops give one scale on every stage cost and a fixed cost
                 per pass (`fit_loop_costs`)
    trace        every exit's greedy choice along the continuations (`measure_trace`): what
                 the predictor replays the engine's round on

The calibration prompts are first user turns of the ShareGPT *training* split (benchmarks
use the held-out split) unless the caller gives prompts.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax import datasets
from hispec_jax.decoding import generate as generate_lib
from hispec_jax.decoding import methods
from hispec_jax.models import heads as heads_lib
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.model import Model
from hispec_jax.models.params import with_layer_layout
from hispec_jax.models.transformer import run_layers_cached, scan_exits
from hispec_jax.decoding.options import DEFAULT_LOOKUP, DEFAULT_MAX_NGRAM
from hispec_jax.planner.latency import Costs, LookupProfile, Trace, blocks


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much to measure.

    Attributes:
      num_prompts: calibration prompts (the batch is filled by repeating them if fewer).
      max_prompt_tokens: longest calibration prompt.
      new_tokens: continuation length per prompt (AR timing and acceptance positions).
      block_sizes: block lengths T the stage costs are measured at.
      repeats: timed samples per measurement (the minimum is kept: contention from other
        processes only adds time).
      capacity: KV-cache positions of every measured loop and stage.
      temperature: 0 for greedy acceptance (top-1 agreement), else the sampling temperature.
      lookup: k of the prompt-lookup drafter run on the calibration prompts (0: neither it
        nor the trace is measured; the search then leaves lookup out and prices every exit
        hierarchy by the renewal formulas).
    """

    num_prompts: int = 8
    max_prompt_tokens: int = 64
    new_tokens: int = 64
    block_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    repeats: int = 7
    capacity: int = 256
    temperature: float = 0.0
    lookup: int = DEFAULT_LOOKUP

    @classmethod
    def quick(cls) -> "Settings":
        return cls(num_prompts=4, max_prompt_tokens=48, new_tokens=32, block_sizes=(1, 2, 4, 8, 16),
                   repeats=3, capacity=192)


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What `calibrate` measured.

    Attributes:
      exits: the exits with a head, ascending (the last is L).
      alpha: [E, E] acceptance between exits[i] and exits[j] (symmetric, 1 on the diagonal).
      costs: the device costs at the batch size.
      tokens: positions the acceptance was measured on.
      seconds: wall seconds the calibration took (compilations included).
      loop: the raw loop timings (for the record).
      lookup: what `method="lookup"` did on the calibration prompts, with the trace
        (`latency.LookupProfile`), or None when not measured.
    """

    exits: tuple[int, ...]
    alpha: np.ndarray
    costs: Costs
    tokens: int
    seconds: float
    loop: dict[str, Any]
    lookup: LookupProfile | None = None

    def alpha_of(self, a: int, b: int) -> float:
        index = {e: i for i, e in enumerate(self.exits)}
        return float(self.alpha[index[a], index[b]])

    def to_json(self) -> dict[str, Any]:
        return {"exits": list(self.exits), "alpha": np.round(self.alpha, 5).tolist(),
                "costs": self.costs.to_json(), "tokens": self.tokens,
                "seconds": round(self.seconds, 2), "loop": self.loop,
                "lookup": self.lookup.to_json() if self.lookup is not None else None}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Calibration":
        return cls(exits=tuple(d["exits"]), alpha=np.asarray(d["alpha"], float),
                   costs=Costs.from_json(d["costs"]), tokens=int(d["tokens"]),
                   seconds=float(d["seconds"]), loop=dict(d.get("loop", {})),
                   lookup=LookupProfile.from_json(d["lookup"]) if d.get("lookup") else None)


def calibration_prompts(model: Model, num_prompts: int, max_prompt_tokens: int,
                        seed: int = 0) -> list[list[int]]:
    """First user turns of the ShareGPT training split (`"User: ...\\nAssistant:"`, as the
    benchmark prompts), or random token prompts for a model without a tokenizer."""
    if model.tokenizer is not None:
        try:
            train, _ = datasets.split_sharegpt(datasets.load_sharegpt().records)
        except (ImportError, FileNotFoundError):
            train = []
        prompts = []
        for record in train:
            text = datasets.first_user_prompt(record)
            if text is not None:
                ids = model.tokenizer(text)["input_ids"]
                if len(ids) <= max_prompt_tokens:
                    prompts.append(list(ids))
                    if len(prompts) == num_prompts:
                        return prompts
        if prompts:
            return prompts
    rng = np.random.default_rng(seed)
    length = max(2, min(max_prompt_tokens, 16))
    return [rng.integers(3, model.cfg.vocab_size, size=length).tolist() for _ in range(num_prompts)]


# ------------------------------------------------------------------------- acceptance
@functools.partial(jax.jit, static_argnames=("model_cfg", "exits", "temperature"))
def _pair_counts(params, heads, tokens_BxT, valid_BxT, *, model_cfg, exits, temperature):
    """[E, E] summed agreement (greedy) or overlap sum_v min(p_a, p_b) over valid positions."""
    params = with_layer_layout(params, "scan")  # scan_exits scans the stacked layers
    _, h_LxBxTxD = scan_exits(params, model_cfg, tokens_BxT, lambda h, index: h)
    logits = [exit_logits(params, heads, model_cfg, h_LxBxTxD[e - 1], e) for e in exits]
    valid = valid_BxT.astype(jnp.float32)
    if temperature == 0.0:
        top_ExBxT = jnp.stack([jnp.argmax(x, -1) for x in logits])
        same = (top_ExBxT[:, None] == top_ExBxT[None]).astype(jnp.float32)
        return jnp.sum(same * valid, axis=(2, 3))
    p_ExBxTxV = jnp.stack([jax.nn.softmax(x.astype(jnp.float32) / temperature, -1) for x in logits])
    overlap = jax.lax.map(lambda p_BxTxV: jnp.sum(jnp.minimum(p_BxTxV[None], p_ExBxTxV), -1),
                          p_ExBxTxV)  # [E, E, B, T]
    return jnp.sum(overlap * valid, axis=(2, 3))


def measure_alpha(model: Model, sequences: list[list[int]], starts: list[int],
                  temperature: float = 0.0, chunk: int = 2) -> tuple[tuple[int, ...], np.ndarray, int]:
    """(exits, alpha [E, E], positions) on `sequences`, counting the predictions made at
    positions >= starts[i] - 1 (the continuation, the regime decoding sees)."""
    exits = tuple(methods.available_exits(model))
    T = max(16, 1 << (max(map(len, sequences)) - 1).bit_length())
    counts, total = np.zeros((len(exits), len(exits))), 0
    for lo in range(0, len(sequences), chunk):
        part = sequences[lo:lo + chunk]
        tokens = np.zeros((chunk, T), np.int32)
        valid = np.zeros((chunk, T), bool)
        for b, s in enumerate(part):
            tokens[b, :len(s)] = s
            valid[b, max(starts[lo + b] - 1, 0):len(s) - 1] = True
        counts += np.asarray(_pair_counts(model.params, model.heads, tokens, valid,
                                          model_cfg=model.cfg, exits=exits,
                                          temperature=float(temperature)))
        total += int(valid.sum())
    return exits, counts / max(total, 1), total


# ------------------------------------------------------------------------- stage costs
STAGE_CALLS = 10  # back-to-back calls per timed sample of a stage program (its mean)


def _timed(fn, calls: int) -> float:
    """Seconds per call of `calls` back-to-back calls."""
    t0 = time.perf_counter()
    for _ in range(calls):
        out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / calls


def monotone(values) -> list[float]:
    """The non-decreasing least-squares fit of `values` (pool adjacent violators): a pass
    over a longer block never costs less, so a sample that contention slowed is averaged
    with its neighbours instead of bending the curve."""
    blocks = [[float(v), 1] for v in values]
    i = 0
    while i < len(blocks) - 1:
        if blocks[i][0] > blocks[i + 1][0]:
            (a, n), (b, m) = blocks[i], blocks[i + 1]
            blocks[i:i + 2] = [[(a * n + b * m) / (n + m), n + m]]
            i = max(i - 1, 0)
        else:
            i += 1
    return [v for v, n in blocks for _ in range(n)]


def head_cost_scales(model: Model) -> tuple[tuple[int, float], ...]:
    """`Costs.head_scale` of `model`: its trained heads' multiply-adds over the shared
    head's (`models.heads.head_cost_scales`)."""
    return heads_lib.head_cost_scales(model.cfg, model.heads)


def measure_stage_costs(model: Model, batch: int, capacity: int, block_sizes, repeats: int,
                        context: int | None = None) -> tuple[list[float], list[float]]:
    """(seconds of one layer, seconds of the shared exit head + argmax) per block length T,
    at `batch` sequences with `context` cached positions before the block (trained heads:
    `head_cost_scales`).

    Per T three jitted programs run layers [0, n1), [0, n2) and [0, n1) + the shared head
    ((n1, n2) = (2, 6), or (1, L) for L < 3); differences cancel the per-call dispatch cost
    (that cost is the engine's pass overhead, fitted from loop runs: `fit_loop_costs`)."""
    cfg = model.cfg
    L = cfg.num_layers
    n1, n2 = (2, min(6, L)) if L >= 3 else (1, L)
    context = capacity // 2 if context is None else context
    per_layer = isinstance(model.params["layers"], (tuple, list))

    def program(T, stop, head):
        positions = jnp.broadcast_to(context + jnp.arange(T, dtype=jnp.int32), (batch, T))

        def f(params, heads, x, cache):
            h, cache = run_layers_cached(params, cfg, x, positions, cache, 0, stop)
            out = jnp.argmax(exit_logits(params, heads, cfg, h, stop), -1) if head else h
            return out, cache
        return jax.jit(f, donate_argnums=(3,))

    # Per T three programs: layers [0, n1), [0, n2), [0, n1) + head.
    keys = [(T, part) for T in block_sizes for part in ("lo", "hi", "head")]
    progs = {(T, part): program(T, n1 if part != "hi" else n2, part == "head") for T, part in keys}
    inputs = {T: jnp.asarray(np.random.default_rng(0).normal(size=(batch, T, cfg.hidden_size))
                             * 0.1, jnp.dtype(cfg.dtype)) for T in block_sizes}
    caches = {key: KVCache.zeros(cfg, batch, capacity, n2, per_layer=per_layer) for key in keys}

    def call(key):
        out, caches[key] = progs[key](model.params, {}, inputs[key[0]], caches[key])  # shared head
        return out

    for key in keys:  # compile + warm
        jax.block_until_ready(call(key))
    samples = {key: [] for key in keys}
    # Interleaved over every block length and program: a burst of machine noise hits them
    # alike, so it cannot bend the cost curve.
    for _ in range(repeats):
        for key in keys:
            samples[key].append(_timed(lambda: call(key), STAGE_CALLS))
    layer_s, head_s = [], []
    for T in block_sizes:
        # the minimum: contention from other processes only ever adds time
        t = {part: min(samples[(T, part)]) for part in ("lo", "hi", "head")}
        layer = (t["hi"] - t["lo"]) / (n2 - n1) if n2 > n1 else 0.0
        if layer <= 0:  # noise swamped the difference: charge the dispatch to the layers
            layer = t["hi"] / n2
        head = t["head"] - t["lo"]
        layer_s.append(layer)
        head_s.append(head if head > 0 else 0.5 * layer)
    return monotone(layer_s), monotone(head_s)


# ------------------------------------------------------------------------- loop costs
def generate_seconds(model, prompts, repeats, **kwargs):
    """(`generate`'s decode seconds on `prompts`, EOS ignored: the fastest of `repeats`
    calls after a first that compiles, the last call's result)."""
    seconds, result = [], None
    for _ in range(repeats + 1):  # the first call compiles (not counted)
        result = generate_lib.generate(model, prompts, ignore_eos=True, **kwargs)
        seconds.append(result.stats["decode_seconds"])
    return min(seconds[1:]), result  # contention only ever adds time


def calibrate(model: Model, batch_size: int = 1, prompts: list[list[int]] | None = None,
              settings: Settings = Settings(), progress=None,
              costs_from: Calibration | None = None) -> Calibration:
    """Measures acceptance between every pair of exits and the costs of the engine's pieces
    on this device at `batch_size` (see the module docstring). With `costs_from` (an earlier
    calibration of this model, device and batch size) only what depends on the prompts is
    measured (acceptance, the lookup); the costs are that calibration's."""
    tick = progress or (lambda msg: None)
    t_start = time.perf_counter()
    s = settings
    if prompts is None:
        prompts = calibration_prompts(model, s.num_prompts, s.max_prompt_tokens)
    # The loops are timed over every calibration prompt (in batches of `batch_size`; one
    # batch, prompts repeated, when there are fewer), and the stages at those prompts' mean
    # context: a step's cost grows with its context (attention over the used cache span), and
    # `fit_loop_costs` reconciles loops and stages timed at the same context.
    batch_prompts = (list(prompts) if len(prompts) >= batch_size
                     else [prompts[i % len(prompts)] for i in range(batch_size)])
    batches = -(-len(batch_prompts) // batch_size)
    L = model.cfg.num_layers
    capacity = min(s.capacity, model.cfg.max_position_embeddings)
    context = min(capacity // 2, sum(map(len, batch_prompts)) // len(batch_prompts)
                  + s.new_tokens // 2)
    common = dict(batch_size=batch_size, max_cache_len=capacity)

    tick("AR continuations (acceptance positions) and AR timing")
    ar = generate_lib.generate(model, prompts, method="ar", max_new_tokens=s.new_tokens,
                               ignore_eos=True, batch_size=batch_size, max_cache_len=capacity)
    if costs_from is not None:
        return _prompt_measurements(model, ar, prompts, s, batch_size, capacity, tick, t_start,
                                    costs_from)
    t_ar_run, _ = generate_seconds(model, batch_prompts, s.repeats, method="ar",
                                   max_new_tokens=s.new_tokens, **common)
    t_prefill, _ = generate_seconds(model, batch_prompts, s.repeats, method="ar",
                                    max_new_tokens=1, **common)
    t_ar_run, t_prefill = t_ar_run / batches, t_prefill / batches  # per batch
    per_round_ar = (t_ar_run - t_prefill) / max(s.new_tokens - 1, 1)
    if per_round_ar <= 0:  # noise: no separate prefill estimate
        per_round_ar, t_prefill = t_ar_run / s.new_tokens, 0.0

    tick("acceptance between every pair of exits")
    sequences, starts, choices, (exits, alpha, tokens) = _acceptance(model, ar, s)

    tick("stage costs (layers, exit head) per block length")
    layer_s, head_s = measure_stage_costs(model, batch_size, capacity, s.block_sizes, s.repeats,
                                          context=context)
    costs = Costs(batch=batch_size, num_layers=L, block_sizes=tuple(s.block_sizes),
                  layer_s=tuple(layer_s), head_s=tuple(head_s),
                  head_scale=head_cost_scales(model))

    # (seconds per batch; the LayerSkip counters below are summed over the timed batches)
    loop: dict[str, Any] = {"ar_seconds": t_ar_run, "prefill_seconds": t_prefill,
                            "ar_seconds_per_round": per_round_ar, "timed_batches": batches,
                            "stage_context": context}
    fixed_ar = per_round_ar - (L * costs.layer(1) + costs.head(1))  # = pass_s + round_s
    costs = dataclasses.replace(costs, round_s=float(max(fixed_ar, 0.0)))
    candidates = [e for e in exits if e < L]
    if candidates:
        tick("LayerSkip loop (the stage scale and the fixed cost of a pass)")
        draft = methods.default_exits(model)[0]
        nd = 2
        t_ls, r = generate_seconds(model, batch_prompts, s.repeats, method="layerskip",
                                   draft_exit=draft, draft_len=nd,
                                   max_new_tokens=s.new_tokens, **common)
        drafts, verifies = r.stats["actions_per_level"]
        # (the LayerSkip time and counters are summed over the batches)
        costs, fit = fit_loop_costs(costs, per_round_ar, t_ls - batches * t_prefill, draft, nd,
                                    drafts, verifies)
        loop.update(fit)
        loop.update(layerskip_seconds=t_ls / batches, layerskip_rounds=r.stats["rounds"],
                    layerskip_passes=drafts + verifies, layerskip_draft_exit=draft,
                    layerskip_draft_len=nd)
    costs = dataclasses.replace(costs, prefill_s=float(t_prefill))
    lookup = _lookup(model, prompts, s, batch_size, capacity, sequences, starts, choices, tick)
    return Calibration(exits=exits, alpha=alpha, costs=costs, tokens=tokens,
                       seconds=time.perf_counter() - t_start, loop=loop, lookup=lookup)


def _acceptance(model: Model, ar, s: Settings):
    """(sequences, starts, the exits' greedy choices or None, (exits, alpha, positions))."""
    sequences = [p + t for p, t in zip(ar.prompt_token_ids, ar.token_ids)]
    starts = [len(p) for p in ar.prompt_token_ids]
    if s.temperature == 0.0:  # top-1 agreement: from the exits' choices (also the trace's)
        choices = exit_choices(model, sequences)
        return sequences, starts, choices, alpha_from_choices(choices, starts)
    return sequences, starts, None, measure_alpha(model, sequences, starts, s.temperature)


def _lookup(model, prompts, s: Settings, batch_size, capacity, sequences, starts, choices,
            tick) -> LookupProfile | None:
    if not s.lookup:
        return None
    tick("prompt lookup on the calibration prompts (rounds and blocks)")
    lookup = measure_lookup(model, prompts, s.lookup, s.new_tokens, batch_size, capacity)
    tick("every exit's choices along the continuations (the trace the predictor replays)")
    return dataclasses.replace(lookup, trace=measure_trace(model, sequences, starts,
                                                           choices=choices))


def _prompt_measurements(model, ar, prompts, s: Settings, batch_size, capacity, tick, t_start,
                         costs_from: Calibration) -> Calibration:
    """`calibrate` with the costs of `costs_from`: acceptance and the lookup only."""
    if costs_from.costs.batch != batch_size:
        raise ValueError(f"costs_from was measured at batch {costs_from.costs.batch}, "
                         f"not {batch_size}")
    tick("acceptance between every pair of exits (costs: the earlier calibration's)")
    sequences, starts, choices, (exits, alpha, tokens) = _acceptance(model, ar, s)
    lookup = _lookup(model, prompts, s, batch_size, capacity, sequences, starts, choices, tick)
    return Calibration(exits=exits, alpha=alpha, costs=costs_from.costs, tokens=tokens,
                       seconds=time.perf_counter() - t_start,
                       loop={**costs_from.loop, "costs_from_an_earlier_calibration": True},
                       lookup=lookup)


def measure_lookup(model: Model, prompts: list[list[int]], k: int, new_tokens: int,
                   batch_size: int = 1, max_cache_len: int | None = None) -> LookupProfile:
    """What `method="lookup"` (greedy, k) does on `prompts`: its rounds and the positions
    each verification ran. Prompts with copyable context (a passage to summarize, code to
    edit) give long accepted blocks; open chat gives mostly one-position rounds."""
    r = generate_lib.generate(model, prompts, method="lookup", lookup=k,
                              max_new_tokens=new_tokens, ignore_eos=True, batch_size=batch_size,
                              max_cache_len=max_cache_len)
    return LookupProfile(k=k, rounds=int(r.stats["rounds"]),
                         tokens=int(r.stats["emitted_in_loop"]),
                         verified=tuple(int(n) for n in r.stats["verified_length_histogram"]))


@functools.partial(jax.jit, static_argnames=("model_cfg",))
def _hidden_states(params, tokens_BxT, *, model_cfg):
    """[L, B, T, D] every layer's output states (teacher-forced)."""
    params = with_layer_layout(params, "scan")
    return scan_exits(params, model_cfg, tokens_BxT, lambda h, index: h)[1]


@functools.partial(jax.jit, static_argnames=("model_cfg", "exit_layer"))
def _greedy_choice(params, heads, h_BxTxD, *, model_cfg, exit_layer):
    return jnp.argmax(exit_logits(params, heads, model_cfg, h_BxTxD, exit_layer), -1)


def exit_choices(model: Model, sequences: list[list[int]]) -> dict[int, list[np.ndarray]]:
    """{exit: per sequence [len] its greedy token after every position} for every exit with
    a head (teacher-forced). One sequence and one exit's [T, V] logits at a time (SmolLM2's
    49k vocabulary over 30 exits does not fit at once); exits on the shared head share one
    compiled program."""
    from hispec_jax.models.heads import projection_kind

    exits = tuple(methods.available_exits(model))
    shared = next((e for e in exits if projection_kind(model.cfg, model.heads, e) == "shared"
                   and str(e) not in model.heads), None)
    choices: dict[int, list[np.ndarray]] = {e: [] for e in exits}
    for seq in sequences:
        T = max(16, 1 << (len(seq) - 1).bit_length())
        tokens = np.zeros((1, T), np.int32)
        tokens[0, :len(seq)] = seq
        h_LxBxTxD = _hidden_states(model.params, tokens, model_cfg=model.cfg)
        for e in exits:
            key = shared if (shared is not None and str(e) not in model.heads) else e
            top = _greedy_choice(model.params, model.heads, h_LxBxTxD[e - 1], model_cfg=model.cfg,
                                 exit_layer=key)
            choices[e].append(np.asarray(top)[0, :len(seq)])
    return choices


def alpha_from_choices(choices: dict[int, list[np.ndarray]],
                       starts: list[int]) -> tuple[tuple[int, ...], np.ndarray, int]:
    """Greedy `measure_alpha` from `exit_choices`: top-1 agreement of every pair of exits at
    the positions >= starts[i] - 1 (the predictions of the continuation)."""
    exits = tuple(sorted(choices))
    tops = [np.concatenate([c[max(p - 1, 0):len(c) - 1] for c, p in zip(choices[e], starts)])
            for e in exits]
    total = len(tops[0])
    alpha = np.array([[float(np.mean(a == b)) if total else 0.0 for b in tops] for a in tops])
    return exits, alpha, total


def measure_trace(model: Model, sequences: list[list[int]], starts: list[int],
                  max_ngram: int = DEFAULT_MAX_NGRAM,
                  choices: dict[int, list[np.ndarray]] | None = None) -> Trace:
    """The greedy continuations `sequences` (prompt + continuation from `starts`) and every
    exit below L's greedy choice along them (`exit_choices`, unless given): what
    `latency.replay` runs the engine's round on (the lookup's matches, what each exit keeps
    of the tokens below it)."""
    L = model.cfg.num_layers
    choices = exit_choices(model, sequences) if choices is None else choices
    return Trace(
        max_ngram=max_ngram, sequences=tuple(tuple(int(t) for t in s) for s in sequences),
        starts=tuple(starts),
        predictions=tuple((e, tuple(tuple(int(t) for t in c[p:]) for c, p in zip(per, starts)))
                          for e, per in sorted(choices.items()) if e < L))


def fit_loop_costs(costs: Costs, per_round_ar: float, ls_seconds: float, draft: int, nd: int,
                   drafts: int, verifies: int) -> tuple[Costs, dict[str, Any]]:
    """Reconciles the stage costs (timed alone) with two loops timed with `generate`: AR
    (`per_round_ar` seconds per token) and LayerSkip(draft, nd) (`ls_seconds` without
    prefill, its counters `drafts` and `verifies`).

    The model: inside the loop every stage costs `s` times its timing alone, and every pass
    adds a fixed `p` (dispatch, the exit's argmax, the cache writes: a draft step of a few
    layers pays it as a full step does). With w the stage work a loop ran,

        t_ar = s * w_ar + p,    t_ls = s * w_ls + passes * p

    two equations in (s, p). Where their solution has s <= 0 or p < 0 (timing noise), p = 0
    and s matches AR's loop alone. The loop's fixed cost per trip is part of p (AR runs one
    pass a trip). Measured on the default model's tasks, this fit predicts the exit plans
    within about 10 % of their loop speed (docs/planner.md, "Loop costs").

    Returns (costs, {"stage_scale": s, "pass_seconds": p, "matches_layerskip": whether
    both loops are matched})."""
    L = costs.num_layers
    blk = blocks((nd,))[0]
    w_ar = L * costs.layer(1) + costs.head(1)
    w_ls = (drafts * (draft * costs.layer(1) + costs.head_at(draft, 1))
            + verifies * ((L - draft) * costs.layer(blk) + costs.head(blk)))
    passes = drafts + verifies
    denom = w_ls - passes * w_ar  # < 0: a draft pass runs fewer layers than L
    s = (ls_seconds - passes * per_round_ar) / denom if passes > 0 and denom != 0 else 0.0
    p = per_round_ar - s * w_ar
    exact = s > 0 and p >= 0
    if not exact:
        s, p = per_round_ar / w_ar, 0.0
    scale = lambda values: tuple(float(v * s) for v in values)
    return (dataclasses.replace(costs, layer_s=scale(costs.layer_s), head_s=scale(costs.head_s),
                                pass_s=float(p), round_s=0.0),
            {"stage_scale": float(s), "pass_seconds": float(p), "matches_layerskip": exact})
