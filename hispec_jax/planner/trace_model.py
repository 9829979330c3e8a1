"""The engine's compiled round on a calibration trace: what the planner's replay counts.

A `TraceBackbone` stands in for the model (`decoding/backbone.py`): every exit answers with
the greedy choice the calibration recorded for it at that position (`latency.Trace`), the
final layer with the model's own continuation. The engine (`Engine.run`: prefill, then the
rounds of `engine/round.py` until every sequence is done) runs on it unchanged, so its
counters (rounds, passes per level and block, tokens proposed, accepted and emitted,
verified lengths) are what the same engine counts on the model, wherever an exit's
choices do not depend on tokens the top level rejects; otherwise the exit answers with its
choice along the continuation (the engine discards those tokens either way).

    hidden state   (row b, position q)            D = 2: what every "layer" passes on
    exit j         table[j - 1, b, q]: the plan's j-th exit's recorded choice after
                   position q, as one-hot logits (the last exit: the continuation's
                   token at q + 1)
    KV cache       one head, never written: nothing reads it

The trace model's exits are numbered 1..K, whatever layers the plan's exits are: the
layers between exits only count work, which the planner prices from the passes itself
(`latency.price`), so plans of the same shape (levels, windows, lookup k) share one
program and differ only in their tables. Tokens are renumbered to the trace's own (a
power of two of them), positions padded to a multiple of 64: traces of similar size share
programs too. The programs go through the process's one program cache (`compile_cache`),
compiled several at once before a search scores its plans (`prepare`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.decoding import methods
from hispec_jax.decoding.backbone import Backbone
from hispec_jax.decoding.engine import Engine, Shapes, compile_cache
from hispec_jax.decoding.gate import default_pass_cost
from hispec_jax.decoding.request import Request
from hispec_jax.decoding.sampling import SamplingArrays
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVBlock
from hispec_jax.models.model import Model

POSITION_MULTIPLE = 64
MIN_VOCAB = 1024  # (one-hot logits of 1024 are still small; more traces share programs)


@dataclasses.dataclass(frozen=True)
class TraceBackbone(Backbone):
    """The model's functions answered from a recorded trace: `params["table"]` [K, B, S]
    int32, exit j's choice after each position of each row in `table[j - 1]`."""

    def embed(self, params, tokens_BxT):
        return jnp.zeros(tokens_BxT.shape + (2,), jnp.float32)

    @staticmethod
    def _states(positions_BxT):
        """[B, T, 2] (row, position): every layer's output here."""
        rows_BxT = jnp.broadcast_to(jnp.arange(positions_BxT.shape[0])[:, None],
                                    positions_BxT.shape)
        return jnp.stack([rows_BxT, positions_BxT], axis=-1).astype(jnp.float32)

    def run_layers(self, params, cfg, x_BxTxD, positions_BxT, cache, start, stop, *,
                   split_context=False, rider=None):
        if rider is not None:
            raise ValueError("the trace model carries no prefill rider")
        B, T = positions_BxT.shape
        nothing = jnp.zeros((0, B, T, 1, cfg.head_dim), cache.dtype)  # no layer to write
        return self._states(positions_BxT), KVBlock(k=nothing, v=nothing)

    def run_layers_cached(self, params, cfg, x_BxTxD, positions_BxT, cache, start, stop, *,
                          stop_BxT=None, rider=None):
        if rider is not None:
            raise ValueError("the trace model carries no prefill rider")
        return self._states(positions_BxT), cache

    def exit_logits(self, params, heads, cfg, h_BxTxD, exit_layer: int):
        table_BxS = params["table"][exit_layer - 1]
        rows_BxT = h_BxTxD[..., 0].astype(jnp.int32)
        positions_BxT = jnp.clip(h_BxTxD[..., 1].astype(jnp.int32), 0, table_BxS.shape[1] - 1)
        return jax.nn.one_hot(table_BxS[rows_BxT, positions_BxT], cfg.vocab_size,
                              dtype=jnp.float32)

    def prefill(self, params, cfg, tokens_BxS, lengths_B, cache, stop: int, chunk: int):
        return self._states((lengths_B - 1)[:, None])[:, 0], cache


def trace_config(levels: int, vocab_size: int) -> ModelConfig:
    """The trace model's architecture: one layer per exit, states of width 2, one
    key/value head of width 2 (RoPE wants it even)."""
    return ModelConfig(model_type="llama", vocab_size=vocab_size, hidden_size=2,
                       intermediate_size=1, num_layers=levels, num_heads=1, num_kv_heads=1,
                       head_dim=2)


@dataclasses.dataclass(frozen=True)
class Renumbered:
    """A trace in the trace model's tokens (0..V - 1, V a power of two >= `MIN_VOCAB`).

    Attributes:
      vocab_size: V.
      length: the longest sequence.
      sequences: per prompt, its tokens [len].
      choices: {exit below L: per prompt, its choices after positions P, P + 1, ...}.
    """

    vocab_size: int
    length: int
    sequences: tuple[np.ndarray, ...]
    choices: dict

    @classmethod
    def of(cls, trace) -> "Renumbered":
        ids: dict[int, int] = {}
        number = lambda tokens: np.asarray([ids.setdefault(int(t), len(ids)) for t in tokens],
                                           np.int32)
        sequences = tuple(number(s) for s in trace.sequences)
        choices = {e: tuple(number(p) for p in per) for e, per in trace.predictions}
        return cls(vocab_size=max(MIN_VOCAB, 1 << max(len(ids) - 1, 1).bit_length()),
                   length=max(len(s) for s in sequences), sequences=sequences, choices=choices)


@functools.lru_cache(maxsize=8)
def renumbered(trace) -> Renumbered:
    return Renumbered.of(trace)


def groups(trace, exits: tuple[int, ...], batch: int, capacity: int):
    """Per group of `batch` prompts (cycled to fill the last): (prompts [B, S] right-padded,
    prompt lengths [B], budgets [B], table [K, B, S] of the plan's exits)."""
    r = renumbered(trace)
    n = len(r.sequences)
    for g in range(0, n, batch):
        rows = [(g + b) % n for b in range(batch)]
        tokens = np.zeros((batch, capacity), np.int32)
        table = np.zeros((len(exits), batch, capacity), np.int32)
        for b, s in enumerate(rows):
            seq, P = r.sequences[s], trace.starts[s]
            tokens[b, :P] = seq[:P]
            table[-1, b, :len(seq) - 1] = seq[1:]
            for j, e in enumerate(exits[:-1]):  # after P, P + 1, ...; then the last again
                per = r.choices[e][s]
                table[j, b, P:P + len(per)] = per
                table[j, b, P + len(per):] = per[-1]
        yield (tokens, np.asarray([trace.starts[s] for s in rows], np.int32),
               np.asarray([len(r.sequences[s]) - trace.starts[s] for s in rows], np.int32),
               table)


def decoder(exits: tuple[int, ...], windows: tuple[int, ...], lookup: int, max_ngram: int,
            vocab_size: int = 2) -> methods.Decoder:
    """The greedy decoder of the plan (exits, windows, lookup k) as `generate` makes it
    (`Plan.spec`, `methods.make_method`), on the trace model's exits 1..K."""
    from hispec_jax.planner.plan import Plan  # (plan imports the planner)

    levels = tuple(range(1, len(exits) + 1))
    model = Model(cfg=trace_config(len(exits), vocab_size), params={})
    method, options = Plan(exits=levels, windows=tuple(windows), lookup=lookup).spec().flat()
    if lookup:
        options["max_ngram"] = max_ngram
    return methods.make_method(model, method, **options)


def _params(cfg: ModelConfig, table) -> dict:
    return {"embed": np.zeros((cfg.vocab_size, 2), np.float32), "layers": {}, "table": table}


def engine(trace, exits, windows, lookup: int, batch: int) -> tuple[Engine, methods.Decoder]:
    """The engine (and decoder) that replays the plan on `trace`."""
    r = renumbered(trace)
    dec = decoder(exits, windows, lookup, trace.max_ngram, r.vocab_size)
    cfg = trace_config(len(exits), r.vocab_size)
    need = r.length + dec.lookahead() + 1
    capacity = -(-need // POSITION_MULTIPLE) * POSITION_MULTIPLE
    table = jax.ShapeDtypeStruct((len(exits), batch, capacity), jnp.int32)
    eng = dataclasses.replace(
        Engine.for_model(Model(cfg=cfg, params=_params(cfg, table)), dec.hierarchy,
                         Shapes(batch=batch, capacity=capacity, prompt_block=1)),
        backbone=TraceBackbone())
    return eng, dec


def _replay_loop(eng: Engine, params, heads, req, cache, windows_K1):
    """`Engine.run`: what the replay compiles (the name keys it in the program cache)."""
    return eng.run(params, heads, req, cache, windows_K1)


def program(eng: Engine):
    """`eng.run` compiled, through the process's one program cache (`compile_cache.program`:
    kept in process and stored across processes, as the decoding programs are)."""
    return compile_cache.program(_replay_loop, (eng,), (), eng.abstract_arguments())


def prepare(trace, plans, batch: int) -> None:
    """Compiles the programs of `plans` ((exits, windows, lookup k), ...), several at once
    (XLA compiles outside the GIL; those made already cost a lookup): what a search
    replays next."""
    engines = list(dict.fromkeys(engine(trace, *p, batch)[0] for p in plans))
    if len(engines) > 1:
        with concurrent.futures.ThreadPoolExecutor(min(len(engines), os.cpu_count() or 1)) as pool:
            list(pool.map(program, engines))


def run_counters(trace, exits: tuple[int, ...], windows: tuple[int, ...], lookup: int = 0,
                 batch: int = 1):
    """The engine's greedy loop on `trace` for the plan: (its decoder, the loop's
    `Counters` per group of `batch` prompts, as numpy)."""
    eng, dec = engine(trace, exits, windows, lookup, batch)
    run = program(eng)
    windows_K1 = dec.windows_array()
    counters = []
    for tokens, starts, budgets, table in groups(trace, tuple(exits), batch,
                                                 eng.shapes.capacity):
        req = Request(tokens_BxS=tokens, prompt_lens_B=starts, max_new_B=budgets,
                      eos_ids_E=np.full((1,), -1, np.int32),
                      sequence_keys_Bx2=np.zeros((batch, 2), np.uint32),
                      sampling=SamplingArrays(np.float32(1.0), np.int32(0), np.float32(1.0)),
                      lookup_cost=default_pass_cost())
        _, c, _ = run(_params(eng.cfg, table), {}, req, eng.empty_cache(), windows_K1)
        counters.append(jax.tree.map(np.asarray, c))
    return dec, counters
