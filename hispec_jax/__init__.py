"""hispec-jax: hierarchical speculative decoding for early-exit language models in JAX.

    model = hispec_jax.load_model("path/to/hf_dir")
    result = hispec_jax.generate(model, ["Hello"], method="hispec", max_new_tokens=64)
    result.texts, result.token_ids, result.stats
"""

import os as _os

from hispec_jax.decoding.generate import GenerationResult, generate
from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.model import Model, load_model, save_model

# The shipped early-exit model (docs/default_model.md): what `hispec generate` uses
# without --model. Rebuild it with `hispec pretrain --config configs/pretrain_gpu.py`, then
# `hispec pretrain --config configs/finetune_default.py`.
DEFAULT_MODEL_DIR: str = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "default_model")

__all__ = [
    "DEFAULT_MODEL_DIR",
    "GenerationResult",
    "Model",
    "ModelConfig",
    "SamplingParams",
    "generate",
    "load_model",
    "save_model",
]
