"""Model presets: `configs/model_*.py` (ml_collections) -> `ModelConfig`, and random models.

A preset file defines `get_config()` returning a `ConfigDict` with exactly the fields of
`ModelConfig` (no defaults are filled in: a missing or unknown key raises). `rope_scaling`
is None or a nested ConfigDict of the HF `rope_scaling` entries.

`init_random_model` builds a complete `Model` (random weights, a byte-level tokenizer,
a generation config) that `save_model` writes in HF layout; its output is random text.
`hispec init-model` writes one (tests, compile and memory checks at a preset's shapes).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

import jax
import ml_collections

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.model import Model
from hispec_jax.models.params import init_params

# configs/ beside the package (present in a source checkout / editable install).
PRESETS_DIR = Path(__file__).resolve().parents[2] / "configs"

# Byte-level tokenizer ids: specials first (Llama's convention), then byte b at b + 3.
UNK, BOS, EOS = "<unk>", "<s>", "</s>"
SPECIAL_TOKENS = (UNK, BOS, EOS)
BYTE_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256


def resolve_preset(name_or_path: str | Path) -> Path:
    """A preset file: an existing path, or a name `N` meaning `configs/model_N.py`."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    candidate = PRESETS_DIR / f"model_{name_or_path}.py"
    if candidate.is_file():
        return candidate
    available = sorted(p.stem.removeprefix("model_") for p in PRESETS_DIR.glob("model_*.py"))
    raise ValueError(f"model config {str(name_or_path)!r} is neither a file nor a preset name "
                     f"(presets in {PRESETS_DIR}: {available or 'none'})")


def run_config_file(path: str | Path, *args) -> ml_collections.ConfigDict:
    """Runs an ml_collections config file's `get_config(*args)` and returns the ConfigDict."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"_hispec_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ValueError(f"{path}: defines no get_config()")
    return module.get_config(*args)


def load_config(name_or_path: str | Path) -> ml_collections.ConfigDict:
    """Runs a model preset file's `get_config()` and returns the ConfigDict."""
    return run_config_file(resolve_preset(name_or_path))


def apply_overrides(cfg: ml_collections.ConfigDict, overrides: dict[str, str]) -> None:
    """Sets `cfg[key] = value` for dotted keys (`rope_scaling.factor`) from command-line text.

    The text is parsed as the existing field's type (int, float, bool, str, tuple of ints);
    a None or nested field takes a Python literal (`None`, `{'rope_type': 'linear', 'factor': 2.0}`).
    Raises ValueError naming an unknown key or an unparsable value.
    """
    for key, text in overrides.items():
        *parents, leaf = key.split(".")
        node = cfg
        for part in parents:
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                raise ValueError(f"config has no key {key!r}")
            node = node[part]
        if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
            raise ValueError(f"config has no key {key!r}")
        current = node[leaf]
        try:
            if isinstance(current, bool):
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(text)
                value = text.lower() in ("true", "1")
            elif isinstance(current, (int, float)):
                value = type(current)(text)
            elif isinstance(current, str):
                value = text
            elif isinstance(current, tuple):  # a tuple of ints: "3,7,11", "(3, 7)", "3", ""
                value = ast.literal_eval(text.strip() or "()")
                value = tuple(value) if isinstance(value, (tuple, list)) else (value,)
                if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                    raise ValueError(text)
            else:
                value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            kind = "a tuple of ints" if isinstance(current, tuple) else type(current).__name__
            raise ValueError(f"config key {key!r}: cannot parse {text!r} as {kind}") from None
        if isinstance(value, dict):
            value = ml_collections.ConfigDict(value)
        node[leaf] = value


def model_config_from_ml_collections(cfg: ml_collections.ConfigDict) -> ModelConfig:
    """The `ModelConfig` a preset describes; every ModelConfig field must be present, except
    `matmul_precision` and `flat_attention_output` (numerics and layout settings, not
    architecture: their defaults when absent)."""
    fields = [f.name for f in dataclasses.fields(ModelConfig)]
    missing = [k for k in fields if k not in cfg
               and k not in ("matmul_precision", "flat_attention_output")]
    if missing:
        raise ValueError(f"model config is missing key(s) {missing}")
    unknown = sorted(set(cfg.keys()) - set(fields))
    if unknown:
        raise ValueError(f"model config has unknown key(s) {unknown}; ModelConfig fields: {fields}")
    values = {k: cfg[k] for k in fields if k in cfg}
    rope = values["rope_scaling"]
    if rope is not None:
        rope = rope.to_dict() if isinstance(rope, ml_collections.ConfigDict) else dict(rope)
        values["rope_scaling"] = tuple(sorted(rope.items()))
    for name in ("rms_norm_eps", "rope_theta"):
        values[name] = float(values[name])
    return ModelConfig(**values)


def load_preset(path: str | Path) -> ModelConfig:
    """The `ModelConfig` of a preset file (or preset name, e.g. "tiny")."""
    return model_config_from_ml_collections(load_config(path))


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table (what the ByteLevel pre-tokenizer emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_tokenizer(model_max_length: int | None = None):
    """A byte-level tokenizer: <unk>=0, <s>=1, </s>=2, byte b = b + 3; prepends <s>.

    A BPE model over the 256 ByteLevel symbols with no merges, so every text encodes to its
    UTF-8 bytes and decodes back exactly. Returns a `transformers.PreTrainedTokenizerFast`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: b + len(SPECIAL_TOKENS) for b, ch in enumerate(_bytes_to_unicode())})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, vocab[BOS])])
    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS,
                                   unk_token=UNK, **extra)


def init_random_model(cfg: ModelConfig, seed: int = 0, init_std: float = 0.02) -> Model:
    """A `Model` with random weights (`init_params`), the byte-level tokenizer, no exit heads.

    Raises ValueError when `cfg.vocab_size` is smaller than the tokenizer's vocabulary.
    """
    tokenizer = byte_tokenizer(model_max_length=cfg.max_position_embeddings)
    if cfg.vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size={cfg.vocab_size} does not cover the byte-level "
                         f"tokenizer's {len(tokenizer)} tokens")
    params = init_params(cfg, jax.random.key(seed), init_std=init_std)
    generation_config = {"bos_token_id": tokenizer.bos_token_id,
                         "eos_token_id": tokenizer.eos_token_id}
    return Model(cfg=cfg, params=params, heads={}, tokenizer=tokenizer,
                 generation_config=generation_config)
