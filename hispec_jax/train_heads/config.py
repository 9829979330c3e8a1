"""Head-training run configs: `configs/train_heads_*.py` files, overrides, validation.

A run config is an `ml_collections.ConfigDict` from a file's `get_config()` holding exactly
the keys of `KEYS` (no defaults are filled in here: a missing or unknown key raises).
Command-line overrides `--config.KEY=VALUE` are parsed as the key's type; tuples of ints
take `3,7,11` or `(3, 7, 11)`.
"""

from __future__ import annotations

from pathlib import Path

import ml_collections

from hispec_jax.models import presets
from hispec_jax.models.params import ADAPTER_ACTS, HEAD_PROJECTIONS

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"

# key -> type. Every config file sets all of them (see configs/train_heads_default.py).
KEYS: dict[str, type] = {
    "model_path": str, "model_dtype": str, "output_dir": str,
    "head_layers": tuple, "head_rank": int,
    "head_adapter_width": int, "head_adapter_act": str, "head_projection": str,
    "temperature": float, "target_top_k": int, "loss": str,
    "learning_rate": float, "end_lr_fraction": float, "warmup_steps": int,
    "weight_decay": float, "adam_b1": float, "adam_b2": float, "adam_eps": float,
    "grad_clip_norm": float,
    "batch_size": int, "seq_len": int, "num_epochs": int, "total_steps": int,
    "data_source": str, "max_train_docs": int, "random_train_rows": int, "eval_rows": int,
    "on_policy_prompts": int, "on_policy_new_tokens": int, "on_policy_sampling": str,
    "on_policy_temperature": float, "on_policy_batch": int,
    "feature_cache": bool, "cache_dir": str, "cache_dtype": str, "cache_max_gb": float,
    "workdir": str, "resume": bool, "checkpoint_every": int, "keep_checkpoints": int,
    "async_checkpoint": bool, "eval_every": int, "seed": int, "progress_bar": bool,
}
DATA_SOURCES = ("sharegpt", "on_policy", "random")
LOSSES = ("kl", "ce")


def resolve_config_path(name_or_path) -> Path:
    """A config file: an existing path, else `configs/<name>.py` or `configs/train_heads_<name>.py`."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    for candidate in (CONFIGS_DIR / f"{name_or_path}.py", CONFIGS_DIR / f"train_heads_{name_or_path}.py"):
        if candidate.is_file():
            return candidate
    available = sorted(p.name for p in CONFIGS_DIR.glob("train_heads_*.py"))
    raise ValueError(f"train config {str(name_or_path)!r} is neither a file nor a config name "
                     f"(in {CONFIGS_DIR}: {available or 'none'})")


def load_config(name_or_path, overrides: dict[str, str] | None = None) -> ml_collections.ConfigDict:
    """Runs a config file's `get_config()`, applies `overrides` and validates the result."""
    config = presets.run_config_file(resolve_config_path(name_or_path))
    apply_overrides(config, overrides or {})
    check_config(config)
    return config


def apply_overrides(config: ml_collections.ConfigDict, overrides: dict[str, str]) -> None:
    """Sets `config[key]` from command-line text, parsed as the key's type; unknown keys raise."""
    for key in overrides:
        if key not in KEYS:
            raise ValueError(f"train config has no key {key!r}; keys: {', '.join(sorted(KEYS))}")
    presets.apply_overrides(config, overrides)


def check_config(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError naming the first missing, unknown or ill-typed key or bad value."""
    missing = sorted(set(KEYS) - set(config.keys()))
    if missing:
        raise ValueError(f"train config is missing key(s) {missing}")
    unknown = sorted(set(config.keys()) - set(KEYS))
    if unknown:
        raise ValueError(f"train config has unknown key(s) {unknown}")
    for key, kind in KEYS.items():
        value = config[key]
        if kind is tuple:
            ok = isinstance(value, (tuple, list))
        elif kind in (int, float):
            ok = isinstance(value, (int, float) if kind is float else int)
            ok = ok and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind)
        if not ok:
            raise ValueError(f"train config key {key!r} must be {kind.__name__}, got {value!r}")
    positive = ("batch_size", "seq_len", "checkpoint_every", "keep_checkpoints", "eval_rows")
    for key in positive:
        if config[key] < 1:
            raise ValueError(f"train config key {key!r} must be >= 1, got {config[key]}")
    for key in ("head_rank", "head_adapter_width", "target_top_k", "warmup_steps", "total_steps", "num_epochs",
                "max_train_docs", "random_train_rows", "eval_every"):
        if config[key] < 0:
            raise ValueError(f"train config key {key!r} must be >= 0, got {config[key]}")
    if config.total_steps == 0 and config.num_epochs == 0:
        raise ValueError("train config: set total_steps or num_epochs (both are 0)")
    if config.temperature <= 0 or config.learning_rate <= 0:
        raise ValueError("train config: temperature and learning_rate must be > 0")
    if config.loss not in LOSSES:
        raise ValueError(f"train config: loss={config.loss!r} must be one of {LOSSES} (kl: "
                         "T^2 KL(final || exit) at `temperature`; ce: cross-entropy on the final "
                         "layer's greedy token)")
    if config.head_adapter_act not in ADAPTER_ACTS:
        raise ValueError(f"train config: head_adapter_act={config.head_adapter_act!r} must be "
                         f"one of {ADAPTER_ACTS}")
    if config.head_projection not in HEAD_PROJECTIONS:
        raise ValueError(f"train config: head_projection={config.head_projection!r} must be one "
                         f"of {HEAD_PROJECTIONS} (own: a trained copy of the final norm + LM "
                         "head; shared: the model's own, frozen, behind an adapter)")
    if config.head_projection == "shared" and (config.head_adapter_width == 0 or config.head_rank):
        raise ValueError("train config: head_projection='shared' needs head_adapter_width > 0 "
                         f"and head_rank = 0 (got {config.head_adapter_width} and "
                         f"{config.head_rank}): the head is an adapter before the model's own "
                         "LM head")
    if config.data_source not in DATA_SOURCES:
        raise ValueError(f"train config: data_source={config.data_source!r} must be one of "
                         f"{DATA_SOURCES}")
    if config.data_source == "on_policy":
        from hispec_jax.train_heads import on_policy

        try:
            on_policy.generation_from_config(config, config.seed)
        except ValueError as e:
            raise ValueError(f"train config: {e} with data_source='on_policy'") from None
    if config.data_source == "random" and config.random_train_rows < config.batch_size:
        raise ValueError(f"train config: random_train_rows={config.random_train_rows} must be "
                         f">= batch_size={config.batch_size}")
    if config.cache_dtype not in ("bfloat16", "float32"):
        raise ValueError(f"train config: cache_dtype={config.cache_dtype!r} must be 'bfloat16' "
                         "or 'float32'")
    if config.model_dtype not in ("", "bfloat16", "float32"):
        raise ValueError(f"train config: model_dtype={config.model_dtype!r} must be '', "
                         "'bfloat16' or 'float32'")
    if not config.model_path:
        raise ValueError("train config: model_path is empty; pass --config.model_path=DIR "
                         "(a local Hugging Face model directory)")
