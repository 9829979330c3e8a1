"""Full-size shapes trace and lower without allocating: Llama-3-8B and Llama-2-70B.

Only `jax.eval_shape` and `jit(...).lower(...)` run here (no `.compile()`, no weights):
parameters come from `shape_structs(cfg)`, caches and requests are `ShapeDtypeStruct`s.
Layers run as a `lax.scan`, so the lowered program must not grow with depth.
"""

import functools
import time

import jax
import jax.numpy as jnp
import pytest

from hispec_jax.decoding.engine import Engine, Hierarchy, Shapes
from hispec_jax.decoding.generate import plan_shapes
from hispec_jax.decoding.methods import make_method
from hispec_jax.decoding.prefill import prefill
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.model import Model
from hispec_jax.models.params import shape_structs
from hispec_jax.models.transformer import embed, run_layers_cached

LLAMA3_8B = ModelConfig(
    model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
    num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling=tuple(sorted({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}.items())),
    max_position_embeddings=131072, tie_word_embeddings=False, dtype="bfloat16")

LLAMA2_70B = ModelConfig(
    model_type="llama", vocab_size=32000, hidden_size=8192, intermediate_size=28672,
    num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5,
    max_position_embeddings=4096, tie_word_embeddings=False, dtype="bfloat16")

CONFIGS = {"llama3_8b": LLAMA3_8B, "llama2_70b": LLAMA2_70B}
BATCH, BLOCK, CAPACITY = 1, 128, 4096
BF16 = jnp.bfloat16
I32 = jnp.int32


def sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def cache_structs(cfg, batch=BATCH, capacity=CAPACITY, layers=None):
    shape = (layers or cfg.num_layers, batch, cfg.num_kv_heads, capacity, cfg.head_dim)
    return KVCache(k=sds(shape, BF16), v=sds(shape, BF16))


def live_bytes():
    return sum(a.nbytes for a in jax.live_arrays())


@pytest.fixture(autouse=True)
def no_allocation():
    """Nothing of model size may be allocated by tracing or lowering."""
    before = live_bytes()
    yield
    assert live_bytes() - before < 64 * 2**20


@pytest.mark.parametrize("name", CONFIGS)
def test_param_shapes(name):
    cfg = CONFIGS[name]
    params = shape_structs(cfg)
    L, D, F, V = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    assert params["embed"].shape == (V, D) and params["lm_head"].shape == (D, V)
    assert params["layers"]["wq"].shape == (L, D, cfg.num_heads, cfg.head_dim)
    assert params["layers"]["wk"].shape == (L, D, cfg.num_kv_heads, cfg.head_dim)
    assert params["layers"]["w_down"].shape == (L, F, D)
    assert all(x.dtype == BF16 for x in jax.tree.leaves(params))
    count = sum(x.size for x in jax.tree.leaves(params))
    expected = {"llama3_8b": 8.03e9, "llama2_70b": 68.98e9}[name]
    assert abs(count - expected) / expected < 0.01, count


@pytest.mark.parametrize("name", CONFIGS)
def test_prefill_eval_shape(name):
    cfg = CONFIGS[name]
    L = cfg.num_layers
    fn = functools.partial(prefill, cfg=cfg, stop=L, chunk=BLOCK)
    h, cache = jax.eval_shape(
        lambda p, t, n, c: fn(p, tokens_BxS=t, lengths_B=n, cache=c),
        shape_structs(cfg), sds((BATCH, CAPACITY), I32), sds((BATCH,), I32), cache_structs(cfg))
    assert h.shape == (BATCH, cfg.hidden_size) and h.dtype == BF16
    expected = (L, BATCH, cfg.num_kv_heads, CAPACITY, cfg.head_dim)
    assert cache.k.shape == expected and cache.v.shape == expected
    assert cache.k.dtype == BF16 and cache.v.dtype == BF16


def lower_decode_step(cfg):
    L = cfg.num_layers

    def step(params, token_Bx1, positions_Bx1, cache):
        h, cache = run_layers_cached(params, cfg, embed(params, token_Bx1), positions_Bx1, cache, 0, L)
        return exit_logits(params, {}, cfg, h, L), cache

    return jax.jit(step).lower(shape_structs(cfg), sds((BATCH, 1), I32), sds((BATCH, 1), I32),
                               cache_structs(cfg))


def lower_ar_loop(cfg, greedy=True):
    """The whole autoregressive loop (prefill + while loop): the engine with one level."""
    model = Model(cfg=cfg, params=shape_structs(cfg))
    engine = Engine.for_model(model, Hierarchy(exits=(cfg.num_layers,)),
                              Shapes(batch=BATCH, capacity=CAPACITY, prompt_block=BLOCK), greedy)
    return engine.lower()


@pytest.mark.parametrize("name", CONFIGS)
def test_decode_step_lowers(name):
    cfg = CONFIGS[name]
    lowered = lower_decode_step(cfg)
    logits, cache = lowered.out_info
    assert logits.shape == (BATCH, 1, cfg.vocab_size) and logits.dtype == jnp.float32
    assert cache.k.shape == (cfg.num_layers, BATCH, cfg.num_kv_heads, CAPACITY, cfg.head_dim)
    assert "while" in lowered.as_text()  # the layer scan


@pytest.mark.parametrize("greedy", [True, False])
def test_ar_loop_lowers_8b(greedy):
    cfg = LLAMA3_8B
    lowered = lower_ar_loop(cfg, greedy)
    out, counters, cache = lowered.out_info
    assert out.tokens_BxS.shape == (BATCH, CAPACITY)
    assert out.num_new_B.shape == (BATCH,)
    assert counters.rounds.shape == ()
    assert cache.k.shape == (cfg.num_layers, BATCH, cfg.num_kv_heads, CAPACITY, cfg.head_dim)


def test_method_lowers_like_generate_does():
    """The exact path `generate` takes (`make_method`, `plan_shapes`, `Engine.lower`), with a
    shape-only Model and a 100-token prompt: AR, early exit, LayerSkip, HiSpec."""
    cfg = LLAMA3_8B
    model = Model(cfg=cfg, params=shape_structs(cfg))
    for method, opts in (("ar", {}), ("exit", {"exit_layer": 8}),
                         ("layerskip", {"draft_exit": 4}),
                         ("hispec", {"draft_exit": 4, "verify_exits": (8,)})):
        decoder = make_method(model, method, **opts)
        block, capacity = plan_shapes(100, 64, decoder.lookahead(), cfg.max_position_embeddings,
                                      None)
        assert block == 128 and capacity >= 100 + 64 + decoder.lookahead()
        engine = Engine.for_model(model, decoder.hierarchy,
                                  Shapes(batch=BATCH, capacity=capacity, prompt_block=block))
        out, _, cache = engine.lower().out_info
        assert out.tokens_BxS.shape == (BATCH, capacity), method
        assert out.num_new_B.shape == (BATCH,), method
        assert cache.k.shape == (decoder.cache_layers, BATCH, cfg.num_kv_heads, capacity,
                                 cfg.head_dim), method


def lower_hispec_loop(cfg):
    model = Model(cfg=cfg, params=shape_structs(cfg))
    decoder = make_method(model, "hispec", draft_exit=4, verify_exits=(8,))
    engine = Engine.for_model(model, decoder.hierarchy,
                              Shapes(batch=BATCH, capacity=1024, prompt_block=BLOCK))
    return engine.lower()


def test_lowered_size_does_not_grow_with_depth():
    sizes, seconds = {}, {}
    for name, cfg in CONFIGS.items():
        lower_decode_step(cfg)  # warm tracing caches
        t0 = time.perf_counter()
        sizes[name, "step"] = len(lower_decode_step(cfg).as_text())
        sizes[name, "loop"] = len(lower_ar_loop(cfg).as_text())
        seconds[name] = time.perf_counter() - t0
        sizes[name, "hispec"] = len(lower_hispec_loop(cfg).as_text())
    for what in ("step", "loop", "hispec"):
        ratio = sizes["llama2_70b", what] / sizes["llama3_8b", what]
        assert ratio < 1.5, (what, sizes)
    # 80 vs 32 layers: lowering time is per program, not per layer (generous for noisy CI)
    assert seconds["llama2_70b"] < 3 * seconds["llama3_8b"] + 2.0, seconds
