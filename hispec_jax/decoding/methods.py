"""Decoding methods: frozen dataclasses of static settings, each lowering one compiled loop.

Every method answers the same questions for `generate`: how many cache layers it needs,
how far past the last emitted token it may write (`lookahead`), how to lower its loop, and
how to summarize the loop's raw counters into stats.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hispec_jax.decoding.autoregressive import generate_autoregressive
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.model import Model


@dataclasses.dataclass(frozen=True)
class Autoregressive:
    """Token-by-token decoding from one exit: `exit_layer = L` is plain AR (`method=ar`);
    `exit_layer < L` is LayerSkip's lossy early-exit inference (`method=exit`)."""

    exit_layer: int

    def cache_layers(self, cfg: ModelConfig) -> int:
        return self.exit_layer

    def lookahead(self) -> int:
        return 0

    def lower(self, model: Model, req, cache, *, greedy: bool, prompt_block: int):
        exit_layer = self.exit_layer

        def run(params, heads, req, cache):
            state = generate_autoregressive(params, heads, req, cache, cfg=model.cfg,
                                            exit_layer=exit_layer, greedy=greedy,
                                            prompt_block=prompt_block)
            return state.out, {"rounds": state.rounds}

        import jax

        return jax.jit(run).lower(model.params, model.heads, req, cache)

    def summarize(self, raw: list[dict[str, Any]], new_tokens: int) -> dict[str, Any]:
        rounds = int(sum(np.asarray(r["rounds"]) for r in raw))
        return {
            "exit_layer": self.exit_layer,
            "rounds": rounds,
            # One sequential pass through `exit_layer` layers per emitted token.
            "layer_passes_per_token": float(self.exit_layer),
        }


def _check_exit(cfg: ModelConfig, name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer layer in [1, {cfg.num_layers}], got {value!r}")
    if not 1 <= value <= cfg.num_layers:
        raise ValueError(f"{name}={value} is outside [1, {cfg.num_layers}] "
                         f"(the model has {cfg.num_layers} layers)")
    return int(value)


METHODS = ("ar", "exit")


def make_method(model: Model, method: str, *, exit_layer: int | None = None, **options):
    """The decoding method object for `method` and its options; ValueError on bad settings."""
    cfg = model.cfg
    unused = {k: v for k, v in options.items() if v is not None and v is not False}
    if method == "ar":
        if unused or exit_layer is not None:
            raise ValueError(f"method 'ar' takes no options, got {sorted(unused) or ['exit_layer']}")
        return Autoregressive(exit_layer=cfg.num_layers)
    if method == "exit":
        if unused:
            raise ValueError(f"method 'exit' takes only exit_layer, got {sorted(unused)}")
        if exit_layer is None:
            raise ValueError("method 'exit' needs exit_layer")
        return Autoregressive(exit_layer=_check_exit(cfg, "exit_layer", exit_layer))
    raise ValueError(f"method={method!r} is not one of {METHODS}")
