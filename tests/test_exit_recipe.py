"""The early-exit training recipe (`hispec_jax.train_heads.exit_recipe`): exit weights,
curriculum, layer dropout, distillation, and continued training (`init_from`)."""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from hispec_jax import cli, load_model
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import init_params
from hispec_jax.models.presets import PRESETS_DIR
from hispec_jax.models.transformer import embed, run_layers, scan_exits
from hispec_jax import datasets
from hispec_jax.train_heads import data
from hispec_jax.train_heads import exit_recipe as er
from hispec_jax.train_heads import pretrain as pt

TINY = ModelConfig(model_type="llama", vocab_size=50, hidden_size=32, intermediate_size=48,
                   num_layers=5, num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5,
                   max_position_embeddings=64, tie_word_embeddings=True)


# ----- exit weights --------------------------------------------------------------------

def test_exit_weight_schemes():
    L = 8
    lin = er.exit_loss_weights(L, 2.0, "linear")
    uni = er.exit_loss_weights(L, 2.0, "uniform")
    sq = er.exit_loss_weights(L, 2.0, "sqrt")
    e = np.arange(1, L)
    for w, shape in ((lin, e), (uni, np.ones(L - 1)), (sq, np.sqrt(e))):
        assert w[-1] == 1.0 and np.isclose(w[:-1].sum(), 2.0)
        np.testing.assert_allclose(w[:-1], 2.0 * shape / shape.sum(), rtol=1e-6)
    # The shallow exits get more under uniform than under linear (which starves them).
    assert uni[0] > sq[0] > lin[0] and lin[-2] > sq[-2] > uni[-2]


def test_exit_layers_and_active_mask_renormalize():
    w = er.exit_loss_weights(12, 3.0, "uniform", exit_layers=(3, 6))
    assert np.flatnonzero(w[:-1]).tolist() == [2, 5] and np.allclose(w[[2, 5]], 1.5)
    active = np.zeros(12, bool)
    active[[5, 11]] = True
    w = er.exit_loss_weights(12, 3.0, "uniform", exit_layers=(3, 6), active=active)
    assert np.flatnonzero(w[:-1]).tolist() == [5] and np.isclose(w[5], 3.0)
    none = er.exit_loss_weights(12, 3.0, "linear", active=np.eye(12, dtype=bool)[-1])
    assert np.all(none[:-1] == 0) and none[-1] == 1.0
    assert er.parse_exit_layers("", 4) == (1, 2, 3)
    assert er.parse_exit_layers("6, 3,6", 12) == (3, 6)
    with pytest.raises(ValueError, match="12"):
        er.parse_exit_layers("3,12", 12)
    with pytest.raises(ValueError, match="exit_weights"):
        er.exit_loss_weights(4, 1.0, "cubic")


# ----- curriculum ----------------------------------------------------------------------

def test_rotational_curriculum_selects_every_rth_exit():
    L, R = 12, 3
    for step in range(7):
        active = er.curriculum_active("rotational", L, step, 0.0, R)
        expected = [e for e in range(1, L) if e % R == step % R] + [L]
        assert (np.flatnonzero(active) + 1).tolist() == expected
    # Over R consecutive steps every early exit is active exactly once.
    counts = sum(er.curriculum_active("rotational", L, s, 0.0, R).astype(int) for s in range(R))
    assert counts[:-1].tolist() == [1] * (L - 1) and counts[-1] == R


def test_gradual_curriculum_switches_exits_on_from_the_deepest():
    L = 8
    assert (np.flatnonzero(er.curriculum_active("gradual", L, 0, 0.0, 1)) + 1).tolist() == [L]
    # One more exit (the next shallower one) every 1 / (2L) of progress.
    for k in range(1, L):
        active = er.curriculum_active("gradual", L, 0, k / (2 * L) + 1e-9, 1)
        assert (np.flatnonzero(active) + 1).tolist() == list(range(L - k, L + 1))
    assert er.curriculum_active("gradual", L, 0, 0.5, 1).all()
    assert er.curriculum_active("gradual", L, 0, 1.0, 1).all()
    assert er.curriculum_active("none", L, 5, 0.3, 1).all()


def _recipe(**overrides):
    c = ml_collections.ConfigDict(dict(
        exit_loss_scale=2.0, exit_weights="uniform", exit_layers="", distill_weight=0.5,
        distill_temperature=1.0, curriculum="rotational", curriculum_rotation=2,
        layer_dropout_max=0.0, exit_stride=1))
    c.update(overrides)
    return c


def test_step_exit_weights_follow_the_curriculum():
    w0 = er.step_exit_weights(_recipe(), 6, 0, 0.0)   # exits 2, 4 active at even steps
    w1 = er.step_exit_weights(_recipe(), 6, 1, 0.0)   # exits 1, 3, 5 at odd ones
    assert np.flatnonzero(w0[:-1]).tolist() == [1, 3] and np.allclose(w0[[1, 3]], 1.0)
    assert np.flatnonzero(w1[:-1]).tolist() == [0, 2, 4] and np.allclose(w1[[0, 2, 4]], 2 / 3)
    for bad, match in ((dict(curriculum="cyclic"), "curriculum"),
                       (dict(distill_weight=1.5), "distill_weight"),
                       (dict(layer_dropout_max=1.0), "layer_dropout_max"),
                       (dict(exit_layers="0"), "exit_layers")):
        with pytest.raises(ValueError, match=match):
            er.validate_recipe(_recipe(**bad), 6)


# ----- layer dropout -------------------------------------------------------------------

def test_layer_dropout_rates_and_mask():
    rates = er.layer_dropout_rates(9, 0.2)
    assert rates[0] == 0 and np.isclose(rates[-1], 0.2) and np.all(np.diff(rates) > 0)
    np.testing.assert_allclose(rates, 0.2 * (2.0 ** (np.arange(9) / 8) - 1), rtol=1e-6)
    keep = np.asarray(er.layer_keep_mask(jax.random.key(0), jnp.asarray(rates), 20000))
    np.testing.assert_allclose(1 - keep.mean(axis=1), rates, atol=0.01)
    assert keep[0].all()


def test_dropped_layers_are_skipped_per_sequence():
    params = init_params(TINY, jax.random.key(0), init_std=0.2)
    tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, TINY.vocab_size)
    full, _ = scan_exits(params, TINY, tokens, lambda h, i: 0)
    same, _ = scan_exits(params, TINY, tokens, lambda h, i: 0,
                            jnp.ones((TINY.num_layers, 2), bool))
    np.testing.assert_array_equal(full, same)
    # Layer 3 (0-based 2) skipped for sequence 1 only: sequence 1 equals a model without it.
    keep = np.ones((TINY.num_layers, 2), bool)
    keep[2, 1] = False
    h, _ = scan_exits(params, TINY, tokens, lambda h, i: 0, jnp.asarray(keep))
    np.testing.assert_array_equal(h[0], full[0])
    without = jax.tree.map(lambda w: jnp.delete(w, 2, axis=0), params["layers"])
    short = TINY.replace(num_layers=TINY.num_layers - 1)
    ref, _ = scan_exits({**params, "layers": without}, short, tokens[1:], lambda h, i: 0)
    np.testing.assert_allclose(h[1], ref[0], rtol=1e-5, atol=1e-5)


# ----- distillation --------------------------------------------------------------------

def _identity_layers(params):
    """Zero output projections: every layer adds 0, so every exit sees the same states."""
    layers = dict(params["layers"])
    layers["wo"] = jnp.zeros_like(layers["wo"])
    layers["w_down"] = jnp.zeros_like(layers["w_down"])
    return {**params, "layers": layers}


def test_kl_is_zero_when_the_exit_distribution_is_the_final_one():
    params = _identity_layers(init_params(TINY, jax.random.key(0), init_std=0.2))
    batch = jax.random.randint(jax.random.key(1), (2, 11), 0, TINY.vocab_size)
    for stride in (1, 3):
        terms = er.exit_losses(params, TINY, batch, stride, 2.0)
        np.testing.assert_allclose(terms["kl"], 0.0, atol=1e-6)
        np.testing.assert_array_equal(terms["agreement"], 1.0)


def _exit_logits_reference(params, batch):
    inputs = batch[:, :-1]
    B, T = inputs.shape
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    out = []
    for e in range(1, TINY.num_layers + 1):
        h, _ = run_layers(params, TINY, embed(params, inputs), positions,
                          KVCache.zeros(TINY, B, T), 0, e)
        out.append(exit_logits(params, {}, TINY, h, e))
    return np.asarray(jnp.stack(out), np.float64)   # [L, B, T, V]


def test_kl_and_agreement_match_a_direct_computation():
    params = init_params(TINY, jax.random.key(2), init_std=0.3)
    batch = jax.random.randint(jax.random.key(3), (2, 13), 0, TINY.vocab_size)
    logits = _exit_logits_reference(params, batch)
    temp, stride = 2.0, 4

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    terms = er.exit_losses(params, TINY, batch, stride, temp)
    pos = er.exit_positions(TINY.num_layers, 12, stride)
    for l in range(TINY.num_layers - 1):
        zs, zt = logits[l][:, pos[l]], logits[-1][:, pos[l]]
        lp, lq = log_softmax(zt / temp), log_softmax(zs / temp)
        kl = temp**2 * np.mean(np.sum(np.exp(lp) * (lp - lq), -1))
        np.testing.assert_allclose(terms["kl"][l], kl, rtol=1e-4)
        assert kl > 1e-3
        agree = np.mean(zs.argmax(-1) == zt.argmax(-1))
        np.testing.assert_allclose(terms["agreement"][l], agree)


def test_distillation_does_not_train_the_teacher():
    """With only KL terms, the last layer (which only the teacher depends on) gets no
    gradient: the final distribution is a fixed target."""
    params = init_params(TINY, jax.random.key(4), init_std=0.2)
    batch = jax.random.randint(jax.random.key(5), (2, 9), 0, TINY.vocab_size)
    weights = jnp.asarray([1.0, 1.0, 1.0, 1.0, 0.0])

    def loss(p, alpha):
        return er.combine_losses(er.exit_losses(p, TINY, batch, 1, 1.0), weights, alpha)

    g_kl = jax.grad(loss)(params, 1.0)
    g_ce = jax.grad(loss)(params, 0.0)
    for name, g in g_kl["layers"].items():
        assert np.all(np.asarray(g[-1]) == 0), name
        assert np.any(np.asarray(g[0]) != 0), name
    assert any(np.any(np.asarray(g[0]) != 0) for g in g_ce["layers"].values())
    # combine_losses: CE_L + sum_e w_e [(1 - a) CE_e + a KL_e].
    terms = er.exit_losses(params, TINY, batch, 1, 1.0)
    w = jnp.asarray([0.5, 0.0, 0.25, 0.25, 1.0])
    expected = terms["ce"][-1] + sum(
        float(w[e]) * (0.7 * terms["ce"][e] + 0.3 * terms["kl"][e]) for e in range(4))
    np.testing.assert_allclose(er.combine_losses(terms, w, 0.3), expected, rtol=1e-6)



def test_scored_exits_compute_only_those_exits():
    """`scored_exits` skips the other exits' logits: the scored terms, the final CE and the
    gradient of a loss that weighs only the scored exits are those of the full computation."""
    params = init_params(TINY, jax.random.key(6), init_std=0.3)
    batch = jax.random.randint(jax.random.key(7), (2, 11), 0, TINY.vocab_size)
    full = er.exit_losses(params, TINY, batch, 2, 2.0)
    some = er.exit_losses(params, TINY, batch, 2, 2.0, scored_exits=(1, 3))
    for key in ("ce", "kl", "agreement"):
        a, b = np.asarray(some[key]), np.asarray(full[key])
        np.testing.assert_allclose(a[[0, 2, 4]], b[[0, 2, 4]], rtol=1e-6)
        assert np.all(a[[1, 3]] == 0), key
    weights = jnp.asarray([0.7, 0.0, 1.3, 0.0, 1.0])

    def loss(p, scored):
        return er.combine_losses(er.exit_losses(p, TINY, batch, 2, 2.0, scored_exits=scored),
                                 weights, 0.5)

    for g_full, g_some in zip(jax.tree.leaves(jax.grad(loss)(params, None)),
                              jax.tree.leaves(jax.grad(loss)(params, (1, 3)))):
        np.testing.assert_allclose(g_some, g_full, rtol=1e-4, atol=1e-6)
    none = er.exit_losses(params, TINY, batch, 2, 2.0, scored_exits=())
    np.testing.assert_allclose(none["ce"][-1], full["ce"][-1], rtol=1e-6)
    assert np.all(np.asarray(none["kl"]) == 0)

# ----- reply masks ---------------------------------------------------------------------

def test_reply_token_masks_mark_the_assistant_replies(tmp_path):
    record = {"conversations": [{"from": "human", "value": "Hello there, how are you?"},
                                {"from": "gpt", "value": "I am fine, thanks."},
                                {"from": "human", "value": "Good."},
                                {"from": "gpt", "value": "Great to hear!"}]}
    text = datasets.conversation_text(record)
    assert [text[a:b] for a, b in datasets.reply_spans(record)] == [" I am fine, thanks.\n",
                                                                 " Great to hear!\n"]
    tok = data.train_tokenizer([text] * 3, 300)
    mask = data.reply_token_masks(tok, [record, {"conversations": []}])
    assert len(mask) == 1   # empty conversations have no document
    ids = data.tokenize_docs(tok, [text])[0]
    assert len(mask[0]) == len(ids) and mask[0][0] == 0   # <s>
    replies = tok.decode(ids[mask[0] == 1])
    assert replies == " I am fine, thanks.\n Great to hear!\n"


# ----- continued training (init_from) ---------------------------------------------------

def _pretrain(tmp, *overrides):
    code = cli.main(["pretrain", "--small", "--no-progress", f"--config.work_dir={tmp}",
                     f"--config.out_dir={tmp / 'model'}", *overrides])
    assert code == 0
    return json.loads((tmp / "model" / pt.SUMMARY_FILENAME).read_text())


def test_recipe_run_and_init_from(tmp_path):
    first = _pretrain(tmp_path / "a", "--config.num_steps=20", "--config.exit_weights=uniform",
                      "--config.distill_weight=0.5", "--config.curriculum=rotational",
                      "--config.layer_dropout_max=0.2", "--config.exit_layers=1,2")
    assert first["last_loss"] < first["first_loss"]
    assert first["exit_loss_weights"] == [0.5, 0.5, 0.0, 1.0]
    assert first["eval"]["replies"]["tokens"] > 0
    # Continued from that model with no steps: the same model (and the same evaluation).
    src = tmp_path / "a" / "model"
    again = _pretrain(tmp_path / "b", f"--config.init_from={src}", "--config.num_steps=0")
    assert again["eval"] == first["eval"]
    a, b = load_model(src), load_model(tmp_path / "b" / "model")
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a.params),
                                                    jax.tree.leaves(b.params)))
    assert b.tokenizer.backend_tokenizer.to_str() == a.tokenizer.backend_tokenizer.to_str()
    # Continued training starts from those weights: its first loss is the trained model's.
    cont = _pretrain(tmp_path / "c", f"--config.init_from={src}", "--config.num_steps=3")
    scratch = _pretrain(tmp_path / "d", "--config.num_steps=3")
    assert cont["first_loss"] < scratch["first_loss"] - 1.0


def test_init_from_must_match_the_architecture(tmp_path, capsys):
    _pretrain(tmp_path / "a", "--config.num_steps=1")
    assert cli.main(["pretrain", "--small", "--no-progress", f"--config.work_dir={tmp_path}",
                     f"--config.init_from={tmp_path / 'a' / 'model'}",
                     "--config.model.num_layers=3"]) == 2
    assert "num_layers (4 vs 3)" in capsys.readouterr().err


def test_recipe_keys_are_in_every_pretrain_config():
    keys = {"exit_loss_scale", "exit_weights", "exit_layers", "distill_weight",
            "distill_temperature", "curriculum", "curriculum_rotation", "layer_dropout_max",
            "exit_stride", "init_from"}
    for name in ("pretrain_default.py", "pretrain_gpu.py", "finetune_default.py",
                 "finetune_smollm2.py"):
        config = pt.load_pretrain_config(PRESETS_DIR / name)
        assert keys <= set(config.keys()), name
        assert {"token_cache_dir", "source", "on_policy_prompts", "on_policy_new_tokens",
                "on_policy_sampling", "on_policy_temperature", "on_policy_batch",
                "on_policy_repeat"} <= set(config.data)
        er.validate_recipe(config, config.model.num_layers)
        pt.validate_data(config)
