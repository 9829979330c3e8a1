"""Weight-only int8 layer projections (`params.quantize_layer`, `load_model(quantize="int8")`):
the stored form and its round trip, each projection equal to the product with its
dequantized weight, the decoding methods exact against the quantized model's own AR, and
the loader's checks."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hispec_jax
from hispec_jax import generate
from hispec_jax.models import sharding, transformer
from hispec_jax.models.params import (PROJECTIONS, SCALE_SUFFIX, dequantize_layer, is_quantized,
                                      layer_dict_out_major, quantize_layer, with_layer_layout)

from test_engine import random_prompts, tiny_model


@pytest.mark.parametrize("out_major,fused", [(False, False), (True, False), (False, True),
                                             (True, True)])
def test_the_stored_form_and_its_round_trip(out_major, fused):
    params = tiny_model(3, 1).params
    q = with_layer_layout(params, "unrolled", out_major=out_major, fused=fused, int8=True)
    assert is_quantized(q) and not is_quantized(params)
    plain = with_layer_layout(params, "unrolled", out_major=out_major, fused=fused)
    for layer, want in zip(q["layers"], plain["layers"]):
        for key, w in want.items():
            name = key.removesuffix("_T")
            if name not in PROJECTIONS:
                np.testing.assert_array_equal(layer[key], w)  # norms untouched
                continue
            assert layer[key].dtype == jnp.int8 and layer[key].shape == w.shape
            scale = np.asarray(layer[name + SCALE_SUFFIX])
            out_shape = w.shape[PROJECTIONS[name][0]:] if key == name else \
                w.shape[:w.ndim - PROJECTIONS[name][0]]
            assert scale.shape == out_shape
            # every output channel uses the whole range, and is within half a step of w
            ints = np.abs(np.asarray(layer[key], np.int32))
            in_axes = tuple(range(PROJECTIONS[name][0])) if key == name else \
                tuple(range(w.ndim - PROJECTIONS[name][0], w.ndim))
            assert (ints.max(axis=in_axes) == 127).all()
            deq = np.asarray(dequantize_layer(layer)[key])
            bshape = ((1,) * len(in_axes) + scale.shape if key == name
                      else scale.shape + (1,) * len(in_axes))
            assert np.all(np.abs(deq - np.asarray(w)) <= 0.5 * scale.reshape(bshape) + 1e-7)
    # other layouts keep the int8 weights (requantized from the dequantized ones: the same
    # integers, the scales within an ulp)
    again = with_layer_layout(q, "unrolled", out_major=not out_major, fused=fused)
    assert is_quantized(again)
    back = with_layer_layout(again, "unrolled", out_major=out_major, fused=fused)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=0), back, q)
    for a, b in zip(back["layers"], q["layers"]):
        for key in b:
            if b[key].dtype == jnp.int8:
                np.testing.assert_array_equal(a[key], b[key])
    # the scan layout holds the dequantized canonical weights
    scan = with_layer_layout(q, "scan")
    assert not is_quantized(scan) and scan["layers"]["wq"].dtype == params["layers"]["wq"].dtype
    for name in PROJECTIONS:
        if name in params["layers"]:
            step = np.abs(np.asarray(params["layers"][name])).max() / 127
            np.testing.assert_allclose(scan["layers"][name], params["layers"][name], atol=step)
    with pytest.raises(ValueError, match="int8 weights need the unrolled layer layout"):
        with_layer_layout(params, "scan", int8=True)


def test_a_zero_channel_quantizes_to_zeros():
    layer = {"w_down": jnp.zeros((4, 3)).at[:, 1].set(jnp.asarray([0.5, -1.0, 0.25, 0.0]))}
    q = quantize_layer(layer)
    np.testing.assert_array_equal(q["w_down"][:, 0], 0)
    assert float(q["w_down_scale"][0]) == 1.0
    assert float(q["w_down_scale"][1]) == pytest.approx(1.0 / 127)
    np.testing.assert_array_equal(q["w_down"][:, 1], [64, -127, 32, 0])  # 0.5 / (1 / 127): 63.5
    np.testing.assert_allclose(dequantize_layer(q)["w_down"], layer["w_down"], atol=0.5 / 127)


@pytest.mark.parametrize("out_major", [False, True])
@pytest.mark.parametrize("rows", [1, 6])
def test_each_projection_is_the_product_with_its_dequantized_weight(out_major, rows):
    """`transformer.project` on int8 weights: the product with the int8 weight, scaled per
    output channel, equals x @ (q s) in float32 (one row: a decoding step; six: a block)."""
    params = tiny_model(2, 3).params
    q = with_layer_layout(params, "unrolled", out_major=out_major, fused=True, int8=True)
    layer = q["layers"][1]
    deq = dequantize_layer(layer)
    x = jax.random.normal(jax.random.key(0), (1, rows, 32), jnp.float32)
    for name in ("wqkv", "wo", "w_gate_up", "w_down"):
        key = name + ("_T" if out_major else "")
        width = int(np.prod(layer[key].shape[:PROJECTIONS[name][0]] if not out_major else
                            layer[key].shape[layer[key].ndim - PROJECTIONS[name][0]:]))
        xi = x if width == 32 else jax.random.normal(jax.random.key(1), (1, rows, width))
        got = transformer.project(layer, name, xi, "highest")
        want = transformer.project(deq, name, xi, "highest")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_methods_on_int8_weights_give_its_own_ar_tokens():
    """Quantization changes the model, not the decoding: every method on the int8 model
    gives the int8 model's AR tokens (greedy), and its layer passes as on float weights."""
    model = tiny_model(4, 0, 0.1)
    q = dataclasses.replace(model, params=with_layer_layout(model.params, "unrolled",
                                                            int8=True))
    prompts = random_prompts(np.random.RandomState(5), 3, 9)
    ar = generate(q, prompts, method="ar", max_new_tokens=12)
    for method, options in [("layerskip", {"draft_exit": 1}),
                            ("hispec", {"draft_exit": 1, "verify_exits": (2,)}),
                            ("lookup", {"lookup": 4})]:
        assert generate(q, prompts, method=method, max_new_tokens=12, **options).token_ids \
            == ar.token_ids, method


def test_sharding_axes_follow_the_int8_layout():
    """`sharding.param_axes` gives every int8 weight its projection's axes and every scale
    the projection's output axes (the trees match, so every array gets a sharding)."""
    model = tiny_model(2, 0)
    for om, fused in ((False, False), (True, True)):
        params = with_layer_layout(model.params, "unrolled", out_major=om, fused=fused,
                                   int8=True)
        axes = sharding.param_axes(model.cfg, params)
        is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)
        pairs = jax.tree.map(lambda a, w: len(a) == w.ndim, axes, params, is_leaf=is_axes)
        assert all(jax.tree.leaves(pairs))
        layer = layer_dict_out_major(axes["layers"][0], False)
        name = "wqkv" if fused else "wq"
        assert axes["layers"][0][name + SCALE_SUFFIX] == layer[name][1:]


def test_load_model_int8_and_its_errors(llama_dir):
    q = hispec_jax.load_model(llama_dir, layer_layout="unrolled", quantize="int8")
    plain = hispec_jax.load_model(llama_dir, layer_layout="unrolled")
    assert is_quantized(q.params) and not is_quantized(plain.params)
    # (quantized on the host while loading: NumPy's division, an ulp from XLA's in a scale)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=0), q.params,
                 with_layer_layout(plain.params, "unrolled", int8=True))
    with pytest.raises(ValueError, match="quantize='int4' is not one of"):
        hispec_jax.load_model(llama_dir, quantize="int4")
    with pytest.raises(ValueError, match="needs layer_layout='unrolled', got 'scan'"):
        hispec_jax.load_model(llama_dir, layer_layout="scan", quantize="int8")
