"""Model configuration: a frozen, hashable dataclass usable as a static `jit` argument.

`ModelConfig.from_hf_dict` maps a Hugging Face `config.json` (Llama family including
LayerSkip checkpoints and CodeLlama, and Qwen3) onto it, rejecting anything the model code
does not implement with a `ValueError` naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import numpy as np

SUPPORTED_MODEL_TYPES = ("llama", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
MATMUL_PRECISIONS = ("highest", "high", "default")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only early-exit transformer.

    Attributes:
      model_type: "llama" or "qwen3" (the HF `model_type`).
      vocab_size: V.
      hidden_size: D, the residual width.
      intermediate_size: F, the SwiGLU width.
      num_layers: L.
      num_heads: N, query heads.
      num_kv_heads: K, key/value heads (GQA when K < N).
      head_dim: H (Qwen3 sets it explicitly; Llama uses D / N).
      rms_norm_eps: epsilon of every RMSNorm.
      rope_theta: RoPE base.
      rope_scaling: None or a sorted tuple of (key, value) pairs from HF `rope_scaling`.
      max_position_embeddings: the longest context the model supports.
      tie_word_embeddings: LM head is the transposed embedding.
      qk_norm: per-head RMSNorm on queries and keys before RoPE (Qwen3).
      dtype: parameter and activation dtype name ("float32" or "bfloat16").
      matmul_precision: the precision of every matmul of the model ("highest", "high" or
        "default": `jax.lax.Precision`). "highest" (the default) makes float32 matmuls
        exact float32 on GPUs and TPUs too, whose default passes round inputs to TF32 or
        bfloat16; then a speculative method's greedy output equals AR's even at near-ties
        (with TF32, HiSpec's greedy output departs from AR's on an H100: docs/numerics.md).
        "default" is faster on GPUs/TPUs and gives up that guarantee; bfloat16 models'
        inputs are exact either way.
      flat_attention_output: a layout choice, not architecture (no token changes): the
        attention output, flattened to [B, T, N*H], passes an optimization barrier before
        the o projection, which keeps XLA from bitcasting wo to [N, H, D] (on a GPU that
        turned the projection into a full x_i * wo_io product and a second reduction;
        docs/accelerator_checks.md). Off by default; the accelerator runbook times it. Part
        of every compile key (the engine's key holds the config).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    dtype: str = "float32"
    matmul_precision: str = "highest"
    flat_attention_output: bool = False

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type={self.model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype={self.dtype!r} must be 'float32' or 'bfloat16'")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(f"matmul_precision={self.matmul_precision!r} is not one of "
                             f"{MATMUL_PRECISIONS}")
        rope_type = self.rope_scaling_dict.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"rope_scaling.rope_type={rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}"
            )

    # ----- derived (cached) properties -------------------------------------------------
    @property
    def rope_scaling_dict(self) -> dict[str, Any]:
        return dict(self.rope_scaling or ())

    @property
    def precision(self) -> jax.lax.Precision:
        """`matmul_precision` as the `precision=` argument of the model's matmuls."""
        return jax.lax.Precision[self.matmul_precision.upper()]

    @property
    def q_per_kv(self) -> int:
        """G: query heads sharing one key/value head."""
        return self.num_heads // self.num_kv_heads

    @functools.cached_property
    def inv_freq(self) -> np.ndarray:
        """RoPE inverse frequencies [H/2], with `linear` or `llama3` scaling applied."""
        exponents = np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim
        inv_freq = 1.0 / (self.rope_theta**exponents)
        scaling = self.rope_scaling_dict
        rope_type = scaling.get("rope_type", "default")
        if rope_type == "linear":
            inv_freq = inv_freq / float(scaling["factor"])
        elif rope_type == "llama3":
            factor = float(scaling["factor"])
            low = float(scaling["low_freq_factor"])
            high = float(scaling["high_freq_factor"])
            old_len = float(scaling["original_max_position_embeddings"])
            wavelen = 2 * math.pi / inv_freq
            scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
            smooth = (old_len / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
            inv_freq = np.where(is_medium, smoothed, scaled)
        return inv_freq.astype(np.float32)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # ----- Hugging Face ----------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], dtype: str | None = None) -> "ModelConfig":
        """Builds a config from a HF `config.json` dict; raises ValueError naming bad fields."""
        model_type = hf.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"config.json: model_type={model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}"
            )
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads")
        for key in required:
            if key not in hf:
                raise ValueError(f"config.json: missing required field {key!r}")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act={hf['hidden_act']!r} is not supported (only 'silu')")
        for key in ("attention_bias", "mlp_bias", "use_sliding_window"):
            if hf.get(key):
                raise ValueError(f"config.json: {key}=true is not supported")
        if hf.get("pretraining_tp", 1) not in (1, None):
            raise ValueError(f"config.json: pretraining_tp={hf['pretraining_tp']} is not supported (only 1)")
        num_heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // num_heads
        # transformers >= 5 writes `rope_parameters` (with rope_theta inside); older
        # checkpoints write `rope_theta` and `rope_scaling` (with "type" or "rope_type").
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_theta = float(hf.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        rope.pop("rope_theta", None)
        if "type" in rope:
            rope.setdefault("rope_type", rope.pop("type"))
        rope_scaling = None if rope.get("rope_type", "default") == "default" else tuple(sorted(rope.items()))
        if dtype is None:
            dtype = "bfloat16" if hf.get("torch_dtype", hf.get("dtype")) == "bfloat16" else "float32"
        return cls(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", model_type == "qwen3")),
            qk_norm=model_type == "qwen3",
            dtype=dtype,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The HF `config.json` dict describing this architecture."""
        arch = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[self.model_type]
        out = {
            "architectures": [arch],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling_dict or None,
            "rope_parameters": {"rope_type": "default", **self.rope_scaling_dict,
                                "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": False,
            "torch_dtype": self.dtype,
        }
        if self.model_type == "llama":
            out["mlp_bias"] = False
        return out
