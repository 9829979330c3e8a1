"""One compiled AR decoding step reads what it must and nothing more (no weight or cache
copies), by XLA's own cost analysis against the analytic bytes (weights + KV read)."""

import jax
import pytest

from hispec_jax import Model, ModelConfig
from hispec_jax.bench.roofline import compiled_step_bytes
from hispec_jax.models.params import default_layer_layout, init_params, with_layer_layout


def model(layout: str) -> Model:
    cfg = ModelConfig(model_type="llama", vocab_size=2048, hidden_size=128, intermediate_size=384,
                      num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                      max_position_embeddings=2048)
    return Model(cfg=cfg, params=with_layer_layout(init_params(cfg, jax.random.PRNGKey(0)), layout))


@pytest.mark.parametrize("batch,capacity,tolerance", [(1, 64, 0.10), (1, 1024, 0.10),
                                                      (2, 1024, 0.15)])
def test_ar_step_bytes_at_the_roofline(batch, capacity, tolerance, monkeypatch, users_codegen):
    """The default layout on this backend (unrolled on CPU). At capacity 1024 the KV cache
    is a third of the bytes, so a single copy of a cache layer per step would show. Batch
    > 1 adds XLA's charge for in-place scatters (whole operand + output per KV write) and
    the keys' relayout for the score products that XLA:CPU makes (~0.5 x KV).

    The attention reads the whole cache here (one span): with the used-slot spans
    (`transformer.attention_spans`) each layer's attention is a `lax.switch` whose every
    branch a static cost analysis counts, though a step runs one. The branches are the
    same attention on a shorter prefix; that no cache layer is copied around the switches
    is checked on the op list of the engine's round below (copies of a few bytes only)."""
    from hispec_jax.models import transformer

    monkeypatch.setattr(transformer, "attention_spans", lambda capacity: (capacity,))
    jax.clear_caches()  # no trace of the step with spans may be reused
    step = compiled_step_bytes(model(default_layer_layout()), batch, capacity)
    jax.clear_caches()
    assert step.kv_read > 0.3 * step.analytic or capacity < 1024
    assert abs(step.ratio - 1) < tolerance, step


def test_cpu_default_layout_is_unrolled():
    """The scanned layout slices every layer's weights out of the stacked arrays inside the
    loop, which XLA:CPU and XLA:GPU materialize (cost analysis: ~2x the analytic bytes at
    batch 1 even though it counts the loop body once); TPU keeps "scan"."""
    assert jax.default_backend() != "cpu" or default_layer_layout() == "unrolled"


@pytest.mark.parametrize("batch", [1, 4])
def test_engine_ar_round_is_the_minimal_step_plus_bookkeeping(batch, users_codegen):
    """The engine's AR round compiles to what a hand-written AR step does (embed, layers
    with KV writes, LM head, argmax) plus a fixed handful of small integer ops (budgets,
    positions, the token buffer: 25 here, whatever the model's size) and no copy of
    anything larger than a few integers per sequence. On a GPU each op is a kernel, so
    this is the engine's fixed cost per AR token."""
    from hispec_jax.bench.roofline import engine_ar_step, minimal_ar_step, step_ops

    m = model("unrolled")
    engine, minimal = (step_ops(f(m, batch, 256)) for f in (engine_ar_step, minimal_ar_step))
    assert engine.counts["dot"] == minimal.counts["dot"]
    assert minimal.total < engine.total <= minimal.total + 32, (engine, minimal)
    assert all(b <= 16 * batch for b in engine.copy_bytes), engine.copy_bytes
