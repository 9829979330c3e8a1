"""On-policy training data (`train_heads/on_policy.py`): the rows are the model's own
continuations (greedy: exactly its argmax, token by token), deterministic given the seed,
cached on disk; `train-heads` and `hispec pretrain` (`data.source="on_policy"`, or "mixed"
with ShareGPT text) train on them; bad settings are one-line errors."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from hispec_jax import cli, load_model
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.presets import PRESETS_DIR
from hispec_jax.models.transformer import scan_exits
from hispec_jax.train_heads import on_policy
from hispec_jax.train_heads import pretrain as pt
from hispec_jax.train_heads.train import train
from test_engine import random_prompts, tiny_model
from test_exit_recipe import _pretrain
from test_train_heads import read_metrics, small_config


def _final_argmax(model, tokens):
    """The final layer's greedy token after every prefix of `tokens` (teacher-forced)."""
    h, _ = scan_exits(model.params, model.cfg, jnp.asarray(tokens)[None], lambda h, i: None)
    return np.asarray(jnp.argmax(exit_logits(model.params, {}, model.cfg, h,
                                             model.cfg.num_layers), -1))[0]


def test_greedy_continuations_are_the_models_argmax_and_cached(tmp_path):
    model = tiny_model(3, 2)
    prompts = random_prompts(np.random.RandomState(1), 5, 7)
    gen = on_policy.Generation(new_tokens=6, batch_size=2)
    logs = []
    docs = on_policy.continuation_docs(model, prompts, gen, cache_dir=tmp_path, log=logs.append)
    assert len(docs) == 5 and all(d.dtype == np.int32 for d in docs)
    for prompt, doc in zip(prompts, docs):
        assert list(doc[:len(prompt)]) == prompt and 1 <= len(doc) - len(prompt) <= 6
        # every continuation token is the final layer's argmax given what came before
        np.testing.assert_array_equal(doc[len(prompt):], _final_argmax(model, doc)[len(prompt) - 1:-1])
    again = on_policy.continuation_docs(model, prompts, gen, cache_dir=tmp_path, log=logs.append)
    assert "generated" in logs[0] and "continuations from" in logs[1]  # the second read the cache
    for a, b in zip(docs, again):
        np.testing.assert_array_equal(a, b)


def test_sampled_continuations_are_deterministic_given_the_seed():
    model = tiny_model(3, 2)
    prompts = random_prompts(np.random.RandomState(2), 4, 5)
    runs = [on_policy.continuation_docs(model, prompts, on_policy.Generation(
        new_tokens=8, sampling="sampled", seed=seed, batch_size=4), log=lambda s: None)
        for seed in (3, 3, 4)]
    assert all(np.array_equal(a, b) for a, b in zip(runs[0], runs[1]))
    assert not all(np.array_equal(a, b) for a, b in zip(runs[0], runs[2]))


def test_train_heads_on_policy_end_to_end(tmp_path, hf_models):
    """A tiny model with a tokenizer: rows from its own continuations of ShareGPT training
    prompts, trained through `train`; the rows' source says so."""
    model_dir = hf_models["llama3"][1]
    config = small_config(tmp_path, model_dir, data_source="on_policy", on_policy_prompts=6,
                          on_policy_new_tokens=12, on_policy_batch=3, seq_len=16,
                          total_steps=4, eval_every=4, eval_rows=2, head_layers=(1,),
                          head_rank=0)
    logs = []
    result = train(config, log=logs.append)
    assert any("on-policy (greedy continuations of 6 ShareGPT training prompts" in line
               for line in logs)
    assert [r["step"] for r in read_metrics(config.workdir) if r["event"] == "eval"] == [0, 4]
    assert set(result.heads) == {"1"}
    assert load_model(result.output_dir).exit_head_kinds()[1] == "full"


@pytest.mark.parametrize("args, message", [
    (["--config.data_source=on_policy", "--config.on_policy_sampling=beam"],
     "on_policy_sampling='beam' must be 'greedy' or 'sampled'"),
    (["--config.data_source=on_policy", "--config.on_policy_new_tokens=0"],
     "on_policy_new_tokens=0 must be >= 1"),
    (["--config.data_source=on_policy", "--config.on_policy_sampling=sampled",
      "--config.on_policy_temperature=0"], "on_policy_temperature=0.0 must be > 0"),
])
def test_bad_on_policy_settings_are_one_line_errors(capsys, args, message):
    assert cli.main(["train-heads", "--config", "configs/train_heads_small.py",
                     "--config.model_path=/m", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


# ----- continued pretraining on the model's own continuations (hispec pretrain) --------

ON_POLICY = ["--config.data.source=on_policy", "--config.data.on_policy_prompts=4",
             "--config.data.on_policy_new_tokens=8", "--config.data.on_policy_batch=2",
             "--config.data.batch_size=2"]


def test_pretrain_on_policy_trains_on_the_init_models_continuations(tmp_path, capsys):
    """The training documents are `init_from`'s greedy continuations of ShareGPT training
    prompts (every new token its final layer's argmax), generated once and then read from
    the cache; evaluation stays on ShareGPT."""
    _pretrain(tmp_path / "a", "--config.num_steps=0", "--config.eval_batches=1")
    src = tmp_path / "a" / "model"
    args = [f"--config.init_from={src}", "--config.num_steps=2", "--config.eval_batches=1",
            *ON_POLICY]
    summary = _pretrain(tmp_path / "b", *args)
    assert "generated" in capsys.readouterr().out
    assert summary["steps"] == 2 and summary["train_source"] == "on_policy"
    assert summary["train_docs"] == 4 and summary["eval"]["replies"]["tokens"] > 0
    assert len(list((tmp_path / "b" / "token_cache" / "on_policy").glob("*.tokens.npy"))) == 1

    model = load_model(src, dtype="float32", layer_layout="scan")
    prompts = on_policy.training_prompts(model, 4)
    config = pt.load_pretrain_config(PRESETS_DIR / "pretrain_default.py", small=True)
    config.init_from, config.data.token_cache_dir = str(src), str(tmp_path / "b" / "token_cache")
    for key in ON_POLICY:
        key, value = key.removeprefix("--config.data.").split("=")
        config.data[key] = type(config.data[key])(value)
    _, train, evals, _ = pt.prepare_data(config, tmp_path / "c", model.tokenizer, model)
    assert "continuations from" in capsys.readouterr().out  # the cache, not a new generation
    assert len(train.docs) == 4
    for prompt, doc in zip(prompts, train.docs):
        assert list(doc[:len(prompt)]) == prompt and 1 <= len(doc) - len(prompt) <= 8
        np.testing.assert_array_equal(doc[len(prompt):],
                                      _final_argmax(model, doc)[len(prompt) - 1:-1])
    assert evals.docs[0][0] == model.tokenizer.bos_token_id  # held-out text: ShareGPT's


def test_pretrain_mixed_trains_on_sharegpt_and_repeated_continuations(tmp_path, capsys):
    """`data.source="mixed"`: the ShareGPT training documents, then the `init_from` model's
    continuations `on_policy_repeat` times (the packing shuffles them together)."""
    _pretrain(tmp_path / "a", "--config.num_steps=0", "--config.eval_batches=1")
    src = tmp_path / "a" / "model"
    model = load_model(src, dtype="float32", layer_layout="scan")
    config = pt.load_pretrain_config(PRESETS_DIR / "pretrain_default.py", small=True)
    config.init_from, config.data.token_cache_dir = str(src), str(tmp_path / "cache")
    for key in ON_POLICY:
        key, value = key.removeprefix("--config.data.").split("=")
        config.data[key] = type(config.data[key])(value)
    _, policy, _, _ = pt.prepare_data(config, tmp_path / "b", model.tokenizer, model)
    config.data.source = "sharegpt"
    _, human, _, _ = pt.prepare_data(config, tmp_path / "b", model.tokenizer, model)
    config.data.source, config.data.on_policy_repeat = "mixed", 3
    _, mixed, _, _ = pt.prepare_data(config, tmp_path / "b", model.tokenizer, model)
    assert "generated" in capsys.readouterr().out  # once: the later runs read the cache
    assert len(mixed.docs) == len(human.docs) + 3 * len(policy.docs)
    expected = list(human.docs) + 3 * list(policy.docs)
    assert all(np.array_equal(a, b) for a, b in zip(mixed.docs, expected))
    summary = _pretrain(tmp_path / "c", f"--config.init_from={src}", "--config.num_steps=1",
                        "--config.eval_batches=1", *ON_POLICY, "--config.data.source=mixed",
                        f"--config.data.token_cache_dir={tmp_path / 'cache'}")
    assert summary["train_source"] == "mixed" and summary["train_docs"] == len(mixed.docs) - 2 * 4


@pytest.mark.parametrize("args, message", [
    (["--config.data.source=pile"],
     "data.source='pile' must be one of ('sharegpt', 'on_policy', 'mixed')"),
    (["--config.data.source=on_policy"], "data.source='on_policy' trains on the init_from"),
    (["--config.data.source=mixed"], "data.source='mixed' trains on the init_from"),
    (["--config.init_from=/m", *ON_POLICY, "--config.data.source=mixed",
      "--config.data.on_policy_repeat=0"], "data.on_policy_repeat=0 must be an integer >= 1"),
    (["--config.init_from=/m", *ON_POLICY, "--config.data.on_policy_sampling=beam"],
     "data.on_policy_sampling='beam' must be 'greedy' or 'sampled'"),
    (["--config.init_from=/m", *ON_POLICY, "--config.data.on_policy_prompts=0"],
     "data.on_policy_prompts=0 must be >= 1"),
    (["--config.init_from=/m", *ON_POLICY, "--config.data.on_policy_sampling=sampled",
      "--config.data.on_policy_temperature=0"], "data.on_policy_temperature=0.0 must be > 0"),
])
def test_bad_pretrain_on_policy_settings_are_one_line_errors(tmp_path, capsys, args, message):
    assert cli.main(["pretrain", "--small", "--no-progress", f"--config.work_dir={tmp_path}",
                     *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "tokenizer").exists()  # rejected before any data was prepared
