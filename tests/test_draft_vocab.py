"""Draft vocabularies (exit heads that propose only K tokens): the head's logits, greedy output
equal to AR and the sampling distribution exact whatever the vocabulary, the file format, the
choice of tokens, and `hispec draft-vocab`."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

import test_sampling_exact as exact
from hispec_jax import cli, generate, load_model
from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.models import hf_io, sharding
from hispec_jax.models.heads import draft_vocab_size, exit_logits
from hispec_jax.models.params import head_specs, init_from_specs
from hispec_jax.train_heads import draft_vocab
from test_engine import VOCAB, check_equals_autoregressive, random_prompts, tiny_model


def _with_heads(model, heads):
    return dataclasses.replace(model, heads=heads)


def _trained_heads(model, ranks: dict[int, int | None]):
    """Random (not shared-head) trained heads at the given exits, full or low rank."""
    return {str(e): init_from_specs(head_specs(model.cfg, r), jax.random.key(e), jnp.float32, 0.3)
            for e, r in ranks.items()}


def test_restricted_head_logits_are_the_vocab_columns_and_minus_inf_elsewhere():
    model = tiny_model(4, 0)
    model = _with_heads(model, _trained_heads(model, {1: None, 2: 5}))
    vocab = np.array([0, 3, 7, 8, 20, 41, 63], np.int32)
    restricted = _with_heads(model, draft_vocab.restrict_heads(model, (1, 2, 3), vocab))
    h = jax.random.normal(jax.random.key(0), (2, 3, model.cfg.hidden_size))
    outside = np.setdiff1d(np.arange(VOCAB), vocab)
    for e in (1, 2, 3):  # full trained, low-rank trained, shared
        assert draft_vocab_size(restricted.cfg, restricted.heads, e) == len(vocab)
        full = np.asarray(exit_logits(model.params, model.heads, model.cfg, h, e))
        got = np.asarray(exit_logits(restricted.params, restricted.heads, model.cfg, h, e))
        assert got.shape == full.shape
        np.testing.assert_allclose(got[..., vocab], full[..., vocab], rtol=1e-5, atol=1e-5)
        assert np.all(np.isneginf(got[..., outside]))
        # the restricted argmax is the unrestricted ranking's best token inside the vocabulary
        masked = np.where(np.isin(np.arange(VOCAB), vocab), full, -np.inf)
        np.testing.assert_array_equal(got.argmax(-1), masked.argmax(-1))
    assert draft_vocab_size(restricted.cfg, restricted.heads, 4) == VOCAB  # the model itself


def test_choose_vocab_most_frequent_keeps_eos_sorted():
    counts = np.array([5, 0, 9, 9, 1, 7, 0, 2])
    np.testing.assert_array_equal(draft_vocab.choose_vocab(counts, 3), [2, 3, 5])
    # EOS (6, never counted) is kept; ties broken by the lower id
    np.testing.assert_array_equal(draft_vocab.choose_vocab(counts, 3, always=[6]), [2, 3, 6])
    np.testing.assert_array_equal(draft_vocab.choose_vocab(counts, 8), np.arange(8))
    assert draft_vocab.coverage(counts, np.array([2, 3])) == pytest.approx(18 / 33)
    for size, always in ((0, ()), (9, ()), (1, (6, 7)), (2, (8,))):
        with pytest.raises(ValueError, match="draft vocabulary size|token ids to keep"):
            draft_vocab.choose_vocab(counts, size, always)


def test_restrict_heads_errors():
    model = tiny_model(4, 0)
    vocab = np.arange(8, dtype=np.int32)
    with pytest.raises(ValueError, match="outside"):
        draft_vocab.restrict_heads(model, (4,), vocab)
    twice = _with_heads(model, draft_vocab.restrict_heads(model, (2,), vocab))
    with pytest.raises(ValueError, match="already has a draft vocabulary"):
        draft_vocab.restrict_heads(twice, (2,), vocab)


@pytest.mark.parametrize("layer_scale", [1.0, 0.0])
@pytest.mark.parametrize("method,options", [
    ("layerskip", dict(draft_exit=1, draft_len=3)),
    ("hispec", dict(draft_exit=1, verify_exits=(2,), draft_len=2, verify_window=3)),
    ("hispec", dict(draft_exit=2, verify_exits=(3,), draft_len=3, verify_window=2,
                    adaptive=True)),
    ("specbound", dict(depth_bound=3, tau=0.5)),
])
def test_greedy_equals_autoregressive_with_a_draft_vocabulary(method, options, layer_scale):
    """A small vocabulary (12 of 64 tokens) keeps most of the final layer's tokens out of the
    drafts' reach; on the always-agree model (layer_scale 0) every draft it can make is right."""
    model = tiny_model(4, 1, layer_scale)
    model = _with_heads(model, _trained_heads(model, {2: None}))
    vocab = draft_vocab.choose_vocab(np.arange(VOCAB)[::-1] % 17, 12, always=[3])
    model = _with_heads(model, draft_vocab.restrict_heads(model, (1, 2, 3), vocab))
    rng = np.random.RandomState(0)
    case = dict(max_new=20, ignore_eos=False, tight_cache=True)
    check_equals_autoregressive(model, random_prompts(rng, 3, 9), case, method, options)
    case = dict(max_new=12, ignore_eos=True, tight_cache=False)
    check_equals_autoregressive(model, random_prompts(rng, 1, 5), case, method, options)


@pytest.mark.parametrize("acceptance", ["tokenwise", "blockwise"])
def test_sampling_matches_exact_distribution_with_a_draft_vocabulary(acceptance):
    """The drafts' q is zero outside the vocabulary (tokens 1 and 3 of 4 here); the output is
    still the model's exact distribution (chi-square against enumeration)."""
    model = exact.small_model()
    model = _with_heads(model, draft_vocab.restrict_heads(model, (1, 2), np.array([0, 2])))
    sampling = SamplingParams(temperature=1.0, top_k=0, seed=5)
    probs = exact.exact_ar_distribution(model, sampling)
    got = exact.sample(model, "hispec", sampling, draft_exit=1, verify_exits=(2,), draft_len=2,
                       verify_window=2, acceptance=acceptance)
    stat, threshold = exact.chi_square_test(got, probs, exact.N_SAMPLES)
    assert stat < threshold, (stat, threshold)


@pytest.fixture(scope="module")
def restricted_heads(hf_models):
    cfg, _, _, _ = hf_io.load_checkpoint(hf_models["llama3"][1])
    heads = _trained_heads(load_model(hf_models["llama3"][1]), {1: None, 2: 3})
    return cfg, {e: {**h, "vocab": jnp.asarray([1, 4, 9], jnp.int32),
                     **({"proj": h["proj"][:, [1, 4, 9]]} if "proj" in h else
                        {"proj_up": h["proj_up"][:, [1, 4, 9]]})} for e, h in heads.items()}


def test_heads_with_a_draft_vocabulary_round_trip(restricted_heads, tmp_path):
    cfg, heads = restricted_heads
    hf_io.save_exit_heads(tmp_path, cfg, heads)
    tensors = safetensors.numpy.load_file(tmp_path / hf_io.HEADS_FILENAME)
    np.testing.assert_array_equal(tensors["exit_heads.1.vocab"], [1, 4, 9])
    assert tensors["exit_heads.1.vocab"].dtype == np.int32
    assert tensors["exit_heads.1.proj.weight"].shape == (3, cfg.hidden_size)
    assert tensors["exit_heads.2.proj_up.weight"].shape == (3, 3)
    loaded = hf_io.load_exit_heads(tmp_path, cfg)
    for e in heads:
        for part in heads[e]:
            np.testing.assert_array_equal(loaded[e][part], heads[e][part])
    assert loaded["1"]["vocab"].dtype == jnp.int32
    axes = sharding.heads_axes(cfg, loaded)
    assert axes["1"]["vocab"] == ("draft_vocab",) and axes["2"]["proj_up"] == ("rank", "vocab")


@pytest.mark.parametrize("vocab,match", [
    (np.array([4, 1, 9], np.int32), "sorted and unique"),
    (np.array([1, 4, 4], np.int32), "sorted and unique"),
    (np.array([1, 4, 10_000], np.int32), r"must be in \[0, "),
    (np.array([1.0, 4.0, 9.0], np.float32), "integer token ids"),
])
def test_bad_draft_vocabulary_in_the_file_is_a_clear_error(restricted_heads, tmp_path, vocab, match):
    cfg, heads = restricted_heads
    hf_io.save_exit_heads(tmp_path, cfg, heads)
    tensors = safetensors.numpy.load_file(tmp_path / hf_io.HEADS_FILENAME)
    tensors["exit_heads.1.vocab"] = vocab
    safetensors.numpy.save_file(tensors, tmp_path / hf_io.HEADS_FILENAME,
                                metadata={"format": "pt", "exit_layers": "1,2"})
    with pytest.raises(ValueError, match=match):
        hf_io.load_exit_heads(tmp_path, cfg)
    with pytest.raises(ValueError, match=match):
        hf_io.save_exit_heads(tmp_path / "again", cfg, {"1": {**heads["1"], "vocab": vocab}})


def test_cli_writes_a_restricted_model_that_decodes_like_ar(capsys, hf_models, tmp_path):
    src = str(hf_models["llama3"][1])
    out = tmp_path / "restricted"
    assert cli.main(["draft-vocab", "--model", src, "--size", "40", "--exits", "1",
                     "--out", str(out), "--docs", "50"]) == 0
    printed = capsys.readouterr().out
    assert "draft vocabulary: 40 of" in printed and "held-out ShareGPT tokens" in printed
    model = load_model(out)
    assert model.heads["1"]["vocab"].shape == (40,)
    assert set(model.eos_token_ids) <= set(np.asarray(model.heads["1"]["vocab"]).tolist())
    prompts = ["the cat", "a dog ran"]
    ref = generate(model, prompts, method="ar", max_new_tokens=10, ignore_eos=True)
    got = generate(model, prompts, method="layerskip", draft_exit=1, draft_len=2,
                   max_new_tokens=10, ignore_eos=True)
    assert got.token_ids == ref.token_ids


@pytest.mark.parametrize("args,match", [
    (["--size", "0", "--exits", "1"], "--size must be >= 1"),
    (["--size", "8", "--exits", "99"], r"--exits 99: must be in \[1, "),
    (["--size", "8", "--exits", "1", "--docs", "0"], "--docs must be >= 1"),
])
def test_cli_errors_name_the_flag(capsys, hf_models, tmp_path, args, match):
    code = cli.main(["draft-vocab", "--model", str(hf_models["llama3"][1]), *args,
                     "--out", str(tmp_path / "x")])
    assert code == 2
    assert re.search(match, capsys.readouterr().err)
