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
    ar = generate(target, PROMPTS, method="ar", max_new_tokens=NEW, ignore_eos=True)
    got = generate(target, PROMPTS, draft=draft, max_new_tokens=NEW, ignore_eos=True)
    assert got.stats["method"] == "draft"
    assert got.token_ids == ar.token_ids  # batch 8
    one = generate(target, PROMPTS[:1], draft=draft, max_new_tokens=NEW, ignore_eos=True)
    assert one.token_ids == ar.token_ids[:1]  # batch 1
    stats = got.stats["draft_model"]
    assert stats["proposed"] > 0 and stats["draft_steps"] >= stats["proposed"]
    # every prompt is caught up before its first draft (its last position runs with the
    # first draft step)
    assert stats["caught_up_positions"] >= sum(len(p) - 1 for p in got.prompt_token_ids)
    # its passes' share of the work (by multiply-adds): the target's passes remain
    assert 0 < stats["work_share"] < 0.5
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
    ("draft", {"lookup": 4, "max_ngram": 2}),  # lookup -> draft model -> L
    ("layerskip", {"draft_exit": 2, "draft_len": 2, "lookup": 3}),  # lookup -> draft -> 2 -> L
])
def test_hierarchies_over_a_draft_model_equal_ar(loaded, method, options):
    target, draft = loaded["llama3"]
    ar = generate(target, PROMPTS, method="ar", max_new_tokens=NEW, ignore_eos=True)
    got = generate(target, PROMPTS, method=method, draft=draft, max_new_tokens=NEW,
                   ignore_eos=True, **options)
    assert got.token_ids == ar.token_ids
    assert got.stats["exits"][0] == 0 and got.stats["draft_model"]["proposed"] > 0


def test_a_draft_that_always_agrees_is_always_accepted(loaded):
    """The target drafting for itself: every draft kept, k tokens a round."""
    target, _ = loaded["llama3"]
    got = generate(target, PROMPTS[:2], draft=target, draft_k=4, draft_gate=False,
                   max_new_tokens=24, ignore_eos=True)
    ar = generate(target, PROMPTS[:2], method="ar", max_new_tokens=24, ignore_eos=True)
    assert got.token_ids == ar.token_ids
    assert got.stats["draft_model"]["acceptance_rate"] == 1.0
    assert got.stats["tokens_per_round"] > 3.5  # 4 a round, less the budget's last one


def test_rounds_without_drafts_run_as_ar_steps(loaded):
    """A draft model that never agrees (random weights): after its first round the gate
    drafts nothing but a probe now and then, and its rounds at window 0 run as AR's step
    (`Round.plain`, a loop of its own between the rounds that draft): AR's output at batch
    8 and 1."""
    target, _ = loaded["llama3"]
    cfg = target.cfg.replace(num_layers=1)
    never = Model(cfg=cfg, params=init_params(cfg, jax.random.PRNGKey(5)))
    ar = generate(target, PROMPTS, method="ar", max_new_tokens=60, ignore_eos=True)
    for prompts in (PROMPTS, PROMPTS[:1]):
        got = generate(target, prompts, draft=never, max_new_tokens=60, ignore_eos=True)
        assert got.token_ids == ar.token_ids[:len(prompts)]
        dm, rounds = got.stats["draft_model"], got.stats["rounds"]
        assert dm["accepted"] == 0 and rounds == 59  # the prefill emits the first token
        # the first round drafts k = 5, a probe 1 more; every other round is plain
        assert dm["draft_steps"] > 5 * len(prompts) and dm["plain_rounds"] >= rounds - 3
        # catching up: the prompts before the first round, then each probe's skipped rounds
        # (a pass of up to 64 positions for all the batch)
        assert 2 <= dm["catch_up_passes"] <= rounds - dm["plain_rounds"]
        assert dm["caught_up_positions"] <= 64 * len(prompts) * dm["catch_up_passes"]


def test_a_smaller_k_after_a_larger_one_compiles_its_own_loop(loaded):
    """An ungated draft model at k = 3 after one at k = 4 in the same process: the k = 4
    loop cannot run it (a draft model's k is its level's window), so it gets its own
    (`Hierarchy.covers` once raised here instead of answering no)."""
    target, _ = loaded["llama3"]
    for k in (4, 3):
        got = generate(target, PROMPTS[:1], draft=target, draft_k=k, draft_gate=False,
                       max_new_tokens=12, ignore_eos=True)
        assert got.stats["draft_model"]["k"] == k and got.stats["window_bounds"][0] == k


def test_lookup_tokens_the_draft_model_agrees_with_are_drafted_in_one_pass(loaded):
    """prompt lookup -> draft model -> target, the target drafting for itself over a
    prompt that repeats: lookup tokens kept, more drafts than draft-model passes."""
    target, _ = loaded["llama3"]
    ar = generate(target, PROMPTS[:2], method="ar", max_new_tokens=32, ignore_eos=True)
    prompts = [p + q for p, q in zip(ar.prompt_token_ids, ar.token_ids)]  # its own output
    ar = generate(target, prompts, method="ar", max_new_tokens=32, ignore_eos=True)
    got = generate(target, prompts, draft=target, draft_k=6, draft_gate=False, lookup=4,
                   max_new_tokens=32, ignore_eos=True)
    assert got.token_ids == ar.token_ids
    stats = got.stats["draft_model"]
    assert stats["lookup"]["accepted"] > 0 and stats["drafted"] > stats["draft_steps"]
    assert stats["acceptance_rate"] == 1.0


def test_the_lookup_below_a_draft_model_drafts_from_earlier_requests(loaded):
    """prompt lookup -> draft model -> target with a store of earlier requests
    (`cross_request`): the same prompts again draft from the store (its tokens kept by the
    draft model), and every output is AR's, at batch 3 and 1."""
    from hispec_jax.decoding.suffix_store import SuffixStore

    target, draft = loaded["llama3"]
    ar = generate(target, PROMPTS[:3], method="ar", max_new_tokens=NEW, ignore_eos=True)
    store = SuffixStore(size=512)
    options = dict(draft=target, draft_k=6, draft_gate=False, lookup=4, max_new_tokens=NEW,
                   ignore_eos=True, cross_request=store)
    first = generate(target, PROMPTS[:3], **options)
    assert first.token_ids == ar.token_ids
    assert first.stats["draft_model"]["lookup"]["from_earlier_requests"]["proposed"] == 0
    assert store.version == 3
    for prompts in (PROMPTS[:3], PROMPTS[:1]):
        again = generate(target, prompts, **options)
        assert again.token_ids == ar.token_ids[:len(prompts)]
        earlier = again.stats["draft_model"]["lookup"]["from_earlier_requests"]
        assert earlier["accepted"] > 0 and again.stats["draft_model"]["acceptance_rate"] == 1.0
    # a draft model that disagrees with the target: its store tokens are checked, output AR's
    got = generate(target, PROMPTS[:3], **dict(options, draft=draft))
    assert got.token_ids == ar.token_ids
    assert got.stats["draft_model"]["lookup"]["from_earlier_requests"]["proposed"] > 0


@pytest.fixture(scope="module")
def smaller(tmp_path_factory):
    """A one-layer llama draft for llama3's two-layer draft model (HSD's lowest level)."""
    small = build_hf_model("llama3", seed=2, **dict(DRAFT_DIMS, num_hidden_layers=1))
    small_dir = tmp_path_factory.mktemp("llama3_smaller")
    small.save_pretrained(small_dir, safe_serialization=True)
    build_tokenizer().save_pretrained(small_dir)
    return load_model(small_dir)


@pytest.mark.parametrize("method,options", [
    ("draft", {"draft_k": (2, 4)}),  # small -> draft model -> L
    ("layerskip", {"draft_exit": 2, "draft_len": 2}),  # small -> draft model -> exit 2 -> L
])
def test_two_draft_models_equal_ar(loaded, smaller, method, options):
    target, draft = loaded["llama3"]
    ar = generate(target, PROMPTS, method="ar", max_new_tokens=NEW, ignore_eos=True)
    got = generate(target, PROMPTS, method=method, draft=(smaller, draft), max_new_tokens=NEW,
                   ignore_eos=True, **options)
    assert got.token_ids == ar.token_ids
    inner = got.stats["draft_model"]["inner_draft_model"]
    assert inner["layers"] == 1 and inner["proposed"] > 0


def test_two_draft_models_that_always_agree_draft_k_plus_one_a_round(loaded):
    """The target drafting for itself twice: every level keeps everything, the smaller
    model's tokens save the draft model's passes."""
    target, _ = loaded["llama3"]
    got = generate(target, PROMPTS[:2], draft=(target, target), draft_k=(2, 4),
                   draft_gate=False, max_new_tokens=25, ignore_eos=True)
    ar = generate(target, PROMPTS[:2], method="ar", max_new_tokens=25, ignore_eos=True)
    assert got.token_ids == ar.token_ids
    stats = got.stats["draft_model"]
    assert stats["acceptance_rate"] == 1.0
    assert stats["inner_draft_model"]["accepted"] == stats["inner_draft_model"]["proposed"] > 0
    assert stats["drafted"] > 2 * stats["draft_steps"]  # 1 + 2 drafts a pass, less the ends
    assert got.stats["tokens_per_round"] > 4.5  # k + 1 = 5 a round, less the budget's end


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
    ("draft", {"lookup": 4, "lookup_gate": False},
     "lookup_gate does not combine with a draft model"),
    ("draft", {"draft_k": 0}, "draft_k must be an integer in"),
    ("draft", {"draft_gate": "yes"}, "draft_gate must be True or False"),
    ("auto", {"draft_k": 3}, "method 'auto' does not take draft_k"),
])
def test_draft_model_settings_are_checked(method, options, message):
    with pytest.raises(OptionError, match=message):
        generate(_tiny(29, 0, layers=4), [[1, 2]], method=method, draft=_tiny(29, 1),
                 **options)


@pytest.mark.parametrize("drafts,options,message", [
    (1, {"draft_k": (2, 4)}, "gives two draft models' k, the model has one draft model"),
    (2, {"lookup": 4}, "lookup does not combine with two draft models"),
    (3, {}, "one or two draft models"),
    (2, {"draft_k": (2, 4, 6)}, "draft_k must be an integer in"),
])
def test_two_draft_models_settings_are_checked(drafts, options, message):
    with pytest.raises(ValueError, match=message):
        generate(_tiny(29, 0, layers=4), [[1, 2]], method="draft",
                 draft=[_tiny(29, i + 1) for i in range(drafts)], **options)
    with pytest.raises(ValueError, match="three draft models"):
        _tiny(29, 0).with_draft(_tiny(29, 1).with_draft(_tiny(29, 2).with_draft(_tiny(29, 3))))


# ---- sampling: the target's distribution exactly ----------------------------------------
def _exact_setup():
    """The enumerable model of tests/test_sampling_exact.py (VOCAB tokens) and a one-layer
    draft model of its vocabulary whose q differs from the target's p."""
    from test_sampling_exact import VOCAB, small_model

    cfg = ModelConfig(model_type="llama", vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                      num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                      max_position_embeddings=64)
    return small_model(), Model(cfg=cfg, params=init_params(cfg, jax.random.PRNGKey(3),
                                                            init_std=0.5))


def _store_after(context, continuation):
    """A store of earlier requests holding one entry: `context` then `continuation`."""
    from hispec_jax.decoding.suffix_store import SuffixStore

    store = SuffixStore(size=64)
    store.add(store.scope_of(None), context, continuation)
    return store


def _sampled(target, draft, method, seed, **options):
    from test_sampling_exact import N_SAMPLES, NEW as N_NEW, PROMPT

    return generate(target, [PROMPT] * N_SAMPLES, method=method, draft=draft,
                    max_new_tokens=N_NEW, ignore_eos=True, temperature=1.0, top_k=3, seed=seed,
                    **options)


@pytest.mark.parametrize("method,options", [
    ("draft", {"acceptance": "tokenwise", "draft_k": 2}),
    ("draft", {"acceptance": "blockwise", "draft_k": 3, "draft_gate": False}),
    ("layerskip", {"draft_exit": 2, "draft_len": 1}),  # draft model -> exit 2 -> L
    # lookup -> draft model -> L, over a prompt whose last token occurred before (2: the
    # lookup proposes 3 after it), no gate, 4 new tokens: prefill emits the first, the first
    # round drafts 2, so the draft model's first pass checks 1 lookup token
    ("draft", {"draft_k": 3, "draft_gate": False, "lookup": 2, "max_ngram": 1}),
    # the same with a store of earlier requests whose 2-gram match outranks the prompt's
    # 1-gram one (`_store_after`): the lookup's tokens come from the store
    ("draft", {"draft_k": 3, "draft_gate": False, "lookup": 2, "max_ngram": 2,
               "cross_request": "store"}),
])
def test_sampling_keeps_the_target_distribution_exactly(method, options, monkeypatch):
    import test_sampling_exact
    from test_sampling_exact import N_SAMPLES, chi_square_test, exact_ar_distribution

    from hispec_jax.decoding.sampling import SamplingParams

    if "lookup" in options:
        prompt = [1, 2, 3, 1, 2] if "cross_request" not in options else [1, 2, 3, 0, 2]
        monkeypatch.setattr(test_sampling_exact, "PROMPT", prompt)
        monkeypatch.setattr(test_sampling_exact, "NEW", 4)
    if "cross_request" in options:
        options = dict(options, cross_request=_store_after([0, 2], [1, 3, 2, 0, 1]))
    target, draft = _exact_setup()
    probs = exact_ar_distribution(target, SamplingParams(temperature=1.0, top_k=3, seed=21))
    r = _sampled(target, draft, method, 21, **options)
    assert 0 < r.stats["draft_model"]["acceptance_rate"] < 1  # drafts kept and rejected
    if options.get("draft_gate", True) and method == "draft" and "lookup" not in options:
        # the budget's last token was drawn in a plain round (`Round.plain`)
        assert r.stats["draft_model"]["plain_rounds"] > 0
    if "lookup" in options:  # the draft model kept some lookup tokens and replaced others
        lookup = r.stats["draft_model"]["lookup"]
        assert 0 < lookup["accepted"] < lookup["proposed"]
        if "cross_request" in options:
            earlier = lookup["from_earlier_requests"]
            assert 0 < earlier["accepted"] < earlier["proposed"]
    stat, threshold = chi_square_test(r.token_ids, probs, N_SAMPLES)
    assert stat < threshold, (stat, threshold)


def test_sampling_with_two_draft_models_keeps_the_target_distribution(monkeypatch):
    """small -> draft model -> L: the draft model checks the small model's draws with their
    q' (token-wise rejection), so its drafts are draws from its q; 4 new tokens (prefill
    emits the first, the first round drafts 2: the small model proposes 1)."""
    import test_sampling_exact
    from test_sampling_exact import N_SAMPLES, chi_square_test, exact_ar_distribution

    from hispec_jax.decoding.sampling import SamplingParams

    monkeypatch.setattr(test_sampling_exact, "NEW", 4)
    target, draft = _exact_setup()
    small = Model(cfg=draft.cfg, params=init_params(draft.cfg, jax.random.PRNGKey(4),
                                                    init_std=0.5))
    probs = exact_ar_distribution(target, SamplingParams(temperature=1.0, top_k=3, seed=21))
    r = _sampled(target, (small, draft), "draft", 21, draft_k=(2, 3), draft_gate=False)
    inner = r.stats["draft_model"]["inner_draft_model"]
    assert 0 < inner["accepted"] < inner["proposed"]
    stat, threshold = chi_square_test(r.token_ids, probs, N_SAMPLES)
    assert stat < threshold, (stat, threshold)


def test_the_same_test_catches_a_drafter_that_misstates_its_q(monkeypatch):
    """The drafts drawn from q but verified as if drawn from a uniform q: biased output."""
    from test_sampling_exact import N_SAMPLES, chi_square_test, exact_ar_distribution

    import jax.numpy as jnp

    from hispec_jax.decoding.engine import draft_model
    from hispec_jax.decoding.sampling import SamplingParams

    def uniform_logq(self, rnd, state, proposed_pos_BxT, proposed_BxT):
        V = rnd.cfg.vocab_size
        return jnp.full(proposed_BxT.shape + (V,), -np.log(V), jnp.float32)

    from hispec_jax.decoding import engine as engine_lib

    engine_lib.clear_compiled()  # the loop compiled above is the same engine: trace it anew
    monkeypatch.setattr(draft_model.DraftModelDrafter, "proposal_logq", uniform_logq)
    target, draft = _exact_setup()
    probs = exact_ar_distribution(target, SamplingParams(temperature=1.0, top_k=3, seed=21))
    r = _sampled(target, draft, "draft", 21, acceptance="tokenwise", draft_k=2)
    engine_lib.clear_compiled()  # no later test may run the mutant
    stat, threshold = chi_square_test(r.token_ids, probs, N_SAMPLES)
    assert stat > threshold, (stat, threshold)


# ---- streaming and serving --------------------------------------------------------------
def test_generate_stream_with_a_draft_model_is_ar(loaded):
    import hispec_jax

    target, draft = loaded["llama3"]
    ar = generate(target, PROMPTS[:1], method="ar", max_new_tokens=NEW, ignore_eos=True)
    stream = hispec_jax.generate_stream(target.with_draft(draft), PROMPTS[0],
                                        max_new_tokens=NEW, ignore_eos=True)
    text = "".join(stream)
    assert stream.result.token_ids == ar.token_ids
    ar_text = "".join(hispec_jax.generate_stream(target, PROMPTS[0], method="ar",
                                                 max_new_tokens=NEW,
                                                 ignore_eos=True))
    assert text == ar_text  # (the streams' detokenizer: the test tokenizer joins no spaces)
    assert stream.result.stats["method"] == "draft"
    assert stream.result.stats["draft_model"]["proposed"] > 0


def test_served_with_a_draft_model_answers_as_ar(loaded):
    """`hispec serve --draft-model`'s app: greedy answers are AR's through the openai
    client; /health names the plan, /metrics counts the draft model's proposals and its
    share of the work."""
    import json
    import urllib.request

    from conftest import serving

    openai = pytest.importorskip("openai")
    from hispec_jax.serving import server as server_lib

    import hispec_jax

    target, draft = loaded["llama3"]
    ar = [("".join(hispec_jax.generate_stream(target, p, method="ar",
                                              max_new_tokens=NEW, ignore_eos=True)))
          for p in PROMPTS[:3]]
    app = server_lib.build_app(target.with_draft(draft), None, slots=2, max_cache_len=96,
                               warmup=False)
    with serving(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                               timeout=300)
        for prompt, text in zip(PROMPTS[:3], ar):
            r = client.completions.create(model=client.models.list().data[0].id,
                                          prompt=prompt, max_tokens=NEW, temperature=0,
                                          extra_body={"ignore_eos": True})
            assert r.choices[0].text == text
        with urllib.request.urlopen(url + "/health", timeout=30) as h:
            health = json.loads(h.read().decode())
        with urllib.request.urlopen(url + "/metrics", timeout=30) as m:
            metrics = m.read().decode()
    assert health["plan"] == "draft model llama 2x32 k=5", health
    assert health["reason"] == "a draft model was given"
    line = next(x for x in metrics.splitlines() if x.startswith(
        'hispec:spec_decode_num_draft_tokens_total{drafter="draft",engine="greedy"'))
    assert float(line.split()[-1]) > 0
    passes = next(x for x in metrics.splitlines() if x.startswith(
        'hispec:spec_decode_drafter_events_total{drafter="draft",engine="greedy",'
        'event="draft_passes"}'))
    assert float(passes.split()[-1]) > 0
    share = next(x for x in metrics.splitlines() if x.startswith(
        'hispec:spec_decode_draft_work_share{engine="greedy"}'))
    assert 0 < float(share.split()[-1]) < 0.5  # the target's passes remain most of it


def test_served_lookup_below_a_draft_model_drafts_from_earlier_requests(loaded):
    """`hispec serve --draft-model D --lookup K --cross-request`'s app: a repeated request
    drafts from the store below the draft model (/metrics' drafter events say so), /health
    says the store is on, and both answers are the same. (Their tokens are AR's by
    `test_the_lookup_below_a_draft_model_drafts_from_earlier_requests`; the tiny tokenizer's
    text of a random model's tokens depends on how they were streamed, so text is compared
    only between the two answers.)"""
    import json
    import urllib.request

    from conftest import serving

    openai = pytest.importorskip("openai")
    from hispec_jax.serving import server as server_lib

    target, _ = loaded["llama3"]
    app = server_lib.build_app(target.with_draft(target), None, slots=2, max_cache_len=96,
                               warmup=False, cross_request=True, lookup=4, draft_gate=False)
    with serving(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                               timeout=300)
        texts = [client.completions.create(
            model=client.models.list().data[0].id, prompt=PROMPTS[0], max_tokens=NEW,
            temperature=0, extra_body={"ignore_eos": True}).choices[0].text for _ in range(2)]
        assert texts[0] == texts[1] and texts[0]
        with urllib.request.urlopen(url + "/health", timeout=30) as h:
            health = json.loads(h.read().decode())
        with urllib.request.urlopen(url + "/metrics", timeout=30) as m:
            metrics = m.read().decode()
    assert health["cross_request"] is True, health
    kept = next(x for x in metrics.splitlines() if x.startswith(
        'hispec:spec_decode_drafter_events_total{drafter="draft",engine="greedy",'
        'event="below_store_accepted"}'))
    assert float(kept.split()[-1]) > 0


def test_command_line_draft_model_gives_ar_output(pairs, capsys):
    """`hispec generate --draft-model D`: method draft by default, AR's tokens, the draft's
    own startup line."""
    import json

    from hispec_jax import cli

    _, target_dir, _, draft_dir = pairs["llama3"]
    base = ["generate", "--model", str(target_dir), "--max-new-tokens", "12", "--ignore-eos",
            "--json", PROMPTS[0]]
    assert cli.main(base + ["--method", "ar"]) == 0
    ar = json.loads(capsys.readouterr().out)
    assert cli.main(base + ["--draft-model", str(draft_dir), "--draft-k", "3"]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert got["outputs"][0]["token_ids"] == ar["outputs"][0]["token_ids"]
    assert got["stats"]["method"] == "draft" and got["stats"]["draft_model"]["k"] == 3
    assert f"draft model {draft_dir}: 2 layers" in err
    assert "plan: draft (a draft model was given (--draft-model))" in err
    # HSD's two draft models: the draft drafting for itself under the draft model
    assert cli.main(base + ["--draft-model", str(draft_dir), "--smaller-draft-model",
                            str(draft_dir), "--draft-k", "2,4"]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert got["outputs"][0]["token_ids"] == ar["outputs"][0]["token_ids"]
    inner = got["stats"]["draft_model"]["inner_draft_model"]
    assert inner["k"] == 2 and inner["accepted"] == inner["proposed"] > 0
    assert f"smaller draft model {draft_dir}: 2 layers" in err


# ---- the compiled loop ----------------------------------------------------------------------
@pytest.mark.parametrize("layout, smaller", [("scan", False), ("unrolled", False),
                                             ("unrolled", True)])
def test_the_compiled_loop_copies_no_draft_cache(layout, smaller, users_codegen):
    """The draft's KV cache (and with two draft models the smaller one's) is written outside
    every `lax.cond` (its passes only read it): the optimized HLO of a gated draft-model
    loop copies no buffer of either cache inside the loop (a branch that updates a cache
    makes XLA copy it at every branch), nor of the target's (written by the rounds' switch
    and by the plain rounds' loop)."""
    import re

    from hispec_jax.decoding import methods
    from hispec_jax.decoding.engine import engine as engine_lib
    from hispec_jax.models.params import with_layer_layout

    def model(hidden, heads, kv_heads, layers, seed):
        cfg = ModelConfig(model_type="llama", vocab_size=29, hidden_size=hidden,
                          intermediate_size=32, num_layers=layers, num_heads=heads,
                          num_kv_heads=kv_heads, head_dim=8, max_position_embeddings=128)
        return Model(cfg=cfg, params=with_layer_layout(init_params(cfg, jax.random.PRNGKey(seed)),
                                                       layout))

    # the draft's cache layer [B, 2, S, 8], the smaller's [B, 3, S, 8], the target's [B, 1, S, 8]
    draft = model(32, 4, 2, 2, 1)
    if smaller:
        draft = draft.with_draft(model(24, 3, 3, 1, 2))
    pair = model(16, 2, 1, 3, 0).with_draft(draft)
    decoder = methods.make_method(pair, "draft", draft_k=(2, 3) if smaller else 3)
    engine = engine_lib.Engine.for_model(pair, decoder.hierarchy,
                                         engine_lib.Shapes(batch=2, capacity=96, prompt_block=16))
    text = engine.lower().compile().as_text()
    loop = text[:text.index("\nENTRY")]  # every computation but the entry's: the loop's
    shape = r"f32\[(?:[0-9]+,)?2,2,96,8\]"
    assert re.search(rf"{shape}[^ ]* (?:scatter|fusion)\(", loop), "no draft-cache write?"
    copies = re.findall(rf"= {shape}[^ ]* copy\(", loop)
    assert not copies, copies[:3]
    # nor of the target's: the rounds at window 0 (`Round.plain`) write it in their loop
    shape = r"f32\[(?:[0-9]+,)?2,1,96,8\]"
    assert re.search(rf"{shape}[^ ]* (?:scatter|fusion|dynamic-update-slice)\(", loop), \
        "no target-cache write?"
    copies = re.findall(rf"= {shape}[^ ]* copy\(", loop)
    assert not copies, copies[:3]
    if smaller:
        shape = r"f32\[(?:[0-9]+,)?2,3,96,8\]"
        assert re.search(rf"{shape}[^ ]* (?:scatter|fusion)\(", loop), "no smaller-cache write?"
        copies = re.findall(rf"= {shape}[^ ]* copy\(", loop)
        assert not copies, copies[:3]
