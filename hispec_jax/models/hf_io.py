"""Hugging Face checkpoint import / export, read and written without torch.

A checkpoint is a local HF directory:

    config.json                          -> ModelConfig (ModelConfig.from_hf_dict / to_hf_dict)
    model.safetensors                    one file, or
    model.safetensors.index.json         {"weight_map": {tensor: shard file}}, with the shards
                                         model-0000i-of-0000n.safetensors
    generation_config.json               optional, returned as a plain dict
    exit_heads.safetensors               optional, the trained exit heads (format below)

Only safetensors are read: `.bin` / `.pt` pickles are rejected. HF tensor names map to our
stacked layout (see `params.py`) through `_RULES`; HF `Linear.weight` is [out, in], ours is
in×out, so `W.T` reshaped. Every tensor's shape is checked against `param_specs(cfg)` before
it is read, and unknown, missing, duplicate (across shards) or mis-shaped tensors raise a
`ValueError` naming the tensor.

Tied embeddings: HF omits `lm_head.weight` from tied checkpoints. If a tied checkpoint does
carry it, it is accepted only when exactly equal to `model.embed_tokens.weight` (and then
dropped); a different matrix means the config is wrong, so it raises. Export of a tied model
never writes it.

Exit heads file `exit_heads.safetensors` (HF `Linear` [out, in] orientation, so a head is
loadable as `torch.nn.Linear` weights), one group per exit layer e in 1..L (the head reads
the residual stream after layer e):

    exit_heads.{e}.norm.weight       [D]      RMSNorm scale
    exit_heads.{e}.proj.weight       [V, D]   full head, or
    exit_heads.{e}.proj_down.weight  [R, D]   low-rank head: proj_up @ proj_down
    exit_heads.{e}.proj_up.weight    [V, R]
    exit_heads.{e}.vocab             [K]      optional int32 draft vocabulary (sorted token
                                              ids); proj / proj_up then have K rows, not V
    exit_heads.{e}.adapter_norm.weight  [D]   optional adapter block (models/heads.py):
    exit_heads.{e}.adapter_gate.weight  [Fa, D]   SwiGLU only (absent: GELU)
    exit_heads.{e}.adapter_up.weight    [Fa, D]
    exit_heads.{e}.adapter_down.weight  [D, Fa]
                                      an adapter head without norm / proj tensors feeds the
                                      model's own final norm + LM head
    metadata: {"format": "pt", "exit_layers": "3,7"}   (sorted, comma-separated)

In memory: heads[str(e)] = {"norm": [D], "proj": [D, V]} or
{"norm": [D], "proj_down": [D, R], "proj_up": [R, V]}, + "vocab" [K], + the adapter's
"adapter_*" arrays (`params.head_specs`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
# ml_dtypes registers bfloat16 with numpy, so safetensors' "np" framework reads and writes bf16.
import ml_dtypes  # noqa: F401
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from hispec_jax.models import lazy_weights
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.params import (ExitHeads, Params, check_shapes, head_shape_args, head_specs,
                                      param_specs)

HEADS_FILENAME = "exit_heads.safetensors"
CONFIG_FILENAME = "config.json"
GENERATION_CONFIG_FILENAME = "generation_config.json"
WEIGHTS_FILENAME = "model.safetensors"
INDEX_FILENAME = "model.safetensors.index.json"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_METADATA = {"format": "pt"}  # transformers refuses safetensors files without it

# (HF name template, our path, n_in). n_in = 0: copied as is; n_in > 0: a Linear whose
# first n_in axes of our (per-layer) shape are its input: ours = W.T.reshape(shape).
_RULES: list[tuple[str, tuple[str, ...], int]] = [
    ("model.embed_tokens.weight", ("embed",), 0),
    ("model.layers.{i}.input_layernorm.weight", ("layers", "attn_norm"), 0),
    ("model.layers.{i}.self_attn.q_proj.weight", ("layers", "wq"), 1),
    ("model.layers.{i}.self_attn.k_proj.weight", ("layers", "wk"), 1),
    ("model.layers.{i}.self_attn.v_proj.weight", ("layers", "wv"), 1),
    ("model.layers.{i}.self_attn.o_proj.weight", ("layers", "wo"), 2),
    ("model.layers.{i}.self_attn.q_norm.weight", ("layers", "q_norm"), 0),
    ("model.layers.{i}.self_attn.k_norm.weight", ("layers", "k_norm"), 0),
    ("model.layers.{i}.post_attention_layernorm.weight", ("layers", "mlp_norm"), 0),
    ("model.layers.{i}.mlp.gate_proj.weight", ("layers", "w_gate"), 1),
    ("model.layers.{i}.mlp.up_proj.weight", ("layers", "w_up"), 1),
    ("model.layers.{i}.mlp.down_proj.weight", ("layers", "w_down"), 1),
    ("model.norm.weight", ("final_norm",), 0),
    ("lm_head.weight", ("lm_head",), 1),
]
_INDEX = r"(0|[1-9][0-9]*)"  # no leading zeros, so one tensor has exactly one name
_RULE_RES = [(re.compile(re.escape(t).replace(re.escape("{i}"), _INDEX) + "$"), p, n)
             for t, p, n in _RULES]
_HEAD_RE = re.compile(rf"exit_heads\.{_INDEX}\.(?:(norm|proj|proj_down|proj_up|adapter_norm|"
                      rf"adapter_gate|adapter_up|adapter_down)\.weight|(vocab))$")
_HEAD_N_IN = {"norm": 0, "proj": 1, "proj_down": 1, "proj_up": 1, "vocab": 0,
              "adapter_norm": 0, "adapter_gate": 1, "adapter_up": 1, "adapter_down": 1}


def _head_tensor_name(e, part: str) -> str:
    return f"exit_heads.{int(e)}.{part}" + ("" if part == "vocab" else ".weight")


def check_draft_vocab(vocab, vocab_size: int, where: str) -> np.ndarray:
    """`vocab` as int32 after checking it is a draft vocabulary: 1-D, integer, strictly
    increasing token ids in [0, vocab_size). Raises ValueError naming what is wrong."""
    v = np.asarray(vocab)
    if v.ndim != 1 or v.size == 0 or not np.issubdtype(v.dtype, np.integer):
        raise ValueError(f"{where}: a draft vocabulary must be a non-empty 1-D array of "
                         f"integer token ids, got shape {v.shape} dtype {v.dtype}")
    if v.min() < 0 or v.max() >= vocab_size:
        raise ValueError(f"{where}: draft vocabulary token ids must be in [0, {vocab_size}), "
                         f"got [{v.min()}, {v.max()}]")
    if np.any(np.diff(v) <= 0):
        raise ValueError(f"{where}: draft vocabulary token ids must be sorted and unique")
    return v.astype(np.int32)


def _hf_shape(shape: tuple[int, ...], n_in: int) -> tuple[int, ...]:
    """HF shape of a tensor whose (per-layer) shape in our layout is `shape`."""
    return shape if n_in == 0 else (math.prod(shape[n_in:]), math.prod(shape[:n_in]))


def _to_ours(w: np.ndarray, shape: tuple[int, ...], n_in: int) -> np.ndarray:
    return w if n_in == 0 else w.T.reshape(shape)


def _to_hf(x: np.ndarray, n_in: int) -> np.ndarray:
    x = np.asarray(x)
    if n_in:
        x = x.reshape(math.prod(x.shape[:n_in]), -1).T
    return np.ascontiguousarray(x)


def _read_json(path: Path) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def _weight_files(path: Path) -> list[Path]:
    """The safetensors files holding the model weights (raises if there are none)."""
    index = path / INDEX_FILENAME
    if index.exists():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no 'weight_map'")
        files = [path / name for name in sorted(set(weight_map.values()))]
        for f in files:
            if not f.exists():
                raise ValueError(f"{INDEX_FILENAME} names shard {f.name!r}, "
                                 f"which does not exist in {path}")
        return files
    if (path / WEIGHTS_FILENAME).exists():
        return [path / WEIGHTS_FILENAME]
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(f"{path}: only safetensors weights are supported, found {pickles[0]!r}; "
                         "convert it with transformers' save_pretrained(safe_serialization=True)")
    raise ValueError(f"{path}: no weight files ({WEIGHTS_FILENAME} or {INDEX_FILENAME})")


def load_checkpoint(path, dtype: str | None = None, host: bool = False, lazy: bool = False
                    ) -> tuple[ModelConfig, Params, ExitHeads, dict]:
    """Loads a local HF directory -> (cfg, params, heads, generation_config_dict).

    `dtype` ("float32" / "bfloat16") overrides the config's `torch_dtype`; weights are cast
    to it. `heads` is {} without an `exit_heads.safetensors`, and the generation config {}
    without a `generation_config.json`. `host`: the weights stay NumPy arrays in host memory
    (for a caller that rearranges them before placing them, as `load_model` does: NumPy
    slicing and transposing compile nothing); otherwise they are JAX arrays. `lazy` (with
    `host`): the weights are `lazy_weights.LazyTensor` / `LazyStack`s, read only where
    indexed, so that placing them on a mesh reads only this process's shards (the exit
    heads, small, are read whole); every check above runs all the same.
    """
    path = Path(path)
    if not (path / CONFIG_FILENAME).exists():
        raise ValueError(f"{path}: missing {CONFIG_FILENAME}")
    hf_config = _read_json(path / CONFIG_FILENAME)
    cfg = ModelConfig.from_hf_dict(hf_config, dtype=dtype)
    specs = param_specs(cfg)
    L = cfg.num_layers

    slots: dict[tuple[str, ...], list] = {}  # our path -> [array] or [array per layer]
    origin: dict[str, str] = {}  # HF name -> file it came from
    tied_head = None
    for file in _weight_files(path):
        with safe_open(file, framework="np") as f:
            for name in f.keys():
                if name in origin:
                    raise ValueError(f"duplicate tensor {name!r} in {origin[name]} and {file.name}")
                origin[name] = file.name
                match = next(((m, p, n) for r, p, n in _RULE_RES if (m := r.match(name))), None)
                if match is None or (match[1][-1] in ("q_norm", "k_norm") and not cfg.qk_norm):
                    raise ValueError(f"unknown tensor {name!r} in {file.name}")
                m, our, n_in = match
                layer = int(m.group(1)) if m.groups() else None
                if layer is not None and layer >= L:
                    raise ValueError(f"tensor {name!r}: layer {layer} >= num_layers={L}")
                tied = our == ("lm_head",) and cfg.tie_word_embeddings
                if tied:
                    shape = want = specs["embed"].shape  # a tied head is the embedding, [V, D]
                else:
                    spec = specs["layers"][our[1]] if layer is not None else specs[our[0]]
                    shape = spec.shape[1:] if layer is not None else spec.shape
                    want = _hf_shape(shape, n_in)
                got = tuple(f.get_slice(name).get_shape())
                if got != want:
                    raise ValueError(f"tensor {name!r} has shape {got}, expected {want}")
                if lazy and not tied:
                    value = lazy_weights.LazyTensor(file, name, shape, n_in,
                                                    jnp.dtype(cfg.dtype))
                else:
                    value = (f.get_tensor(name) if tied
                             else _to_ours(f.get_tensor(name), shape, n_in))
                if tied:
                    tied_head = value
                elif layer is None:
                    slots[our] = [value]
                else:
                    slots.setdefault(our, [None] * L)[layer] = value

    embed = slots.get(("embed",), [None])[0]
    if tied_head is not None and embed is not None and not np.array_equal(
            tied_head, np.asarray(embed)):
        raise ValueError("tensor 'lm_head.weight' differs from 'model.embed_tokens.weight' "
                         "but config.json has tie_word_embeddings=true")
    params: Params = {"layers": {}}
    for template, our, _ in _RULES:
        stacked = our[0] == "layers"
        if our[-1] not in (specs["layers"] if stacked else specs):
            continue  # q/k norms of a non-qk_norm model, lm_head of a tied one
        values = slots.pop(our, [None] * (L if stacked else 1))  # pop: free host copies early
        missing = [i for i, v in enumerate(values) if v is None]
        if missing:
            raise ValueError(f"missing tensor {template.format(i=missing[0])!r} in {path}")
        if lazy:
            value = lazy_weights.LazyStack(values) if stacked else values[0]
        else:
            value = np.asarray(np.stack(values) if stacked else values[0],
                               dtype=jnp.dtype(cfg.dtype))
        (params["layers"] if stacked else params)[our[-1]] = value
    check_shapes(params, specs)

    gen_path = path / GENERATION_CONFIG_FILENAME
    generation_config = _read_json(gen_path) if gen_path.exists() else {}
    heads = load_exit_heads(path, cfg, host=True)
    if lazy and not host:
        raise ValueError("lazy weights stay on the host: pass host=True with lazy=True")
    if not host:
        params, heads = jax.device_put((params, heads))
    return cfg, params, heads, generation_config


def save_checkpoint(path, cfg: ModelConfig, params, heads: ExitHeads | None = None,
                    generation_config: dict | None = None,
                    max_shard_bytes: int | None = None) -> None:
    """Writes `params` as a HF directory that `AutoModelForCausalLM.from_pretrained` loads.

    Writes `config.json` (with bos/eos/pad token ids from `generation_config`),
    `model.safetensors`, or, when `max_shard_bytes` is given and the weights exceed it,
    `model-0000i-of-0000n.safetensors` shards plus `model.safetensors.index.json`;
    `generation_config.json` when `generation_config` is given; `exit_heads.safetensors`
    when `heads` is non-empty. Model weight files from an earlier save are removed first.
    """
    path = Path(path)
    check_shapes(params, param_specs(cfg))
    tensors: dict[str, np.ndarray] = {}
    for template, our, n_in in _RULES:
        group = params["layers"] if our[0] == "layers" else params
        if our[-1] not in group:
            continue
        if our[0] == "layers":
            for i in range(cfg.num_layers):
                tensors[template.format(i=i)] = _to_hf(group[our[-1]][i], n_in)
        else:
            tensors[template] = _to_hf(group[our[-1]], n_in)

    path.mkdir(parents=True, exist_ok=True)
    for stale in [path / WEIGHTS_FILENAME, path / INDEX_FILENAME,
                  *path.glob("model-*-of-*.safetensors")]:
        stale.unlink(missing_ok=True)
    total = sum(t.nbytes for t in tensors.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        save_file(tensors, path / WEIGHTS_FILENAME, metadata=_METADATA)
    else:
        shards: list[dict[str, np.ndarray]] = [{}]
        size = 0
        for name, t in tensors.items():  # greedy, in order; an oversized tensor gets its own shard
            if shards[-1] and size + t.nbytes > max_shard_bytes:
                shards.append({})
                size = 0
            shards[-1][name] = t
            size += t.nbytes
        weight_map = {}
        for k, shard in enumerate(shards):
            file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, path / file, metadata=_METADATA)
            weight_map.update(dict.fromkeys(shard, file))
        _write_json(path / INDEX_FILENAME,
                    {"metadata": {"total_size": total}, "weight_map": weight_map})

    hf_config = cfg.to_hf_dict()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if generation_config and generation_config.get(key) is not None:
            hf_config[key] = generation_config[key]
    _write_json(path / CONFIG_FILENAME, hf_config)
    if generation_config is not None:
        _write_json(path / GENERATION_CONFIG_FILENAME, dict(generation_config))
    if heads:
        save_exit_heads(path, cfg, heads)


def _write_json(path: Path, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def _exit_layer(e, L: int, where: str) -> int:
    """`e` as an int, checked to be a layer index in [1, L] written without leading zeros."""
    if not re.fullmatch(_INDEX, str(e)) or not 1 <= int(e) <= L:
        raise ValueError(f"{where}: exit layer {e!r} must be an integer in [1, {L}]")
    return int(e)


def save_exit_heads(path, cfg: ModelConfig, heads: ExitHeads) -> None:
    """Writes `heads` to `path/exit_heads.safetensors` (format in the module docstring)."""
    tensors, layers = {}, []
    for e, head in heads.items():
        layers.append(_exit_layer(e, cfg.num_layers, f"exit head {e!r}"))
        check_shapes(head, head_specs(cfg, **head_shape_args(head)), where=f"exit head {e!r}")
        for part, value in head.items():
            if part == "vocab":
                value = check_draft_vocab(value, cfg.vocab_size, f"exit head {e!r}")
            tensors[_head_tensor_name(e, part)] = _to_hf(value, _HEAD_N_IN[part])
    Path(path).mkdir(parents=True, exist_ok=True)
    metadata = {**_METADATA, "exit_layers": ",".join(map(str, sorted(layers)))}
    save_file(tensors, Path(path) / HEADS_FILENAME, metadata=metadata)


def load_exit_heads(path, cfg: ModelConfig, host: bool = False) -> ExitHeads:
    """Reads `path/exit_heads.safetensors` -> ExitHeads in `cfg.dtype`; {} when absent.
    `host`: NumPy arrays (as `load_checkpoint`), else JAX arrays."""
    file = Path(path) / HEADS_FILENAME
    if not file.exists():
        return {}
    groups: dict[str, dict[str, np.ndarray]] = {}
    with safe_open(file, framework="np") as f:
        for name in f.keys():
            m = _HEAD_RE.match(name)
            if m is None:
                raise ValueError(f"{HEADS_FILENAME}: unknown tensor {name!r}")
            e = str(_exit_layer(m.group(1), cfg.num_layers, f"{HEADS_FILENAME}: tensor {name!r}"))
            groups.setdefault(e, {})[m.group(2) or m.group(3)] = f.get_tensor(name)
        listed = (f.metadata() or {}).get("exit_layers")
    heads: ExitHeads = {}
    for e, group in sorted(groups.items(), key=lambda kv: int(kv[0])):
        low_rank = "proj_down" in group and "proj" not in group
        vocab = group.get("vocab")
        if vocab is not None:
            vocab = group["vocab"] = check_draft_vocab(
                vocab, cfg.vocab_size, f"{HEADS_FILENAME}: tensor {_head_tensor_name(e, 'vocab')!r}")
        adapter = "adapter_up" in group
        own = any(part in group for part in ("norm", "proj", "proj_down", "proj_up"))
        try:
            specs = head_specs(
                cfg, int(group["proj_down"].shape[0]) if low_rank else None,
                draft_vocab=None if vocab is None else int(vocab.shape[0]),
                adapter_width=int(group["adapter_up"].shape[0]) if adapter else None,
                adapter_act="swiglu" if "adapter_gate" in group or not adapter else "gelu",
                projection="own" if own or not adapter else "shared")
        except ValueError as err:
            raise ValueError(f"{HEADS_FILENAME}: exit head {e}: {err}") from None
        for part in specs:
            if part not in group:
                raise ValueError(f"{HEADS_FILENAME}: missing tensor {_head_tensor_name(e, part)!r}")
        for part, w in group.items():
            name = _head_tensor_name(e, part)
            if part not in specs:
                raise ValueError(f"{HEADS_FILENAME}: unexpected tensor {name!r}")
            if part == "vocab":
                group[part] = np.asarray(w, np.int32)
                continue
            n_in = _HEAD_N_IN[part]
            want = _hf_shape(specs[part].shape, n_in)
            if tuple(w.shape) != want:
                raise ValueError(f"{HEADS_FILENAME}: tensor {name!r} has shape {tuple(w.shape)}, "
                                 f"expected {want}")
            group[part] = np.asarray(_to_ours(w, specs[part].shape, n_in),
                                     dtype=jnp.dtype(cfg.dtype))
        heads[e] = group
    if listed is not None and listed != ",".join(heads):
        raise ValueError(f"{HEADS_FILENAME}: metadata exit_layers={listed!r} does not match "
                         f"the tensors' layers {','.join(heads)!r}")
    return heads if host else jax.device_put(heads)
