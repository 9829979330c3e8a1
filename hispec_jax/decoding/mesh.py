"""The decoding loop over a device mesh: how `Engine.run`'s arguments and results are
sharded (by `models.sharding`'s rule table) and where the loop is lowered.

    params, heads   tensor parallel over "model" (heads, MLP width, vocabulary)
    request         batch over "data" (fields with a leading B: tokens_BxS, max_new_B, ...)
    KV cache        batch over "data", KV heads over "model" (replicated when not divisible)
    windows         replicated
    output          batch over "data"; counters replicated; the cache as it came in (donated)

The loop is lowered under `jax.set_mesh(mesh)`, so the sharding hints apply: hidden states
between layers (`sharding.constrain`) and the while loop's state, every [B, ...] array split
over "data" (`sharding.constrain_state`, called by `Engine.run`); XLA's SPMD partitioner
derives everything else. The loop itself is the single-device one:
greedy output does not depend on which sequences share a round, and sampled sequences draw
from their own keys, so sharded and unsharded decoding give the same tokens.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import Mesh

from hispec_jax.decoding import emit
from hispec_jax.decoding.engine import Counters, Engine
from hispec_jax.models import sharding


@dataclasses.dataclass(frozen=True)
class LoopShardings:
    """In/out shardings of `Engine.run` on a mesh, flattened so the object is hashable (it is
    part of the engine's compile key: `Engine.shardings`).

    Attributes:
      mesh: the device mesh.
      inputs, outputs: (treedef, leaves) of the `NamedSharding` pytrees of run's arguments
        (params, heads, request, cache, windows) and results (output, counters, cache).
    """

    mesh: Mesh
    inputs: tuple
    outputs: tuple

    @classmethod
    def for_engine(cls, engine: Engine, mesh: Mesh) -> "LoopShardings":
        params, heads, req, cache, windows = engine.abstract_arguments()
        cfg = engine.cfg
        cache_sh = sharding.cache_shardings(cache, mesh)
        inputs = (sharding.param_shardings(cfg, params, mesh),
                  sharding.heads_shardings(cfg, heads, mesh),
                  sharding.batch_shardings(req, mesh), cache_sh,
                  sharding.replicated(windows, mesh))
        out = jax.eval_shape(emit.start_output, req.tokens_BxS, req.prompt_lens_B, req.max_new_B)
        h = engine.hierarchy
        counters = jax.eval_shape(lambda: Counters.zeros(
            h.num_levels, drafter=h.drafter.init_counters(cfg.num_layers)))
        outputs = (sharding.batch_shardings(out, mesh), sharding.replicated(counters, mesh),
                   cache_sh)
        return cls(mesh=mesh, inputs=_flatten(inputs), outputs=_flatten(outputs))

    def in_shardings(self):
        return jax.tree.unflatten(*self.inputs)

    def out_shardings(self):
        return jax.tree.unflatten(*self.outputs)

    def jit(self, fn, donate_argnums=()):
        """`jax.jit(fn)` with these in/out shardings (lower it under `self.mesh`)."""
        return jax.jit(fn, in_shardings=self.in_shardings(), out_shardings=self.out_shardings(),
                       donate_argnums=donate_argnums)

    def lower(self, fn, args, donate_argnums=()) -> jax.stages.Lowered:
        """`jax.jit(fn)` lowered on `args` with these shardings, under the mesh."""
        with jax.set_mesh(self.mesh):
            return self.jit(fn, donate_argnums).lower(*args)


def _flatten(tree) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple(leaves)


def sharded(engine: Engine, mesh: Mesh | None) -> Engine:
    """`engine` partitioned over `mesh` (unchanged for None). The batch must be a multiple
    of the data axis (`generate` pads it)."""
    if mesh is None:
        return engine
    data = sharding.axis_size(mesh, "data")
    if engine.shapes.batch % data:
        raise ValueError(f"batch {engine.shapes.batch} is not a multiple of the mesh's data "
                         f"axis ({data}); pad it (generate does)")
    return dataclasses.replace(engine, shardings=LoopShardings.for_engine(engine, mesh))
