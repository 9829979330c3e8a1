"""Every matmul of the model carries the configured precision (float32 models: "highest").

What these tests check: the precision label of every dot in the lowered decoding loop.
Why it matters is a GPU/TPU claim that no test here can check: there the default
precision rounds float32 inputs to TF32/bfloat16, and "highest" is what keeps speculative
greedy output equal to AR (docs/numerics.md). That equality on an accelerator is checked
by `hispec bench-tool accelerator` on the device (docs/accelerator_checks.md; pending). On
the CPU float32 dots are exact under either setting, which the last test records."""

import re

import jax
import jax.numpy as jnp
import pytest

from hispec_jax import Model, ModelConfig, load_model
from hispec_jax.bench.roofline import ar_engine
from hispec_jax.models.params import init_params, with_layer_layout


def tiny(precision: str | None = None, tie: bool = False) -> Model:
    extra = {} if precision is None else {"matmul_precision": precision}
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                      tie_word_embeddings=tie, **extra)
    return Model(cfg=cfg, params=with_layer_layout(init_params(cfg, jax.random.PRNGKey(0)),
                                                   "unrolled"))


def dot_precisions(model: Model, batch: int) -> list[str]:
    """The precision of every dot_general in the lowered (unoptimized) engine loop."""
    text = ar_engine(model, batch, 32).lower().as_text()
    dots = re.findall(r"stablehlo\.dot_general.*", text)
    assert dots
    return [m.group(1) if (m := re.search(r"precision = \[(\w+), \w+\]", d)) else "none"
            for d in dots]


@pytest.mark.parametrize("tie", [False, True])
def test_default_is_highest_everywhere(tie):
    assert tiny(tie=tie).cfg.precision == jax.lax.Precision.HIGHEST
    # batch 2: prefill blocks and decoding dots (one query per sequence uses no dot on CPU)
    assert set(dot_precisions(tiny(tie=tie), batch=2)) == {"HIGHEST"}


def test_configurable():
    assert set(dot_precisions(tiny("default"), batch=1)) == {"DEFAULT"}


def test_bad_precision_is_named(tmp_path):
    with pytest.raises(ValueError, match="matmul_precision='fast' is not one of"):
        tiny("fast")
    with pytest.raises(ValueError, match="matmul_precision='fast' is not one of"):
        load_model(tmp_path / "nothing-here", matmul_precision="fast")


def test_cpu_ignores_the_precision_setting():
    """A platform fact the docs rely on, not a check of the library: on the CPU float32
    matmuls are exact either way, so the setting changes no logit (CPU results stand for
    both settings; GPU/TPU results do not)."""
    from hispec_jax.models.heads import exit_logits
    from hispec_jax.models.kv_cache import KVCache
    from hispec_jax.models.transformer import embed, run_layers_cached
    outs = []
    for precision in ("highest", "default"):
        m = tiny(precision)
        tokens = jnp.arange(6)[None]
        x, _ = run_layers_cached(m.params, m.cfg, embed(m.params, tokens), jnp.arange(6)[None],
                                 KVCache.zeros(m.cfg, 1, 8), 0, 2)
        outs.append(exit_logits(m.params, {}, m.cfg, x, 2))
    assert jnp.array_equal(outs[0], outs[1])
