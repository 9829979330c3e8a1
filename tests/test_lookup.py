"""Prompt-lookup (n-gram) drafting: the search, greedy == AR, exact sampling, bad input.

Matches really happen here: "cycling" models (identity layers, so the next token depends on
the current one only) fall into a short cycle that the lookup copies, and the shipped model
gets a prompt that repeats a passage. Tests assert the lookup counters, so a drafter that
never drafts (or never gets a draft accepted) fails them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hispec_jax import DEFAULT_MODEL_DIR, generate, load_model
from hispec_jax.decoding import engine as engine_lib
from hispec_jax.decoding import methods
from hispec_jax.decoding.acceptance import BlockwiseVerification, TokenwiseRejection
from hispec_jax.decoding.lookup import PromptLookup, one_hot_logq
from hispec_jax.decoding.options import OptionError, check_method_options
from hispec_jax.decoding.sampling import SamplingParams

from test_engine import PROPERTY_SETTINGS, ar_reference, random_prompts, tiny_model
from test_sampling_exact import (N_SAMPLES, NEW, PROMPT, chi_square_test, exact_ar_distribution,
                                 output_distribution, random_conditionals, total_variation)


# ------------------------------------------------------------------ 1. the n-gram search
def reference_proposal(tokens, c, k, max_ngram, limit, cap=lambda n: 10**9):
    """Plain Python: longest n first, most recent earlier occurrence ending before c; a
    match of n tokens proposes at most `cap(n)`."""
    seq = tokens[:c + 1]
    for n in range(max_ngram, 0, -1):
        if n > c + 1:
            continue
        suffix = seq[c - n + 1:]
        for j in range(c - 1, n - 2, -1):
            if seq[j - n + 1:j + 1] == suffix:
                m = min(k, c - j, limit, cap(n))
                return seq[j + 1:j + 1 + m], n
    return [seq[c]], 0  # the placeholder: the newest token again


@settings(max_examples=60, **PROPERTY_SETTINGS)
@given(data=st.data())
def test_proposal_equals_reference(data):
    B, S = data.draw(st.integers(1, 4)), 24
    k, max_ngram = data.draw(st.integers(1, 16)), data.draw(st.integers(1, 6))
    vocab = data.draw(st.integers(2, 5))
    rows = [data.draw(st.lists(st.integers(0, vocab - 1), min_size=S, max_size=S)) for _ in range(B)]
    newest = [data.draw(st.integers(0, S - 1)) for _ in range(B)]
    limit = [data.draw(st.integers(1, k)) for _ in range(B)]
    drafter = PromptLookup(k, max_ngram)
    prop = drafter.propose(jnp.asarray(rows, jnp.int32), jnp.asarray(newest, jnp.int32),
                           jnp.asarray(limit, jnp.int32))
    cap = ngram_cap(k, max_ngram)
    for b in range(B):
        want, n = reference_proposal(rows[b], newest[b], k, max_ngram, limit[b], cap)
        m = int(prop.length_B[b])
        assert np.asarray(prop.tokens_BxK[b, :m]).tolist() == want
        assert int(prop.ngram_B[b]) == n and bool(prop.matched_B[b]) == (n > 0)


def ngram_cap(k, max_ngram):
    """The drafter's cap by n (`ngram_tokens`), spelled out: k from 5-grams (or max_ngram-grams if
    shorter), else k / 4 for a 1-gram and k / 2 for longer ones (each at least 1)."""
    return lambda n: (k if n >= min(5, max_ngram) else max(k // 4, 1) if n == 1
                      else max(k // 2, 1))


def test_ngram_tokens_caps_short_matches():
    drafter = PromptLookup(16, 8)
    assert [drafter.ngram_tokens(n) for n in range(1, 9)] == [4, 8, 8, 8, 16, 16, 16, 16]
    assert [PromptLookup(16, 3).ngram_tokens(n) for n in (1, 2, 3)] == [4, 8, 16]
    assert [PromptLookup(8, 1).ngram_tokens(1)] == [8]  # every match is as long as it gets
    for k in range(1, 17):
        for max_ngram in range(1, 9):
            drafter = PromptLookup(k, max_ngram)
            ints = [drafter.ngram_tokens(n) for n in range(1, max_ngram + 1)]
            assert ints == [ngram_cap(k, max_ngram)(n) for n in range(1, max_ngram + 1)]
            got = drafter.ngram_tokens(jnp.arange(1, max_ngram + 1)).tolist()  # the engine's
            assert got == ints and all(1 <= t <= k for t in ints)
    #      0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19
    row = [1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 9, 9, 9, 9, 1, 2, 3, 4, 5, 0, 0, 0, 0, 0]
    tokens = jnp.asarray([row, row])
    prop = PromptLookup(8, 8).propose(tokens, jnp.asarray([18, 9]),
                                                        jnp.asarray([8, 8]))
    # sequence 0: the 5-gram 1 2 3 4 5 matched -> all 8 (6 7 8 9 3 9 9 9); sequence 1: only
    # "3" matched (at 2) -> k / 4 = 2 tokens (4 5)
    assert prop.length_B.tolist() == [8, 2] and prop.ngram_B.tolist() == [5, 1]
    assert np.asarray(prop.tokens_BxK[0]).tolist() == [6, 7, 8, 9, 3, 9, 9, 9]
    assert np.asarray(prop.tokens_BxK[1, :2]).tolist() == [4, 5]


def test_proposal_prefers_longest_then_most_recent():
    #        0  1  2  3  4  5  6  7  8  9
    row = [7, 1, 2, 5, 9, 2, 6, 1, 2, 0, 0, 0]
    prop = PromptLookup(3, 3).propose(jnp.asarray([row]), jnp.asarray([8]),
                                                        jnp.asarray([3]))
    # suffix (1, 2) occurs ending at 2 (then 5 9 2); "2" alone most recently at 5 (then 6)
    assert np.asarray(prop.tokens_BxK[0]).tolist() == [5, 9, 2]
    assert int(prop.ngram_B[0]) == 2
    prop = PromptLookup(3, 1).propose(jnp.asarray([row]), jnp.asarray([8]),
                                                        jnp.asarray([3]))
    assert np.asarray(prop.tokens_BxK[0, :2]).tolist() == [6, 1] and int(prop.length_B[0]) == 3


# --------------------------------------------------------------- 2. greedy equals AR
def cycling_model(num_layers=4, seed=0):
    """Identity layers: the next token is a function of the current one, so greedy output
    enters a cycle that the lookup drafter copies."""
    return tiny_model(num_layers, seed, layer_scale=0.0)


LOOKUP_METHODS = [
    ("lookup", {}),
    ("lookup", dict(lookup=2, max_ngram=1)),
    ("layerskip", dict(lookup=3, draft_exit=2)),
    ("hispec", dict(lookup=4, draft_exit=1, verify_exits=(2,), verify_window=2)),
]


@settings(max_examples=10, **PROPERTY_SETTINGS)
@given(case=st.fixed_dictionaries(dict(
    which=st.integers(0, len(LOOKUP_METHODS) - 1), seed=st.integers(0, 2),
    layer_scale=st.sampled_from([1.0, 0.1, 0.0]), batch=st.sampled_from([1, 3]),
    max_prompt_len=st.integers(1, 12), max_new=st.integers(1, 20),
    ignore_eos=st.booleans(), prompt_seed=st.integers(0, 1000), tight_cache=st.booleans())))
# the cycling model under HiSpec + lookup: long accepted copies run into a cache that is
# exactly full, for a batch of 3
@example(case=dict(which=3, seed=0, layer_scale=0.0, batch=3, max_prompt_len=12, max_new=20,
                   ignore_eos=True, prompt_seed=4, tight_cache=True))
def test_lookup_greedy_equals_autoregressive(case):
    """Tiny random and cycling models, batch > 1 with per-sequence matches, EOS (id 3),
    budgets down to one token, and caches just large enough."""
    model = tiny_model(4, case["seed"], case["layer_scale"])
    method, options = LOOKUP_METHODS[case["which"]]
    prompts = random_prompts(np.random.RandomState(case["prompt_seed"]), case["batch"],
                             case["max_prompt_len"])
    max_cache_len = None
    if case["tight_cache"]:
        max_cache_len = (max(map(len, prompts)) + case["max_new"]
                         + methods.make_method(model, method, **options).lookahead())
    common = dict(max_new_tokens=case["max_new"], ignore_eos=case["ignore_eos"])
    ref = ar_reference(model, prompts, **common)
    got = generate(model, prompts, method=method, max_cache_len=max_cache_len, **common,
                   **options)
    assert got.token_ids == ref.token_ids, (case, got.stats)


@pytest.mark.parametrize("method,options", LOOKUP_METHODS)
def test_lookup_drafts_are_accepted_on_a_cycle(method, options):
    """On a cycling model most rounds copy the cycle: the lookup proposes and level 1
    accepts, and the loop takes far fewer rounds than AR."""
    model = cycling_model()
    prompts = [[5, 9, 11], [7], [1, 2, 3, 4, 5, 6, 7, 8]]
    N = 40
    ref = generate(model, prompts, method="ar", max_new_tokens=N, ignore_eos=True)
    got = generate(model, prompts, method=method, max_new_tokens=N, ignore_eos=True, **options)
    assert got.token_ids == ref.token_ids
    look = got.stats["lookup"]
    assert look["matches"] > 0 and look["proposed"] > 0
    assert look["accepted"] >= 0.8 * look["proposed"], look
    if method == "lookup":  # k tokens per round once the cycle is found
        assert got.stats["rounds"] <= ref.stats["rounds"] / 1.5


def test_default_drafter_scales_k_by_the_match():
    """`methods` builds the lookup drafter with k = 16 and 8-grams
    unless told (the study: BENCHMARKS.md at commit cb2a647, "Longer proposals for longer
    matches"), its window k."""
    model = tiny_model(4, 1)
    drafter = methods.make_method(model, "lookup").hierarchy.drafter.lookup
    assert (drafter.max_tokens, drafter.max_ngram) == (16, 8)
    decoder = methods.make_method(model, "lookup", lookup=5)
    assert decoder.hierarchy.drafter.lookup.max_tokens == 5 and decoder.windows[0] == 5


def test_every_level_above_the_lookup_runs_at_a_power_of_two_block():
    """Under HiSpec the intermediate level's input varies with the lookup's proposals (up to
    k + Nd): it switches block lengths like level 1 and the top, so a pass pays for what
    arrived. Without a lookup drafter every level keeps its one static block."""
    from hispec_jax.decoding.windows import power_of_two_blocks

    model = tiny_model(6, 0)
    options = dict(draft_exit=1, verify_exits=(3,), draft_len=2, verify_window=4)
    h = methods.make_method(model, "hispec", lookup=16, **options).hierarchy
    assert h.blocks[1] > 16  # k + Nd + 1 positions may arrive
    for k in range(1, h.num_levels):
        assert h.level_blocks(k) == power_of_two_blocks(h.blocks[k - 1])
    assert h.level_blocks(2)[:3] == (1, 2, 4)
    plain = methods.make_method(model, "hispec", **options).hierarchy
    assert [plain.level_blocks(k) for k in (1, 2)] == [(), ()]


@pytest.mark.parametrize("method,options", [LOOKUP_METHODS[0], LOOKUP_METHODS[2]])
def test_lookup_keeps_greedy_equal_to_ar_with_per_sequence_matches(method, options):
    """The output is AR's and the drafter drafts (a cycling model, batch 3 with
    per-sequence matches)."""
    model = cycling_model()
    prompts = [[5, 9, 11], [7], [1, 2, 3, 4, 5, 6, 7, 8]]
    ref = generate(model, prompts, method="ar", max_new_tokens=30, ignore_eos=True)
    got = generate(model, prompts, method=methods.make_method(model, method, **options),
                   max_new_tokens=30, ignore_eos=True)
    assert got.token_ids == ref.token_ids
    assert got.stats["lookup"]["accepted"] > 0, got.stats["lookup"]


def test_round_without_match_submits_one_position():
    """Without a match a sequence submits one position (its newest token, an AR step), and
    the pass runs at the shortest compiled block that holds the longest submission."""
    model = tiny_model(4, 1)
    assert methods.make_method(model, "lookup").hierarchy.level_blocks(1) == (1, 2, 4, 8, 16)
    got = generate(model, [list(range(10, 20))], method="lookup", max_new_tokens=12,
                   ignore_eos=True)
    s, hist = got.stats, got.stats["verified_length_histogram"]
    assert sum(hist) == s["rounds"] and hist[1] >= s["rounds"] - s["lookup"]["matches"]


def test_shipped_model_copies_a_repeated_passage():
    """The shipped model, greedy, a prompt that quotes a passage twice: output equals AR and
    the lookup drafter has tokens accepted. In the scan layout, which compiles its 24 layers
    as one (test_engine.py: the layouts give the same tokens)."""
    model = load_model(DEFAULT_MODEL_DIR, layer_layout="scan")
    passage = ("The committee met on the fourth of May and agreed on three points: the "
               "budget, the schedule and the new members. ")
    prompt = passage + passage + passage[:40]
    ref = generate(model, [prompt], method="ar", max_new_tokens=32, ignore_eos=True)
    got = generate(model, [prompt], method="lookup", max_new_tokens=32, ignore_eos=True)
    assert got.token_ids == ref.token_ids
    assert got.stats["lookup"]["accepted"] > 0


# ------------------------------------------------------ 3. sampling: exact, q one-hot
@pytest.mark.parametrize("rule", [TokenwiseRejection(), BlockwiseVerification()],
                         ids=["tokenwise", "blockwise"])
@pytest.mark.parametrize("V,gamma,seed", [(2, 2, 0), (3, 2, 1), (3, 3, 2), (4, 2, 3)])
def test_deterministic_proposal_preserves_target_exactly(rule, V, gamma, seed):
    """Exact enumeration with q one-hot (the lookup's proposal, a function of the prefix):
    the output distribution is p's, including targets that give the proposal p = 0."""
    rng = np.random.RandomState(seed)
    p_table = random_conditionals(rng, V, gamma, zero_frac=0.3)
    q_table = {prefix: np.eye(V)[rng.randint(V)] for prefix in p_table}
    dist = output_distribution(rule, p_table, q_table, V, gamma)
    assert total_variation(dist, p_table, V, gamma) < 1e-6


def test_one_hot_logq():
    logq = np.asarray(one_hot_logq(jnp.asarray([[2, 0]]), 3))
    assert logq.tolist() == [[[-np.inf, -np.inf, 0.0], [0.0, -np.inf, -np.inf]]]


@pytest.fixture(scope="module")
def small():
    from test_sampling_exact import small_model

    return small_model()


@pytest.mark.parametrize("method,options", [
    ("lookup", dict(lookup=2, acceptance="tokenwise")),
    ("lookup", dict(lookup=3, max_ngram=2, acceptance="blockwise")),
    ("layerskip", dict(lookup=2, draft_exit=2, draft_len=2, acceptance="tokenwise")),
])
def test_lookup_sampling_matches_exact_distribution(small, method, options):
    """Through the decoding loop: the first tokens after PROMPT (4-token vocabulary, so the
    n-gram search matches in most rounds) follow AR sampling's exact distribution."""
    sampling = SamplingParams(temperature=1.0, seed=19)
    probs = exact_ar_distribution(small, sampling)
    r = generate(small, [PROMPT] * N_SAMPLES, method=method, max_new_tokens=NEW,
                 ignore_eos=True, temperature=1.0, seed=19, **options)
    look = r.stats["lookup"]
    assert look["proposed"] > N_SAMPLES and 0 < look["accepted"] < look["proposed"], look
    stat, threshold = chi_square_test(r.token_ids, probs, N_SAMPLES)
    assert stat < threshold, (stat, threshold)


def test_broken_rule_under_lookup_fails_the_same_test(small):
    """Negative control: the same chi-square test, through the lookup hierarchy, rejects a
    rule that replaces rejected lookup drafts from p instead of the residual."""
    import dataclasses

    from test_sampling_exact import _ResampleFromTarget

    decoder = methods.make_method(small, "lookup", lookup=2, greedy=False)
    broken = methods.Decoder(dataclasses.replace(decoder.hierarchy, rule=_ResampleFromTarget()),
                             windows=decoder.windows)
    sampling = SamplingParams(temperature=1.0, seed=19)
    probs = exact_ar_distribution(small, sampling)
    r = generate(small, [PROMPT] * N_SAMPLES, method=broken, max_new_tokens=NEW,
                 ignore_eos=True, temperature=1.0, seed=19)
    stat, threshold = chi_square_test(r.token_ids, probs, N_SAMPLES)
    assert stat > threshold, (stat, threshold)


# ------------------------------------------------------------------- 4. bad input
@pytest.mark.parametrize("method,options,match", [
    ("lookup", dict(lookup=0), "lookup must be an integer in"),
    ("lookup", dict(lookup=-3), "lookup must be an integer in"),
    ("lookup", dict(lookup=10_000), "lookup must be an integer in"),
    ("lookup", dict(lookup=2.5), "lookup must be an integer in"),
    ("lookup", dict(max_ngram=0), "max_ngram must be an integer in"),
    ("lookup", dict(draft_exit=1), "does not take draft_exit"),
    ("ar", dict(lookup=4), "does not take lookup"),
    ("sv", dict(lookup=4), "does not take lookup"),
    ("specbound", dict(lookup=4), "does not take lookup"),
    ("layerskip", dict(max_ngram=2), "max_ngram needs a lookup drafter"),
    ("hispec", dict(lookup=4, adaptive=True), "adaptive windows do not combine"),
])
def test_bad_lookup_settings_fail_before_compiling(method, options, match):
    model = tiny_model(4, 0)
    before = engine_lib.compilations
    with pytest.raises(ValueError, match=match):
        generate(model, [[1, 2]], method=method, max_new_tokens=4, **options)
    assert engine_lib.compilations == before
    with pytest.raises(OptionError) as err:  # the check the command line runs
        check_method_options(method, num_layers=4, **options)
    assert err.value.name in options


@pytest.mark.parametrize("argv,expected", [
    ("--method lookup --lookup 0", "--lookup 0: must be an integer in [1, 64]"),
    ("--method lookup --lookup 100000", "--lookup 100000: must be an integer in [1, 64]"),
    ("--method sv --lookup 4", "--lookup 4: only methods lookup, layerskip, hispec, draft take it"),
    ("--method specbound --lookup 4", "--lookup 4: only methods lookup, layerskip, hispec"),
    ("--method layerskip --max-ngram 2", "--max-ngram 2: needs a lookup drafter"),
    ("--method lookup --max-ngram 0", "--max-ngram 0: must be an integer in [1, 16]"),
    ("--method hispec --lookup 4 --adaptive", "--adaptive: adaptive windows do not combine"),
])
def test_cli_bad_lookup_flags_exit_2_in_one_line(argv, expected, capsys):
    from hispec_jax import cli

    before = engine_lib.compilations
    assert cli.main(["generate", *argv.split(), "hello"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err
    assert engine_lib.compilations == before


# ------------------------------------------------------------ 5. the task-mix benchmark
def test_task_prompts_come_from_packaged_data():
    from hispec_jax.bench import tasks

    for task in tasks.TASKS:
        messages = tasks.task_messages(task)
        assert len(messages) >= 50, task
    summarize, extract = tasks.task_messages("summarize")[0], tasks.task_messages("extract")[0]
    assert summarize.startswith("Summarize this text:\n\n") and len(summarize) > 400
    assert any(ch.isdigit() for ch in extract.split("\n\n", 1)[1])
    assert "def " in tasks.task_messages("code")[0] and "return" in tasks.task_messages("code")[0]


@pytest.mark.parametrize("argv,expected", [
    ("--tasks chat,poetry", "--tasks chat,poetry: expected a comma-separated list"),
    ("--tasks code --rounds 0", "--rounds 0: must be >= 1"),
    ("--tasks code --lookup 0", "--lookup 0: must be an integer in [1, 64]"),
])
def test_task_bench_bad_flags(argv, expected, capsys):
    from hispec_jax.bench import tasks

    assert tasks.main(argv.split()) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


# ------------------------------------------------------ the compiled loop copies no cache
def _cache_copies(model, k=4) -> int:
    """Copies of cache-shaped buffers ([.., S = 64, H = 8]) in the compiled lookup loop."""
    import re

    decoder = methods.make_method(model, "lookup", lookup=k)
    engine = engine_lib.Engine.for_model(model, decoder.hierarchy,
                                         engine_lib.Shapes(batch=1, capacity=64, prompt_block=16))
    return len(re.findall(r"= f32\[[0-9,]*64,8\]\{[0-9,]*\} copy\(", engine.lower().compile().as_text()))


def test_lookup_loop_copies_no_cache(monkeypatch, users_codegen):
    """The `lax.switch` over block lengths only reads the cache (keys/values are written
    after it): a branch that writes the cache makes XLA copy all of it every round."""
    import functools

    import jax

    model = tiny_model(2, 0)
    assert _cache_copies(model) == 0

    def writes_in_branches(self, state, k, part_B):  # the cache written in the branches
        blocks = self.h.level_blocks(k)
        index = jnp.minimum(jnp.searchsorted(jnp.asarray(blocks), jnp.max(jnp.where(
            part_B, self.pending(state, k), 0))), len(blocks) - 1)
        return jax.lax.switch(index, [functools.partial(self.verify, k=k, part_B=part_B, T=T)
                                      for T in blocks], state)

    monkeypatch.setattr(engine_lib.Round, "verify_at_shortest_block", writes_in_branches)
    assert _cache_copies(model) > 0
