"""Memory plans: per-device memory of a decoding loop on a mesh, before any weights exist.

The programs `generate` runs (`slots.SlotEngine`: the batch's insert and its rounds loop,
the slots over "data", the weights over "model") are compiled ahead of time on abstract
arrays (`jax.ShapeDtypeStruct`: nothing is allocated); XLA's `memory_analysis()` of the
partitioned programs (the larger of the two, field by field) gives one device's arguments
(weights, cache, request), outputs, aliased (donated) and temporary bytes.
Beside it, the analytic count from the shapes and the rule table:

    weights    every parameter's shard on one device (`sharding.RULES`)
    KV cache   [L', B, K, S, H] keys + values, split over data (B) and model (K if divisible)
    overhead   request and output tokens [B, S], hidden-state ring buffers [B, W, D] per
               verifying level, sampling's distribution rings [B, W, V] float32, and the
               float32 logits of the largest block [B, T, V]

The compile runs on the default backend when it has the mesh's devices, else on that many
CPU devices (`--xla_force_host_platform_device_count`, set by `hispec plan-memory` before
JAX starts). XLA:CPU's temporaries are not an accelerator's: it has no bfloat16 matmul and
converts bfloat16 weight blocks to float32 temporaries, so on CPU the compiled total
overstates a TPU/GPU's; weights, cache and outputs are the same on every backend.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from hispec_jax.decoding import methods as methods_lib
from hispec_jax.decoding import slots as slots_lib
from hispec_jax.decoding.engine import compile_cache
from hispec_jax.decoding.generate import _round_up, plan_shapes
from hispec_jax.models import mesh_spec, sharding
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.model import Model
from hispec_jax.models.params import shape_structs, with_layer_layout

GIB = 2**30

# (name, method, options, greedy): the loops `compare_loops` plans, AR first in each mode.
LOOPS = (("ar", "ar", {}, True), ("layerskip", "layerskip", {}, True),
         ("hispec", "hispec", {}, True), ("hispec adaptive", "hispec", {"adaptive": True}, True),
         ("ar", "ar", {}, False), ("hispec", "hispec", {}, False))


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """One device's memory for one decoding loop (bytes).

    Attributes:
      description: model, method, shapes, mesh and the devices the plan was compiled for.
      weights, kv_cache, overhead: the analytic count (module docstring).
      arguments, outputs, aliased, temporaries: `compiled.memory_analysis()` of one device.
      compile_seconds: lowering + compiling on abstract arrays.
    """

    description: dict
    weights: int
    kv_cache: int
    overhead: int
    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    compile_seconds: float

    @property
    def analytic_total(self) -> int:
        return self.weights + self.kv_cache + self.overhead

    @property
    def compiled_total(self) -> int:
        """Arguments + outputs + temporaries, the donated cache counted once."""
        return self.arguments + self.outputs - self.aliased + self.temporaries


def plan_devices(count: int) -> list:
    """`count` devices to compile for: the default backend's when it has that many, else
    CPU devices. Raises ValueError when neither has exactly... at least that many."""
    for devices in (jax.devices(), jax.devices("cpu")):
        if len(devices) >= count:
            return list(devices[:count])
    raise ValueError(f"planning a {count}-device mesh needs {count} devices; this process has "
                     f"{jax.device_count()} {jax.default_backend()} and {len(jax.devices('cpu'))} "
                     f"cpu devices (set XLA_FLAGS=--xla_force_host_platform_device_count={count} "
                     "before JAX starts; `hispec plan-memory` does)")


def _shard_bytes(shape, dtype, axes, mesh) -> int:
    spec = sharding.partition_spec(axes, shape, mesh)
    sizes = dict(mesh.shape)
    split = math.prod(sizes[a] for a in spec if a is not None)
    return math.prod(shape) * jnp.dtype(dtype).itemsize // split


def _tree_shard_bytes(structs, shardings) -> int:
    total = 0
    for x, s in zip(jax.tree.leaves(structs), jax.tree.leaves(shardings)):
        total += math.prod(s.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
    return total


def plan_memory(cfg: ModelConfig, mesh_shape: dict[str, int] | str, *, method: str = "ar",
                batch: int = 1, max_len: int = 4096, prompt_len: int = 128,
                greedy: bool = True, layer_layout: str = "scan", devices=None,
                quantize: str | None = None, **method_options) -> MemoryPlan:
    """Compiles `method`'s loop for `cfg` on a mesh of abstract arrays and returns one
    device's memory, compiled and analytic.

    Args:
      cfg: the architecture (e.g. `presets.load_preset("llama3_8b")`).
      mesh_shape: {"data": d, "model": m} or "data=d,model=m".
      method, method_options: as `generate` (exits default as there).
      batch: sequences (padded to a multiple of the data axis, as `generate` does).
      max_len: the KV-cache capacity S (positions per sequence, prompt included).
      prompt_len: the prompt length the prefill block is sized for.
      greedy: greedy (True) or sampling loop (sampling keeps distribution ring buffers).
      layer_layout: "scan" (TPU's default; compile time flat in depth) or "unrolled".
      devices: the devices to compile for (default: `plan_devices`).
      quantize: "int8" for weight-only int8 layer projections (`load_model(quantize=)`;
        the unrolled layout only), None for the config's dtype.
    """
    if quantize is not None and layer_layout != "unrolled":
        raise ValueError(f"quantize={quantize!r} needs layer_layout='unrolled'")
    shape = mesh_spec.parse_mesh(mesh_shape) if isinstance(mesh_shape, str) else mesh_shape
    devices = devices or plan_devices(mesh_spec.mesh_size(shape))
    mesh = sharding.make_mesh(shape, devices)
    params = shape_structs(cfg)
    if layer_layout == "unrolled":
        params = jax.eval_shape(
            lambda p: with_layer_layout(p, "unrolled", int8=bool(quantize)), params)
    placed = lambda x, axes: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=sharding.named_sharding(axes, x.shape, mesh))
    params = jax.tree.map(placed, params, sharding.param_axes(cfg, params),
                          is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    model = Model(cfg=cfg, params=params, mesh=mesh)
    decoder = methods_lib.make_method(model, method, greedy=greedy, **method_options)
    lookahead = decoder.lookahead()
    if prompt_len + 1 + lookahead > max_len:
        raise ValueError(f"max_len={max_len} leaves no room after prompt_len={prompt_len} "
                         f"(+ method lookahead {lookahead})")
    block, capacity = plan_shapes(prompt_len, max_len - prompt_len - lookahead, lookahead,
                                  max(cfg.max_position_embeddings, max_len), max_len)
    loop_batch = _round_up(batch, shape["data"])
    slots = slots_lib.SlotEngine(model, decoder, slots=loop_batch, capacity=capacity,
                                 greedy=greedy, eos_ids=(), prefill_chunk=block,
                                 empty_state=False)
    seconds, _ = slots.compile_batch()
    m = slots.memory_analysis()
    cache = compile_cache.structs(jax.eval_shape(slots.engine.empty_cache), mesh, loop_batch)
    shards = lambda tree: _tree_shard_bytes(tree, [x.sharding for x in jax.tree.leaves(tree)])
    K, W, D, V = (decoder.hierarchy.num_levels, decoder.hierarchy.ring, cfg.hidden_size,
                  cfg.vocab_size)
    T = max(decoder.hierarchy.blocks, default=1)
    dtype = jnp.dtype(cfg.dtype)
    overhead = (2 * _shard_bytes((loop_batch, capacity), jnp.int32, ("batch", None), mesh)
                + (K - 1) * _shard_bytes((loop_batch, W, D), dtype, ("batch", None, "embed"), mesh)
                + (0 if greedy else (K - 1) * _shard_bytes((loop_batch, W, V), jnp.float32,
                                                           ("batch", None, "vocab"), mesh))
                + _shard_bytes((loop_batch, T, V), jnp.float32, ("batch", None, "vocab"), mesh))
    device = devices[0]
    description = {
        "model_type": cfg.model_type, "num_layers": cfg.num_layers, "dtype": cfg.dtype,
        "parameters": sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
        "method": method, "exits": list(decoder.hierarchy.exits), "greedy": greedy,
        "batch": batch, "loop_batch": loop_batch, "max_len": capacity, "prompt_block": block,
        "mesh": mesh_spec.mesh_text(shape), "devices": len(devices),
        "platform": device.platform, "device_kind": device.device_kind,
        "layer_layout": layer_layout, "quantize": quantize, "jax": jax.__version__,
    }
    return MemoryPlan(description=description,
                      weights=shards(params) + shards(model.heads),
                      kv_cache=shards(cache), overhead=overhead,
                      arguments=int(m.argument_size_in_bytes), outputs=int(m.output_size_in_bytes),
                      aliased=int(m.alias_size_in_bytes), temporaries=int(m.temp_size_in_bytes),
                      compile_seconds=seconds)


def summary_lines(plan: MemoryPlan) -> list[str]:
    """The plan as a small text table (GiB per device)."""
    d = plan.description
    unit, scale = ("GiB", GIB) if plan.compiled_total >= GIB else ("MiB", 2**20)
    g = lambda b: f"{b / scale:8.2f} {unit}"
    mode = "greedy" if d["greedy"] else "sampling"
    return [
        f"{d['model_type']} {d['parameters'] / 1e9:.2f} B parameters, {d['num_layers']} layers, "
        f"{d['dtype']}" + (f", {d['quantize']} layer projections" if d.get("quantize") else "")
        + f"; {d['method']} ({mode}, exits {','.join(map(str, d['exits']))}); "
        f"batch {d['batch']}"
        + (f" (padded to {d['loop_batch']})" if d["loop_batch"] != d["batch"] else "")
        + f", max_len {d['max_len']}, prompt block {d['prompt_block']}",
        f"mesh {d['mesh']}: compiled for {d['devices']} {d['platform']} device(s) "
        f"({d['device_kind']}), {d['layer_layout']} layout, {plan.compile_seconds:.1f} s",
        "per device         analytic        compiled (memory_analysis)",
        f"weights        {g(plan.weights)}    arguments    {g(plan.arguments)}",
        f"KV cache       {g(plan.kv_cache)}    outputs      {g(plan.outputs)}",
        f"overhead       {g(plan.overhead)}    aliased      {g(plan.aliased)}  (donated cache)",
        f"                                temporaries  {g(plan.temporaries)}",
        f"total          {g(plan.analytic_total)}    total        {g(plan.compiled_total)}",
    ]


def compare_loops(cfg: ModelConfig, mesh_shape: dict[str, int] | str, progress=None,
                  **shapes) -> list[tuple[str, MemoryPlan]]:
    """`plan_memory` of every loop of `LOOPS` (greedy AR, LayerSkip, HiSpec, HiSpec adaptive;
    sampling AR and HiSpec) with the same shapes (`batch`, `max_len`, `prompt_len`,
    `layer_layout`, `devices`, `quantize`): [(name, plan)], AR first in each mode."""
    plans = []
    for name, method, options, greedy in LOOPS:
        plan = plan_memory(cfg, mesh_shape, method=method, greedy=greedy, **shapes, **options)
        if progress is not None:
            progress(f"{name} ({'greedy' if greedy else 'sampling'}) compiled in "
                     f"{plan.compile_seconds:.1f} s")
        plans.append((name, plan))
    return plans


def comparison_lines(plans: list[tuple[str, MemoryPlan]]) -> list[str]:
    """`compare_loops`' plans as a markdown table (GiB per device): each loop's compiled
    memory and its total over the first loop of the same mode (AR's)."""
    lines = ["| method | mode | arguments GiB | outputs GiB | temporaries GiB | total GiB "
             "| extra vs AR |", "|---|---|---|---|---|---|---|"]
    base: dict[bool, int] = {}
    for name, plan in plans:
        greedy = plan.description["greedy"]
        total = base.setdefault(greedy, plan.compiled_total)
        extra = (plan.compiled_total - total) / total * 100
        lines.append(f"| {name} | {'greedy' if greedy else 'sampling'} "
                     f"| {plan.arguments / GIB:.3f} | {plan.outputs / GIB:.3f} "
                     f"| {plan.temporaries / GIB:.4f} | {plan.compiled_total / GIB:.3f} "
                     f"| {extra:+.3f}% |")
    return lines


def to_json(plan: MemoryPlan) -> dict:
    return {**dataclasses.asdict(plan), "analytic_total": plan.analytic_total,
            "compiled_total": plan.compiled_total}
