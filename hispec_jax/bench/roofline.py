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

Shapes: B batch, S cache capacity, L layers, K kv heads, H head dim, D hidden, V vocab.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from hispec_jax.decoding import methods
from hispec_jax.decoding.engine import Engine, Shapes
from hispec_jax.models.model import Model


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
    params, heads, req, cache, windows = engine.abstract_arguments()
    state = jax.eval_shape(engine.init_state, params, heads, req, cache, windows)
    compiled = jax.jit(engine.step, donate_argnums=3).lower(params, heads, req, state).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    kv = nbytes(cache)
    return StepBytes(weights=step_weight_bytes(model), kv_read=kv, scatter_charge=0 if batch == 1 else 2 * kv,
                     compiled=int(analysis["bytes accessed"]))

