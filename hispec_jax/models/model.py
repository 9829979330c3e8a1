"""`Model`: config + parameters + exit heads + tokenizer, loaded from a HF directory or a GGUF
file, saved to a HF directory."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax

from hispec_jax.models import gguf_io, hf_io, sharding
from hispec_jax.models.config import MATMUL_PRECISIONS, ModelConfig
from hispec_jax.models.draft_weights import DraftWeights, check_pair
from hispec_jax.models.heads import head_kind
from hispec_jax.models.params import (LAYER_LAYOUTS, WEIGHT_QUANTIZATIONS, ExitHeads, Params,
                                      default_fused, default_layer_layout, default_out_major,
                                      with_layer_layout)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclasses.dataclass
class Model:
    """An early-exit model ready for decoding.

    Attributes:
      cfg: architecture (static under `jit`).
      params: parameter pytree (`params.py`), layers stacked ("scan" layout) or a tuple of
        per-layer dicts ("unrolled" layout).
      heads: trained exit heads by exit layer (`{}`: every exit uses the shared head).
      tokenizer: a HF tokenizer, or None (then prompts must be token ids).
      generation_config: the checkpoint's `generation_config.json` as a dict.
      path: the directory (or GGUF file) it was loaded from, if any.
      mesh: the device mesh its parameters are sharded over (`sharding.RULES`), or None
        (one device); `generate` decodes over it.
    """

    cfg: ModelConfig
    params: Params
    heads: ExitHeads = dataclasses.field(default_factory=dict)
    tokenizer: Any = None
    generation_config: dict = dataclasses.field(default_factory=dict)
    path: str | None = None
    mesh: Any = None

    @property
    def num_layers(self) -> int:
        return self.cfg.num_layers

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """EOS ids from generation_config.json, else from the tokenizer; may be empty."""
        eos = self.generation_config.get("eos_token_id")
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            return ()
        return tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))

    @property
    def draft(self) -> DraftWeights | None:
        """The draft model's weights paired with this model (`with_draft`), or None."""
        return self.params.get("draft") if isinstance(self.params, dict) else None

    def with_draft(self, draft: "Model") -> "Model":
        """This model with `draft` (a smaller `Model` of the same vocabulary) as its draft
        model: its weights join this model's parameters as `params["draft"]`
        (`draft_weights.py`), placed on this model's mesh, so the draft model drafter
        (method "draft", or `draft=` under "layerskip" / "hispec") finds them in every
        compiled loop. The draft may have a draft model of its own (HSD's two draft models:
        `target.with_draft(mid.with_draft(small))`), not a third. ValueError (one line) for
        a pair that does not share the vocabulary (`draft_weights.check_pair`), before
        anything compiles."""
        if not isinstance(draft, Model):
            raise ValueError(f"draft must be a loaded Model, got {type(draft).__name__}")
        inner = draft.draft
        if inner is not None and isinstance(inner.params, dict) and "draft" in inner.params:
            raise ValueError("three draft models: at most two (a draft model and its own)")
        check_pair(self, draft)
        draft = place_on_mesh(draft, self.mesh) if self.mesh is not None else draft
        params = {k: v for k, v in self.params.items() if k != "draft"}
        params["draft"] = DraftWeights(params=draft.params, cfg=draft.cfg)
        return dataclasses.replace(self, params=params)

    def exit_head_kinds(self) -> dict[int, str]:
        """Which head every exit uses: {exit: "shared" | "full" | "low_rank"}."""
        return {e: head_kind(self.cfg, self.heads, e) for e in range(1, self.cfg.num_layers + 1)}


def load_model(path, dtype: str | None = None, layer_layout: str | None = None,
               matmul_precision: str = "highest", mesh=None,
               out_major: bool | None = None, fused: bool | None = None,
               quantize: str | None = None) -> Model:
    """Loads a local Hugging Face directory or a llama.cpp `.gguf` file.

    Args:
      path: a directory with config.json and model.safetensors (or a sharded index), its
        tokenizer and exit heads; or a `.gguf` file (weights dequantized, tokenizer and chat
        template from its metadata; see `gguf_io.py`).
      dtype: "float32" or "bfloat16" to override the checkpoint's dtype (GGUF: the dtype
        weights are dequantized to; default float32).
      layer_layout: "scan" (stacked layer weights, scanned) or "unrolled" (per-layer
        weights, unrolled loop); None: "unrolled" on CPU and GPU, "scan" on TPU (see
        `params.default_layer_layout`). Training code that scans the stacked weights asks
        for "scan".
      out_major: whether the "unrolled" layout stores the layer projections transposed,
        [out..., in...] (`transformer.project`); None: `params.default_out_major`
        (off). The math is the same; only the matmul kernel differs.
      fused: whether the "unrolled" layout fuses q/k/v into one projection and gate/up into
        another (`params.fuse_layer`); None: `params.default_fused` (off on every backend
        until measured to pay), and off on a mesh of several devices (a fused weight
        shards over the kv heads only). The same math in fewer, larger products.
      quantize: "int8" for weight-only int8 layer projections (`params.quantize_layer`: a
        scale per output channel; the unrolled layout only), None to keep the dtype. Not
        exact: greedy output departs from the unquantized model's where two tokens' logits
        are close (docs/layer_layouts.md, "Weight-only int8").
      matmul_precision: "highest" (exact float32 matmuls on every backend: speculative
        greedy output equals AR), "high" or "default" (TF32/bfloat16 passes on GPUs/TPUs:
        faster, not exact); see `ModelConfig`.
      mesh: a `jax.sharding.Mesh` with axes ("data", "model") (`sharding.make_mesh`) to shard
        the parameters over (tensor parallel over "model", replicated over "data"); None: the
        mesh set by `jax.set_mesh`, if any, else one device. On a mesh, each process reads
        from a safetensors checkpoint only the slices its own devices hold
        (`lazy_weights`; over several processes, `hispec_jax.distributed`, no process reads
        the whole model) and places them; a GGUF file, or int8 / fused / out-major weights,
        are read whole on each host first.
    """
    path = Path(path)
    layout = layer_layout or default_layer_layout()
    if layout not in LAYER_LAYOUTS:  # before reading any weights
        raise ValueError(f"layer_layout={layout!r} is not one of {LAYER_LAYOUTS}")
    if quantize is not None and quantize not in WEIGHT_QUANTIZATIONS:
        raise ValueError(f"quantize={quantize!r} is not one of {WEIGHT_QUANTIZATIONS}")
    if quantize and layout != "unrolled":
        raise ValueError(f"quantize={quantize!r} needs layer_layout='unrolled', got {layout!r}")
    if matmul_precision not in MATMUL_PRECISIONS:
        raise ValueError(f"matmul_precision={matmul_precision!r} is not one of {MATMUL_PRECISIONS}")
    if mesh is None and not jax.sharding.get_mesh().empty:
        mesh = jax.sharding.get_mesh()
    if fused is None and mesh is not None and mesh.size > 1:
        fused = False
    if path.suffix.lower() == ".gguf":
        cfg, params, tokenizer, generation_config = gguf_io.load_checkpoint(
            path, dtype=dtype, layer_layout=layout, out_major=out_major, fused=fused,
            int8=bool(quantize))
        return place_on_mesh(Model(cfg=cfg.replace(matmul_precision=matmul_precision),
                                   params=params, tokenizer=tokenizer,
                                   generation_config=generation_config, path=str(path)), mesh)
    # the layout is arranged in host memory (NumPy compiles nothing), then placed at once
    # on a mesh, unless the layout computes on every weight (int8 scales, fused or
    # out-major projections), weights are read only where this process's devices hold them
    unrolled = layout == "unrolled"
    lazy = mesh is not None and not quantize and not (unrolled and (
        (default_fused() if fused is None else fused)
        or (default_out_major() if out_major is None else out_major)))
    cfg, params, heads, generation_config = hf_io.load_checkpoint(path, dtype=dtype, host=True,
                                                                  lazy=lazy)
    cfg = cfg.replace(matmul_precision=matmul_precision)
    params = with_layer_layout(params, layout, out_major, fused, int8=bool(quantize))
    if mesh is None:
        params, heads = jax.device_put((params, heads))
    # on a mesh, each device receives only its shards from host memory (`place_on_mesh`;
    # over several processes, each process places its own devices' shards)
    tokenizer = None
    if any((path / f).exists() for f in _TOKENIZER_FILES):
        from transformers import AutoTokenizer  # transformers' tokenizers need no torch

        tokenizer = AutoTokenizer.from_pretrained(str(path))
    return place_on_mesh(Model(cfg=cfg, params=params, heads=heads, tokenizer=tokenizer,
                               generation_config=generation_config, path=str(path)), mesh)


def place_on_mesh(model: Model, mesh) -> Model:
    """`model` with its parameters and exit heads sharded over `mesh` by the rule table
    (`sharding.RULES`); the model itself for None or its own mesh."""
    if mesh is None or mesh == model.mesh:
        return model
    params, heads = sharding.shard_params(model.cfg, model.params, model.heads, mesh)
    return dataclasses.replace(model, params=params, heads=heads, mesh=mesh)


def save_model(model: Model, path, max_shard_bytes: int | None = None) -> None:
    """Writes `model` in HF layout (loadable by `transformers.AutoModelForCausalLM`)."""
    hf_io.save_checkpoint(path, model.cfg, with_layer_layout(model.params, "scan"),
                          heads=model.heads or None,
                          generation_config=model.generation_config or None,
                          max_shard_bytes=max_shard_bytes)
    if model.tokenizer is not None:
        model.tokenizer.save_pretrained(str(path))
