"""Adapter exit heads (a residual MLP block before the head's norm + projection): the block's
math and cost, identity at initialization, the file format, greedy output equal to AR and
the sampling distribution exact with them, training through `train-heads`, bad settings."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

import test_sampling_exact as exact
from hispec_jax import cli, load_model
from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.models import hf_io, sharding
from hispec_jax.models.heads import (exit_logits, head_cost_layers, head_kind, head_macs,
                                     layer_macs, lm_head_matrix)
from hispec_jax.models.params import head_specs, init_from_specs
from hispec_jax.models.transformer import rms_norm
from hispec_jax.train_heads import draft_vocab
from hispec_jax.train_heads.heads import init_heads
from test_engine import check_equals_autoregressive, random_prompts, tiny_model
from test_train_heads import model, model_dir, read_metrics, small_config  # noqa: F401


def _adapter_heads(cfg, kinds: dict[int, dict], std=0.3):
    """Random adapter heads (down projection not zero, so the block changes the states)."""
    return {str(e): init_from_specs(head_specs(cfg, **k), jax.random.key(e), jnp.float32, std)
            | {"adapter_down": std * jax.random.normal(jax.random.key(100 + e),
                                                       (k["adapter_width"], cfg.hidden_size))}
            for e, k in kinds.items()}


SHARED = dict(adapter_width=8, projection="shared")
GELU_LOW_RANK = dict(adapter_width=6, adapter_act="gelu", rank=5)


def test_adapter_logits_cost_and_identity_at_init():
    m = tiny_model(4, 0)
    cfg, params = m.cfg, m.params
    heads = _adapter_heads(cfg, {1: SHARED, 2: GELU_LOW_RANK})
    assert [head_kind(cfg, heads, e) for e in (1, 2, 3)] == ["adapter", "adapter_low_rank", "shared"]
    h = jax.random.normal(jax.random.key(3), (2, 5, cfg.hidden_size))
    # exit 1: h + SwiGLU(norm(h)), then the shared final norm + LM head
    a = heads["1"]
    x = rms_norm(h, a["adapter_norm"], cfg.rms_norm_eps)
    h1 = h + (jax.nn.silu(x @ a["adapter_gate"]) * (x @ a["adapter_up"])) @ a["adapter_down"]
    want = rms_norm(h1, params["final_norm"], cfg.rms_norm_eps) @ lm_head_matrix(params, cfg)
    np.testing.assert_allclose(exit_logits(params, heads, cfg, h, 1), want, rtol=1e-4, atol=1e-4)
    # exit 2: h + GELU MLP, then its own low-rank projection
    b = heads["2"]
    x = rms_norm(h, b["adapter_norm"], cfg.rms_norm_eps)
    h2 = h + jax.nn.gelu(x @ b["adapter_up"]) @ b["adapter_down"]
    want = rms_norm(h2, b["norm"], cfg.rms_norm_eps) @ b["proj_down"] @ b["proj_up"]
    np.testing.assert_allclose(exit_logits(params, heads, cfg, h, 2), want, rtol=1e-4, atol=1e-4)
    # cost: the block's matrices + the projection, in layer equivalents
    D, V = cfg.hidden_size, cfg.vocab_size
    assert head_macs(cfg, heads, 1) == 3 * D * 8 + D * V
    assert head_macs(cfg, heads, 2) == 2 * D * 6 + D * 5 + 5 * V
    assert head_cost_layers(cfg, heads, 1) == pytest.approx((3 * D * 8 + D * V) / layer_macs(cfg))
    # trained-head init: the block starts as the identity, so step 0 is the shared head
    for kind in (SHARED, dict(adapter_width=8, rank=None)):
        init = init_heads(params, cfg, (1, 2), **kind)
        assert float(jnp.abs(init["1"]["adapter_up"]).max()) > 0
        np.testing.assert_allclose(exit_logits(params, init, cfg, h, 2),
                                   exit_logits(params, {}, cfg, h, 2), rtol=1e-5, atol=1e-5)
    # a draft vocabulary over an adapter head with the shared projection takes the LM head's columns
    vocab = np.array([0, 5, 9, 33], np.int32)
    restricted = draft_vocab.restrict_heads(dataclasses.replace(m, heads=heads), (1,), vocab)
    assert head_kind(cfg, restricted, 1) == "adapter_full"
    np.testing.assert_allclose(exit_logits(params, restricted, cfg, h, 1)[..., vocab],
                               exit_logits(params, heads, cfg, h, 1)[..., vocab], rtol=1e-5,
                               atol=1e-5)


def test_adapter_heads_round_trip_and_shard_axes(tmp_path):
    cfg = tiny_model(4, 0).cfg
    heads = _adapter_heads(cfg, {1: SHARED, 2: GELU_LOW_RANK})
    heads["2"]["vocab"] = jnp.asarray([1, 4, 9, 20, 30], jnp.int32)
    heads["2"]["proj_up"] = heads["2"]["proj_up"][:, :5]
    hf_io.save_exit_heads(tmp_path, cfg, heads)
    tensors = safetensors.numpy.load_file(tmp_path / hf_io.HEADS_FILENAME)
    assert tensors["exit_heads.1.adapter_gate.weight"].shape == (8, cfg.hidden_size)  # HF [out, in]
    assert tensors["exit_heads.1.adapter_down.weight"].shape == (cfg.hidden_size, 8)
    assert "exit_heads.1.norm.weight" not in tensors and "exit_heads.2.adapter_gate.weight" not in tensors
    loaded = hf_io.load_exit_heads(tmp_path, cfg)
    for e in heads:
        assert set(loaded[e]) == set(heads[e])
        for part in heads[e]:
            np.testing.assert_array_equal(loaded[e][part], heads[e][part])
    axes = sharding.heads_axes(cfg, loaded)
    assert axes["1"]["adapter_up"] == ("embed", "mlp") and axes["2"]["adapter_down"] == ("mlp", "embed")
    # a file missing one of the block's tensors is a clear error
    del tensors["exit_heads.1.adapter_down.weight"]
    safetensors.numpy.save_file(tensors, tmp_path / hf_io.HEADS_FILENAME,
                                metadata={"format": "pt", "exit_layers": "1,2"})
    with pytest.raises(ValueError, match="missing tensor 'exit_heads.1.adapter_down.weight'"):
        hf_io.load_exit_heads(tmp_path, cfg)


@pytest.mark.parametrize("method,options", [
    ("layerskip", dict(draft_exit=1, draft_len=3)),
    ("hispec", dict(draft_exit=1, verify_exits=(2,), draft_len=2, verify_window=3)),
])
def test_greedy_equals_autoregressive_with_adapter_heads(method, options):
    model = tiny_model(4, 1)
    model = dataclasses.replace(model, heads=_adapter_heads(model.cfg, {1: SHARED, 2: GELU_LOW_RANK}))
    rng = np.random.RandomState(0)
    check_equals_autoregressive(model, random_prompts(rng, 3, 9),
                                dict(max_new=16, ignore_eos=False, tight_cache=True), method, options)


def test_sampling_matches_exact_distribution_with_adapter_heads():
    model = exact.small_model()
    heads = _adapter_heads(model.cfg, {1: dict(adapter_width=4, projection="shared"),
                                       2: dict(adapter_width=4, adapter_act="gelu")}, std=0.5)
    model = dataclasses.replace(model, heads=heads)
    sampling = SamplingParams(temperature=1.0, top_k=0, seed=11)
    probs = exact.exact_ar_distribution(model, sampling)
    got = exact.sample(model, "hispec", sampling, draft_exit=1, verify_exits=(2,), draft_len=2,
                       verify_window=2)
    stat, threshold = exact.chi_square_test(got, probs, exact.N_SAMPLES)
    assert stat < threshold, (stat, threshold)


def test_train_heads_trains_a_shared_projection_adapter(tmp_path, model_dir, model):  # noqa: F811
    """A few steps of `train-heads` with adapters in front of the frozen LM head: the block
    moves, the loss falls, the saved heads load and decode."""
    config = small_config(tmp_path, model_dir, head_adapter_width=8, head_projection="shared",
                          head_rank=0, total_steps=12, eval_every=12, learning_rate=1e-2)
    from hispec_jax.train_heads.train import train
    result = train(config, log=lambda s: None)
    head = result.heads["1"]
    assert set(head) == {"adapter_norm", "adapter_gate", "adapter_up", "adapter_down"}
    assert float(jnp.abs(head["adapter_down"]).max()) > 1e-4
    evals = [r["exits"] for r in read_metrics(config.workdir) if r["event"] == "eval"]
    assert [r["step"] for r in read_metrics(config.workdir) if r["event"] == "eval"] == [0, 12]
    for e in ("1", "2"):  # held-out KL to the final layer falls
        assert evals[1][e]["kl"] < evals[0][e]["kl"]
    loaded = load_model(result.output_dir)
    assert loaded.exit_head_kinds()[1] == "adapter"
    np.testing.assert_allclose(loaded.heads["2"]["adapter_down"], result.heads["2"]["adapter_down"],
                               rtol=1e-6)


@pytest.mark.parametrize("args, message", [
    (["--config.head_projection=shared"], "head_projection='shared' needs head_adapter_width > 0"),
    (["--config.head_projection=shared", "--config.head_adapter_width=8"],
     "head_projection='shared' needs head_adapter_width > 0 and head_rank = 0"),
    (["--config.head_adapter_act=relu"], "head_adapter_act='relu' must be one of"),
    (["--config.head_projection=tied"], "head_projection='tied' must be one of"),
    (["--config.head_adapter_width=-1"], "head_adapter_width' must be >= 0"),
])
def test_bad_adapter_settings_are_one_line_errors(capsys, args, message):
    assert cli.main(["train-heads", "--config", "configs/train_heads_small.py",
                     "--config.model_path=/m", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
