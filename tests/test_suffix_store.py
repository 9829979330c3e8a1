"""Drafts from earlier requests (decoding/suffix_store.py): the store's search against plain
Python, the host ring (eviction, scopes), and the serving slots with a store: every
request's tokens are offline `generate`'s, a repeated request drafts from the store (its
counters say so), and a new store compiles nothing."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hispec_jax
from hispec_jax.decoding import methods as methods_lib
from hispec_jax.decoding import suffix_store
from hispec_jax.decoding.lookup import PromptLookup
from hispec_jax.decoding.suffix_store import NO_SCOPE, SENTINEL, StoreArrays, SuffixStore
from hispec_jax.decoding import slots as slots_lib
from hispec_jax.decoding.slots import SlotEngine, SlotRequest

from conftest import shipped_model_scanned
from test_engine import PROPERTY_SETTINGS


# ------------------------------------------------------------------ 1. the store's search
def reference_store_proposal(store, scopes, seq_scope, tokens, c, k, max_ngram, limit, cap):
    """Plain Python: the longest suffix n (>= MIN_STORE_NGRAM) of tokens[:c + 1] occurring
    in the store within the sequence's scope and followed by a token of the same entry; of
    its occurrences the STORE_CANDIDATES most recent (highest ends); then, token by token,
    the next token most of the occurrences still agreeing continue with (ties: the most
    recent's), up to an entry's end."""
    if seq_scope == NO_SCOPE:
        return None
    seq, R = tokens[:c + 1], len(store)
    for n in range(max_ngram, suffix_store.MIN_STORE_NGRAM - 1, -1):
        if n > c + 1:
            continue
        suffix = seq[c - n + 1:]
        ends = [j for j in range(R - 2, n - 2, -1)
                if store[j - n + 1:j + 1] == suffix and scopes[j] == seq_scope
                and store[j + 1] != SENTINEL][:suffix_store.STORE_CANDIDATES]
        if not ends:
            continue
        continuations = []
        for j in ends:
            run = []
            for t in store[j + 1:]:
                if t == SENTINEL:
                    break
                run.append(t)
            continuations.append(run)
        walk, on = [], continuations
        while len(walk) < k:
            on = [run for run in on if len(run) > len(walk)]
            if not on:
                break
            votes = [sum(other[len(walk)] == run[len(walk)] for other in on) for run in on]
            walk.append(on[votes.index(max(votes))][len(walk)])
            on = [run for run in on if run[len(walk) - 1] == walk[-1]]
        return walk[:min(k, limit, cap(n))], n
    return None


def _propose_after_1_2(store):
    """The store's proposal for one sequence (9, 1, 2) of scope 0, k = 4, 4-grams."""
    arrays = StoreArrays(tokens_R=jnp.asarray(store, jnp.int32),
                         scope_R=jnp.asarray([NO_SCOPE if t == SENTINEL else 0 for t in store],
                                             jnp.int32),
                         scope_B=jnp.zeros((1,), jnp.int32))
    return suffix_store.propose(PromptLookup(4, 4), arrays, jnp.asarray([[9, 1, 2, 0]], jnp.int32),
                                jnp.asarray([2], jnp.int32), jnp.asarray([4], jnp.int32))


def test_the_store_proposes_the_most_frequent_continuation():
    """Three occurrences of (1, 2): the newest continues 3 4, two older ones 5 6 and 5 7;
    the walk takes 5 (two votes), then 7 (the newer of the two left)."""
    store = [1, 2, 5, 6, SENTINEL, 1, 2, 5, 7, SENTINEL, 1, 2, 3, 4, SENTINEL]
    prop = _propose_after_1_2(store)
    assert bool(prop.matched_B[0]) and int(prop.ngram_B[0]) == 2
    assert prop.tokens_BxK[0, :int(prop.length_B[0])].tolist() == [5, 7]


def test_the_continuation_counts_only_the_most_recent_occurrences():
    """Ten old occurrences of (1, 2) continue with 3, the STORE_CANDIDATES newer ones each
    with a token of its own: only the newer ones vote, so the newest's token wins."""
    M = suffix_store.STORE_CANDIDATES
    store = [1, 2, 3, SENTINEL] * 10 + sum(([1, 2, 10 + i, SENTINEL] for i in range(M)), [])
    prop = _propose_after_1_2(store)
    assert prop.tokens_BxK[0, :int(prop.length_B[0])].tolist() == [10 + M - 1]


@settings(max_examples=60, **PROPERTY_SETTINGS)
@given(data=st.data())
def test_store_proposal_equals_reference(data):
    B, S, R = data.draw(st.integers(1, 3)), 12, data.draw(st.integers(2, 30))
    k, max_ngram = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 5))
    vocab = data.draw(st.integers(2, 4))
    store = data.draw(st.lists(st.sampled_from(list(range(vocab)) + [SENTINEL]),
                               min_size=R, max_size=R))
    scopes = [NO_SCOPE if t == SENTINEL else data.draw(st.integers(0, 1)) for t in store]
    seq_scopes = [data.draw(st.sampled_from([NO_SCOPE, 0, 1])) for _ in range(B)]
    rows = [data.draw(st.lists(st.integers(0, vocab - 1), min_size=S, max_size=S))
            for _ in range(B)]
    newest = [data.draw(st.integers(0, S - 1)) for _ in range(B)]
    limit = [data.draw(st.integers(1, k)) for _ in range(B)]
    lookup = PromptLookup(k, max_ngram)
    arrays = StoreArrays(tokens_R=jnp.asarray(store, jnp.int32),
                         scope_R=jnp.asarray(scopes, jnp.int32),
                         scope_B=jnp.asarray(seq_scopes, jnp.int32))
    prop = suffix_store.propose(lookup, arrays, jnp.asarray(rows, jnp.int32),
                                jnp.asarray(newest, jnp.int32), jnp.asarray(limit, jnp.int32))
    for b in range(B):
        want = reference_store_proposal(store, scopes, seq_scopes[b], rows[b], newest[b], k,
                                        max_ngram, limit[b], lambda n: int(lookup.ngram_tokens(n)))
        assert bool(prop.matched_B[b]) == (want is not None)
        if want is not None:
            got_n = int(prop.length_B[b])
            assert (prop.tokens_BxK[b, :got_n].tolist(), int(prop.ngram_B[b])) == want


def test_the_store_proposes_where_its_proposal_is_worth_more():
    """`gate.proposal_value` prices a proposal at its bucket's estimate (expected tokens per
    unit of pass cost, the best block); the round takes the store's where it is worth more
    than the own context's (`LookupDrafter.worth_more`, `suffix_store.prefer`)."""
    from hispec_jax.decoding import gate

    lookup = PromptLookup(4, 4)
    # own context: ... 5 6 7 | 5 6 7 -> a 3-gram own match; the store holds a 4-gram one
    tokens = jnp.asarray([[9, 5, 6, 7, 1, 5, 6, 7]], jnp.int32)
    c = jnp.asarray([7], jnp.int32)
    limit = jnp.asarray([4], jnp.int32)
    own = lookup.propose(tokens, c, limit)
    assert int(own.ngram_B[0]) == 3
    arrays = StoreArrays(tokens_R=jnp.asarray([1, 5, 6, 7, 2, 2, SENTINEL], jnp.int32),
                         scope_R=jnp.zeros((7,), jnp.int32), scope_B=jnp.zeros((1,), jnp.int32))
    earlier = suffix_store.propose(lookup, arrays, tokens, c, limit)
    assert int(earlier.ngram_B[0]) == 4 and bool(earlier.matched_B[0])
    for use, want in ((True, [2, 2]), (False, own.tokens_BxK[0, :int(own.length_B[0])].tolist())):
        prop, from_store = suffix_store.prefer(own, earlier, jnp.asarray([use]))
        assert bool(from_store[0]) == use
        assert prop.tokens_BxK[0, :int(prop.length_B[0])].tolist() == want
    unmatched = dataclasses.replace(earlier, matched_B=jnp.asarray([False]))
    assert not bool(suffix_store.prefer(own, unmatched, jnp.asarray([True]))[1][0])

    cost, blocks = gate.PassCost.of(15.75, 4.25), (1, 2, 4, 8, 16)
    value = lambda a, m, matched=True: float(gate.proposal_value(
        jnp.asarray([a], jnp.float32), jnp.asarray([m], jnp.int32), jnp.asarray([matched]),
        blocks, cost)[0])
    assert value(0.9, 8, matched=False) == 1.0  # no match: the AR step
    assert value(2 / 3, 8) > 1.0 and value(0.05, 8) < 1.0 + 1e-6  # a poor bucket: not worth it
    assert value(0.9, 16) > value(0.9, 8) > value(0.9, 2)  # more tokens at a good estimate
    assert value(0.9, 4) > value(0.3, 16)  # a better estimate beats a longer proposal


# ------------------------------------------------------------------ 2. the host ring
def test_the_ring_evicts_the_oldest_and_keeps_entries_apart():
    store = SuffixStore(size=10, prompt_tail=1)
    a, b = store.scope_of("alice"), store.scope_of(None)
    assert (a, b, store.scope_of("alice")) == (0, 1, 0)
    store.add(a, [7, 8], [1, 2, 3])             # 8 1 2 3 |
    store.add(b, [9], [4, 5])                   # 9 4 5 |
    tokens, scopes = store.host_arrays()
    assert tokens.tolist() == [SENTINEL] * 1 + [8, 1, 2, 3, SENTINEL, 9, 4, 5, SENTINEL]
    assert scopes.tolist() == [NO_SCOPE, a, a, a, a, NO_SCOPE, b, b, b, NO_SCOPE]
    store.add(b, [6], [6, 6])                   # 6 6 6 | evicts the oldest four
    tokens, _ = store.host_arrays()
    assert tokens.tolist() == [3, SENTINEL, 9, 4, 5, SENTINEL, 6, 6, 6, SENTINEL]
    store.add(NO_SCOPE, [1], [1, 2])            # an opted-out request enters nothing
    assert store.version == 3 and store.host_arrays()[0].tolist() == tokens.tolist()
    assert store.describe() == {"tokens": 10, "requests_added": 3, "tokens_added": 10,
                                "scopes": 2}


# ------------------------------------------------------------------ 3. the serving slots
REPEATED = "Repeat after me exactly: the quick brown fox jumps over the lazy dog near the river"
OTHER = "Why is the sky blue?"


@pytest.fixture(scope="module")
def model():
    return shipped_model_scanned()


def _engine(model, store, greedy=True, method="lookup"):
    decoder = methods_lib.make_method(model, method, greedy=greedy)
    return SlotEngine(model, decoder, slots=2, capacity=160, greedy=greedy,
                      eos_ids=model.eos_token_ids, store=store)


def _run(eng, prompt_ids, budget, scope, sampling=None):
    """One request alone in slot 0; returns (tokens, the drafter's counters' increase)."""
    before = eng.counters().drafter
    req = SlotRequest(tuple(prompt_ids), budget, scope=scope,
                      **({} if sampling is None else {"sampling": sampling}))
    eng.insert(0, req)
    got = []
    while eng.busy[0]:
        for u in eng.generate(4):
            got += u.new_token_ids
    after = eng.counters().drafter
    return got, {f: int(getattr(after, f)) - int(getattr(before, f))
                 for f in ("proposed", "accepted", "store_proposed", "store_accepted")}


def test_a_repeated_request_drafts_from_the_store_with_the_tokens_of_generate(model):
    ids = [list(model.tokenizer(p)["input_ids"]) for p in (REPEATED, OTHER)]
    want = [hispec_jax.generate(model, p, method="lookup", max_new_tokens=40).token_ids[0]
            for p in (REPEATED, OTHER)]
    store = SuffixStore(size=512)
    eng = _engine(model, store)
    scope = store.scope_of(None)
    first, c1 = _run(eng, ids[0], 40, scope)
    assert first == want[0] and c1["store_proposed"] == 0  # nothing stored yet
    assert store.version == 1
    compiles = slots_lib.backend_compiles()
    second, c2 = _run(eng, ids[0], 40, scope)  # a new store: same shapes
    assert slots_lib.backend_compiles() == compiles
    assert second == want[0]
    assert c2["store_accepted"] > 0 and c2["accepted"] > c1["accepted"]
    # the new store went to the device once, not as host arrays moved at every call
    assert all(isinstance(x, jax.Array) for x in (eng.req.store.tokens_R, eng.req.store.scope_R))
    # another scope (tenant) and an opted-out request draft nothing from the store
    for other_scope in (store.scope_of("mallory"), NO_SCOPE):
        got, c = _run(eng, ids[0], 40, other_scope)
        assert got == want[0] and c["store_proposed"] == 0
    assert store.version == 3  # mallory's entered; the opted-out one did not
    other, _ = _run(eng, ids[1], 40, scope)
    assert other == want[1]


def test_without_a_lookup_drafter_the_engine_keeps_no_store(model):
    eng = _engine(model, SuffixStore(size=64), method="ar")
    assert eng.store is None and eng.req.store is None


def test_sampling_with_a_store_matches_the_exact_distribution():
    """Through the serving slots, the store filling as requests finish: the first tokens
    after PROMPT (a 4-token vocabulary, so the store matches in most rounds) follow AR
    sampling's exact distribution, and the store's drafts are both kept and rejected. (The
    same run with test_sampling_exact's broken rule, rejected drafts resampled from p, fails
    the chi-square by a wide margin, as its negative control in test_lookup.py does.)"""
    from test_sampling_exact import NEW, PROMPT, chi_square_test, exact_ar_distribution
    from test_sampling_exact import small_model

    small, n = small_model(), 3000
    sampling = hispec_jax.SamplingParams(temperature=1.0, seed=19)
    probs = exact_ar_distribution(small, sampling)
    store = SuffixStore(size=256)
    decoder = methods_lib.make_method(small, "lookup", lookup=3, max_ngram=3, greedy=False)
    eng = SlotEngine(small, decoder, slots=32, capacity=16, greedy=False, eos_ids=(),
                     store=store)
    samples, waiting, owner = {}, list(range(n)), {}
    while waiting or owner:
        for slot in eng.free_slots():
            if waiting:
                i = waiting.pop()
                eng.admit(slot, SlotRequest(tuple(PROMPT), NEW, sampling, sequence_index=i,
                                            ignore_eos=True, scope=0))
                owner[slot], samples[i] = i, []
        eng.prefill()
        for u in eng.generate(4):
            samples[owner[u.slot]] += u.new_token_ids
            if u.done:
                del owner[u.slot]
    c = eng.counters().drafter
    assert 0 < int(c.store_accepted) < int(c.store_proposed), c
    stat, threshold = chi_square_test(list(samples.values()), probs, n)
    assert stat < threshold, (stat, threshold)


# ------------------------------------------------------------------ 4. hispec serve
def _metric(text: str, name: str, **labels) -> float:
    """A sample's value in the Prometheus text format (0 when it is absent)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _from_store(url: str) -> tuple[float, float]:
    """/metrics: (proposed, accepted) greedy lookup tokens that came from earlier requests."""
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    return tuple(_metric(text, f"hispec:spec_decode_num_{w}_tokens_by_source_total",
                         engine="greedy", source="earlier_requests")
                 for w in ("draft", "accepted"))


def test_serve_drafts_from_earlier_requests_with_unchanged_outputs(model):
    import json
    import urllib.request

    openai = pytest.importorskip("openai")
    from hispec_jax.serving import server as server_lib

    from conftest import serving

    def answers(url, api_key="unused", **extra):
        client = openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0,
                               timeout=120)
        return client.completions.create(model=name, prompt=REPEATED, max_tokens=40,
                                         temperature=0, **extra).choices[0].text

    name = "m"
    app = server_lib.build_app(model, "lookup", slots=2, max_cache_len=160, warmup=False,
                               served_name=name, cross_request=True, store_tokens=1024)
    with serving(app) as url:
        health = json.loads(urllib.request.urlopen(url + "/health", timeout=30).read())
        assert health["cross_request"] is True
        assert health["cross_request_store"]["tokens"] == 1024
        first = answers(url)
        assert _from_store(url) == (0.0, 0.0)
        second = answers(url)
        assert second == first
        proposed, accepted = _from_store(url)
        assert proposed > 0 and accepted > 0
        # another tenant's request and an opted-out one draft nothing from the store
        assert answers(url, user="mallory") == first
        assert answers(url, api_key="another-key") == first
        assert answers(url, extra_body={"hispec": {"cross_request": False}}) == first
        assert answers(url, extra_headers={"X-Hispec-Cross-Request": "false"}) == first
        assert _from_store(url) == (proposed, accepted)
        health = json.loads(urllib.request.urlopen(url + "/health", timeout=30).read())
        assert health["cross_request_store"]["requests_added"] == 4  # not the opted-out two
        assert health["cross_request_store"]["scopes"] == 3
        with pytest.raises(openai.BadRequestError, match="X-Hispec-Cross-Request"):
            answers(url, extra_headers={"X-Hispec-Cross-Request": "maybe"})
    app = server_lib.build_app(model, "lookup", slots=2, max_cache_len=160, warmup=False,
                               served_name=name, cross_request=False)
    with serving(app) as url:
        health = json.loads(urllib.request.urlopen(url + "/health", timeout=30).read())
        assert health["cross_request"] is False and health["cross_request_store"] is None
        assert answers(url) == answers(url) == first
        assert _from_store(url) == (0.0, 0.0)


# ------------------------------------------------------------ 5. offline, over batches
def test_generate_drafts_from_earlier_batches_with_unchanged_outputs(model, tmp_path, capsys,
                                                                     monkeypatch):
    """`generate(cross_request=True)` (and `hispec generate --prompts-file F --cross-request`):
    each batch drafts from the prompts and outputs of the batches before; the tokens are
    those without the store; a store passed to two calls carries the first call's tokens."""
    import json

    from hispec_jax import cli

    prompts = [REPEATED, REPEATED + " again", OTHER]
    run = dict(method="lookup", max_new_tokens=24, batch_size=1, ignore_eos=True)
    plain = hispec_jax.generate(model, prompts, **run)
    stored = hispec_jax.generate(model, prompts, cross_request=True, **run)
    assert stored.token_ids == plain.token_ids
    earlier = stored.stats["lookup"]["from_earlier_requests"]
    assert earlier["accepted"] > 0 and plain.stats["lookup"]["from_earlier_requests"] == {
        "matches": 0, "proposed": 0, "accepted": 0}
    assert stored.stats["cross_request_store"]["requests_added"] == 3
    store = suffix_store.SuffixStore(1024)
    hispec_jax.generate(model, prompts[:1], cross_request=store, **run)
    again = hispec_jax.generate(model, prompts[:1], cross_request=store, **run)
    assert again.token_ids == plain.token_ids[:1]
    assert again.stats["lookup"]["from_earlier_requests"]["accepted"] > 0
    with pytest.raises(ValueError, match="needs a prompt-lookup drafter"):
        hispec_jax.generate(model, prompts, method="ar", cross_request=True)

    # the command line in this process, loading the scanned layout as `model` is (the
    # loops compiled above serve it)
    monkeypatch.setattr("hispec_jax.models.model.default_layer_layout", lambda: "scan")
    path = tmp_path / "prompts.txt"
    path.write_text(f"{prompts[0]}\n\n{json.dumps(prompts[1])}\n")
    assert cli.main(["generate", "--model", model.path, "--method", "lookup", "--json",
                     "--max-new-tokens", "24", "--ignore-eos", "--batch-size", "1",
                     "--prompts-file", str(path), "--cross-request", prompts[2]]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [o["prompt"] for o in out["outputs"]] == [prompts[2], prompts[0], prompts[1]]
    assert out["stats"]["cross_request_store"]["requests_added"] == 3
