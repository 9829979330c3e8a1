"""The exit drafter's acceptance gate (`gate.choose_window`, `engine.ExitDrafter(gate=True)`,
`make_method(exit_gate=True)`): the window choice alone, then in the decoding loop: greedy
output stays AR's, drafts that never hold shrink every window to the minimum (one draft a
round), drafts that always hold keep the full window, and sampling stays exact."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from hispec_jax import generate
from hispec_jax.decoding import gate, methods
from hispec_jax.decoding.sampling import SamplingParams

from test_engine import random_prompts, tiny_model
from test_sampling_exact import N_SAMPLES, NEW, PROMPT, chi_square_test, exact_ar_distribution

CPU = gate.default_pass_cost("cpu")


def pick(accept, limit=8, max_window=8, cost=CPU, *, f0=0.25, f1=0.75, joint=False,
         part=None):
    accept = jnp.atleast_1d(jnp.asarray(accept, jnp.float32))
    B = accept.shape[0]
    limit_B = jnp.broadcast_to(jnp.asarray(limit, jnp.int32), (B,))
    part_B = jnp.ones((B,), bool) if part is None else jnp.asarray(part)
    return np.asarray(gate.choose_window(accept, limit_B, part_B, max_window, f0, f1, cost,
                                         joint=joint)).tolist()


# ------------------------------------------------------------------ 1. the window choice
def test_exit_round_cost():
    """(W + 1) draft steps of f_0, each an AR step of b sequences (no jump), and one block
    pass of f_1 over W + 1 positions of the b sequences (the jump)."""
    cost = gate.PassCost.of(10.0, 2.0)
    got = float(gate.exit_round_cost(2, 3, 0.25, 0.75, cost))
    assert got == pytest.approx(4 * 0.25 * (10 + 2) + 0.75 * (10 + 8 + 2))


@pytest.mark.parametrize("joint", [False, True])
def test_window_follows_acceptance(joint):
    """Drafts that never hold: window 0 (one draft a round); drafts that always hold: the
    longest window allowed; in between the window never shrinks as acceptance grows; and
    never above the window policy's."""
    assert pick(0.0, joint=joint) == [0]
    assert pick(0.999, joint=joint) == [8]
    assert pick(0.999, limit=3, joint=joint) == [3]
    windows = [pick(a, joint=joint)[0] for a in np.linspace(0.0, 0.99, 12)]
    assert windows == sorted(windows) and windows[0] == 0 and windows[-1] >= 4, windows


def test_free_passes_draft_long_and_costly_drafts_draft_short():
    """On an accelerator (a pass costs nearly the same for any rows) middling drafts pay
    for a long window; where every row costs its own pass (F = 0) they pay for none."""
    assert pick(0.3, cost=gate.PassCost.of(256.0)) > pick(0.3, cost=CPU) == [0]
    assert pick(0.5, cost=gate.PassCost.of(0.0)) == [0]


def test_joint_choice_is_one_window_for_the_batch():
    """Greedy ("sync"): the batch runs at its longest window, so one window for all,
    weighted by the sequences that run (a finished one's estimate does not count)."""
    got = pick([0.0, 0.99, 0.99], joint=True)
    assert len(set(got)) == 1 and got[0] > 0
    assert pick([0.99, 0.0], joint=True, part=[False, True]) == [0, 0]


# -------------------------------------------------------------- 2. in the decoding loop
GATED = [("layerskip", dict(draft_exit=2, draft_len=3, adaptive=True)),
         ("hispec", dict(draft_exit=1, verify_exits=(2, 4), draft_len=2, verify_window=3))]


@pytest.mark.parametrize("method,options", GATED, ids=[f"{m}-{i}" for i, (m, _) in
                                                       enumerate(GATED)])
def test_gated_greedy_equals_autoregressive(method, options):
    """Random and always-agree models, a batch of 3 of different prompt lengths, EOS on for
    the random one, the cache exactly as long as the run needs."""
    for scale, ignore_eos in ((1.0, False), (0.0, True)):
        model = tiny_model(6, 1, scale)
        prompts = random_prompts(np.random.RandomState(3), 3, 9)
        decoder = methods.make_method(model, method, exit_gate=True, **options)
        assert decoder.hierarchy.drafter.gate
        common = dict(max_new_tokens=20, ignore_eos=ignore_eos)
        ref = generate(model, prompts, **common)
        got = generate(model, prompts, method=method, exit_gate=True, **common, **options,
                       max_cache_len=max(map(len, prompts)) + 20 + decoder.lookahead())
        assert got.token_ids == ref.token_ids, (scale, got.stats)


PROMPTS = [[5, 9, 11], [7]]
RUN = dict(max_new_tokens=40, ignore_eos=True)


def draft_steps_per_check(stats) -> float:
    """Draft steps per level-1 verification: W + 1 at window W."""
    actions = stats["actions_per_level"]
    return actions[0] / actions[1]


def test_drafts_that_never_hold_shrink_to_one_a_round():
    """A random model: its exit's drafts are mostly rejected, so after the first round most
    rounds draft one token (layerskip: most verifications check one position, where ungated
    ones check Nd + 1 = 4, and none but the first checks 4); hispec's draft exit likewise;
    the output is AR's."""
    model = tiny_model(6, 1)
    ref = generate(model, PROMPTS, **RUN)
    ls = dict(method="layerskip", draft_exit=1, draft_len=3, **RUN)
    free, gated = (generate(model, PROMPTS, exit_gate=g, **ls) for g in (False, True))
    assert free.token_ids == gated.token_ids == ref.token_ids
    hist_free, hist = free.stats["verified_length_histogram"], gated.stats["verified_length_histogram"]
    assert hist_free[4] > sum(hist_free) / 2, hist_free
    assert hist[1] > sum(hist) / 2 and hist[4] <= len(PROMPTS), hist  # Nd + 1: first rounds
    assert gated.stats["layer_passes"] < free.stats["layer_passes"]

    hs = dict(method="hispec", draft_exit=1, verify_exits=(3,), draft_len=3, verify_window=4,
              **RUN)
    free, gated = (generate(model, PROMPTS, exit_gate=g, **hs) for g in (False, True))
    assert free.token_ids == gated.token_ids == ref.token_ids
    assert draft_steps_per_check(free.stats) > 3
    assert draft_steps_per_check(gated.stats) < 1.5


def test_drafts_that_always_hold_keep_the_full_window():
    """Identity layers: every draft is accepted, so the gate keeps Nd: the same rounds, the
    same verified lengths and the same minimal work as ungated."""
    model = tiny_model(6, 0, layer_scale=0.0)
    for options in (dict(method="layerskip", draft_exit=2, draft_len=3),
                    dict(method="hispec", draft_exit=1, verify_exits=(3,), draft_len=2,
                         verify_window=4)):
        free, gated = (generate(model, PROMPTS, exit_gate=g, **options, **RUN)
                       for g in (False, True))
        assert gated.token_ids == free.token_ids
        for key in ("rounds", "verified_length_histogram", "layer_token_evals",
                    "actions_per_level"):
            assert gated.stats[key] == free.stats[key], key
        assert draft_steps_per_check(gated.stats) >= options["draft_len"]


def test_method_options_set_the_gates():
    """`exit_gate` (off by default) and `lookup_gate` (on by default) reach the hierarchy."""
    model = tiny_model(4, 0)
    assert not methods.make_method(model, "layerskip").hierarchy.drafter.gate
    h = methods.make_method(model, "hispec", exit_gate=True).hierarchy
    assert h.drafter.gate and h.drafter.gated
    assert methods.make_method(model, "lookup").hierarchy.drafter.lookup.gate
    assert not methods.make_method(model, "lookup",
                                   lookup_gate=False).hierarchy.drafter.lookup.gate
    assert not methods.make_method(model, "hispec", lookup=4,
                                   lookup_gate=False).hierarchy.drafter.lookup.gate


def test_gate_needs_a_static_exit_drafter():
    model = tiny_model(4, 0)
    for method, options in (("lookup", {}), ("layerskip", dict(lookup=4)),
                            ("specbound", {}), ("ar", {})):
        with pytest.raises(ValueError, match="exit_gate"):
            methods.make_method(model, method, exit_gate=True, **options)


# ---------------------------------------------------------------------- 3. sampling stays exact
@pytest.mark.parametrize("method,options", [
    ("layerskip", dict(draft_exit=2, draft_len=2, acceptance="tokenwise")),
    ("hispec", dict(draft_exit=1, verify_exits=(2,), draft_len=2, verify_window=2,
                    acceptance="blockwise")),
])
def test_gated_sampling_matches_exact_distribution(method, options):
    """Through the gated path, the first NEW tokens after PROMPT follow AR sampling's exact
    distribution. The runs go on past them, so a first rejection's next round (whose window
    the gate chose from that rejection) decides some of them; the gated runs check fewer
    drafts in all than the ungated ones."""
    from test_sampling_exact import small_model

    model = small_model()
    sampling = SamplingParams(temperature=1.0, seed=29)
    probs = exact_ar_distribution(model, sampling)
    run = dict(max_new_tokens=3 * NEW, ignore_eos=True, temperature=1.0, seed=29,
               lookup_cost=CPU, **options)
    gated = generate(model, [PROMPT] * N_SAMPLES, method=method, exit_gate=True, **run)
    free = generate(model, [PROMPT] * N_SAMPLES, method=method, **run)
    assert gated.stats["layer_token_evals"] < free.stats["layer_token_evals"], (
        gated.stats["layer_token_evals"], free.stats["layer_token_evals"])
    stat, threshold = chi_square_test([t[:NEW] for t in gated.token_ids], probs, N_SAMPLES)
    assert stat < threshold, (stat, threshold)
