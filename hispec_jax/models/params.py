"""One description of every parameter, from which init, shape checks and HF import derive.

Parameters are a nested dict of arrays. Per-layer weights are stacked on a leading layer
axis so a layer range runs as `lax.scan` over a static slice:

    embed        [V, D]
    layers/
      attn_norm  [L, D]
      wq         [L, D, N, H]     x_BTD @ wq -> q_BTNH
      wk         [L, D, K, H]
      wv         [L, D, K, H]
      wo         [L, N, H, D]
      q_norm     [L, H]           (qk_norm models only: Qwen3)
      k_norm     [L, H]
      mlp_norm   [L, D]
      w_gate     [L, D, F]
      w_up       [L, D, F]
      w_down     [L, F, D]
    final_norm   [D]
    lm_head      [D, V]           (untied models only)

Layer layouts. The stacked dict above is the canonical ("scan") layout: `run_layers` scans
over it, so compile time does not grow with depth. The "unrolled" layout holds the same
weights as a tuple of L per-layer dicts (each entry without the leading [L] axis) and
`run_layers` unrolls the layer loop over it. XLA:CPU copies a layer's weight slice out of
the stacked arrays at every scan step (a dynamic slice materializes before each matmul);
separate per-layer buffers avoid that copy, about 3x less time per layer at batch 1 on CPU
(docs/layer_layouts.md). `load_model` picks "unrolled" on CPU and "scan" on accelerators; the
layout never changes the math. The unrolled layout can also store the layer projections
out-major (`wq_T` [N, H, D] ... `w_down_T` [D, F]: `with_layer_layout`,
`transformer.project`, docs/layer_layouts.md), and fused, one product for the projections
that read the same input:

    wqkv       [D, K, G + 2, H]   per kv head: its G query heads, then its key, its value
    w_gate_up  [D, 2, F]          the gate, then up

(`fuse_layer`; G = N / K, query head n = k G + g, as `transformer` groups them), so a decoding
step launches 4 products per layer instead of 7 and each reads one larger weight. Grouped
per kv head, the fused weight shards over "kv_heads" as wk and wv do.

Weight-only int8 (`quantize_layer`, the unrolled layout): every layer projection (canonical
or out-major, apart or fused) stored as int8 and, under `name + SCALE_SUFFIX`, its scale per
output channel (symmetric: the channel's largest magnitude / 127, in the weight's dtype):

    wq        [D, N, H] int8     wq_T [N, H, D] int8 out-major
    wq_scale  [N, H]             w = wq * wq_scale  (per output channel)

`transformer.project` multiplies by the int8 weight converted to the activations' dtype and
scales the product (x @ (q s) = (x @ q) s), so a decoding step reads a byte per weight where
bfloat16 reads two. Norms, embeddings, the LM head and exit heads stay in the model's dtype.

Exit heads (`ExitHeads`) are a separate dict keyed by the exit layer as a string:

    heads["e"] = {"norm": [D], "proj": [D, V]}                        # full head
    heads["e"] = {"norm": [D], "proj_down": [D, R], "proj_up": [R, V]}  # low-rank head
    heads["e"] = {"norm": [D], "proj": [D, K], "vocab": [K] int32}      # draft vocabulary
                                                 # (K sorted token ids; low rank: proj_up [R, K])

An **adapter** head adds a residual MLP block before its norm + projection
(`models/heads.py`): `adapter_norm` [D], `adapter_up` [D, Fa], `adapter_down` [Fa, D] and,
for a SwiGLU block, `adapter_gate` [D, Fa] (without it the block is a GELU MLP). With its
own projection it also holds `norm` + `proj` (or `proj_down` / `proj_up`, and `vocab`);
without one ("shared" projection) it holds only the adapter and feeds the model's own
final norm + LM head:

    heads["e"] = {"adapter_norm": [D], "adapter_gate": [D, Fa], "adapter_up": [D, Fa],
                  "adapter_down": [Fa, D]}                            # adapter + shared head

Legend: V vocab, D hidden, L layers, N query heads, K kv heads, H head dim, F MLP width,
R head rank, Fa adapter width.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.models.config import ModelConfig

Params = dict[str, Any]
ExitHeads = dict[str, dict[str, jax.Array]]


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """Shape, logical axes (for sharding) and init of one parameter."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    init: str = "normal"  # "normal" (std = init_std), "ones" (norm scales), "zeros"
                          # (an adapter's output projection: the block starts as identity)
                          # or "arange" (int32 0..n-1: a draft vocabulary's token ids)


def param_specs(cfg: ModelConfig) -> dict[str, Any]:
    """The `ParamSpec` pytree describing `cfg`'s parameters (same structure as params)."""
    L, D, N, K, H, F, V = (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                           cfg.head_dim, cfg.intermediate_size, cfg.vocab_size)
    layers = {
        "attn_norm": ParamSpec((L, D), ("layers", "embed"), "ones"),
        "wq": ParamSpec((L, D, N, H), ("layers", "embed", "q_heads", "head_dim")),
        "wk": ParamSpec((L, D, K, H), ("layers", "embed", "kv_heads", "head_dim")),
        "wv": ParamSpec((L, D, K, H), ("layers", "embed", "kv_heads", "head_dim")),
        "wo": ParamSpec((L, N, H, D), ("layers", "q_heads", "head_dim", "embed")),
        "mlp_norm": ParamSpec((L, D), ("layers", "embed"), "ones"),
        "w_gate": ParamSpec((L, D, F), ("layers", "embed", "mlp")),
        "w_up": ParamSpec((L, D, F), ("layers", "embed", "mlp")),
        "w_down": ParamSpec((L, F, D), ("layers", "mlp", "embed")),
    }
    if cfg.qk_norm:
        layers["q_norm"] = ParamSpec((L, H), ("layers", "head_dim"), "ones")
        layers["k_norm"] = ParamSpec((L, H), ("layers", "head_dim"), "ones")
    specs = {
        "embed": ParamSpec((V, D), ("vocab", "embed")),
        "layers": layers,
        "final_norm": ParamSpec((D,), ("embed",), "ones"),
    }
    if not cfg.tie_word_embeddings:
        specs["lm_head"] = ParamSpec((D, V), ("embed", "vocab"))
    return specs


ADAPTER_ACTS = ("swiglu", "gelu")
HEAD_PROJECTIONS = ("own", "shared")


def head_specs(cfg: ModelConfig, rank: int | None = None, draft_vocab: int | None = None,
               adapter_width: int | None = None, adapter_act: str = "swiglu",
               projection: str = "own") -> dict[str, ParamSpec]:
    """`ParamSpec`s of one trained exit head: full `D×V` when rank is None, else `D×R, R×V`;
    with a draft vocabulary of K tokens, K output columns instead of V and `vocab` [K].
    `adapter_width` Fa adds a residual MLP block (`adapter_act` "swiglu" or "gelu") before
    the norm + projection; `projection="shared"` (adapters only) leaves the projection to the
    model's final norm + LM head, so the head holds the adapter alone."""
    D, V = cfg.hidden_size, cfg.vocab_size
    if projection not in HEAD_PROJECTIONS:
        raise ValueError(f"head projection must be one of {HEAD_PROJECTIONS}, got {projection!r}")
    if adapter_width is not None:
        if not isinstance(adapter_width, int) or isinstance(adapter_width, bool) or adapter_width < 1:
            raise ValueError(f"adapter width must be a positive integer, got {adapter_width!r}")
        if adapter_act not in ADAPTER_ACTS:
            raise ValueError(f"adapter activation must be one of {ADAPTER_ACTS}, got {adapter_act!r}")
    specs: dict[str, ParamSpec] = {}
    if adapter_width is not None:
        Fa = adapter_width
        specs["adapter_norm"] = ParamSpec((D,), ("embed",), "ones")
        if adapter_act == "swiglu":
            specs["adapter_gate"] = ParamSpec((D, Fa), ("embed", "mlp"))
        specs["adapter_up"] = ParamSpec((D, Fa), ("embed", "mlp"))
        specs["adapter_down"] = ParamSpec((Fa, D), ("mlp", "embed"), "zeros")
    if projection == "shared":
        if adapter_width is None:
            raise ValueError("a head with the shared projection needs an adapter (without one "
                             "it is the shared head itself: leave the exit without a head)")
        if rank is not None or draft_vocab is not None:
            raise ValueError("a head with the shared projection has no rank or draft "
                             "vocabulary of its own (those are the own projection's)")
        return specs
    out = V
    if draft_vocab is not None:
        if not isinstance(draft_vocab, int) or not 1 <= draft_vocab <= V:
            raise ValueError(f"draft vocabulary size must be an integer in [1, {V}], "
                             f"got {draft_vocab!r}")
        out = draft_vocab
    specs["norm"] = ParamSpec((D,), ("embed",), "ones")
    if rank is None:
        specs["proj"] = ParamSpec((D, out), ("embed", "vocab"))
    else:
        if not isinstance(rank, int) or rank < 1:
            raise ValueError(f"head rank must be a positive integer, got {rank!r}")
        specs["proj_down"] = ParamSpec((D, rank), ("embed", "rank"))
        specs["proj_up"] = ParamSpec((rank, out), ("rank", "vocab"))
    if draft_vocab is not None:
        specs["vocab"] = ParamSpec((draft_vocab,), ("draft_vocab",), "arange")
    return specs


def head_shape_args(head) -> dict[str, Any]:
    """`head_specs` keyword arguments (rank, draft_vocab, adapter_width, adapter_act,
    projection) that describe `head`'s arrays."""
    own = "proj" in head or "proj_down" in head or "proj_up" in head or "norm" in head
    rank = int(head["proj_down"].shape[1]) if "proj_down" in head else None
    draft_vocab = int(head["vocab"].shape[0]) if "vocab" in head else None
    adapter = "adapter_up" in head
    return {"rank": rank, "draft_vocab": draft_vocab,
            "adapter_width": int(head["adapter_up"].shape[1]) if adapter else None,
            "adapter_act": "swiglu" if "adapter_gate" in head or not adapter else "gelu",
            "projection": "own" if own or not adapter else "shared"}


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def init_from_specs(specs, key: jax.Array, dtype, init_std: float = 0.02):
    """Random parameters for a `ParamSpec` pytree (normal(0, init_std) weights, unit norms)."""
    leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
    keys = jax.random.split(key, len(leaves))

    def init(s: ParamSpec, k):
        if s.init == "ones":
            return jnp.ones(s.shape, dtype)
        if s.init == "zeros":
            return jnp.zeros(s.shape, dtype)
        if s.init == "arange":
            return jnp.arange(s.shape[0], dtype=jnp.int32)
        return (init_std * jax.random.normal(k, s.shape, jnp.float32)).astype(dtype)

    arrays = [init(s, k) for s, k in zip(leaves, keys)]
    return jax.tree.unflatten(treedef, arrays)


def init_params(cfg: ModelConfig, key: jax.Array, init_std: float = 0.02) -> Params:
    """Random model parameters for `cfg` (tests, and training from scratch)."""
    return init_from_specs(param_specs(cfg), key, jnp.dtype(cfg.dtype), init_std)


def shape_structs(cfg: ModelConfig) -> Params:
    """`jax.ShapeDtypeStruct` pytree of the parameters: for `eval_shape` / AOT lowering."""
    dtype = jnp.dtype(cfg.dtype)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), param_specs(cfg),
                        is_leaf=_is_spec)


def check_shapes(params, specs, where: str = "params") -> None:
    """Raises ValueError naming the first missing, unexpected or mis-shaped entry."""
    flat_specs = dict(_flatten(specs))
    flat_params = dict(_flatten(params))
    for name in flat_specs:
        if name not in flat_params:
            raise ValueError(f"{where}: missing parameter {name!r}")
    for name, value in flat_params.items():
        if name not in flat_specs:
            raise ValueError(f"{where}: unexpected parameter {name!r}")
        if tuple(value.shape) != flat_specs[name].shape:
            raise ValueError(f"{where}: parameter {name!r} has shape {tuple(value.shape)}, "
                             f"expected {flat_specs[name].shape}")


def _flatten(tree, prefix: str = ""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, f"{prefix}{k}/")
    else:
        yield prefix[:-1], tree


LAYER_LAYOUTS = ("scan", "unrolled")

# The layer projections: (input axes, output axes) of each, canonical order [in..., out...];
# the fused ones (`FUSED`) only in the unrolled layout.
PROJECTIONS = {"wq": (1, 2), "wk": (1, 2), "wv": (1, 2), "wo": (2, 1),
               "w_gate": (1, 1), "w_up": (1, 1), "w_down": (1, 1),
               "wqkv": (1, 3), "w_gate_up": (1, 2)}
# Each fused projection, the canonical ones it holds (in order) and its logical axes.
FUSED = {"wqkv": ("wq", "wk", "wv"), "w_gate_up": ("w_gate", "w_up")}
FUSED_AXES = {"wqkv": ("embed", "kv_heads", None, "head_dim"), "w_gate_up": ("embed", None, "mlp")}
# Weight-only quantization: a projection's scale per output channel sits beside it under
# `name + SCALE_SUFFIX` (`quantize_layer`).
SCALE_SUFFIX = "_scale"
WEIGHT_QUANTIZATIONS = ("int8",)
# Out-major storage of projection `name`: key `name + OUT_MAJOR_SUFFIX`, axes [out..., in...].
OUT_MAJOR_SUFFIX = "_T"


def to_out_major(name: str, w):
    """Projection `name` [(L,) in..., out...] -> [(L,) out..., in...] (a transposed copy);
    `w` an array, or a tuple of its logical axes (`sharding.param_axes`)."""
    return _permute(w, _out_major_order(name, _ndim(w), out_major=True))


def from_out_major(name: str, w_T):
    """Inverse of `to_out_major`."""
    return _permute(w_T, _out_major_order(name, _ndim(w_T), out_major=False))


def out_major_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape `to_out_major(name, w)` has for `w` of `shape`."""
    return to_out_major(name, tuple(shape))


def _ndim(w) -> int:
    return len(w) if isinstance(w, tuple) else w.ndim


def _out_major_order(name: str, ndim: int, out_major: bool) -> tuple[int, ...]:
    """The axis permutation [lead, in..., out...] -> [lead, out..., in...] (or back); the
    leading [L] axis of the stacked layout stays first."""
    n_in, n_out = PROJECTIONS[name]
    lead = ndim - n_in - n_out
    first, second = (n_in, n_out) if out_major else (n_out, n_in)
    return (*range(lead), *range(lead + first, lead + first + second), *range(lead, lead + first))


def _permute(w, order):
    if isinstance(w, tuple):
        return tuple(w[i] for i in order)
    if isinstance(w, np.ndarray):
        return np.ascontiguousarray(w.transpose(order))
    return jnp.transpose(w, order)


def fuse_layer(layer: dict) -> dict:
    """One canonical per-layer dict (no [L] axis) with q/k/v fused into `wqkv` [D, K, G + 2,
    H] and gate/up into `w_gate_up` [D, 2, F] (`FUSED`); NumPy stays NumPy."""
    xp = np if isinstance(layer["wq"], np.ndarray) else jnp
    D, N, H = layer["wq"].shape
    K = layer["wk"].shape[1]
    fused = {k: w for k, w in layer.items() if not any(k in parts for parts in FUSED.values())}
    fused["wqkv"] = xp.concatenate([layer["wq"].reshape(D, K, N // K, H),
                                    layer["wk"][:, :, None], layer["wv"][:, :, None]], axis=2)
    fused["w_gate_up"] = xp.stack([layer["w_gate"], layer["w_up"]], axis=1)
    return fused


def unfuse_layer(layer: dict) -> dict:
    """Inverse of `fuse_layer` (a dict without fused projections is returned as it is)."""
    if "wqkv" not in layer:
        return layer
    D, K, G2, H = layer["wqkv"].shape
    out = {k: w for k, w in layer.items() if k not in FUSED}
    qkv, gate_up = layer["wqkv"], layer["w_gate_up"]
    out["wq"] = qkv[:, :, :G2 - 2].reshape(D, K * (G2 - 2), H)
    out["wk"], out["wv"] = qkv[:, :, G2 - 2], qkv[:, :, G2 - 1]
    out["w_gate"], out["w_up"] = gate_up[:, 0], gate_up[:, 1]
    if isinstance(qkv, np.ndarray):
        out = {k: np.ascontiguousarray(w) if k in PROJECTIONS else w for k, w in out.items()}
    return out


def _channel_view(key: str, w) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the input axes of projection weight `key` (canonical or `name_T`, no [L] axis), the
    shape its per-output-channel scale broadcasts as)."""
    name = key.removesuffix(OUT_MAJOR_SUFFIX)
    n_in, _ = PROJECTIONS[name]
    if key == name:  # [in..., out...]
        return tuple(range(n_in)), (1,) * n_in + tuple(w.shape[n_in:])
    return (tuple(range(w.ndim - n_in, w.ndim)),
            tuple(w.shape[:w.ndim - n_in]) + (1,) * n_in)  # [out..., in...]


def quantize_layer(layer: dict) -> dict:
    """One per-layer dict (no [L] axis) with every projection weight-only int8: the weight
    rounded to int8 at a scale per output channel, max |w| / 127 over the channel's inputs
    (1 for an all-zero channel), kept beside it as `name_scale` [out...] in the weight's
    dtype. A layer already quantized is returned as it is; NumPy stays NumPy."""
    if is_quantized_layer(layer):
        return layer
    out = {}
    for key, w in layer.items():
        name = key.removesuffix(OUT_MAJOR_SUFFIX)
        if name not in PROJECTIONS:
            out[key] = w
            continue
        xp = np if isinstance(w, np.ndarray) else jnp
        in_axes, bshape = _channel_view(key, w)
        w32 = w.astype(np.float32)
        absmax = xp.max(xp.abs(w32), axis=in_axes)
        scale = xp.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)
        out[key] = xp.clip(xp.round(w32 / scale.reshape(bshape)), -127, 127).astype(np.int8)
        out[name + SCALE_SUFFIX] = scale.astype(w.dtype)
    return out


def dequantize_layer(layer: dict) -> dict:
    """Inverse of `quantize_layer` up to its rounding: each int8 projection times its scale,
    in the scale's dtype (a layer without int8 weights is returned as it is)."""
    if not is_quantized_layer(layer):
        return layer
    out = {}
    for key, w in layer.items():
        name = key.removesuffix(OUT_MAJOR_SUFFIX)
        if key.endswith(SCALE_SUFFIX):
            continue
        if name not in PROJECTIONS:
            out[key] = w
            continue
        scale = layer[name + SCALE_SUFFIX]
        xp = np if isinstance(w, np.ndarray) else jnp
        _, bshape = _channel_view(key, w)
        deq = w.astype(np.float32) * xp.asarray(scale).astype(np.float32).reshape(bshape)
        out[key] = deq.astype(scale.dtype)
    return out


def is_quantized_layer(layer: dict) -> bool:
    return any(k.endswith(SCALE_SUFFIX) for k in layer)


def _first_layer(params: Params) -> dict:
    """The first per-layer dict of the unrolled layout ({} for the scan layout: it always
    holds canonical weights, apart and in the model's dtype)."""
    layers = params["layers"]
    return layers[0] if isinstance(layers, (tuple, list)) and layers else {}


def is_quantized(params: Params) -> bool:
    """True if the (unrolled) layers hold weight-only int8 projections (`quantize_layer`)."""
    return is_quantized_layer(_first_layer(params))


def quantized_axes(layer_axes: dict) -> dict:
    """One layer's logical axes (canonical, no [L] axis) with each projection's scale
    carrying the projection's output axes."""
    scales = {name + SCALE_SUFFIX: axes[PROJECTIONS[name][0]:]
              for name, axes in layer_axes.items() if name in PROJECTIONS}
    return {**layer_axes, **scales}


def fused_axes(layer_axes: dict) -> dict:
    """One layer's logical axes (`sharding.param_axes`, canonical, no [L] axis) with the
    fused projections' axes in place of their parts'."""
    out = {k: a for k, a in layer_axes.items() if not any(k in p for p in FUSED.values())}
    return {**out, **FUSED_AXES}


def is_fused(params: Params) -> bool:
    """True if the (unrolled) layers hold fused projections (`wqkv`, `w_gate_up`)."""
    return any(k.removesuffix(OUT_MAJOR_SUFFIX) in FUSED for k in _first_layer(params))


def default_fused() -> bool:
    """Whether `load_model` fuses the unrolled layout's projections: on no backend. On
    XLA:CPU the fused products are sliced apart again and verify blocks and batches cost
    more (docs/layer_layouts.md, "Fused projections"); accelerators are not measured yet
    (the runbook's fused-projections study). `fused=True` still selects it."""
    return False


def layer_layout(params: Params) -> str:
    """"unrolled" if params["layers"] is a tuple of per-layer dicts, else "scan"."""
    return "unrolled" if isinstance(params["layers"], (tuple, list)) else "scan"


def default_layer_layout() -> str:
    """The layout chosen per backend by measurement: "unrolled" on CPU and GPU, "scan" on TPU.

    Scanning slices each layer's weights out of the stacked arrays inside the loop, and
    XLA:CPU and XLA:GPU materialize those slices (copies of every layer's weights at every
    decoding step: AR at 8B shapes on a GPU and on CPU is much faster unrolled); unrolled
    compiles in time linear in depth (docs/layer_layouts.md). On TPU XLA reads the slices in place, and the scan keeps
    compile time flat (not measured by this project: no TPU)."""
    return "scan" if jax.default_backend() == "tpu" else "unrolled"


def default_out_major() -> bool:
    """Whether the unrolled layout stores the layer projections out-major (the weight as a
    block's left operand, `transformer.project`): on no backend. It paid on XLA:CPU only
    while YNNPACK repacked a right-hand weight on every call; with the YNNPACK fusions off
    (`engine.COMPILER_OPTIONS["cpu"]`) it costs more at short blocks (docs/layer_layouts.md).
    Accelerators are not measured and keep the canonical order. `out_major=True` still
    selects it."""
    return False


def is_out_major(params: Params) -> bool:
    """True if the (unrolled) layers hold their projections out-major (`name_T` keys)."""
    return any(k.endswith(OUT_MAJOR_SUFFIX) for k in _first_layer(params))


def layer_dict_out_major(layer: dict, out_major: bool) -> dict:
    """One layer's (or the stacked layers') weight dict with its projections out-major
    (`name_T`, [out..., in...]) or canonical (`name`, [in..., out...])."""
    converted = {}
    for key, w in layer.items():
        name = key[:-len(OUT_MAJOR_SUFFIX)] if key.endswith(OUT_MAJOR_SUFFIX) else key
        if name not in PROJECTIONS or (key != name) == out_major:
            converted[key] = w
        elif out_major:
            converted[name + OUT_MAJOR_SUFFIX] = to_out_major(name, w)
        else:
            converted[name] = from_out_major(name, w)
    return converted


def arrange_layer(layer: dict, out_major: bool, fused: bool, int8: bool) -> dict:
    """One canonical per-layer dict (no [L] axis) in the unrolled layout's form: fused
    (`fuse_layer`), then out-major (`layer_dict_out_major`), then int8 (`quantize_layer`),
    each where asked."""
    layer = layer_dict_out_major(fuse_layer(layer) if fused else layer, out_major)
    return quantize_layer(layer) if int8 else layer


def canonical_layer(layer: dict) -> dict:
    """Inverse of `arrange_layer` (int8 weights dequantized)."""
    return unfuse_layer(layer_dict_out_major(dequantize_layer(layer), False))


def with_layer_layout(params: Params, layout: str, out_major: bool | None = None,
                      fused: bool | None = None, int8: bool | None = None) -> Params:
    """`params` in `layout` ("scan": stacked arrays; "unrolled": a tuple of per-layer dicts).

    The unrolled layout holds the layer projections out-major when `out_major` (None:
    `default_out_major()`: off), fused (`fuse_layer`) when `fused` (None: `default_fused()`:
    off) and weight-only int8 (`quantize_layer`) when `int8` (None: as `params` are); the
    scan layout always holds them canonical, apart and in the model's dtype (int8 weights
    dequantized), so every consumer that needs the canonical weights (training, export,
    calibration) gets them from `with_layer_layout(params, "scan")`.

    NumPy weights stay NumPy (host memory, nothing compiled), JAX weights stay JAX.
    Converting allocates the new layout before the old one can be freed (momentarily twice
    the layer weights)."""
    if layout not in LAYER_LAYOUTS:
        raise ValueError(f"layer_layout={layout!r} is not one of {LAYER_LAYOUTS}")
    unrolled = layout == "unrolled"
    if int8 and not unrolled:
        raise ValueError("int8 weights need the unrolled layer layout (the scan layout holds "
                         "the canonical weights)")
    want_out_major = unrolled and (default_out_major() if out_major is None else out_major)
    want_fused = unrolled and (default_fused() if fused is None else fused)
    want_int8 = unrolled and (is_quantized(params) if int8 is None else int8)
    if (layer_layout(params) == layout and is_out_major(params) == want_out_major
            and is_fused(params) == want_fused and is_quantized(params) == want_int8):
        return params
    layers = params["layers"]
    if layer_layout(params) == "unrolled":  # back to canonical, stacked
        layers = jax.tree.map(lambda *ws: np.stack(ws) if isinstance(ws[0], np.ndarray)
                              else jnp.stack(ws),
                              *(canonical_layer(layer) for layer in layers))
    if unrolled:
        num_layers = len(next(iter(layers.values())))
        converted = tuple(arrange_layer(jax.tree.map(lambda w: w[i], layers), want_out_major,
                                        want_fused, want_int8) for i in range(num_layers))
    else:
        converted = layers
    return {**params, "layers": converted}
