"""SV (companion-chosen verification length) and SpecBound (dynamic-exit drafting) are
lossless configurations of the one engine: greedy output equals autoregressive greedy on
random models (most drafts rejected) and on always-agree models, with batches, EOS and tight
caches; bad settings fail before compiling. Sampling exactness: test_sampling_exact.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hispec_jax import generate
from hispec_jax.decoding import engine as engine_lib
from hispec_jax.decoding import methods
from hispec_jax.decoding import sv as sv_lib
from hispec_jax.decoding.draft import annealed_temperature
from hispec_jax.planner import calibrate
from hispec_jax.planner.latency import Costs
from test_engine import PROPERTY_SETTINGS, check_equals_autoregressive, random_prompts, tiny_model


def synthetic_table(draft_exit: int, companion_exit: int, num_layers: int, seed: int = 0,
                    slope: float = 3.0) -> sv_lib.SVTable:
    """A hand-made SV profile: random per-bin acceptance, and a top-level pass whose cost
    grows with its block length (so that the selector really shortens verifications)."""
    rng = np.random.RandomState(seed)
    acc = tuple(tuple(float(x) for x in row) for row in rng.uniform(0.05, 0.95, (3, 2)))
    costs = Costs(batch=1, num_layers=num_layers, block_sizes=(1, 8),
                  layer_s=(1e-3, 1e-3 * (1 + 7 * slope)), head_s=(1e-4, 1e-4)).to_json()
    return sv_lib.SVTable(draft_exit, companion_exit, s_edges=(0.3, 0.6), a_edges=(0.5,),
                          greedy_acceptance=acc, sampling_acceptance=acc,
                          counts=((1, 1),) * 3, costs=costs)


@st.composite
def cases(draw):
    L = draw(st.integers(3, 5))
    return dict(
        L=L, seed=draw(st.integers(0, 3)), layer_scale=draw(st.sampled_from([1.0, 0.1, 0.0])),
        batch=draw(st.sampled_from([1, 3])), max_prompt_len=draw(st.integers(1, 10)),
        max_new=draw(st.integers(1, 20)), ignore_eos=draw(st.booleans()),
        prompt_seed=draw(st.integers(0, 1000)), tight_cache=draw(st.booleans()),
        # SV
        draft_exit=draw(st.integers(1, L - 2)), draft_len=draw(st.integers(1, 4)),
        slope=draw(st.sampled_from([0.0, 3.0, 30.0])), table_seed=draw(st.integers(0, 5)),
        # SpecBound
        tau=draw(st.sampled_from([0.02, 0.05, 0.1, 0.3, 1.0])),
        anneal=draw(st.sampled_from([0.0, 1.0])), depth_bound=draw(st.integers(1, L - 1)),
        width=draw(st.integers(1, 4)),
    )


def _check_equal(case, method, options):
    model = tiny_model(case["L"], case["seed"], case["layer_scale"])
    prompts = random_prompts(np.random.RandomState(case["prompt_seed"]), case["batch"],
                             case["max_prompt_len"])
    return check_equals_autoregressive(model, prompts, case, method, options)


CASE = dict(L=4, seed=0, layer_scale=1.0, batch=1, max_prompt_len=1, max_new=1,
            ignore_eos=False, prompt_seed=0, tight_cache=False, draft_exit=1, draft_len=1,
            slope=0.0, table_seed=0, tau=0.1, anneal=0.0, depth_bound=1, width=1)


@settings(max_examples=6, **PROPERTY_SETTINGS)
@given(case=cases())
# always-agree model, verification as long as possible, cache exactly full
@example(case={**CASE, "layer_scale": 0.0, "draft_len": 4, "max_new": 20, "ignore_eos": True,
               "tight_cache": True, "batch": 3, "max_prompt_len": 10})
# a steep verify cost (the selector's shortening case) on a random model, batch of 3
@example(case={**CASE, "L": 5, "draft_exit": 2, "draft_len": 4, "slope": 30.0,
               "max_new": 16, "batch": 3, "max_prompt_len": 6, "prompt_seed": 5})
def test_sv_greedy_equals_autoregressive(case):
    d = case["draft_exit"]
    table = synthetic_table(d, d + 1, case["L"], case["table_seed"], case["slope"])
    _check_equal(case, "sv", dict(draft_exit=d, verify_exits=(d + 1,),
                                  draft_len=case["draft_len"], sv_profile=table))


@settings(max_examples=6, **PROPERTY_SETTINGS)
@given(case=cases())
# tau = 1: every draft hard, rounds of one token from the depth bound, tight cache
@example(case={**CASE, "tau": 1.0, "depth_bound": 3, "width": 4, "max_new": 12,
               "tight_cache": True, "batch": 3, "max_prompt_len": 8})
# always-agree model, mixed exit depths, annealing, the widest drafts
@example(case={**CASE, "L": 5, "layer_scale": 0.0, "tau": 0.05, "anneal": 1.0,
               "depth_bound": 4, "width": 4, "max_new": 20, "ignore_eos": True})
def test_specbound_greedy_equals_autoregressive(case):
    _check_equal(case, "specbound", dict(tau=case["tau"], anneal=case["anneal"],
                                         depth_bound=case["depth_bound"], width=case["width"]))


def test_specbound_mixed_depths_run_every_layer_once():
    """Always-agree model, a threshold that lets tokens exit at several depths: every layer
    still processes every generated position exactly once (lazy fill + alignment never
    repeat work), and the exit-depth histogram shows the mix."""
    model = tiny_model(6, 0, layer_scale=0.0)
    prompts = [[5, 9, 11], [7], [1, 2, 3, 4, 5, 6, 7, 8]]
    N = 20
    ref = generate(model, prompts, method="ar", max_new_tokens=N, ignore_eos=True)
    got = generate(model, prompts, method="specbound", tau=0.1, anneal=0.5, depth_bound=4,
                   width=3, max_new_tokens=N, ignore_eos=True)
    assert got.token_ids == ref.token_ids
    s = got.stats
    assert s["layer_token_evals"] == 6 * (N - 1) * len(prompts)
    assert len(s["draft_exit_histogram"]) >= 3, s["draft_exit_histogram"]
    assert s["acceptance_rate_per_level"][1] == 1.0
    assert s["layer_passes_per_token"] < 6  # cheaper than AR on an always-agree model


def test_specbound_hard_token_ends_the_round():
    """tau = 1 is never cleared: every draft is hard, so each round proposes one token from
    the depth bound and the final layer verifies it at once."""
    model = tiny_model(4, 1)
    got = generate(model, [[3, 4, 5]], method="specbound", tau=1.0, depth_bound=2, width=4,
                   max_new_tokens=10, ignore_eos=True)
    s = got.stats
    assert s["draft_exit_histogram"] == {2: s["actions_per_level"][0]}
    assert s["verified_length_histogram"][1] == s["actions_per_level"][1]


def test_annealed_temperature_schedule():
    assert annealed_temperature(8, 8, 2.0) == 1.0
    assert annealed_temperature(0, 8, 2.0) == 3.0
    assert annealed_temperature(4, 8, 0.0) == 1.0


def test_sv_shortens_verification_when_it_pays():
    """An always-agree model with a table that predicts rejection: with a steep verify cost
    the selector verifies one token per round; with a flat one it verifies every draft."""
    model = tiny_model(5, 0, layer_scale=0.0)
    prompts = [[4, 5, 6]]
    ref = generate(model, prompts, method="ar", max_new_tokens=16, ignore_eos=True)
    low = sv_lib.SVTable(1, 2, (), (), ((0.1,),), ((0.1,),), ((1,),),
                         Costs(1, 5, (1, 8), (1e-3, 1e-1), (1e-4, 1e-4)).to_json())
    flat = sv_lib.SVTable(1, 2, (), (), ((0.9,),), ((0.9,),), ((1,),),
                          Costs(1, 5, (1, 8), (1e-3, 1e-3), (1e-4, 1e-4)).to_json())
    short = generate(model, prompts, method="sv", draft_exit=1, verify_exits=2, draft_len=3,
                     sv_profile=low, max_new_tokens=16, ignore_eos=True)
    full = generate(model, prompts, method="sv", draft_exit=1, verify_exits=2, draft_len=3,
                    sv_profile=flat, max_new_tokens=16, ignore_eos=True)
    assert short.token_ids == full.token_ids == ref.token_ids
    h_short, h_full = short.stats["verified_length_histogram"], full.stats["verified_length_histogram"]
    assert h_short[1] > 0 and sum(h_short[2:]) == 0, h_short
    assert h_full[4] > 0, h_full
    assert full.stats["tokens_per_round"] > short.stats["tokens_per_round"]


def test_sv_selector_follows_goodput():
    """The selector grows gamma while E[accepted] / cost grows (worked example)."""
    import jax.numpy as jnp

    sel = sv_lib.SVSelector(s_edges=(), a_edges=(), acceptance=((0.5,),), round_seconds=1.0,
                            verify_seconds=(1.0, 1.0, 3.0, 3.0))
    # gamma=1: 0.5/2; gamma=2: 0.75/2 (grows); gamma=3: 0.875/4 (shrinks) -> gamma = 2
    V, T = 5, 4
    logp = jnp.log(jnp.full((1, T, V), 1.0 / V))
    verdict = sel.select(logp, logp, jnp.zeros((1, T), jnp.int32), jnp.asarray([4]), True)
    assert int(verdict.num_accepted_B[0]) == 1  # gamma - 1 accepted + x_gamma passed up
    verdict = sel.select(logp, logp, jnp.zeros((1, T), jnp.int32), jnp.asarray([1]), True)
    assert int(verdict.num_accepted_B[0]) == 1  # one draft: always verified (all "accepted")


def test_sv_profile_round_trip_and_lookup(tmp_path):
    model = tiny_model(5, 0)
    table = sv_profile_quick(model)
    assert table.meta["positions"] > 0
    assert len(table.greedy_acceptance) == len(table.s_edges) + 1
    path = table.save(tmp_path)
    assert path.name == sv_lib.PROFILE_FILE
    again = sv_lib.SVTable.load(tmp_path)
    assert again == table
    assert sv_lib.find_table(str(tmp_path)) == table  # "saved with the model"
    got = generate(model, [[1, 2, 3]], method="sv", draft_exit=1, verify_exits=2,
                   sv_profile=str(path), max_new_tokens=8, ignore_eos=True)
    ref = generate(model, [[1, 2, 3]], method="ar", max_new_tokens=8, ignore_eos=True)
    assert got.token_ids == ref.token_ids


def sv_profile_quick(model):
    from hispec_jax.planner import sv_profile

    s = calibrate.Settings(num_prompts=2, max_prompt_tokens=8, new_tokens=16, block_sizes=(1, 4),
                           repeats=1, capacity=64)
    return sv_profile.profile_sv(model, 1, 2, settings=s, s_bins=4, a_bins=3)


@pytest.mark.parametrize("method,options,error,match", [
    ("specbound", dict(tau=0.0), ValueError, "tau"),
    ("specbound", dict(tau=1.5), ValueError, "tau"),
    ("specbound", dict(anneal=-1.0), ValueError, "anneal"),
    ("specbound", dict(depth_bound=5), ValueError, "depth_bound"),
    ("specbound", dict(width=0), ValueError, "width"),
    ("specbound", dict(draft_exit=1), ValueError, "specbound"),
    ("layerskip", dict(tau=0.5), ValueError, "tau"),
    ("hispec", dict(sv_profile="x"), ValueError, "sv_profile"),
    ("sv", dict(draft_exit=1, verify_exits=2, sv_profile="/nonexistent"), FileNotFoundError,
     "profile-sv"),
    ("sv", dict(verify_window=3), ValueError, "verify_window"),
    ("sv", dict(verify_exits=(2, 3)), ValueError, "one companion"),
    ("sv", dict(draft_exit=1, verify_exits=3, sv_profile=synthetic_table(1, 2, 5)), ValueError,
     "made for exits"),
])
def test_bad_settings_fail_before_compiling(method, options, error, match):
    model = tiny_model(5, 0)
    before = engine_lib.compilations
    with pytest.raises(error, match=match):
        generate(model, [[1, 2]], method=method, max_new_tokens=4, **options)
    with pytest.raises(error, match=match):
        generate(model, [[1, 2]], method=method, max_new_tokens=4, temperature=1.0,
                 **options)
    assert engine_lib.compilations == before


def test_sv_rejects_blockwise_sampling():
    model = tiny_model(5, 0)
    with pytest.raises(ValueError, match="tokenwise"):
        generate(model, [[1, 2]], method="sv", acceptance="blockwise", temperature=1.0,
                 sv_profile=synthetic_table(1, 2, 5), max_new_tokens=4)


def test_specbound_sweep_rows():
    from hispec_jax.bench.compare import best_row, specbound_sweep

    model = tiny_model(4, 0, layer_scale=0.0)
    rows = specbound_sweep(model, [[1, 2, 3]], 8, {"tau": [0.05, 0.9], "anneal": [0.0],
                                                   "depth_bound": [2], "width": [2]}, rounds=1)
    assert [r["name"] for r in rows] == ["ar", "specbound anneal=0.0 depth_bound=2 tau=0.05 width=2",
                                         "specbound anneal=0.0 depth_bound=2 tau=0.9 width=2"]
    assert all(r["identical_to_ar"] for r in rows)
    # always-agree model: every draft is accepted, so a token costs fewer than L passes
    low = rows[1]
    assert low["layer_passes_per_token"] < 4 and set(low["draft_exit_histogram"]) <= {1, 2}
    assert best_row(rows)["name"] in {rows[1]["name"], rows[2]["name"]}
    rows[2]["identical_to_ar"] = False
    with pytest.raises(AssertionError, match="tau=0.9"):
        best_row(rows)


def test_shipped_model_has_an_sv_profile_for_its_default_exits():
    """`method="sv"` works out of the box with the shipped model: its directory holds a
    profile for the default (draft, companion) exits, with enough positions per bin."""
    from hispec_jax import DEFAULT_MODEL_DIR
    from hispec_jax.models.model import load_model

    model = load_model(DEFAULT_MODEL_DIR)
    table = sv_lib.find_table(model.path)
    assert (table.draft_exit, table.companion_exit) == methods.default_exits(model)
    counts = np.array(table.counts)
    assert counts.sum() >= 1000
    for name in ("greedy_acceptance", "sampling_acceptance"):
        a = np.array(getattr(table, name))
        assert a.shape == counts.shape and ((0 <= a) & (a <= 1)).all()
    # a profile measured on another kind of device still decodes, with a warning
    import dataclasses

    elsewhere = dataclasses.replace(table, meta={**table.meta, "device": "gpu-other"})
    with pytest.warns(UserWarning, match="measured on gpu-other"):
        methods.make_method(model, "sv", sv_profile=elsewhere)


def test_depths_and_lengths_are_data_one_compile_per_shape():
    """SpecBound's per-position exit depths and SV's verified lengths are data: other
    prompts (other depths, lengths, hard tokens) and another model with the same shapes
    reuse the compiled loop."""
    table = synthetic_table(1, 2, 5, seed=0)
    for method, options in (("specbound", dict(tau=0.3, depth_bound=3, width=3)),
                            ("sv", dict(draft_exit=1, verify_exits=2, sv_profile=table))):
        first = generate(tiny_model(5, 0), [[1, 2, 3], [4, 5]], method=method,
                         max_new_tokens=12, max_cache_len=64, **options)
        again = generate(tiny_model(5, 1, layer_scale=0.1), [[7, 8, 9, 10, 11], [6]],
                         method=method, max_new_tokens=12, max_cache_len=64, **options)
        assert first.stats["compile_count"] <= 2 and again.stats["compile_count"] == 0, method
