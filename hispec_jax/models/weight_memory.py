"""The memory a model's weights will take once loaded, from its config alone: what a command
says before it reads any weight, so that a model too large for the device is known before
minutes of loading (an 8B GGUF file dequantizes to float32 unless told otherwise).

    weight_bytes(cfg, quantize)   every parameter of `param_specs(cfg)` in `cfg.dtype`; with
                                  "int8", the layer projections one byte per weight plus a
                                  scale per output channel in `cfg.dtype` (`params.quantize_layer`)
    describe(path, dtype, ...)    the same for a model on disk: its config (config.json, or a
                                  GGUF file's metadata) and the exit heads beside it
                                  (exit_heads.safetensors' header), no tensor read

The count is the parameters' bytes on one device without a mesh (a mesh of M "model"
devices holds about 1/M of the sharded ones on each); the decoding loop's KV cache and
temporaries come on top (`hispec plan-memory` compiles and measures them).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from hispec_jax.models import gguf_io, hf_io
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.params import PROJECTIONS, ParamSpec, param_specs

_ITEMSIZE = {"float32": 4, "bfloat16": 2}


@dataclasses.dataclass(frozen=True)
class WeightMemory:
    """A model's weights as they will sit in memory.

    Attributes:
      parameters: how many values (the model's and its exit heads').
      bytes: their size in `dtype` (int8 projections at one byte each, with their scales).
      dtype: "float32" or "bfloat16".
      quantize: "int8" or None.
      num_layers: L.
    """

    parameters: int
    bytes: int
    dtype: str
    quantize: str | None
    num_layers: int

    def summary(self) -> str:
        """`24 layers, 7.1M parameters, float32: weights 28.5 MB`."""
        kind = self.dtype + (", int8 layer projections" if self.quantize else "")
        return (f"{self.num_layers} layers, {_count(self.parameters)} parameters, {kind}: "
                f"weights {format_bytes(self.bytes)}")


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def format_bytes(n: int) -> str:
    """Decimal units, as `du --si` and vendors' memory sizes: 1.6 GB, 270.0 MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def weight_bytes(cfg: ModelConfig, quantize: str | None = None) -> tuple[int, int]:
    """(parameters, bytes) of `cfg`'s parameters in `cfg.dtype`; with `quantize="int8"` the
    layer projections take one byte per weight and a `cfg.dtype` scale per output channel."""
    itemsize = _ITEMSIZE[cfg.dtype]
    count = total = 0
    for name, spec in _leaves(param_specs(cfg)):
        n = math.prod(spec.shape)
        count += n
        proj = name.rpartition("/")[2]
        if quantize and name.startswith("layers/") and proj in PROJECTIONS:
            n_out = PROJECTIONS[proj][1]
            channels = spec.shape[0] * math.prod(spec.shape[len(spec.shape) - n_out:])
            total += n + channels * itemsize
        else:
            total += n * itemsize
    return count, total


def _leaves(tree, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, ParamSpec):
            yield prefix + key, value
        else:
            yield from _leaves(value, f"{prefix}{key}/")


def _heads_header(file: Path, itemsize: int) -> tuple[int, int]:
    """(parameters, bytes in the model's dtype) of an exit-heads safetensors file, from its
    header alone (8 bytes of length, then JSON with every tensor's dtype and shape)."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    count = total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        n = math.prod(info["shape"])
        count += n
        total += n * (4 if info["dtype"].startswith("I") else itemsize)  # vocab: int32
    return count, total


def read_config(path, dtype: str | None = None) -> ModelConfig:
    """The `ModelConfig` of a Hugging Face directory or a GGUF file, read as `load_model`
    reads it (`dtype` None: the checkpoint's; a GGUF file's is float32), no tensor read."""
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return gguf_io.read_config(path, dtype or "float32")
    hf = json.loads((path / hf_io.CONFIG_FILENAME).read_text())
    return ModelConfig.from_hf_dict(hf, dtype=dtype)


def describe(path, dtype: str | None = None, quantize: str | None = None) -> WeightMemory:
    """What `load_model(path, dtype=dtype, quantize=quantize)` will hold: the model's
    parameters and its exit heads (which stay in the model's dtype). Raises ValueError for a
    config the model code does not take (as loading would, before reading a weight)."""
    cfg = read_config(path, dtype)
    count, total = weight_bytes(cfg, quantize)
    heads = Path(path) / hf_io.HEADS_FILENAME
    if heads.is_file():
        n, b = _heads_header(heads, _ITEMSIZE[cfg.dtype])
        count, total = count + n, total + b
    return WeightMemory(parameters=count, bytes=total, dtype=cfg.dtype, quantize=quantize,
                        num_layers=cfg.num_layers)


def array_bytes(tree) -> int:
    """The bytes the arrays of a loaded pytree hold (a check of `describe` against a model
    in memory)."""
    import jax

    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))
