"""Bytes one decoding step must read (the memory roofline) vs what XLA compiled for it.

Autoregressive decoding at small batch is memory-bound: a step reads every layer's weights
and the KV cache once. `analytic_step_bytes` is that lower bound; `compiled_step_bytes` is
XLA's own cost analysis (`compiled.cost_analysis()["bytes accessed"]`) of one compiled AR
round (`Engine.step`: embed, every layer with its in-place KV write, the LM head, accept,
emit), lowered on abstract arrays (nothing is allocated). A copy of a weight or of a cache
layer inside the step shows up as bytes beyond the bound.

XLA's cost model charges an in-place scatter (the KV write at batch > 1) its whole operand
and output, i.e. twice the written cache layer, although only the new rows move; at batch 1
the write is a dynamic-update-slice, charged by its update. `scatter_charge_bytes` is that
accounting term, so that a test can tell a real copy from the convention.

`step_ops` counts the operations of a compiled step (each a kernel launch on a GPU);
`minimal_ar_step` is the least an AR step compiles to, the reference the engine's AR round
(`engine_ar_step`) is held to: its fixed cost per token is the difference.

Shapes: B batch, S cache capacity, L layers, K kv heads, H head dim, D hidden, V vocab.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

import jax
import jax.numpy as jnp

from hispec_jax.decoding import methods
from hispec_jax.decoding.engine import Engine, Shapes
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.model import Model
from hispec_jax.models.transformer import embed, run_layers_cached


@dataclasses.dataclass(frozen=True)
class StepBytes:
    """One AR decoding step: what it must read, and what XLA's cost analysis counts."""

    weights: int            # every parameter but the embedding table (one row is read)
    kv_read: int            # the cache of every layer, [L, B, K, S, H] keys and values
    scatter_charge: int     # XLA's charge for in-place KV scatters (0 at batch 1)
    compiled: int           # cost_analysis()["bytes accessed"] of the compiled step

    @property
    def analytic(self) -> int:
        return self.weights + self.kv_read

    @property
    def ratio(self) -> float:
        """compiled / (analytic + scatter charge): 1.0 means no copies at all."""
        return self.compiled / (self.analytic + self.scatter_charge)


def nbytes(tree) -> int:
    return sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def step_weight_bytes(model: Model) -> int:
    """Weights one decoding step reads: every parameter but the embedding table (one row of
    it is read), plus the table itself when it is the (tied) LM head."""
    weights = nbytes(model.params) - nbytes(model.params["embed"])
    if model.cfg.tie_word_embeddings:
        weights += nbytes(model.params["embed"])
    return weights


def ar_engine(model: Model, batch: int, capacity: int) -> Engine:
    decoder = methods.make_method(model, "ar")
    return Engine.for_model(model, decoder.hierarchy,
                            Shapes(batch=batch, capacity=capacity, prompt_block=16))


def compiled_step_bytes(model: Model, batch: int, capacity: int) -> StepBytes:
    """Lowers one AR round of `model` on abstract arrays and reads XLA's bytes accessed."""
    engine = ar_engine(model, batch, capacity)
    analysis = compile_step(engine).cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    kv = nbytes(engine.abstract_arguments()[3])  # the cache
    return StepBytes(weights=step_weight_bytes(model), kv_read=kv, scatter_charge=0 if batch == 1 else 2 * kv,
                     compiled=int(analysis["bytes accessed"]))


# ------------------------------------------------------------ ops of one compiled step
# Bookkeeping that is no work on any backend: tuple plumbing, views, literals.
_FREE_OPS = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant"}
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
             "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


@dataclasses.dataclass(frozen=True)
class StepOps:
    """The operations of a compiled step's entry computation (fusions, dots, copies, ...:
    each a kernel launch on a GPU), bookkeeping (`_FREE_OPS`) left out."""

    counts: collections.Counter   # opcode -> how many
    copy_bytes: tuple[int, ...]   # the output bytes of each `copy`

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def step_ops(compiled) -> StepOps:
    """`StepOps` of a compiled (`.lower(...).compile()`) function, from its optimized HLO."""
    text = compiled.as_text()
    entry = text[text.index("\nENTRY "):]
    entry = entry[:entry.index("\n}")]
    counts, copies = collections.Counter(), []
    for line in entry.splitlines()[1:]:
        m = re.match(r"\s*(?:ROOT )?%?[\w.\-]+ = (\S+) ([\w\-]+)\(", line)
        if not m or m.group(2) in _FREE_OPS:
            continue
        counts[m.group(2)] += 1
        if m.group(2) == "copy":
            dtype, dims = re.match(r"(\w+)\[([\d,]*)\]", m.group(1)).groups()
            size = math.prod(int(d) for d in dims.split(",") if d)
            copies.append(size * _ITEMSIZE.get(dtype, 4))
    return StepOps(counts, tuple(copies))


def minimal_ar_step(model: Model, batch: int, capacity: int):
    """The least an AR step can compile to: embed one token per sequence, every layer with
    its in-place KV write, the LM head, argmax; compiled on abstract arrays, the cache
    donated. The reference `engine_ar_step` is held to."""
    cfg, L = model.cfg, model.cfg.num_layers

    def step(params, tokens_B, positions_B, cache):
        h, cache = run_layers_cached(params, cfg, embed(params, tokens_B[:, None]),
                                     positions_B[:, None], cache, 0, L)
        logits_BxV = exit_logits(params, {}, cfg, h, L)[:, 0]
        return jnp.argmax(logits_BxV, -1).astype(jnp.int32), cache

    per_layer = isinstance(model.params["layers"], (tuple, list))
    cache = jax.eval_shape(lambda: KVCache.zeros(cfg, batch, capacity, per_layer=per_layer))
    ints = jax.ShapeDtypeStruct((batch,), jnp.int32)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), model.params)
    return jax.jit(step, donate_argnums=3).lower(params, ints, ints, cache).compile()


def engine_ar_step(model: Model, batch: int, capacity: int):
    """One AR round of the engine (`Engine.step`), compiled on abstract arrays."""
    return compile_step(ar_engine(model, batch, capacity))


def compile_step(engine: Engine):
    """`engine.step` (one round), compiled on abstract arrays, the state donated."""
    params, heads, req, cache, windows = engine.abstract_arguments()
    state = jax.eval_shape(engine.init_state, params, heads, req, cache, windows)
    return jax.jit(engine.step, donate_argnums=3).lower(params, heads, req, state).compile()
