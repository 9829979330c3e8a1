"""vLLM's sampling extensions on `hispec serve`: `ignore_eos` (decode past EOS to the token
budget) and `min_tokens` (EOS suppressed in the model's choice until that many new tokens),
sent by the official `openai` client in `extra_body` as load tools send them.

The shipped model seldom ends a text, so this module serves a copy of it whose EOS is "!"
(token 3): its greedy answer to "Hello" is "!!!!...", so without the extensions a request
ends at its first token. The references are offline `generate(ignore_eos=True)` and a
greedy loop over the final layer's logits with EOS masked (`scan_exits`, no cache)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hispec_jax

from conftest import serving, shipped_model_scanned

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")  # the servers below

BANG = 3  # "!"
PROMPT = "Hello"


@pytest.fixture(scope="module")
def model():
    base = shipped_model_scanned()
    return dataclasses.replace(base, generation_config={**base.generation_config,
                                                        "eos_token_id": BANG})


@pytest.fixture(scope="module", params=["layerskip", "ar"])
def method(request):
    """layerskip: the top level's verification suppresses EOS; ar: the one level's draft."""
    return request.param


@pytest.fixture(scope="module")
def client(model, method):
    from hispec_jax.serving import server as server_lib

    app = server_lib.build_app(model, method, slots=2, max_cache_len=64, warmup=False)
    with serving(app) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                            timeout=120)


def _masked_greedy(model, prompt_ids: list[int], max_new: int, min_tokens: int) -> list[int]:
    """Greedy decoding over the final layer's logits of the whole sequence (no cache), EOS
    masked for the first `min_tokens` new tokens, stopping at EOS after them."""
    from hispec_jax.models.heads import exit_logits
    from hispec_jax.models.transformer import scan_exits

    cfg, L = model.cfg, model.cfg.num_layers
    width = len(prompt_ids) + max_new  # one compiled length: causal, so padding is unseen

    @jax.jit
    def logits_at(tokens_1xT, last):
        h_1xTxD, _ = scan_exits(model.params, cfg, tokens_1xT, lambda h, i: ())
        return exit_logits(model.params, model.heads, cfg, h_1xTxD, L)[0, last]

    ids = list(prompt_ids)
    for i in range(max_new):
        row = np.zeros((1, width), np.int32)
        row[0, :len(ids)] = ids
        logits = np.array(logits_at(jnp.asarray(row), len(ids) - 1), np.float32)
        if i < min_tokens:
            logits[list(model.eos_token_ids)] = -np.inf
        ids.append(int(np.argmax(logits)))
        if i >= min_tokens and ids[-1] in model.eos_token_ids:
            break
    return ids[len(prompt_ids):]


def test_without_the_extensions_the_answer_ends_at_eos(client):
    r = client.completions.create(model="default_model", prompt=PROMPT, max_tokens=8,
                                  temperature=0)
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("stop", 1)


def test_ignore_eos_decodes_to_the_budget_as_offline_generate(model, method, client):
    r = client.completions.create(model="default_model", prompt=PROMPT, max_tokens=6,
                                  temperature=0, extra_body={"ignore_eos": True})
    offline = hispec_jax.generate(model, PROMPT, method=method, max_new_tokens=6,
                                  ignore_eos=True)
    assert offline.token_ids[0][0] == BANG  # it did pass an EOS
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6
    assert r.choices[0].text == offline.texts[0]


def test_min_tokens_suppresses_eos_until_then(model, client):
    """The first 4 tokens are the model's best apart from EOS (the masked greedy
    reference); after them EOS may end the answer, and here does."""
    ids = model.tokenizer(PROMPT)["input_ids"]
    expected = _masked_greedy(model, ids, 10, min_tokens=4)
    assert BANG not in expected[:4] and len(expected) >= 4
    r = client.completions.create(model="default_model", prompt=PROMPT, max_tokens=10,
                                  temperature=0, extra_body={"min_tokens": 4})
    assert r.usage.completion_tokens == len(expected)
    assert r.choices[0].text == model.tokenizer.decode(expected, skip_special_tokens=True)
    assert r.choices[0].finish_reason == ("stop" if expected[-1] == BANG else "length")


def test_streamed_min_tokens_equals_the_whole_answer(client):
    whole = client.completions.create(model="default_model", prompt=PROMPT, max_tokens=10,
                                      temperature=0, extra_body={"min_tokens": 3})
    chunks = list(client.completions.create(model="default_model", prompt=PROMPT,
                                            max_tokens=10, temperature=0, stream=True,
                                            extra_body={"min_tokens": 3}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text


@pytest.mark.parametrize("extra,named", [
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 1.5}, "min_tokens"),
    ({"min_tokens": 9}, "min_tokens"),  # above max_tokens
])
def test_bad_extension_values_get_a_400_and_the_server_keeps_serving(client, extra, named):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="default_model", prompt=PROMPT, max_tokens=4,
                                  temperature=0, extra_body=extra)
    assert named in str(e.value)
    r = client.completions.create(model="default_model", prompt=PROMPT, max_tokens=2,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 2


def test_sampled_answers_reach_min_tokens(client):
    """Sampling (the sampling engine: EOS masked before the softmax): with min_tokens 5
    every seed's answer has at least 5 tokens; without it, most of these end at once."""
    def lengths(**extra):
        return [client.completions.create(
            model="default_model", prompt=PROMPT, max_tokens=8, temperature=1.0, seed=seed,
            extra_body=extra).usage.completion_tokens for seed in range(4)]

    assert min(lengths(min_tokens=5)) >= 5
    assert min(lengths()) < 5
