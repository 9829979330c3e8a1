"""Sharding over a device mesh: one logical-axis rule table for parameters, caches and
activations (jax-llm-examples' logical axes; MaxText's `logical_axis_rules`).

Every array names its axes logically: parameters in `params.param_specs` / `head_specs`,
the KV cache here (`CACHE_AXES`), decoding state by its shape suffix (`x_BxS`: B is the
batch), activations where the model constrains them (`constrain`). `RULES` maps a logical
axis to a mesh axis (`mesh_spec.MESH_AXES`):

    logical axis   mesh axis   what it splits
    batch          data        sequences (requests, cache, decoding state, activations)
    q_heads        model       query heads (wq, wo)
    kv_heads       model       KV heads (wk, wv, the cache)
    mlp            model       MLP width (w_gate, w_up, w_down)
    vocab          model       vocabulary (embedding, LM head, exit heads' columns)
    anything else  -           replicated (embed, layers, head_dim, rank, sequence)

A dimension that the mesh axis does not divide is replicated instead (GQA with fewer KV
heads than the model axis: every model shard holds all KV heads and computes them again;
a vocabulary of 97 on 4 devices). A batch is never replicated that way: `generate` pads it
to a multiple of the data axis. Sharding never changes the math, only where it runs (up to
the order of floating-point sums in tensor-parallel matmuls).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from hispec_jax.models import lazy_weights, mesh_spec
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import (ParamSpec, fused_axes, head_shape_args, head_specs,
                                      is_fused, is_out_major, is_quantized,
                                      layer_dict_out_major, param_specs, quantized_axes)

RULES: dict[str, str] = {
    "batch": "data",
    "q_heads": "model",
    "kv_heads": "model",
    "mlp": "model",
    "vocab": "model",
}

CACHE_AXES = ("layers", "batch", "kv_heads", "cache_len", "head_dim")  # KVCache [L, B, K, S, H]
HIDDEN_AXES = ("batch", "seq", "embed")  # activations x_BxTxD between layers


def make_mesh(shape: dict[str, int] | str, devices=None) -> Mesh:
    """A `Mesh` with axes ("data", "model") from `{"data": 2, "model": 4}` or "data=2,model=4".

    Uses all of `devices` (default: `jax.devices()`); raises ValueError unless the axis sizes
    multiply to their number. Axes are `AxisType.Auto` (the compiler propagates shardings
    from the arguments and the `constrain` hints)."""
    shape = mesh_spec.parse_mesh(shape) if isinstance(shape, str) else {
        axis: shape.get(axis, 1) for axis in mesh_spec.MESH_AXES}
    unknown = set(shape) - set(mesh_spec.MESH_AXES)
    if unknown:
        raise ValueError(f"unknown mesh axes {sorted(unknown)} (axes: {mesh_spec.MESH_AXES})")
    devices = list(jax.devices() if devices is None else devices)
    mesh_spec.check_device_count(shape, len(devices), devices[0].platform if devices else "")
    sizes = tuple(shape[a] for a in mesh_spec.MESH_AXES)
    return jax.make_mesh(sizes, mesh_spec.MESH_AXES, devices=devices,
                         axis_types=(AxisType.Auto,) * len(sizes))


def axis_size(mesh: Mesh | None, axis: str) -> int:
    """Size of a mesh axis (1 when there is no mesh or no such axis)."""
    return 1 if mesh is None else dict(mesh.shape).get(axis, 1)


def partition_spec(axes: tuple[str | None, ...], shape: tuple[int, ...], mesh) -> PartitionSpec:
    """The `PartitionSpec` of an array with logical `axes` and `shape` on `mesh` (a `Mesh` or
    an `AbstractMesh`): each axis goes to its rule's mesh axis when that axis has size > 1,
    divides the dimension and is not used by an earlier axis of the array; else replicated."""
    sizes = dict(mesh.shape)
    used, spec = set(), []
    for name, dim in zip(axes, shape):
        target = RULES.get(name) if name else None
        if target is None or sizes.get(target, 1) == 1 or dim % sizes[target] or target in used:
            spec.append(None)
        else:
            spec.append(target)
            used.add(target)
    while spec and spec[-1] is None:
        spec.pop()
    return PartitionSpec(*spec)


def named_sharding(axes, shape, mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(axes, shape, mesh))


def constrain(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
    """`x` constrained to its logical `axes` on the mesh being traced under (`jax.set_mesh`);
    unchanged without one (the single-device path traces no sharding constraint)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, partition_spec(axes, x.shape, mesh))


def _state_leaf_axes(path, x, batch: int) -> tuple[str | None, ...]:
    name = next((str(getattr(k, "name", getattr(k, "key", ""))) for k in reversed(path)
                 if not isinstance(k, jax.tree_util.SequenceKey)), "")
    if "_" not in name and x.ndim and x.shape[0] == batch:
        return ("batch",) + (None,) * (x.ndim - 1)
    return suffix_axes(name, x.ndim)


def map_state(fn, state, batch: int):
    """`fn(x, axes)` over every array of a decoding loop's state (or request) with its
    logical axes: KV caches by `CACHE_AXES`, arrays named with a shape suffix by it
    (`tokens_BxS`, `done_B`, `actions_K`), other arrays whose leading axis has length
    `batch` (the hidden-state and distribution rings, per-sequence sampling settings)
    "batch", the rest replicated."""
    def one(path, x):
        if isinstance(x, KVCache):
            return jax.tree.map(lambda a: fn(a, CACHE_AXES[-a.ndim:]), x)
        return fn(x, _state_leaf_axes(path, x, batch))

    return jax.tree_util.tree_map_with_path(one, state, is_leaf=lambda x: isinstance(x, KVCache))


def constrain_state(state, batch: int):
    """A decoding loop's state constrained on the mesh being traced under (`map_state`'s
    axes); unchanged without a mesh."""
    if jax.sharding.get_abstract_mesh().empty:
        return state
    return map_state(constrain, state, batch)


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def param_axes(cfg: ModelConfig, params) -> Any:
    """Logical axes of every parameter, as a pytree shaped like `params` (either layer
    layout: the per-layer dicts of the "unrolled" layout drop the leading "layers" axis; a
    draft model's, `params["draft"]`, by its own architecture and the same rules)."""
    if "draft" in params:
        draft = params["draft"]
        rest = {k: v for k, v in params.items() if k != "draft"}
        return {**param_axes(cfg, rest),
                "draft": draft.replace(params=param_axes(draft.cfg, draft.params))}
    axes = jax.tree.map(lambda s: s.axes, param_specs(cfg), is_leaf=_is_spec)
    if isinstance(params["layers"], (tuple, list)):
        # fused projections carry their own axes (`params.FUSED_AXES`); out-major ones
        # (`name_T`) carry theirs in the same transposed order
        per_layer = {k: a[1:] for k, a in axes["layers"].items()}
        if is_fused(params):
            per_layer = fused_axes(per_layer)
        if is_quantized(params):  # int8 weights: each scale on its projection's output axes
            per_layer = quantized_axes(per_layer)
        per_layer = layer_dict_out_major(per_layer, is_out_major(params))
        axes = {**axes, "layers": type(params["layers"])(per_layer for _ in params["layers"])}
    return axes


def heads_axes(cfg: ModelConfig, heads) -> Any:
    """Logical axes of exit heads, shaped like `heads` (full or low-rank, draft vocabulary
    or not, per exit)."""
    out = {}
    for exit_layer, head in heads.items():
        specs = head_specs(cfg, **head_shape_args(head))
        out[exit_layer] = {k: s.axes for k, s in specs.items()}
    return out


def _shardings(axes_tree, arrays, mesh: Mesh):
    is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)
    return jax.tree.map(lambda axes, x: named_sharding(axes, x.shape, mesh), axes_tree, arrays,
                        is_leaf=is_axes)


def param_shardings(cfg: ModelConfig, params, mesh: Mesh):
    """`NamedSharding` of every parameter (params may be arrays or `ShapeDtypeStruct`s)."""
    return _shardings(param_axes(cfg, params), params, mesh)


def heads_shardings(cfg: ModelConfig, heads, mesh: Mesh):
    return _shardings(heads_axes(cfg, heads), heads, mesh)


def cache_shardings(cache, mesh: Mesh):
    """Shardings of a `KVCache` (stacked [L, B, K, S, H] or per-layer [B, K, S, H])."""
    def one(x):
        axes = CACHE_AXES if x.ndim == len(CACHE_AXES) else CACHE_AXES[1:]
        return named_sharding(axes, x.shape, mesh)

    return jax.tree.map(one, cache)


def suffix_axes(name: str, ndim: int) -> tuple[str | None, ...]:
    """Logical axes from a nanodo shape suffix: `tokens_BxS` -> ("batch", None), `done_B` ->
    ("batch",), `eos_ids_E` -> (None,). Names without a suffix of `ndim` letters are
    replicated."""
    letters = name.rsplit("_", 1)[-1].split("x") if "_" in name else []
    if len(letters) != ndim:
        return (None,) * ndim
    return tuple("batch" if letter == "B" else None for letter in letters)


def batch_shardings(tree, mesh: Mesh):
    """Shardings of a pytree of dataclasses whose array fields carry shape suffixes
    (`Request`, `emit.Output`, ...): arrays with a leading `B` split over the data axis,
    the rest replicated."""
    def one(path, x):
        key = path[-1] if path else None  # GetAttrKey (dataclass field) or DictKey
        name = str(getattr(key, "name", getattr(key, "key", "")))
        return named_sharding(suffix_axes(name, len(x.shape)), x.shape, mesh)

    return jax.tree_util.tree_map_with_path(one, tree)


def replicated(tree, mesh: Mesh):
    return jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), tree)


def shard_arrays(tree, shardings):
    """`tree` placed by `shardings` (`jax.device_put`; numpy arrays go shard by shard to
    their devices, arrays already placed so are returned as they are).

    Over several processes (a mesh with devices this process cannot address), each process
    places only its own devices' shards, cut from its host copy
    (`jax.make_array_from_callback`): every process must hold the same values, as SPMD
    programs do (same checkpoint, same prompts), and no device receives a whole array.
    A checkpoint's lazy weights (`lazy_weights`) are read shard by shard the same way, so a
    process reads only what its devices hold."""
    def one(x, s):
        if lazy_weights.is_lazy(x):  # each distinct shard read once (replicas share it)
            read = functools.cache(lambda key: x[tuple(slice(*k) for k in key)])
            return jax.make_array_from_callback(x.shape, s, lambda index: read(tuple(
                (i.start, i.stop) for i in index)))
        if s.is_fully_addressable or (isinstance(x, jax.Array) and not x.is_fully_addressable):
            return jax.device_put(x, s)  # one process; or a global array resharded
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, s, lambda index: host[index])

    return jax.tree.map(one, tree, shardings)


def host_values(tree):
    """`jax.device_get(tree)`, also for arrays spread over several processes' devices:
    those are gathered from every process first, all in one program (a collective: every
    process must call this with the same tree; `gathers` says whether it does). An array
    that every device holds whole (replicated) is read from this process's copy. NumPy
    arrays out."""
    leaves, treedef = jax.tree.flatten(tree)
    out = list(leaves)
    named = []  # spread over processes on a mesh: gathered together below
    for i, x in enumerate(leaves):
        if _spread(x) and isinstance(x.sharding, NamedSharding):
            named.append(i)
        elif _spread(x):
            from jax.experimental import multihost_utils

            out[i] = np.asarray(multihost_utils.process_allgather(x, tiled=True))
        elif _remote(x):  # replicated: this process's copy is the whole array
            out[i] = np.asarray(x.addressable_data(0))
    if named:
        whole = tuple(leaves[i].sharding.update(spec=PartitionSpec()) for i in named)
        gathered = jax.jit(_identity, out_shardings=whole)(*(leaves[i] for i in named))
        for i, x in zip(named, gathered):
            out[i] = np.asarray(x.addressable_data(0))
    return jax.device_get(treedef.unflatten(out))


def _identity(*xs):
    return xs


def gathers(tree) -> bool:
    """Whether `host_values(tree)` runs a collective (some array of it is spread over
    several processes' devices, not replicated)."""
    return any(_spread(x) for x in jax.tree.leaves(tree))


def _remote(x) -> bool:  # on devices of other processes too
    return isinstance(x, jax.Array) and not x.is_fully_addressable


def _spread(x) -> bool:  # ... and not whole on each of this process's devices
    return _remote(x) and not x.is_fully_replicated


def shard_params(cfg: ModelConfig, params, heads, mesh: Mesh):
    """(params, heads) placed on `mesh` by the rule table."""
    return (shard_arrays(params, param_shardings(cfg, params, mesh)),
            shard_arrays(heads, heads_shardings(cfg, heads, mesh)))


def describe(mesh: Mesh | None) -> str:
    """"data=2,model=4 (8 cpu devices)" or "one device"."""
    if mesh is None:
        return "one device"
    devices = np.asarray(mesh.devices).reshape(-1)
    return (f"{mesh_spec.mesh_text(dict(mesh.shape))} ({devices.size} {devices[0].platform} "
            f"device{'s' if devices.size != 1 else ''})")
