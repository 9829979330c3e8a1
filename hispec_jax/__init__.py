"""hispec-jax: hierarchical speculative decoding for early-exit language models in JAX.

    model = hispec_jax.load_model("path/to/hf_dir")
    result = hispec_jax.generate(model, ["Hello"], method=hispec_jax.HiSpec(), max_new_tokens=64)
    result.texts, result.token_ids, result.stats

The names below are imported on first use (PEP 562), so `import hispec_jax` (and the
`hispec` command's argument checks) does not pay for importing JAX.
"""

import importlib as _importlib
import logging as _logging
import os as _os
from typing import TYPE_CHECKING

# The shipped early-exit model (docs/default_model.md): what `hispec generate` uses
# without --model. Rebuild it with `hispec pretrain --config configs/pretrain_gpu.py`, then
# `hispec pretrain --config configs/finetune_default.py`.
DEFAULT_MODEL_DIR: str = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "default_model")

_LAZY = {
    "GenerationResult": "hispec_jax.decoding.generate",
    "generate": "hispec_jax.api",
    "generate_stream": "hispec_jax.serving.stream",
    "TextStream": "hispec_jax.serving.stream",
    "SamplingParams": "hispec_jax.decoding.sampling",
    "ModelConfig": "hispec_jax.models.config",
    "Model": "hispec_jax.models.model",
    "load_model": "hispec_jax.models.model",
    "save_model": "hispec_jax.models.model",
    # method specs: generate(model, prompts, method=hispec_jax.HiSpec(draft_exit=4, ...))
    **dict.fromkeys(("AR", "Exit", "Lookup", "LayerSkip", "HiSpec", "SV", "SpecBound",
                     "DraftModel", "MethodSpec"), "hispec_jax.decoding.method_spec"),
}

__all__ = ["DEFAULT_MODEL_DIR", *sorted(_LAZY)]

if TYPE_CHECKING:
    from hispec_jax.api import generate
    from hispec_jax.decoding.generate import GenerationResult
    from hispec_jax.decoding.method_spec import (AR, SV, DraftModel, Exit, HiSpec, LayerSkip,
                                                 Lookup, MethodSpec, SpecBound)
    from hispec_jax.decoding.sampling import SamplingParams
    from hispec_jax.serving.stream import TextStream, generate_stream
    from hispec_jax.models.config import ModelConfig
    from hispec_jax.models.model import Model, load_model, save_model


# Submodules reachable as attributes without importing them first.
_SUBMODULES = ("distributed",)


def __getattr__(name):
    if name in _SUBMODULES:  # hispec_jax.distributed.initialize(...)
        return _importlib.import_module(f"hispec_jax.{name}")
    if name not in _LAZY:
        raise AttributeError(f"module 'hispec_jax' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


class _NoTorchAdvice(_logging.Filter):
    """transformers warns "PyTorch was not found" when it is imported without torch; hispec-jax
    only uses its tokenizers, which need no torch, so that warning reads like a broken install."""

    def filter(self, record):
        return "PyTorch was not found" not in str(record.msg)


_logging.getLogger("transformers").addFilter(_NoTorchAdvice())
