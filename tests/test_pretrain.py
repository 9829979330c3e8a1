"""Pretraining with the early-exit loss (`hispec pretrain`), and the shipped default model."""

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hispec_jax
from hispec_jax import cli, load_model
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import init_params
from hispec_jax.models.presets import PRESETS_DIR
from hispec_jax.models.transformer import embed, run_layers
from hispec_jax.train_heads import exit_recipe
from hispec_jax.train_heads import pretrain as pt

TINY = ModelConfig(model_type="llama", vocab_size=50, hidden_size=32, intermediate_size=48,
                   num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5,
                   max_position_embeddings=64, tie_word_embeddings=True)


def test_exit_loss_weights():
    w = exit_recipe.exit_loss_weights(16, 1.0)
    assert w.shape == (16,) and w[-1] == 1.0
    assert np.isclose(w[:-1].sum(), 1.0)
    assert np.all(np.diff(w[:-1]) > 0) and w[:-1].max() < w[-1]
    assert np.allclose(exit_recipe.exit_loss_weights(4, 0.0), [0, 0, 0, 1])


@jax.jit
def _reference_nll(params, batch):
    """Per-position NLL [L, B, T] of every exit through the decoders' path (a KV cache)."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    B, T = inputs.shape
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    out = []
    for e in range(1, TINY.num_layers + 1):
        h, _ = run_layers(params, TINY, embed(params, inputs), positions,
                          KVCache.zeros(TINY, B, T), 0, e)
        logp = jax.nn.log_softmax(exit_logits(params, {}, TINY, h, e))
        out.append(-jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0])
    return jnp.stack(out)


def test_exit_cross_entropies_match_the_decoding_forward():
    params = init_params(TINY, jax.random.key(0), init_std=0.2)
    batch = jax.random.randint(jax.random.key(1), (2, 13), 0, TINY.vocab_size)
    nll = np.asarray(_reference_nll(params, batch))
    ce = jax.jit(exit_recipe.exit_cross_entropies, static_argnums=(1, 3))
    np.testing.assert_allclose(ce(params, TINY, batch, 1), nll.mean(axis=(1, 2)),
                               rtol=1e-5, atol=1e-5)
    # exit_stride s: exit e scores positions t = e - 1 (mod s); the final layer all of them.
    s = 5
    expected = [nll[e, :, (e % s)::s][:, :12 // s].mean() for e in range(TINY.num_layers - 1)]
    np.testing.assert_allclose(ce(params, TINY, batch, s),
                               [*expected, nll[-1].mean()], rtol=1e-5, atol=1e-5)


def _pretrain(tmp, *overrides):
    code = cli.main(["pretrain", "--small", "--no-progress", f"--config.work_dir={tmp}",
                     f"--config.out_dir={tmp / 'model'}", *overrides])
    assert code == 0
    return json.loads((tmp / "model" / pt.SUMMARY_FILENAME).read_text())


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pretrain_small")
    return tmp / "model", _pretrain(tmp)


def test_small_run_lowers_the_loss(small_run):
    _, summary = small_run
    assert summary["steps"] == 30
    assert summary["last_loss"] < summary["first_loss"] - 1.0
    ev = summary["eval"]
    assert ev["tokens"] > 0 and np.isfinite(ev["perplexity"])
    assert len(ev["agreement_exits"]) == 4 and ev["agreement_exits"][-1] == 1.0


def test_small_run_loads_in_hispec_and_transformers(small_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir, _ = small_run
    model = load_model(out_dir)
    assert model.cfg.num_layers == 4 and model.cfg.tie_word_embeddings
    tok = AutoTokenizer.from_pretrained(str(out_dir))
    assert model.eos_token_ids == (tok.eos_token_id,)
    ids = tok("User: Hello there\nAssistant:")["input_ids"]
    assert ids[0] == tok.bos_token_id
    hf = AutoModelForCausalLM.from_pretrained(str(out_dir)).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits.float().numpy()
    x = jnp.asarray([ids])
    positions = jnp.arange(len(ids))[None]
    h, _ = run_layers(model.params, model.cfg, embed(model.params, x), positions,
                      KVCache.zeros(model.cfg, 1, len(ids)), 0, model.cfg.num_layers)
    ours = exit_logits(model.params, {}, model.cfg, h, model.cfg.num_layers)
    np.testing.assert_allclose(np.asarray(ours), ref, rtol=1e-4, atol=1e-4)


def test_resume_continues_exactly(tmp_path, small_run):
    out_dir, whole = small_run
    # An interrupted run (stopped by the time limit after its first step), then resumed:
    # the same batches and the same parameters as the uninterrupted run.
    cut = _pretrain(tmp_path, "--config.checkpoint_every=1", "--config.time_limit_s=1e-9",
                    "--config.eval_batches=1")
    assert cut["steps"] == 1
    resumed = _pretrain(tmp_path, "--config.resume=True", "--config.eval_batches=1")
    assert resumed["steps_this_run"] == whole["steps"] - 1
    assert resumed["last_loss"] == whole["last_loss"]
    a, b = load_model(out_dir), load_model(tmp_path / "model")
    assert all(np.array_equal(x, y) for x, y in
               zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))


def test_unknown_override_is_an_error(tmp_path, capsys):
    assert cli.main(["pretrain", "--small", f"--config.work_dir={tmp_path}",
                     "--config.no_such_key=1"]) == 2
    assert "no_such_key" in capsys.readouterr().err


def test_shipped_model_configs():
    """Stage 1 (pretrain_gpu) feeds stage 2 (finetune_default), which writes the package's
    default model with the shipped architecture; the v1 CPU config no longer overwrites it."""
    gpu = pt.load_pretrain_config(PRESETS_DIR / "pretrain_gpu.py")
    fine = pt.load_pretrain_config(PRESETS_DIR / "finetune_default.py")
    assert fine.model.to_dict() == gpu.model.to_dict()
    m = fine.model
    assert m.num_layers >= 16 and len({m.num_layers // 8, m.num_layers // 4,
                                       m.num_layers // 2}) == 3
    assert (m.hidden_size, m.vocab_size, m.tie_word_embeddings) == (256, 2048, True)
    assert Path(fine.init_from).expanduser() == pt.resolve_dirs(gpu)[0]
    assert pt.resolve_dirs(fine)[0] == Path(hispec_jax.DEFAULT_MODEL_DIR)
    v1 = pt.load_pretrain_config(PRESETS_DIR / "pretrain_default.py")
    assert pt.resolve_dirs(v1)[0] != Path(hispec_jax.DEFAULT_MODEL_DIR)
    shipped = json.loads((Path(hispec_jax.DEFAULT_MODEL_DIR) / "config.json").read_text())
    assert (shipped["num_hidden_layers"], shipped["hidden_size"], shipped["vocab_size"]) == (
        m.num_layers, m.hidden_size, m.vocab_size)


default_model_missing = pytest.mark.skipif(
    not os.path.exists(os.path.join(hispec_jax.DEFAULT_MODEL_DIR, "config.json")),
    reason="the default model has not been trained yet (hispec pretrain)")


@default_model_missing
def test_generate_uses_the_shipped_model(capsys):
    def run(*args):
        assert cli.main(["generate", "--json", "--max-new-tokens", "12", "--ignore-eos",
                         *args, "User: Hello!\nAssistant:"]) == 0
        return json.loads(capsys.readouterr().out)["outputs"][0]

    ar = run()
    assert len(ar["token_ids"]) == 12 and ar["text"]
    assert run("--method", "hispec")["token_ids"] == ar["token_ids"]  # lossless


@default_model_missing
def test_shipped_model_files():
    path = Path(hispec_jax.DEFAULT_MODEL_DIR)
    total = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    assert total < 40 * 2**20
    hf_config = json.loads((path / "config.json").read_text())
    assert hf_config["torch_dtype"] == "float32" and hf_config["num_hidden_layers"] >= 16
    model = load_model(path)
    assert model.params["embed"].dtype == jnp.float32
    assert model.tokenizer is not None and model.eos_token_ids


@default_model_missing
def test_shipped_model_loads_in_transformers():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(hispec_jax.DEFAULT_MODEL_DIR)
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok("User: Hello there\nAssistant:")["input_ids"]
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits.float().numpy()
    model = load_model(path)
    x = jnp.asarray([ids])
    L = model.cfg.num_layers
    h, _ = run_layers(model.params, model.cfg, embed(model.params, x), jnp.arange(len(ids))[None],
                      KVCache.zeros(model.cfg, 1, len(ids)), 0, L)
    ours = exit_logits(model.params, {}, model.cfg, h, L)
    np.testing.assert_allclose(np.asarray(ours), ref, rtol=2e-4, atol=2e-4)


def test_frozen_groups_get_no_updates():
    import ml_collections

    params = init_params(TINY, jax.random.key(0))
    optim = ml_collections.ConfigDict(dict(clip_norm=1.0, b1=0.9, b2=0.95, weight_decay=0.1,
                                           frozen="embed, final_norm"))
    tx = pt.make_optimizer(optim, params)
    grads = jax.tree.map(lambda p: jnp.ones_like(p), params)
    updates, _ = tx.update(grads, tx.init(params), params)
    assert not np.any(np.asarray(updates["embed"])) and not np.any(np.asarray(updates["final_norm"]))
    assert all(np.any(np.asarray(u)) for u in jax.tree.leaves(updates["layers"]))
    optim.frozen = ""
    assert pt.frozen_names(optim, params) == ()
    optim.frozen = "lm_head_typo"
    with pytest.raises(ValueError, match=r"\['lm_head_typo'\] are not parameter groups"):
        pt.make_optimizer(optim, params)
