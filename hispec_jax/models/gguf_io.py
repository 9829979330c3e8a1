"""GGUF import (llama.cpp checkpoints), read with the `gguf` package and without torch.

A `.gguf` file holds the architecture and tokenizer as metadata and the weights as (possibly
quantized) tensors:

    general.architecture          "llama" (Llama 1/2/3, SmolLM2, CodeLlama, ...) or "qwen3"
    {arch}.block_count, .embedding_length, .feed_forward_length, .context_length,
    {arch}.attention.head_count, .head_count_kv, .key_length, .layer_norm_rms_epsilon,
    {arch}.rope.freq_base, .rope.dimension_count, .rope.scaling.type / .factor
                                  -> ModelConfig
    tokenizer.ggml.*              vocabulary, merges, token types, special token ids
    tokenizer.chat_template       Jinja chat template
                                  -> a transformers fast tokenizer (transformers' own GGUF
                                     tokenizer conversion, fed from `gguf.GGUFReader`)

Tensor names map to our stacked layout through `_RULES`. GGUF stores a matrix in ggml order
`[in, out]`, which `GGUFReader` exposes as numpy `[out, in]`: HF's `Linear.weight` orientation,
so the same `W.T.reshape(shape)` as HF import applies. Every tensor type that
`gguf.quants.dequantize` implements is accepted (F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0, the
K-quants, IQ*, ...); it is dequantized in row chunks straight into the compute dtype.

llama.cpp's layout. For `llama` files its converter permutes the rows of the Q and K
projections so that its RoPE kernel can rotate adjacent pairs (GPT-J style) where HF rotates
the two halves of each head (NeoX style). Per head of H rows it interleaves the halves:

    HF   rows: [x0 x1 ... x(H/2-1) | y0 y1 ... y(H/2-1)]
    GGUF rows: [x0 y0 x1 y1 ... x(H/2-1) y(H/2-1)]

`_unpermute_heads` undoes it. `qwen3` files use NeoX RoPE in llama.cpp too and are stored as
HF has them. Llama 3.1+ files carry `rope_freqs.weight` (llama.cpp's per-frequency divisors
for `llama3` RoPE scaling) instead of the scaling parameters; they are recovered by checking
the tensor against the published Llama 3.x parameters (`_llama3_rope_scaling`).

Memory. Weights are converted one parameter at a time (one stacked `[L, ...]` array in the
"scan" layout, one tensor in the "unrolled" layout), each moved to the device before the next
is read, so loading needs the weights in the compute dtype plus about three copies of the
largest tensor (the embedding) — never a second copy of the model, and never float64.

Unknown architectures, tensors, tensor types and unsupported settings raise a `ValueError`
naming them, before any weight is read.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import gguf
import jax
import ml_dtypes
import numpy as np

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.params import (LAYER_LAYOUTS, OUT_MAJOR_SUFFIX, PROJECTIONS, Params,
                                      arrange_layer, default_fused, default_out_major,
                                      layer_dict_out_major, out_major_shape, param_specs)

# GGUF `general.architecture` -> our `model_type`.
SUPPORTED_ARCHITECTURES = {"llama": "llama", "qwen3": "qwen3"}
_UNPERMUTE_QK = ("llama",)  # model types whose Q/K rows llama.cpp permutes

# (GGUF name template, our path, n_in) as in hf_io: n_in = 0 copied as is; n_in > 0 a matrix
# [out, in] whose first n_in axes of our (per-layer) shape are its input: ours = W.T.reshape.
_RULES: list[tuple[str, tuple[str, ...], int]] = [
    ("token_embd.weight", ("embed",), 0),
    ("blk.{i}.attn_norm.weight", ("layers", "attn_norm"), 0),
    ("blk.{i}.attn_q.weight", ("layers", "wq"), 1),
    ("blk.{i}.attn_k.weight", ("layers", "wk"), 1),
    ("blk.{i}.attn_v.weight", ("layers", "wv"), 1),
    ("blk.{i}.attn_output.weight", ("layers", "wo"), 2),
    ("blk.{i}.attn_q_norm.weight", ("layers", "q_norm"), 0),
    ("blk.{i}.attn_k_norm.weight", ("layers", "k_norm"), 0),
    ("blk.{i}.ffn_norm.weight", ("layers", "mlp_norm"), 0),
    ("blk.{i}.ffn_gate.weight", ("layers", "w_gate"), 1),
    ("blk.{i}.ffn_up.weight", ("layers", "w_up"), 1),
    ("blk.{i}.ffn_down.weight", ("layers", "w_down"), 1),
    ("output_norm.weight", ("final_norm",), 0),
    ("output.weight", ("lm_head",), 1),
]
_ROPE_FREQS = "rope_freqs.weight"
_INDEX = r"(0|[1-9][0-9]*)"
_RULE_RES = [(re.compile(re.escape(t).replace(re.escape("{i}"), _INDEX) + "$"), p, n)
             for t, p, n in _RULES]
_NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
_CHUNK_ELEMENTS = 1 << 20  # dequantize ~1M values at a time (4 MB of float32 temporaries)
# Llama 3.1 / 3.2 / 3.3 `rope_scaling` apart from `factor` (8 for 3.1, 32 for 3.2).
_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


def _reader(path: Path):
    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError / struct errors on a bad header
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from e


def _field(reader, key: str, default: Any = None, required: bool = False) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if required:
            raise ValueError(f"GGUF metadata: missing {key!r}")
        return default
    return field.contents()


def _decimal(value) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-06, not
    9.99999997e-07): the value the model was published with."""
    return float(str(np.float32(value)))


def config_from_metadata(reader, dtype: str = "float32") -> ModelConfig:
    """The `ModelConfig` a GGUF file describes; raises ValueError naming what is unsupported."""
    arch = _field(reader, "general.architecture", required=True)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: "
                         f"{sorted(SUPPORTED_ARCHITECTURES)}")
    if dtype not in _NP_DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {sorted(_NP_DTYPES)}")

    def get(key, default=None, required=True):
        value = _field(reader, f"{arch}.{key}", default, required=required and default is None)
        if isinstance(value, list):
            raise ValueError(f"GGUF metadata: {arch}.{key} varies per layer ({value[:4]}...), "
                             "which is not supported")
        return value

    for key in ("expert_count", "attention.sliding_window"):
        if get(key, required=False):
            raise ValueError(f"GGUF metadata: {arch}.{key}={get(key)} is not supported "
                             "(mixture of experts / sliding-window attention)")
    tensor_names = {t.name for t in reader.tensors}
    for name in tensor_names:
        if name.endswith(".bias"):
            raise ValueError(f"GGUF tensor {name!r}: biases are not supported")
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ValueError("GGUF file has no tensor 'token_embd.weight'")
    hidden = int(get("embedding_length"))
    num_heads = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // num_heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise ValueError(f"GGUF metadata: {arch}.attention.value_length != key_length ({head_dim})"
                         " is not supported")
    rope_dims = int(get("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ValueError(f"GGUF metadata: {arch}.rope.dimension_count={rope_dims} != head_dim="
                         f"{head_dim} (partial rotary embeddings) is not supported")
    rope_theta = _decimal(get("rope.freq_base", 10000.0))
    scaling_type = get("rope.scaling.type", "none")
    if scaling_type == "none":
        rope_scaling = None
    elif scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    else:
        raise ValueError(f"GGUF metadata: {arch}.rope.scaling.type={scaling_type!r} is not "
                         "supported (only 'none' and 'linear')")
    cfg = ModelConfig(
        model_type=SUPPORTED_ARCHITECTURES[arch],
        vocab_size=int(get("vocab_size", int(embed.shape[1]))),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rms_norm_eps=_decimal(get("attention.layer_norm_rms_epsilon")),
        rope_theta=rope_theta,
        rope_scaling=None if rope_scaling is None else tuple(sorted(rope_scaling.items())),
        max_position_embeddings=int(get("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,
        qk_norm=arch == "qwen3",
        dtype=dtype,
    )
    if _ROPE_FREQS in tensor_names:
        if rope_scaling is not None:
            raise ValueError(f"GGUF file has both {arch}.rope.scaling.type={scaling_type!r} and "
                             f"a {_ROPE_FREQS!r} tensor")
        rope_freqs = next(t for t in reader.tensors if t.name == _ROPE_FREQS)
        cfg = cfg.replace(rope_scaling=_llama3_rope_scaling(cfg, _dequantize(rope_freqs, np.float32)))
    return cfg


def _llama3_rope_scaling(cfg: ModelConfig, rope_freqs: np.ndarray) -> tuple:
    """The `llama3` rope_scaling whose frequencies llama.cpp's `rope_freqs` divisors encode.

    llama.cpp divides the base frequencies by `rope_freqs` (1 for high frequencies, `factor`
    for the lowest, smooth in between). The file does not store the parameters, so they are
    recovered: `factor` is the largest divisor, and the rest must be Llama 3.x's published
    values, checked against every divisor.
    """
    rope_freqs = np.asarray(rope_freqs, np.float64).reshape(-1)
    if rope_freqs.shape != (cfg.head_dim // 2,):
        raise ValueError(f"GGUF tensor {_ROPE_FREQS!r} has shape {rope_freqs.shape}, expected "
                         f"({cfg.head_dim // 2},)")
    scaling = tuple(sorted({**_LLAMA3_ROPE, "factor": float(rope_freqs.max())}.items()))
    base = cfg.replace(rope_scaling=None).inv_freq.astype(np.float64)
    want = cfg.replace(rope_scaling=scaling).inv_freq.astype(np.float64)
    if not np.allclose(base / rope_freqs, want, rtol=1e-4, atol=0):
        raise ValueError(f"GGUF tensor {_ROPE_FREQS!r} is not llama3 RoPE scaling with "
                         f"{dict(scaling)}; other rope_freqs are not supported")
    return scaling


def _supported_type(qtype) -> bool:
    """Whether `gguf.quants.dequantize` implements `qtype` (probed on one zero block)."""
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    try:
        gguf.quants.dequantize(np.zeros((1, type_size), np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _dequantize(tensor, dtype, out: np.ndarray | None = None) -> np.ndarray:
    """A GGUF tensor as a numpy array in `dtype`, numpy order (`[out, in]` for a matrix),
    written into `out` when given.

    Converted `_CHUNK_ELEMENTS` values at a time straight into the result, so temporaries stay
    small and no float32 copy of a whole bfloat16 tensor is made."""
    shape = tuple(int(n) for n in reversed(tensor.shape))
    rows = np.asarray(tensor.data).reshape(-1, tensor.data.shape[-1])
    result = np.empty(shape, dtype) if out is None else out
    result_rows = result.reshape(rows.shape[0], shape[-1])  # a view: `result` is contiguous
    step = max(1, _CHUNK_ELEMENTS // shape[-1])
    for r in range(0, rows.shape[0], step):
        chunk = rows[r:r + step]
        if tensor.tensor_type == gguf.GGMLQuantizationType.F32:
            result_rows[r:r + step] = chunk.view(np.float32)
        else:
            result_rows[r:r + step] = gguf.quants.dequantize(chunk, tensor.tensor_type)
    return result


def _aligned_empty(shape, dtype, alignment: int = 64) -> np.ndarray:
    """An uninitialized C-contiguous array whose data is `alignment`-byte aligned.

    On the CPU backend `jax.device_put` adopts such a buffer without copying it (an
    unaligned one is copied), so a parameter never exists twice while loading."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    offset = -raw.ctypes.data % alignment
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def _unpermute_heads(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undoes llama.cpp's Q/K row permutation (module docstring) of `w` [heads * H, in]."""
    rows, cols = w.shape
    head_dim = rows // num_heads
    return w.reshape(num_heads, head_dim // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _tensor_index(reader, cfg: ModelConfig) -> dict[tuple[str, ...], list]:
    """{our path: [tensor] or [tensor per layer]}, every name, shape and type checked."""
    specs = param_specs(cfg)
    L = cfg.num_layers
    slots: dict[tuple[str, ...], list] = {}
    seen: set[str] = set()
    type_ok: dict[Any, bool] = {}
    for t in reader.tensors:
        if t.name in seen:
            raise ValueError(f"duplicate GGUF tensor {t.name!r}")
        seen.add(t.name)
        if t.name == _ROPE_FREQS:
            continue  # read into cfg.rope_scaling
        match = next(((m, p, n) for r, p, n in _RULE_RES if (m := r.match(t.name))), None)
        if match is None or (match[1][-1] in ("q_norm", "k_norm") and not cfg.qk_norm):
            raise ValueError(f"unknown GGUF tensor {t.name!r}")
        m, our, n_in = match
        layer = int(m.group(1)) if m.groups() else None
        if layer is not None and layer >= L:
            raise ValueError(f"GGUF tensor {t.name!r}: layer {layer} >= block_count={L}")
        spec = specs["layers"][our[1]] if layer is not None else specs[our[0]]
        shape = spec.shape[1:] if layer is not None else spec.shape
        want = shape if n_in == 0 else (math.prod(shape[n_in:]), math.prod(shape[:n_in]))
        got = tuple(int(n) for n in reversed(t.shape))
        if got != want:
            raise ValueError(f"GGUF tensor {t.name!r} has shape {got}, expected {want}")
        if t.tensor_type not in type_ok:
            type_ok[t.tensor_type] = _supported_type(t.tensor_type)
        if not type_ok[t.tensor_type]:
            raise ValueError(f"GGUF tensor {t.name!r} has type {t.tensor_type.name}, which "
                             "gguf.quants cannot dequantize")
        if layer is None:
            slots[our] = [t]
        else:
            slots.setdefault(our, [None] * L)[layer] = t
    for template, our, _ in _RULES:
        stacked = our[0] == "layers"
        if our[-1] not in (specs["layers"] if stacked else specs):
            continue
        tensors = slots.get(our, [None] * (L if stacked else 1))
        missing = [i for i, t in enumerate(tensors) if t is None]
        if missing:
            raise ValueError(f"missing GGUF tensor {template.format(i=missing[0])!r}")
    return slots


def load_weights(reader, cfg: ModelConfig, layer_layout: str = "scan",
                 out_major: bool | None = None, fused: bool | None = None,
                 int8: bool = False) -> Params:
    """The parameters of a GGUF file in `layer_layout`, dequantized into `cfg.dtype`; the
    unrolled layout's projections out-major when `out_major` and fused when `fused` (None:
    the backend's defaults, `params.with_layer_layout`), weight-only int8 when `int8`."""
    if layer_layout not in LAYER_LAYOUTS:
        raise ValueError(f"layer_layout={layer_layout!r} is not one of {LAYER_LAYOUTS}")
    if out_major is None:
        out_major = default_out_major()
    slots = _tensor_index(reader, cfg)
    specs = param_specs(cfg)
    dtype = _NP_DTYPES[cfg.dtype]
    unpermute = cfg.model_type in _UNPERMUTE_QK
    heads = {"wq": cfg.num_heads, "wk": cfg.num_kv_heads} if unpermute else {}

    def convert(tensor, key: str, n_in: int, out: np.ndarray, out_major: bool = False) -> None:
        """Writes `tensor` in our layout into `out` (its per-layer shape; `out_major`: the
        projection's out-major shape [out..., in...], GGUF's own [out, in] order)."""
        if n_in == 0:
            _dequantize(tensor, dtype, out=out)
            return
        w = _dequantize(tensor, dtype)
        if key in heads:
            w = _unpermute_heads(w, heads[key])
        if out_major:  # out viewed as [out, in] (a view: contiguous), filled as stored
            out.reshape(-1, math.prod(out.shape[out.ndim - n_in:]))[...] = w
            return
        # out viewed as [in, out] (a view: contiguous), filled with the transposed matrix.
        out.reshape(math.prod(out.shape[:n_in]), -1)[...] = w.T

    L = cfg.num_layers
    params: Params = {}
    unrolled: list[dict] = [{} for _ in range(L)]
    stacked: dict = {}
    for _, our, n_in in _RULES:
        if our not in slots:
            continue
        tensors = slots.pop(our)
        if our[0] != "layers":
            value = _aligned_empty(specs[our[0]].shape, dtype)
            convert(tensors[0], our[0], n_in, value)
            params[our[0]] = jax.device_put(value)
            continue
        key = our[1]
        shape = specs["layers"][key].shape[1:]
        if layer_layout == "unrolled":
            transposed = out_major and key in PROJECTIONS
            name = key + OUT_MAJOR_SUFFIX if transposed else key
            if transposed:
                shape = out_major_shape(key, shape)
            for i, t in enumerate(tensors):
                value = _aligned_empty(shape, dtype)
                convert(t, key, n_in, value, transposed)
                unrolled[i][name] = jax.device_put(value)
        else:
            value = _aligned_empty((L, *shape), dtype)
            for i, t in enumerate(tensors):
                convert(t, key, n_in, value[i])
            stacked[key] = jax.device_put(value)
        del value
    fused = default_fused() if fused is None else fused
    if layer_layout == "unrolled" and (fused or int8):
        # one layer at a time, so the copies never exceed one layer's weights
        unrolled = [arrange_layer(layer_dict_out_major(layer, False), out_major, fused, int8)
                    for layer in unrolled]
    params["layers"] = tuple(unrolled) if layer_layout == "unrolled" else stacked
    return params


# ----- tokenizer ----------------------------------------------------------------------------

def _transformers_gguf_tokenizer():
    """transformers' GGUF tokenizer conversion: (GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer).

    It is `transformers.integrations.gguf` in transformers >= 5 and
    `transformers.integrations.ggml` in older releases; neither imports torch."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer)
    except ImportError:
        from transformers.integrations.ggml import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
    return GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer


_SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                   "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}


def load_tokenizer(reader):
    """A transformers fast tokenizer from the file's `tokenizer.*` metadata (None if absent).

    Special tokens (bos/eos/unk/pad), `add_bos_token` / `add_eos_token` and the chat template
    come from the metadata, as `AutoTokenizer.from_pretrained(..., gguf_file=...)` sets them.
    """
    if "tokenizer.ggml.model" not in reader.fields:
        return None
    from transformers import PreTrainedTokenizerFast

    mapping, convert = _transformers_gguf_tokenizer()
    grouped = {group: {name: _field(reader, f"tokenizer.{key}") for key, name in renames.items()
                       if f"tokenizer.{key}" in reader.fields}
               for group, renames in mapping.items()}
    tokenizer_dict, tokenizer_config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer_dict.get("tokenizer_type") == "llama":
        tokenizer_config.setdefault("add_bos_token", True)  # llama.cpp's default for SentencePiece
    tokens = tokenizer_dict.get("tokens") or []
    for name, key in _SPECIAL_TOKENS.items():
        token_id = _field(reader, f"tokenizer.ggml.{key}")
        if token_id is not None and 0 <= token_id < len(tokens):
            tokenizer_config[name] = tokens[token_id]
    arch = _field(reader, "general.architecture")
    try:
        backend, extra = convert(arch, tokenizer_dict)
    except (KeyError, ValueError, NotImplementedError) as e:
        raise ValueError(f"GGUF tokenizer (tokenizer.ggml.model="
                         f"{tokenizer_dict.get('tokenizer_type')!r}) cannot be converted: {e}") from e
    return PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer_config, **extra)


def generation_config(reader) -> dict[str, Any]:
    """bos/eos/pad token ids from the metadata; eos is a list when the file also names an
    end-of-turn (`eot`) or end-of-message (`eom`) token, which llama.cpp stops at too."""
    out: dict[str, Any] = {}
    for key, name in (("bos_token_id", "bos_token_id"), ("pad_token_id", "padding_token_id")):
        if (value := _field(reader, f"tokenizer.ggml.{name}")) is not None:
            out[key] = int(value)
    eos = [int(v) for k in ("eos_token_id", "eot_token_id", "eom_token_id")
           if (v := _field(reader, f"tokenizer.ggml.{k}")) is not None]
    eos = list(dict.fromkeys(eos))
    if eos:
        out["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    return out


def read_config(path, dtype: str = "float32") -> ModelConfig:
    """The `ModelConfig` of a `.gguf` file from its metadata (no tensor read): what
    `load_checkpoint` will build, for a size known before loading."""
    return config_from_metadata(_reader(Path(path)), dtype)


def load_checkpoint(path, dtype: str | None = None, layer_layout: str = "scan",
                    out_major: bool | None = None, fused: bool | None = None,
                    int8: bool = False):
    """Loads a `.gguf` file -> (cfg, params, tokenizer, generation_config_dict).

    `dtype` ("float32", the default, or "bfloat16") is the compute dtype every tensor is
    dequantized to. `tokenizer` is None when the file has no tokenizer metadata.
    """
    path = Path(path)
    reader = _reader(path)
    cfg = config_from_metadata(reader, dtype or "float32")
    _tensor_index(reader, cfg)  # every check before the slow parts
    tokenizer = load_tokenizer(reader)
    gen = generation_config(reader)
    # The parsed metadata (for a 49k vocabulary ~90 MB of small numpy arrays) is done with;
    # drop it before the weights are converted. Tensors keep their own views of the file.
    reader.fields.clear()
    params = load_weights(reader, cfg, layer_layout, out_major, fused, int8)
    return cfg, params, tokenizer, gen
