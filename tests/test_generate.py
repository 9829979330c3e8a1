"""`hispec_jax.generate` end to end against transformers (PyTorch) on the tiny fixture models.

Greedy decoding must match `hf_model.generate` token for token; batching, batch splitting,
padding and EOS handling must never change a sequence's tokens; sampling must depend only
on (seed, index in the request, position).
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

import hispec_jax
from hispec_jax import load_model
from hispec_jax.decoding.sampling import SamplingArrays, filtered_logprobs

KINDS = ("llama3", "llama2", "qwen3")
STATS_KEYS = ("tokens_per_second", "compile_seconds", "compile_count", "decode_seconds",
              "new_tokens")


def prompt(length, seed=0):
    """A prompt of `length` ids: BOS then random non-special tokens."""
    rng = np.random.RandomState(seed + 1000 * length)
    return [1] + rng.randint(3, 97, length - 1).tolist()


@pytest.fixture(scope="module")
def models(hf_models):
    """kind -> (torch model, our Model), each loaded once."""
    return {kind: (hf, load_model(path)) for kind, (hf, path) in hf_models.items()}


def hf_greedy(hf_model, ids, max_new_tokens, eos_token_id=None):
    """transformers' greedy continuation (new tokens only)."""
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    if eos_token_id is None:
        kwargs.update(min_new_tokens=max_new_tokens, eos_token_id=None)
    else:
        kwargs.update(eos_token_id=eos_token_id)
    x = torch.tensor([ids])
    with torch.no_grad():
        out = hf_model.generate(x, attention_mask=torch.ones_like(x), **kwargs)
    return out[0, len(ids):].tolist()


def torch_exit_greedy(hf_model, ids, exit_layer, max_new_tokens):
    """Reference early-exit greedy loop: recompute the whole sequence every step and take the
    argmax of lm_head(norm(hidden_states[exit_layer])) at the last position."""
    seq = list(ids)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            out = hf_model(torch.tensor([seq]), output_hidden_states=True)
            h = out.hidden_states[exit_layer]
            logits = hf_model.lm_head(hf_model.model.norm(h))[0, -1]
            seq.append(int(torch.argmax(logits)))
    return seq[len(ids):]


# ---------------------------------------------------------------------------------------
# greedy == transformers
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_matches_transformers(models, kind):
    hf_model, model = models[kind]
    ids = prompt(7)
    result = hispec_jax.generate(model, [ids], method="ar", max_new_tokens=40, ignore_eos=True)
    assert result.prompt_token_ids == [ids]
    assert len(result.token_ids) == 1 and len(result.token_ids[0]) == 40
    assert result.token_ids[0] == hf_greedy(hf_model, ids, 40)


@pytest.mark.parametrize("kind", KINDS)
def test_eos_cuts_after_first_occurrence(models, kind):
    hf_model, model = models[kind]
    ids = prompt(7)
    full = hispec_jax.generate(model, [ids], method="ar",
                               max_new_tokens=40, ignore_eos=True).token_ids[0]
    # an EOS that first occurs strictly inside the continuation
    tok = next(t for t in full[5:] if full.index(t) >= 5)
    cut = full.index(tok)
    expected = full[:cut + 1]
    assert expected[-1] == tok and tok not in expected[:-1]

    with_eos = dataclasses.replace(model, generation_config={"eos_token_id": tok})
    assert with_eos.eos_token_ids == (tok,)
    got = hispec_jax.generate(with_eos, [ids], method="ar", max_new_tokens=40).token_ids[0]
    assert got == expected
    assert got == hf_greedy(hf_model, ids, 40, eos_token_id=tok)
    # ignore_eos overrides the model's EOS
    assert hispec_jax.generate(with_eos, [ids], method="ar", max_new_tokens=40,
                               ignore_eos=True).token_ids[0] == full


def test_several_eos_ids_cut_at_the_earliest(models):
    hf_model, model = models["llama3"]
    ids = prompt(7)
    full = hispec_jax.generate(model, [ids], method="ar",
                               max_new_tokens=40, ignore_eos=True).token_ids[0]
    early = next(t for t in full[4:] if full.index(t) >= 4)
    late = next(t for t in full[full.index(early) + 1:] if full.index(t) > full.index(early))
    with_eos = dataclasses.replace(model, generation_config={"eos_token_id": [late, early]})
    got = hispec_jax.generate(with_eos, [ids], method="ar", max_new_tokens=40).token_ids[0]
    assert got == full[:full.index(early) + 1]
    assert got == hf_greedy(hf_model, ids, 40, eos_token_id=[late, early])


# ---------------------------------------------------------------------------------------
# batching
# ---------------------------------------------------------------------------------------

RAGGED = (3, 17, 9, 1, 30)


@pytest.fixture(scope="module")
def ragged_single(models):
    """Each ragged prompt generated on its own (batch of one)."""
    _, model = models["llama3"]
    prompts = [prompt(n) for n in RAGGED]
    return prompts, [hispec_jax.generate(model, [p], method="ar",
                                         max_new_tokens=12, ignore_eos=True).token_ids[0]
                     for p in prompts]


def test_ragged_batch_equals_single_runs(models, ragged_single):
    _, model = models["llama3"]
    prompts, single = ragged_single
    result = hispec_jax.generate(model, prompts, method="ar", max_new_tokens=12, ignore_eos=True)
    assert result.token_ids == single
    assert result.prompt_token_ids == prompts
    for key in STATS_KEYS:
        assert key in result.stats, key
    assert result.stats["new_tokens"] == 12 * len(prompts)
    assert result.stats["tokens_per_second"] > 0
    assert result.stats["decode_seconds"] > 0


@pytest.mark.parametrize("batch_size", [2, 8])
def test_batch_splitting_and_padding_rows(models, ragged_single, batch_size):
    """batch_size=2 splits 5 prompts into 2+2+1 (one padding row); 8 pads 3 rows."""
    _, model = models["llama3"]
    prompts, single = ragged_single
    result = hispec_jax.generate(model, prompts, method="ar", max_new_tokens=12, ignore_eos=True,
                                 batch_size=batch_size)
    assert result.token_ids == single
    assert result.stats["new_tokens"] == 12 * len(prompts)


def test_same_bucket_does_not_recompile(models, ragged_single):
    _, model = models["llama3"]
    prompts, _ = ragged_single
    hispec_jax.generate(model, prompts, method="ar", max_new_tokens=12, ignore_eos=True)
    # different lengths, same power-of-two bucket (17..32), same batch size and budget
    other = [prompt(n, seed=1) for n in (20, 5, 31, 2, 18)]
    result = hispec_jax.generate(model, other, method="ar", max_new_tokens=12, ignore_eos=True)
    assert result.stats["compile_count"] == 0
    assert result.stats["compile_seconds"] == 0
    assert all(len(t) == 12 for t in result.token_ids)
    # a different budget that lands on the same capacity also reuses it
    again = hispec_jax.generate(model, other, method="ar", max_new_tokens=5, ignore_eos=True)
    assert again.stats["compile_count"] == 0
    assert again.token_ids == [t[:5] for t in result.token_ids]


def test_max_new_tokens_per_sequence(models, ragged_single):
    _, model = models["llama3"]
    prompts, single = ragged_single
    exact = hispec_jax.generate(model, prompts, method="ar", max_new_tokens=12, ignore_eos=True)
    assert [len(t) for t in exact.token_ids] == [12] * len(prompts)
    # with EOS active, make a token that shows up in some continuations the EOS
    eos = single[1][3]
    with_eos = dataclasses.replace(model, generation_config={"eos_token_id": eos})
    cut = hispec_jax.generate(with_eos, prompts, method="ar", max_new_tokens=12)
    assert cut.stats["new_tokens"] == sum(len(t) for t in cut.token_ids)
    for got, full in zip(cut.token_ids, single):
        assert 1 <= len(got) <= 12
        expected = full[:full.index(eos) + 1] if eos in full else full
        assert got == expected


def test_budget_fills_the_context_exactly(models):
    """prompt + max_new_tokens == max_position_embeddings (256) is allowed."""
    hf_model, model = models["llama2"]
    ids = prompt(250)
    result = hispec_jax.generate(model, [ids], method="ar", max_new_tokens=6, ignore_eos=True)
    assert result.stats["cache_capacity"] <= model.cfg.max_position_embeddings
    assert result.token_ids[0] == hf_greedy(hf_model, ids, 6)


def test_max_cache_len_smaller_than_prompt_bucket(models, ragged_single):
    """A 17-token prompt sits in the 32 bucket; a 20-slot cache must still work."""
    _, model = models["llama3"]
    prompts, single = ragged_single
    ids = prompts[1]
    assert len(ids) == 17
    result = hispec_jax.generate(model, [ids], method="ar", max_new_tokens=3, ignore_eos=True,
                                 max_cache_len=20)
    assert result.stats["cache_capacity"] <= 20
    assert result.token_ids[0] == single[1][:3]


# ---------------------------------------------------------------------------------------
# early exit
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["llama3", "qwen3"])
@pytest.mark.parametrize("exit_layer", [1, 2])
def test_exit_matches_torch_reference(models, kind, exit_layer):
    hf_model, model = models[kind]
    ids = prompt(7)
    result = hispec_jax.generate(model, [ids], method="exit", exit_layer=exit_layer,
                                 max_new_tokens=20, ignore_eos=True)
    assert result.token_ids[0] == torch_exit_greedy(hf_model, ids, exit_layer, 20)
    assert result.stats["exits"] == [exit_layer]
    # one sequential pass through `exit_layer` layers per token emitted by the loop
    assert result.stats["layer_passes_per_token"] == exit_layer


def test_exit_at_last_layer_is_autoregressive(models):
    _, model = models["llama3"]
    ids = prompt(7)
    full = hispec_jax.generate(model, [ids], method="ar", max_new_tokens=40, ignore_eos=True)
    last = hispec_jax.generate(model, [ids], method="exit", exit_layer=model.cfg.num_layers,
                               max_new_tokens=40, ignore_eos=True)
    assert last.token_ids == full.token_ids


# ---------------------------------------------------------------------------------------
# strings
# ---------------------------------------------------------------------------------------


def test_string_prompts_tokenize_and_decode_like_transformers(models, hf_models):
    _, model = models["llama3"]
    tokenizer = AutoTokenizer.from_pretrained(str(hf_models["llama3"][1]))
    texts = ["the cat sat", "a dog ran on the mat"]
    result = hispec_jax.generate(model, texts, method="ar", max_new_tokens=40)
    assert result.prompt_token_ids == [tokenizer(t)["input_ids"] for t in texts]
    assert result.prompt_token_ids[0] == [1, 3, 5, 7]
    assert result.texts == [tokenizer.decode(ids, skip_special_tokens=True)
                            for ids in result.token_ids]
    # the same prompt as token ids gives the same tokens
    by_ids = hispec_jax.generate(model, result.prompt_token_ids, method="ar", max_new_tokens=40)
    assert by_ids.token_ids == result.token_ids
    # a bare string and a bare token list are one prompt each
    one = hispec_jax.generate(model, "the cat sat", method="ar", max_new_tokens=40)
    assert one.token_ids == result.token_ids[:1] and one.texts == result.texts[:1]
    flat = hispec_jax.generate(model, [1, 3, 5, 7], method="ar", max_new_tokens=40)
    assert flat.token_ids == result.token_ids[:1]


def test_no_tokenizer_gives_no_texts(models):
    _, model = models["llama3"]
    bare = dataclasses.replace(model, tokenizer=None, generation_config={"eos_token_id": 2})
    result = hispec_jax.generate(bare, [prompt(7)], method="ar", max_new_tokens=40)
    assert result.texts is None
    assert result.token_ids == hispec_jax.generate(model, [prompt(7)], method="ar",
                                                   max_new_tokens=40).token_ids


# ---------------------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------------------


def sample(model, prompts, **kwargs):
    kwargs = {"max_new_tokens": 20, "ignore_eos": True, "temperature": 1.0, **kwargs}
    return hispec_jax.generate(model, prompts, **kwargs).token_ids


def test_sampling_is_seeded(models):
    _, model = models["llama3"]
    ids = prompt(7)
    a = sample(model, [ids], seed=0)
    assert sample(model, [ids], seed=0) == a
    assert sample(model, [ids], seed=1) != a
    assert sample(model, [ids], seed=0, temperature=1.5) != a


def test_sampling_does_not_depend_on_batch_composition(models):
    _, model = models["llama3"]
    prompts = [prompt(7), prompt(12, seed=3), prompt(4, seed=4)]
    together = sample(model, prompts, seed=5)
    assert sample(model, prompts[:1], seed=5) == together[:1]
    # batch_size=1 runs each prompt alone, but with its index in the request
    assert sample(model, prompts, seed=5, batch_size=1) == together


def test_top_k_1_and_tiny_top_p_are_greedy(models):
    _, model = models["llama3"]
    ids = prompt(7)
    greedy = hispec_jax.generate(model, [ids], method="ar",
                                 max_new_tokens=20, ignore_eos=True).token_ids
    assert sample(model, [ids], top_k=1, seed=3) == greedy
    assert sample(model, [ids], top_p=1e-6, seed=3) == greedy


# ---------------------------------------------------------------------------------------
# filtered_logprobs
# ---------------------------------------------------------------------------------------


def sampling_arrays(temperature=1.0, top_k=0, top_p=1.0):
    return SamplingArrays(temperature=jnp.float32(temperature), top_k=jnp.int32(top_k),
                          top_p=jnp.float32(top_p))


def distinct_logits(rng, rows=6, vocab=40):
    """Logits with no ties (a random permutation of well-separated values)."""
    base = np.linspace(-4.0, 4.0, vocab)
    return np.stack([rng.permutation(base) for _ in range(rows)]).astype(np.float32)


def assert_normalized(logp):
    finite = np.where(np.isfinite(logp), np.exp(logp), 0.0)
    np.testing.assert_allclose(finite.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 7, 40])
def test_filtered_logprobs_top_k(k):
    logits = distinct_logits(np.random.RandomState(k))
    logp = np.asarray(filtered_logprobs(jnp.asarray(logits), sampling_arrays(top_k=k)))
    kept = np.isfinite(logp)
    assert (kept.sum(-1) == k).all()
    top = np.argsort(-logits, axis=-1)[:, :k]
    for row in range(len(logits)):
        assert set(np.flatnonzero(kept[row])) == set(top[row])
        # renormalized softmax over the kept tokens
        z = logits[row, top[row]]
        ref = z - np.log(np.exp(z - z.max()).sum()) - z.max()
        np.testing.assert_allclose(logp[row, top[row]], ref, atol=1e-5)
    assert_normalized(logp)


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("temperature", [0.7, 1.0, 2.0])
def test_filtered_logprobs_top_p(top_p, temperature):
    logits = distinct_logits(np.random.RandomState(int(top_p * 100)))
    logp = np.asarray(filtered_logprobs(jnp.asarray(logits),
                                        sampling_arrays(temperature=temperature, top_p=top_p)))
    kept = np.isfinite(logp)
    for row in range(len(logits)):
        order = np.argsort(-logits[row])
        z = logits[row, order].astype(np.float64) / temperature
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        cum = np.cumsum(probs)
        m = int(np.searchsorted(cum, top_p - 1e-7)) + 1  # minimal prefix with mass >= top_p
        assert abs(cum[m - 1] - top_p) > 1e-4, "ambiguous case; pick other values"
        assert kept[row].sum() == m
        assert set(np.flatnonzero(kept[row])) == set(order[:m])
        np.testing.assert_allclose(logp[row, order[:m]],
                                   np.log(probs[:m] / probs[:m].sum()), atol=1e-5)
    assert_normalized(logp)


def test_filtered_logprobs_top_k_then_top_p():
    """top-p applies to the renormalized top-k distribution (as transformers does)."""
    logits = distinct_logits(np.random.RandomState(9))
    k, top_p = 10, 0.6
    logp = np.asarray(filtered_logprobs(jnp.asarray(logits), sampling_arrays(top_k=k, top_p=top_p)))
    for row in range(len(logits)):
        order = np.argsort(-logits[row])[:k]
        z = logits[row, order].astype(np.float64)
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        m = int(np.searchsorted(np.cumsum(probs), top_p)) + 1
        assert set(np.flatnonzero(np.isfinite(logp[row]))) == set(order[:m])
    assert_normalized(logp)


def test_filtered_logprobs_no_filtering_is_log_softmax():
    logits = distinct_logits(np.random.RandomState(1))
    logp = np.asarray(filtered_logprobs(jnp.asarray(logits), sampling_arrays(temperature=1.3)))
    z = logits / 1.3
    ref = z - np.log(np.exp(z).sum(-1, keepdims=True))
    np.testing.assert_allclose(logp, ref, atol=1e-5)
