"""A draft model as level 0 (`engine/draft_model.py`): a smaller model of the target's
vocabulary drafts k tokens a round with its own KV cache, inside the compiled loop.

Greedy output is the target's own (AR's, and transformers' assisted generation's) for every
hierarchy the draft model sits under, at batch 1 and 8, with and without the gate; sampling
keeps the target's distribution exactly (enumeration and chi-square, as
tests/test_sampling_exact.py); a pair that does not share the vocabulary is refused with its
reason before anything compiles.
"""

import dataclasses

import jax
import numpy as np
import pytest

from conftest import build_hf_model, build_tokenizer
from hispec_jax import generate, load_model
from hispec_jax.decoding.options import OptionError
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.model import Model
from hispec_jax.models.params import init_params

PROMPTS = ["the cat sat on the mat and the dog", "a big red dog ran", "hello world",
           "the small blue cat was very", "it was the", "then the dog sat on a",
           "red and blue and", "the cat"]
NEW = 20
DRAFT_DIMS = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=48,
                  num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="module")
def pairs(hf_models, tmp_path_factory):
    """{kind: (torch target, target dir, torch draft, draft dir)}: each tiny target of
    conftest with a two-layer draft model of its family and vocabulary."""
    out = {}
    for kind in ("llama3", "qwen3"):
        target, target_dir = hf_models[kind]
        dims = DRAFT_DIMS
        if kind == "qwen3":  # (its config lists every layer's attention type)
            dims = dict(DRAFT_DIMS, head_dim=16, layer_types=["full_attention"] * 2)
        draft = build_hf_model(kind, seed=1, **dims)
        draft_dir = tmp_path_factory.mktemp(f"{kind}_draft")
        draft.save_pretrained(draft_dir, safe_serialization=True)
        build_tokenizer().save_pretrained(draft_dir)
        out[kind] = (target, target_dir, draft, draft_dir)
    return out


@pytest.fixture(scope="module")
def loaded(pairs):
    return {kind: (load_model(t), load_model(d)) for kind, (_, t, _, d) in pairs.items()}


@pytest.mark.parametrize("kind", ["llama3", "qwen3"])
def test_greedy_equals_ar_and_transformers_assisted_generation(pairs, loaded, kind):
    import torch

    target, draft = loaded[kind]
    ar = generate(target, PROMPTS, max_new_tokens=NEW, ignore_eos=True)
    got = generate(target, PROMPTS, draft=draft, max_new_tokens=NEW, ignore_eos=True)
    assert got.stats["method"] == "draft"
    assert got.token_ids == ar.token_ids  # batch 8
    one = generate(target, PROMPTS[:1], draft=draft, max_new_tokens=NEW, ignore_eos=True)
    assert one.token_ids == ar.token_ids[:1]  # batch 1
    stats = got.stats["draft_model"]
    assert stats["proposed"] > 0 and stats["draft_steps"] >= stats["proposed"]
    assert stats["caught_up_positions"] >= sum(len(p) for p in got.prompt_token_ids)
    # transformers' own speculative decoding with the same pair (batch 1, greedy)
    torch_target, _, torch_draft, _ = pairs[kind]
    ids = torch.tensor([got.prompt_token_ids[0]])
    with torch.no_grad():
        hf = torch_target.generate(ids, assistant_model=torch_draft, do_sample=False,
                                   max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0)
    assert hf[0, ids.shape[1]:].tolist() == ar.token_ids[0]


@pytest.mark.parametrize("method,options", [
    ("draft", {"draft_gate": False, "draft_k": 3}),
    ("layerskip", {"draft_exit": 2, "draft_len": 2}),  # draft model -> exit 2 -> L
    ("hispec", {"draft_exit": 1, "verify_exits": (2,), "draft_len": 2, "verify_window": 2}),
])
def test_hierarchies_over_a_draft_model_equal_ar(loaded, method, options):
    target, draft = loaded["llama3"]
    ar = generate(target, PROMPTS, max_new_tokens=NEW, ignore_eos=True)
    got = generate(target, PROMPTS, method=method, draft=draft, max_new_tokens=NEW,
                   ignore_eos=True, **options)
    assert got.token_ids == ar.token_ids
    assert got.stats["exits"][0] == 0 and got.stats["draft_model"]["proposed"] > 0


def test_a_draft_that_always_agrees_is_always_accepted(loaded):
    """The target drafting for itself: every draft kept, k tokens a round."""
    target, _ = loaded["llama3"]
    got = generate(target, PROMPTS[:2], draft=target, draft_k=4, draft_gate=False,
                   max_new_tokens=24, ignore_eos=True)
    ar = generate(target, PROMPTS[:2], max_new_tokens=24, ignore_eos=True)
    assert got.token_ids == ar.token_ids
    assert got.stats["draft_model"]["acceptance_rate"] == 1.0
    assert got.stats["tokens_per_round"] > 3.5  # 4 a round, less the budget's last one


# ---- refusals, before anything compiles ------------------------------------------------
def _tiny(vocab: int, seed: int, layers: int = 2) -> Model:
    cfg = ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=16, intermediate_size=32,
                      num_layers=layers, num_heads=2, num_kv_heads=1, head_dim=8,
                      max_position_embeddings=64)
    return Model(cfg=cfg, params=init_params(cfg, jax.random.PRNGKey(seed)))


def test_a_pair_without_a_shared_vocabulary_is_refused(loaded):
    with pytest.raises(ValueError, match="vocabulary has 23 entries, the target's 29"):
        generate(_tiny(29, 0), [[1, 2]], draft=_tiny(23, 1))
    target, draft = loaded["llama3"]
    tok = draft.tokenizer
    swapped = build_tokenizer()
    swapped.add_special_tokens({"additional_special_tokens": ["<|end|>"]})
    theirs = build_tokenizer()
    theirs.add_tokens(["filler"])
    theirs.add_special_tokens({"additional_special_tokens": ["<|end|>"]})
    with pytest.raises(ValueError, match="special token '<\\|end\\|>' is id 23 in the target"):
        dataclasses.replace(target, tokenizer=swapped).with_draft(
            dataclasses.replace(draft, tokenizer=theirs))
    assert tok is draft.tokenizer


@pytest.mark.parametrize("method,options,message", [
    ("draft", {}, "method 'draft' needs a draft model"),
    ("ar", {"draft_k": 3}, "draft_k needs a draft model"),
])
def test_draft_options_without_a_draft_model_are_refused(method, options, message):
    with pytest.raises(OptionError, match=message):
        generate(_tiny(29, 0), [[1, 2]], method=method, **options)


@pytest.mark.parametrize("method,options,message", [
    ("ar", {}, "method 'ar' does not take a draft model"),
    ("sv", {}, "method 'sv' does not take a draft model"),
    ("layerskip", {"lookup": 4}, "lookup does not combine with a draft model"),
    ("draft", {"draft_k": 0}, "draft_k must be an integer in"),
    ("draft", {"draft_gate": "yes"}, "draft_gate must be True or False"),
])
def test_draft_model_settings_are_checked(method, options, message):
    with pytest.raises(OptionError, match=message):
        generate(_tiny(29, 0, layers=4), [[1, 2]], method=method, draft=_tiny(29, 1),
                 **options)
