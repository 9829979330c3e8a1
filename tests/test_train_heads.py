"""Exit-head distillation: init, loss, cached vs. uncached features, frozen base, orbax
kill-and-resume determinism, and heads that `load_model` / `generate` pick up.

Everything runs on a tiny random Llama model and random token rows (no data download).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hispec_jax
from hispec_jax import Model, ModelConfig, cli, load_model, save_model
from hispec_jax.models.heads import exit_logits, lm_head_matrix
from hispec_jax.models.params import ParamSpec, param_specs, with_layer_layout
from hispec_jax.train_heads import config as config_lib
from hispec_jax.train_heads import losses, steps
from hispec_jax.train_heads.features import FeatureCache, compute_features
from hispec_jax.train_heads.heads import init_heads, low_rank_factors
from hispec_jax.train_heads.train import METRICS_FILENAME, train

REPO = Path(__file__).resolve().parents[1]
TINY = ModelConfig(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=64,
                   num_layers=4, num_heads=2, num_kv_heads=1, head_dim=16,
                   max_position_embeddings=64)


def random_params(cfg, seed, std=0.3):
    """Random parameters from numpy (`init_params` compiles a sampler per shape: slow here)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: jnp.ones(s.shape) if s.init == "ones"
        else jnp.asarray(std * rng.standard_normal(s.shape), jnp.float32),
        param_specs(cfg), is_leaf=lambda x: isinstance(x, ParamSpec))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_model")
    params = random_params(TINY, 0)
    save_model(Model(cfg=TINY, params=params, generation_config={"eos_token_id": 2}), path)
    return path


@pytest.fixture(scope="module")
def model(model_dir):
    return load_model(model_dir)


def small_config(tmp_path, model_dir, **overrides):
    config = config_lib.load_config("train_heads_small", {"model_path": str(model_dir)})
    config.workdir = str(tmp_path / "work")
    config.cache_dir = str(tmp_path / "cache")
    config.output_dir = str(tmp_path / "out")
    config.progress_bar = False
    for key, value in overrides.items():
        config[key] = value
    config_lib.check_config(config)
    return config


def read_metrics(workdir):
    lines = (Path(workdir) / METRICS_FILENAME).read_text().splitlines()
    return [json.loads(line) for line in lines]


# ----- heads init ------------------------------------------------------------------------

def test_low_rank_init_reproduces_lm_head_at_full_rank():
    w = np.random.default_rng(1).standard_normal((32, 96)).astype(np.float32)
    down, up = low_rank_factors(jnp.asarray(w), rank=32)
    assert down.shape == (32, 32) and up.shape == (32, 96)
    np.testing.assert_allclose(np.asarray(down @ up), w, rtol=0, atol=2e-5 * np.abs(w).max())
    # Lower rank: the best rank-R approximation (Eckart–Young), with balanced factors.
    u, s, vt = np.linalg.svd(w.astype(np.float64), full_matrices=False)
    for rank in (1, 5):
        down, up = low_rank_factors(jnp.asarray(w), rank)
        best = (u[:, :rank] * s[:rank]) @ vt[:rank]
        np.testing.assert_allclose(np.asarray(down @ up), best, atol=1e-4)
        np.testing.assert_allclose(np.linalg.norm(np.asarray(down), axis=0),
                                   np.linalg.norm(np.asarray(up), axis=1), rtol=1e-4)


@pytest.mark.parametrize("tied", [False, True])
def test_initial_heads_are_the_shared_head(tied):
    cfg = TINY.replace(tie_word_embeddings=tied)
    params = random_params(cfg, 2)
    h = jnp.asarray(np.random.default_rng(3).standard_normal((2, 5, cfg.hidden_size)), jnp.float32)
    shared = exit_logits(params, {}, cfg, h, 2)
    full = init_heads(params, cfg, (1, 2), rank=None)
    assert set(full) == {"1", "2"}
    np.testing.assert_array_equal(full["2"]["proj"], lm_head_matrix(params, cfg))
    np.testing.assert_array_equal(full["2"]["norm"], params["final_norm"])
    np.testing.assert_allclose(exit_logits(params, full, cfg, h, 2), shared, atol=1e-5)
    low = init_heads(params, cfg, (1, 2), rank=cfg.hidden_size)
    np.testing.assert_allclose(exit_logits(params, low, cfg, h, 2), shared, atol=1e-4)
    with pytest.raises(ValueError, match="outside"):
        init_heads(params, cfg, (4,))  # exit L needs no head
    with pytest.raises(ValueError, match="rank"):
        init_heads(params, cfg, (1,), rank=cfg.hidden_size + 1)


# ----- loss -------------------------------------------------------------------------------

def test_topk_kl_is_exact_at_full_vocab_and_a_lower_bound_below():
    rng = np.random.default_rng(4)
    teacher = jnp.asarray(3.0 * rng.standard_normal((2, 6, 40)), jnp.float32)
    student = jnp.asarray(3.0 * rng.standard_normal((2, 6, 40)), jnp.float32)
    T = 2.0
    loss = jax.jit(lambda s, k: losses.distill_loss(losses.make_targets(teacher, T, k), s, T),
                   static_argnums=1)
    full = loss(student, 0)
    p, q = jax.nn.softmax(teacher / T), jax.nn.softmax(student / T)
    reference = T**2 * jnp.mean(jnp.sum(p * (jnp.log(p) - jnp.log(q)), -1))
    np.testing.assert_allclose(full, reference, rtol=1e-5)
    np.testing.assert_allclose(loss(student, 40), full, rtol=1e-5)
    # Coarse-graining onto top-k + tail: KL_k grows with k and stays <= KL.
    topk = [float(loss(student, k)) for k in (1, 8, 39)]
    assert topk == sorted(topk) and topk[-1] <= float(full) * (1 + 1e-5)
    assert float(loss(teacher, 8)) < 1e-6
    grads = jax.jit(jax.grad(loss), static_argnums=1)(student, 8)
    assert bool(jnp.all(jnp.isfinite(grads))) and float(jnp.abs(grads).max()) > 0


# ----- training ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory, model):
    """One 30-step run of configs/train_heads_small.py (feature cache on) on the tiny model."""
    tmp_path = tmp_path_factory.mktemp("trained")
    before = jax.tree.map(lambda x: np.array(x, copy=True), model.params)
    config = small_config(tmp_path, model.path)
    logs = []
    result = train(config, model=model, log=logs.append)
    return config, result, logs, before


def check_heads_moved(heads, model, rank=16):
    """Every parameter of every trained head differs from its initialization (a copy of the
    shared head, `init_heads`)."""
    init = init_heads(model.params, model.cfg, (1, 2), rank=rank)
    assert set(heads) == set(init)
    for e in init:
        for name, x0 in init[e].items():
            moved = float(jnp.max(jnp.abs(jnp.asarray(heads[e][name]) - x0)))
            assert moved > 1e-6, f"exit {e} {name} did not move from its initialization"


def test_training_lowers_kl(trained, model):
    config, result, logs, _ = trained
    evals = [r for r in read_metrics(config.workdir) if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [0, 10, 20, 30]
    for e in ("1", "2"):
        assert evals[-1]["exits"][e]["kl"] < 0.95 * evals[0]["exits"][e]["kl"]
        assert 0.0 <= evals[-1]["exits"][e]["top1_agreement"] <= 1.0
    first = np.mean([result.losses[s] for s in range(5)])
    last = np.mean([result.losses[s] for s in range(25, 30)])
    assert last < first
    assert result.tokens_per_second > 0 and result.cache_build_seconds > 0
    assert any("tokens/s" in line for line in logs)
    # The heads moved away from their initialization and are float32 master copies.
    check_heads_moved(result.heads, model)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(result.heads))


def test_hard_loss_is_cross_entropy_on_the_teachers_greedy_token():
    teacher = jnp.asarray([[[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]]])
    student = jnp.asarray([[[1.0, 0.5, 0.0], [0.0, 0.0, 4.0]]])
    targets = losses.make_targets(teacher, temperature=2.0, top_k=2)
    log_q = jax.nn.log_softmax(student, axis=-1)
    expected = -(log_q[0, 0, 1] + log_q[0, 1, 0]) / 2  # teacher's argmax: 1, then 0
    np.testing.assert_allclose(losses.hard_loss(targets, student), expected, rtol=1e-6)
    mask = jnp.asarray([[True, False]])
    np.testing.assert_allclose(losses.hard_loss(targets, student, mask), -log_q[0, 0, 1], rtol=1e-6)


def test_ce_training_lowers_its_loss_and_keeps_the_kl_metric(tmp_path, model):
    config = small_config(tmp_path, model.path, loss="ce", feature_cache=False, total_steps=20,
                          eval_every=20)
    result = train(config, model=model, log=lambda _: None)
    first = np.mean([result.losses[s] for s in range(4)])
    last = np.mean([result.losses[s] for s in range(16, 20)])
    assert last < first
    evals = [r for r in read_metrics(config.workdir) if r["event"] == "eval"]
    assert {"kl", "top1_agreement"} <= set(evals[-1]["exits"]["1"])


def test_head_check_catches_a_step_that_does_not_update(tmp_path, model, monkeypatch):
    """Negative control: a training step that returns the heads it was given (the optimizer
    runs, nothing is applied) fails `check_heads_moved`."""
    update = steps._update

    def frozen_update(state, *args, **kwargs):
        new_state, metrics = update(state, *args, **kwargs)
        return {**new_state, "heads": state["heads"]}, metrics

    monkeypatch.setattr(steps, "_update", frozen_update)
    jax.clear_caches()  # the jitted steps must trace the mutant
    try:
        result = train(small_config(tmp_path, model.path, total_steps=3, eval_every=0,
                                    feature_cache=False), model=model, log=lambda _: None)
    finally:
        jax.clear_caches()
    with pytest.raises(AssertionError, match="did not move"):
        check_heads_moved(result.heads, model)


def test_base_params_bit_identical_after_training(trained, model):
    """The model training saved (base weights + heads, what `load_model` gives a user
    afterwards) has the base weights it was trained on, bit for bit."""
    config, result, _, before = trained
    saved = load_model(result.output_dir)
    assert set(saved.heads) == {"1", "2"}
    as_scan = lambda p: jax.tree.map(np.asarray, with_layer_layout(p, "scan"))
    jax.tree.map(np.testing.assert_array_equal, as_scan(before), as_scan(saved.params))


def test_feature_cache_matches_uncached_training(tmp_path, trained, model):
    config, cached, _, _ = trained
    uncached = train(small_config(tmp_path / "b", model.path, feature_cache=False),
                     model=model, log=lambda _: None)
    # float32 cache: identical inputs, so identical losses (step 0 and every later step).
    np.testing.assert_allclose(uncached.losses[0], cached.losses[0], rtol=1e-6)
    np.testing.assert_allclose([uncached.losses[s] for s in range(30)],
                               [cached.losses[s] for s in range(30)], rtol=1e-5)
    # Same rows and settings: a new run reuses the cache and trains identically.
    logs = []
    again = train(small_config(tmp_path / "c", model.path, cache_dir=config.cache_dir),
                  model=model, log=logs.append)
    assert again.cache_build_seconds == 0 and any("reusing" in line for line in logs)
    assert again.losses == cached.losses


def test_feature_cache_contents_and_size_guard(tmp_path, model):
    rows = np.random.default_rng(0).integers(0, TINY.vocab_size, (5, 8)).astype(np.int32)

    def compute(chunk):
        return compute_features(model.params, jnp.asarray(chunk), cfg=TINY, head_layers=(1, 3),
                                temperature=2.0, top_k=4, hidden_dtype="bfloat16")

    cache = FeatureCache.open_or_build(tmp_path, {"x": 1}, rows, compute, batch_size=2,
                                       row_bytes=1000, log=lambda _: None)
    expected = compute(rows[[4, 0]])
    got = cache.gather([4, 0])
    assert got.hidden.dtype == jnp.bfloat16 and got.hidden.shape == (2, 2, 8, TINY.hidden_size)
    np.testing.assert_array_equal(got.hidden.astype(np.float32),
                                  np.asarray(expected.hidden, np.float32))
    np.testing.assert_array_equal(got.targets.ids, expected.targets.ids)
    np.testing.assert_allclose(got.targets.log_probs, expected.targets.log_probs, rtol=1e-6)
    np.testing.assert_allclose(got.targets.tail_log_prob, expected.targets.tail_log_prob,
                               rtol=1e-6)
    assert not list(tmp_path.glob("*.tmp-*"))
    with pytest.raises(ValueError, match="feature_cache=False"):
        FeatureCache.open_or_build(tmp_path, {"x": 2}, rows, compute, batch_size=2,
                                   row_bytes=1000, max_bytes=4000, log=lambda _: None)


def test_heads_round_trip_through_load_model_and_generate(trained, model):
    _, result, _, _ = trained
    loaded = load_model(result.output_dir)
    assert loaded.exit_head_kinds() == {1: "low_rank", 2: "low_rank", 3: "shared", 4: "shared"}
    for e in ("1", "2"):
        for part, value in result.heads[e].items():
            np.testing.assert_array_equal(loaded.heads[e][part], value)
    jax.tree.map(np.testing.assert_array_equal, loaded.params, model.params)
    prompts = [[1, 5, 9, 13], [1, 7]]
    ar = hispec_jax.generate(loaded, prompts, method="ar", max_new_tokens=8, ignore_eos=True)
    spec = hispec_jax.generate(loaded, prompts, method="hispec", draft_exit=1, verify_exits=(2,),
                               max_new_tokens=8, ignore_eos=True)
    assert spec.token_ids == ar.token_ids


# ----- config and CLI -----------------------------------------------------------------------

def test_config_files_have_every_key():
    for name in ("train_heads_default", "train_heads_small"):
        config = config_lib.load_config(name, {"model_path": "/m"})
        assert set(config.keys()) == set(config_lib.KEYS)
    default = config_lib.load_config("train_heads_default", {"model_path": "/m"})
    assert (default.temperature, default.learning_rate, default.warmup_steps,
            default.batch_size, default.head_rank) == (2.0, 1e-4, 100, 4, 1024)
    config = config_lib.load_config("train_heads_small", {
        "model_path": "/m", "head_layers": "1,3", "feature_cache": "false", "head_rank": "0"})
    assert (config.head_layers, config.feature_cache, config.head_rank) == ((1, 3), False, 0)
    schedule = steps.learning_rate_schedule(steps.OptimizerSettings(1e-4, 100, 1000))
    assert float(schedule(0)) == 0.0 and abs(float(schedule(100)) - 1e-4) < 1e-9


@pytest.mark.parametrize("args, message", [
    (["--config.nope=1"], "no key 'nope'"),
    (["--config.batch_size=two"], "cannot parse 'two' as int"),
    (["--config.head_layers=a"], "tuple of ints"),
    ([], "model_path is empty"),
    (["--config.model_path=/m", "--config.data_source=pile"], "data_source"),
    (["--config.model_path=/m", "--config.loss=mse"], "loss='mse' must be one of"),
])
def test_cli_config_errors(capsys, args, message):
    assert cli.main(["train-heads", "--config", "configs/train_heads_small.py", *args]) == 2
    assert message in capsys.readouterr().err


# ----- kill and resume ----------------------------------------------------------------------

def _cli(model_dir, work, cache, out):
    return [sys.executable, "-m", "hispec_jax.cli", "train-heads",
            "--config", str(REPO / "configs" / "train_heads_small.py"),
            f"--config.model_path={model_dir}", f"--config.workdir={work}",
            f"--config.cache_dir={cache}", f"--config.output_dir={out}",
            "--config.total_steps=150", "--config.checkpoint_every=10",
            "--config.eval_every=50", "--config.progress_bar=False"]


def _finished_checkpoints(work):
    ckpt = Path(work) / "checkpoints"
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.exists() else []


def test_sigkill_and_restart_resumes_with_identical_losses(tmp_path, model_dir):
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           # One compilation cache for the three runs keeps this test fast.
           "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    cache = tmp_path / "features"

    reference = subprocess.run(_cli(model_dir, tmp_path / "ref", cache, tmp_path / "ref_out"),
                               env=env, capture_output=True, text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr[-3000:]

    work, out = tmp_path / "run", tmp_path / "run_out"
    proc = subprocess.Popen(_cli(model_dir, work, cache, out), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not _finished_checkpoints(work) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"run ended before it was killed:\n{stderr[-3000:]}"
    killed_at = _finished_checkpoints(work)
    assert killed_at and killed_at[-1] < 150

    restart = subprocess.run(_cli(model_dir, work, cache, out), env=env, capture_output=True,
                             text=True, timeout=300)
    assert restart.returncode == 0, restart.stderr[-3000:]
    resumed = [line for line in restart.stdout.splitlines() if "resuming from" in line]
    assert resumed, restart.stdout
    resumed_step = int(resumed[0].split("at step ")[1].split("/")[0])
    assert 10 <= resumed_step < 150

    expected = [r for r in read_metrics(tmp_path / "ref") if r["event"] != "summary"]
    got = [r for r in read_metrics(work) if r["event"] != "summary"]
    assert [(r["event"], r["step"]) for r in got] == [(r["event"], r["step"]) for r in expected]
    assert len([r for r in got if r["event"] == "train"]) == 150
    for g, e in zip(got, expected):
        if g["event"] == "train":
            np.testing.assert_allclose(g["loss"], e["loss"], rtol=1e-6, atol=0)
        else:
            assert g["exits"].keys() == e["exits"].keys()
            for k in g["exits"]:
                np.testing.assert_allclose(g["exits"][k]["kl"], e["exits"][k]["kl"], rtol=1e-6)
    # The saved heads are bit-identical too.
    got_heads, ref_heads = load_model(out).heads, load_model(tmp_path / "ref_out").heads
    jax.tree.map(np.testing.assert_array_equal, got_heads, ref_heads)
