"""The lookup drafter's acceptance gate (`decoding/gate.py`): its pure functions, then the
gated drafter in the decoding loop (greedy == AR, exact sampling, the limits of F)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hispec_jax.decoding import gate
from hispec_jax.decoding.windows import power_of_two_blocks

from test_engine import PROPERTY_SETTINGS

BLOCKS = power_of_two_blocks(16)
costs = st.builds(gate.PassCost.of, st.floats(0.0, 2000.0), st.floats(0.0, 20.0))
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
    """C(b, 1) = 1; C grows with the block; and with the batch from two sequences on (from
    one when J = 0: at batch 1 the AR step alone is a one-row pass, free of the jump)."""
    C = lambda b, T: float(gate.relative_cost(b, T, cost))
    assert abs(C(b, 1) - 1.0) < 1e-6
    assert C(b, 2 * T) >= C(b, T) - 1e-6
    if b >= 2 or float(cost.jump) == 0.0:
        assert C(b + 1, T) >= C(b, T) - 1e-6
    assert abs(C(b, T) - 1.0) < 1e-5 or float(cost.fixed) < 1e7  # F -> inf: every block ~ free
    assert C(b, T) <= T + float(cost.jump) + 1e-4  # at most T AR steps, and the jump


def test_expected_tokens():
    assert float(gate.expected_tokens(0.3, 1)) == 1.0
    assert abs(float(gate.expected_tokens(0.5, 3)) - 1.75) < 1e-6
    assert abs(float(gate.expected_tokens(1.0, 7)) - 7.0) < 1e-6
    assert float(gate.expected_tokens(0.0, 16)) == 1.0


def test_pass_cost_from_seconds_recovers_the_model():
    F, J, row = 17.0, 3.0, 0.002
    seconds = lambda rows: row * (F + rows + J * (rows > 1))
    got = gate.pass_cost_from_seconds(seconds(1), seconds(2), seconds(16), 16)
    assert abs(float(got.fixed) - F) < 1e-3 and abs(float(got.jump) - J) < 1e-3


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
    never lengthen a proposal (from two sequences on; at one, see `test_relative_cost`)."""
    got = [pick(a, length, cost, batch=b, joint=True) for b in (2, 4, 8, 16)]
    assert got == sorted(got, reverse=True)


def test_choice_at_the_default_cpu_cost():
    """At this CPU's default cost: a 10 % match proposes 1 token, a coin flip 4 at batch 1
    and 2 at a batch of 8, a 90 % one all 16 (batch 1) or 8 (batch 8); a no-match is 1."""
    cpu = gate.default_pass_cost("cpu")
    assert pick(0.1, 16, cpu) == 1
    assert pick(0.5, 16, cpu) == 4 and pick(0.5, 16, cpu, batch=8, joint=True) == 2
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
    assert a[0, 1] == 6 / 7 and a[1, 3] == 2 / 4 and a[2, 0] == 0.5  # the prior: 1 / 2
    assert np.asarray(s.of_match(jnp.asarray([2, 4, 0]))).tolist() == [a[0, 1], a[1, 3], 0.5]


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
    # the prior (1 kept, 1 rejection) pulls towards 1/2 by at most 2 of ~10 weighted proposals
    tol = 0.12 if m > 1 else 0.2
    assert abs(est - true_a) < tol, (est, true_a)
