"""The lookup drafter's acceptance gate (`decoding/gate.py`): its pure functions, then the
gated drafter in the decoding loop (greedy == AR, exact sampling, the limits of F)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hispec_jax import generate
from hispec_jax.decoding import gate, methods
from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.decoding.windows import power_of_two_blocks

from test_engine import PROPERTY_SETTINGS, random_prompts, tiny_model
from test_sampling_exact import N_SAMPLES, NEW, PROMPT, chi_square_test, exact_ar_distribution

BLOCKS = power_of_two_blocks(16)
# J <= F: a block pass's own jump is below the fixed part of every pass (weights read)
costs = st.builds(lambda F, J: gate.PassCost.of(F, min(F, J)), st.floats(0.0, 2000.0),
                  st.floats(0.0, 20.0))
accepts = st.floats(0.0, 0.999)


def pick(accept, length, cost, *, batch=1, joint=False, matched=True, blocks=BLOCKS):
    """`gate.choose` for `batch` identical participating sequences; the first one's length."""
    B = batch
    return int(gate.choose(jnp.full((B,), accept, jnp.float32),
                           jnp.full((B,), length, jnp.int32), jnp.full((B,), matched),
                           jnp.ones((B,), bool), blocks, cost, joint=joint)[0])


# ------------------------------------------------------------------ 1. the cost model
@settings(max_examples=60, **PROPERTY_SETTINGS)
@given(cost=costs, b=st.integers(1, 64), T=st.sampled_from(BLOCKS))
def test_relative_cost(cost, b, T):
    """C(b, 1) = 1; C grows with the block, and with the batch (J <= F: the jump, paid
    once per block pass, weighs less than the rows of one more sequence)."""
    C = lambda b, T: float(gate.relative_cost(b, T, cost))
    assert abs(C(b, 1) - 1.0) < 1e-6
    assert C(b, 2 * T) >= C(b, T) - 1e-6
    assert C(b + 1, T) >= C(b, T) - 1e-6
    assert abs(C(b, T) - 1.0) < 1e-5 or float(cost.fixed) < 1e7  # F -> inf: every block ~ free
    assert C(b, T) <= T + float(cost.jump) + 1e-4  # at most T AR steps, and the jump


def test_expected_tokens():
    assert float(gate.expected_tokens(0.3, 1)) == 1.0
    assert abs(float(gate.expected_tokens(0.5, 3)) - 1.75) < 1e-6
    assert abs(float(gate.expected_tokens(1.0, 7)) - 7.0) < 1e-6
    assert float(gate.expected_tokens(0.0, 16)) == 1.0


def test_fit_pass_cost_recovers_the_model():
    """Seconds made by cost(b, T) = F + b T + J [T > 1] (times a row's seconds) fit back to
    (F, J), whatever the batches measured; a table without an AR step is refused."""
    F, J, row = 17.0, 3.0, 0.002
    seconds = {(b, T): row * (F + b * T + J * (T > 1)) for b, T in gate.MEASURED_PASSES}
    got = gate.fit_pass_cost(seconds)
    assert abs(float(got.fixed) - F) < 0.3 and abs(float(got.jump) - J) < 0.3
    only_one = {k: v for k, v in seconds.items() if k[0] == 1}
    got = gate.fit_pass_cost(only_one)
    assert abs(float(got.fixed) - F) < 0.3 and abs(float(got.jump) - J) < 0.3
    with pytest.raises(ValueError, match="AR step"):
        gate.fit_pass_cost({(1, 2): 1.0, (1, 4): 1.5})


# ------------------------------------------------------------------ 2. the choice
@settings(max_examples=40, **PROPERTY_SETTINGS)
@given(cost=costs, b=st.integers(1, 16), length=st.integers(1, 16), joint=st.booleans(),
       data=st.data())
def test_proposes_one_token_when_acceptance_is_low(cost, b, length, joint, data):
    """If even an endless proposal (1 / (1 - a) tokens) cannot pay for the shortest longer
    block, the gate proposes 1 token: an AR step."""
    batch = b if joint else 1
    bound = 1.0 - 1.0 / float(gate.relative_cost(batch, 2, cost))
    accept = data.draw(st.floats(0.0, max(bound - 1e-3, 0.0)))
    assert pick(accept, length, cost, batch=b, joint=joint) == 1


@settings(max_examples=80, **PROPERTY_SETTINGS)
@given(cost=costs, b=st.integers(1, 16), length=st.integers(1, 16), joint=st.booleans(),
       a=accepts, a2=accepts)
def test_length_grows_with_acceptance_and_with_f(cost, b, length, joint, a, a2):
    """More likely drafts, or a pass whose fixed part is larger, never shorten a proposal;
    a proposal stays within [1, what the drafter offered]."""
    lo, hi = sorted((a, a2))
    m_lo = pick(lo, length, cost, batch=b, joint=joint)
    assert 1 <= m_lo <= pick(hi, length, cost, batch=b, joint=joint) <= length
    more_fixed = gate.PassCost.of(2 * float(cost.fixed) + 1, float(cost.jump))
    assert m_lo <= pick(lo, length, more_fixed, batch=b, joint=joint)


@settings(max_examples=40, **PROPERTY_SETTINGS)
@given(cost=costs, a=accepts, length=st.integers(1, 16))
def test_a_fuller_batch_proposes_no_more(cost, a, length):
    """One block for the batch: at the same acceptance, more rows per pass (a larger batch)
    never lengthen a proposal."""
    got = [pick(a, length, cost, batch=b, joint=True) for b in (1, 2, 4, 8, 16)]
    assert got == sorted(got, reverse=True)


def test_choice_at_the_default_cpu_cost():
    """At this CPU's default cost: a 10 % match proposes 1 token, a coin flip 4 at batch 1
    and 1 at a batch of 8, a 90 % one all 16 (batch 1) or 8 (batch 8); a no-match is 1."""
    cpu = gate.default_pass_cost("cpu")
    assert pick(0.1, 16, cpu) == 1
    assert pick(0.5, 16, cpu) == 4 and pick(0.5, 16, cpu, batch=8, joint=True) == 1
    assert pick(0.9, 16, cpu) == 16 and pick(0.9, 16, cpu, batch=8, joint=True) == 8
    assert pick(0.9, 16, cpu, matched=False) == 1


def test_joint_choice_fills_the_block_for_everyone():
    """One block for the batch: a sequence with a good match sets the block, and a sequence
    with a poor one fills it too (its rejected tokens cost nothing more); a shorter match
    proposes what it has; rows not taking part add no tokens. Each sequence on its own
    (`joint=False`) picks its own length."""
    accel, cpu = gate.PassCost.of(256.0), gate.default_pass_cost("cpu")
    got = gate.choose(jnp.asarray([0.95, 0.05, 0.95, 0.95]), jnp.asarray([16, 16, 3, 16]),
                      jnp.asarray([True, True, True, False]), jnp.asarray([True, True, True, True]),
                      BLOCKS, accel, joint=True)
    assert got.tolist() == [16, 16, 3, 1]
    alone = gate.choose(jnp.asarray([0.95, 0.05]), jnp.asarray([16, 16]), jnp.asarray([True, True]),
                        jnp.asarray([False, True]), BLOCKS, cpu, joint=True)
    assert alone.tolist() == [1, 1]  # the good match takes no part: the poor one decides
    own = gate.choose(jnp.asarray([0.95, 0.05]), jnp.asarray([16, 16]), jnp.asarray([True, True]),
                      jnp.asarray([True, True]), BLOCKS, cpu, joint=False)
    assert own.tolist() == [16, 1]


@settings(max_examples=40, **PROPERTY_SETTINGS)
@given(a=accepts, length=st.integers(1, 16), b=st.integers(1, 8), joint=st.booleans())
def test_limits_of_f(a, length, b, joint):
    """F -> inf: every block is free, the gate proposes all the drafter offers; F = J = 0:
    a pass costs its rows, no proposal pays, every proposal is 1 token."""
    assert pick(a, length, gate.PassCost.of(1e30), batch=b, joint=joint) == length
    assert pick(a, length, gate.PassCost.of(0.0), batch=b, joint=joint) == 1


# ------------------------------------------------------------------ 3. the estimate
def test_record_updates_only_the_match_bucket():
    s = gate.GateState.init(3, 4).replace(ngram_B=jnp.asarray([2, 4, 1]))
    s = s.record(jnp.asarray([5, 3, 0]), jnp.asarray([5, 1, 0]))
    kept, rej = np.asarray(s.kept_BxN), np.asarray(s.rejected_BxN)
    assert kept.tolist() == [[0, 5, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]]
    assert rej.tolist() == [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]]  # row 2: no proposal
    a = np.asarray(s.acceptance())
    assert a[0, 1] == 7 / 8 and a[1, 3] == 3 / 5 and a[2, 0] == 2 / 3  # the prior: 2 / 3
    assert np.asarray(s.of_match(jnp.asarray([2, 4, 0]))).tolist() == [a[0, 1], a[1, 3], a[2, 0]]


def test_run_buckets_take_a_sequence_copying_a_passage():
    """With runs, a sequence whose proposals kept RUN or more tokens in a row, with no
    rejection since, reads and updates the run bucket of its match's n; a rejection takes it
    back to the plain buckets."""
    N = 4
    s = gate.GateState.init(2, N, runs=True).replace(ngram_B=jnp.asarray([3, 3]))
    assert s.kept_BxN.shape == (2, 2 * N) and s.max_ngram == N
    fresh = np.asarray(s.of_match(jnp.asarray([3, 3])))
    assert fresh.tolist() == pytest.approx([2 / 3, 2 / 3])
    s = s.record(jnp.asarray([2, 2]), jnp.asarray([2, 1]))  # row 0 kept both, row 1 one of two
    assert np.asarray(s.run_B).tolist() == [2, 0]
    assert np.asarray(s.column(jnp.asarray([3, 3]))).tolist() == [2, 2]  # not yet on a run
    s = s.record(jnp.asarray([2, 0]), jnp.asarray([2, 0]))  # row 1: no match, nothing moves
    assert np.asarray(s.run_B).tolist() == [4, 0]
    assert np.asarray(s.column(jnp.asarray([3, 1]))).tolist() == [N + 2, 0]
    # a fresh run bucket starts from the run prior
    on_run = float(s.of_match(jnp.asarray([3, 3]))[0])
    assert on_run == pytest.approx(gate.PRIOR_RUN_KEPT / (gate.PRIOR_RUN_KEPT
                                                          + gate.PRIOR_RUN_REJECTED))
    s = s.record(jnp.asarray([8, 0]), jnp.asarray([3, 0]))  # chosen on the run: counted there
    kept, rej = np.asarray(s.kept_BxN), np.asarray(s.rejected_BxN)
    assert kept[0, N + 2] == 3 and rej[0, N + 2] == 1 and kept[0, 2] == pytest.approx(0.9 * 2 + 2)
    assert int(s.run_B[0]) == 0 and int(s.column(jnp.asarray([3]))[0]) == 2  # the run ended
    # without runs the state is one bucket per n, as before
    plain = gate.GateState.init(2, N)
    assert plain.kept_BxN.shape == (2, N)
    assert np.asarray(plain.record(jnp.asarray([5, 5]), jnp.asarray([5, 5])).column(
        jnp.asarray([3, 3]))).tolist() == [2, 2]


@settings(max_examples=20, **PROPERTY_SETTINGS)
@given(true_a=st.floats(0.02, 0.97), seed=st.integers(0, 1000), m=st.sampled_from([1, 4, 16]))
def test_estimate_converges_on_a_synthetic_stream(true_a, seed, m):
    """Proposals of m tokens, each kept with probability a until the first rejection: the
    estimate lands near a (the decayed counts keep about the last 10 proposals)."""
    rng = np.random.default_rng(seed)
    B = 64  # independent streams, one per row
    s = gate.GateState.init(B, 2).replace(ngram_B=jnp.full((B,), 2, jnp.int32))
    for _ in range(60):
        kept = np.minimum(rng.geometric(1.0 - true_a, size=B) - 1, m)
        s = s.record(jnp.full((B,), m, jnp.int32), jnp.asarray(kept, jnp.int32))
    est = float(np.mean(np.asarray(s.acceptance())[:, 1]))
    # the prior (2 kept, 1 rejection) pulls towards 2/3 by at most 3 of ~10 weighted proposals
    tol = 0.15 if m > 1 else 0.2
    assert abs(est - true_a) < tol, (est, true_a)


# ------------------------------------------------------------------ 4. in the decoding loop
@pytest.fixture(scope="module")
def small():
    from test_sampling_exact import small_model

    return small_model()


GATED = [("lookup", {}), ("lookup", dict(lookup=4, max_ngram=2)),
         ("layerskip", dict(lookup=4, draft_exit=2)),
         ("hispec", dict(lookup=4, draft_exit=1, verify_exits=(2,), verify_window=2))]
COSTS = [gate.default_pass_cost("cpu"), gate.PassCost.of(1.2), gate.PassCost.of(256.0),
         gate.PassCost.of(0.0), gate.PassCost.of(1e30)]


def ungated(decoder):
    """`decoder` with its lookup drafter's gate off (`ngram_tokens`' limit every round)."""
    h = decoder.hierarchy
    return dataclasses.replace(decoder, hierarchy=dataclasses.replace(
        h, drafter=dataclasses.replace(
            h.drafter, lookup=dataclasses.replace(h.drafter.lookup, gate=False))))


@settings(max_examples=8, **PROPERTY_SETTINGS)
@given(case=st.fixed_dictionaries(dict(
    which=st.integers(0, len(GATED) - 1), cost=st.integers(0, len(COSTS) - 1),
    seed=st.integers(0, 2), layer_scale=st.sampled_from([1.0, 0.0]), batch=st.sampled_from([1, 3]),
    max_prompt_len=st.integers(1, 12), max_new=st.integers(1, 24), ignore_eos=st.booleans(),
    prompt_seed=st.integers(0, 1000))))
def test_gated_greedy_equals_autoregressive(case):
    """Random and cycling models (layer_scale 0), batch > 1 with per-sequence matches, EOS
    (id 3), every pass cost from F = 0 (never speculate) to F = 1e30 (always)."""
    model = tiny_model(4, case["seed"], case["layer_scale"])
    method, options = GATED[case["which"]]
    prompts = random_prompts(np.random.RandomState(case["prompt_seed"]), case["batch"],
                             case["max_prompt_len"])
    common = dict(max_new_tokens=case["max_new"], ignore_eos=case["ignore_eos"])
    ref = generate(model, prompts, **common)
    got = generate(model, prompts, method=method, lookup_cost=COSTS[case["cost"]], **common,
                   **options)
    assert got.token_ids == ref.token_ids, (case, got.stats)


CYCLE_PROMPTS = [[5, 9, 11], [7], [1, 2, 3, 4, 5, 6, 7, 8]]


def _lookup_run(model, method, cost, prompts=CYCLE_PROMPTS, max_new=40, **options):
    r = generate(model, prompts, method=method, max_new_tokens=max_new, ignore_eos=True,
                 lookup_cost=cost, **options)
    return r.token_ids, r.stats["lookup"], r.stats["rounds"]


def test_limits_of_f_in_the_loop():
    """A cycling model and a random one, batch 3: with F = 1e30 every proposal is the
    ungated one (same tokens, counters and rounds); with F = 0 every match proposes one
    token; at this CPU's default cost a random model's poor matches propose fewer tokens
    than ungated, and the cycle's good ones still many."""
    for scale in (0.0, 1.0):
        model = tiny_model(4, 0, scale)
        plain = ungated(methods.make_method(model, "lookup"))
        base = _lookup_run(model, plain, None)
        assert _lookup_run(model, "lookup", gate.PassCost.of(1e30)) == base
        _, look, _ = _lookup_run(model, "lookup", gate.PassCost.of(0.0))
        assert look["matches"] > 0 and look["proposed"] == look["matches"], look
        tokens, look, rounds = _lookup_run(model, "lookup", None)
        assert tokens == base[0]
        if scale == 0.0:  # the cycle: most proposals hold, long proposals stay
            assert look["accepted"] >= 0.8 * look["proposed"] and rounds <= base[2] * 1.5, look
        else:
            assert look["proposed"] < base[1]["proposed"], (look, base[1])


@pytest.mark.parametrize("method,options", [
    ("lookup", dict(lookup=3, max_ngram=1, acceptance="tokenwise")),
    ("lookup", dict(lookup=3, max_ngram=1, acceptance="blockwise")),
    ("layerskip", dict(lookup=3, max_ngram=1, draft_exit=2, draft_len=2,
                       acceptance="tokenwise")),
])
def test_gated_sampling_matches_exact_distribution(small, method, options):
    """Through the gated path: the first tokens after PROMPT (4-token vocabulary, the n-gram
    search matches in most rounds) follow AR sampling's exact distribution, at a pass cost
    (F = 0.25) where a fresh estimate (a = 2/3) proposes one token and one whose probes
    were kept (a >= 0.8) two: fewer tokens in all than ungated. (max_ngram = 1: a match
    may propose all k = 3, so the gate alone shortens a proposal.)"""
    sampling = SamplingParams(temperature=1.0, seed=23)
    probs = exact_ar_distribution(small, sampling)
    run = dict(max_new_tokens=NEW, ignore_eos=True, temperature=1.0, seed=23,
               lookup_cost=gate.PassCost.of(0.25))
    gated = methods.make_method(small, method, greedy=False, **options)
    r = generate(small, [PROMPT] * N_SAMPLES, method=gated, **run)
    look = r.stats["lookup"]
    free = generate(small, [PROMPT] * N_SAMPLES, method=ungated(gated), **run)
    assert 0 < look["proposed"] < free.stats["lookup"]["proposed"], (look, free.stats["lookup"])
    assert 0 < look["accepted"] < look["proposed"], look
    stat, threshold = chi_square_test(r.token_ids, probs, N_SAMPLES)
    assert stat < threshold, (stat, threshold)


def test_gated_sampling_is_reproducible_per_sequence_regardless_of_batch(small):
    """In sampling each sequence's gate decides alone (at the cost of a batch of one), so
    its proposals, and with them its draws, do not depend on the rest of the batch."""
    opts = dict(method="lookup", lookup=4, max_new_tokens=16, ignore_eos=True,
                temperature=1.0, seed=5, lookup_cost=gate.PassCost.of(2.0))
    alone = generate(small, [PROMPT * 3], **opts)
    batch = generate(small, [PROMPT * 3, [0, 1, 0, 1, 0], [3, 3, 2, 3, 3, 2]], **opts)
    assert batch.token_ids[0] == alone.token_ids[0]
    assert alone.stats["lookup"]["matches"] > 0, alone.stats["lookup"]


def test_a_new_pass_cost_compiles_nothing():
    """F and J are arrays in the request: a run at another cost reuses the compiled loop."""
    model = tiny_model(4, 1, 0.0)
    first = generate(model, CYCLE_PROMPTS, method="lookup", max_new_tokens=8,
                     lookup_cost=gate.PassCost.of(3.0, 1.0))
    again = generate(model, CYCLE_PROMPTS, method="lookup", max_new_tokens=8,
                     lookup_cost=gate.PassCost.of(500.0))
    assert again.stats["compile_count"] == 0 and again.token_ids == first.token_ids


def test_measure_pass_cost_fits_a_model():
    """`measure_pass_cost` times a real model's pass: finite, non-negative F and J."""
    cost = gate.measure_pass_cost(tiny_model(2, 0), context=8, capacity=32, repeats=2, calls=2,
                                  shapes=((1, 1), (1, 2), (2, 1), (2, 2)))
    F, J = float(cost.fixed), float(cost.jump)
    assert np.isfinite(F) and np.isfinite(J) and F >= 0 and J >= 0


def test_store_matches_have_their_own_buckets():
    """A match in earlier requests' store is estimated apart from one of the same n in the
    sequence's own context (`LookupDrafter.bucket`: N + n), on and off a run."""
    from hispec_jax.decoding.engine.drafters import LookupDrafter
    from hispec_jax.decoding.lookup import PromptLookup

    drafter = LookupDrafter(PromptLookup(8, 4))
    bucket = drafter.bucket(jnp.asarray([2, 2, 4]), jnp.asarray([False, True, True]))
    assert bucket.tolist() == [2, 6, 8]
    s = drafter.init(3, 0, 0).gate.replace(ngram_B=bucket)
    assert s.kept_BxN.shape == (3, 2 * 2 * 4)  # (own, store) x (off, on a run) x n
    s = s.record(jnp.asarray([3, 3, 3]), jnp.asarray([3, 0, 0]))
    assert s.column(bucket).tolist() == [1, 5, 7]
    kept = np.asarray(s.kept_BxN)
    assert kept[0, 1] == 3 and kept[1, 5] == 0 and kept[1].sum() == 0 and kept[0, 5] == 0
