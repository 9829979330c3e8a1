"""`hispec_jax.planner`: the predictor against closed forms and the replay, the loop-cost
fit, the search on synthetic tables, plan files, method="auto" (== AR greedy) and
`hispec tune`."""

import dataclasses
import json

import numpy as np
import pytest

from hispec_jax.decoding.options import DEFAULT_LOOKUP
from hispec_jax.planner import latency, plan as plan_lib, search as search_lib
from hispec_jax.planner.latency import Costs

COSTS = Costs(batch=1, num_layers=24, block_sizes=(1, 4, 16, 32),
              layer_s=(1e-4, 1.3e-4, 2.5e-4, 4e-4), head_s=(5e-5, 6e-5, 1e-4, 1.6e-4),
              pass_s=3e-5, round_s=5e-5)
EXITS = tuple(range(1, 25))


def test_cheaper_exit_heads_cost_their_share_of_the_shared_head():
    """Costs.head_scale charges exit e's head its own cost (a draft vocabulary or low rank),
    survives JSON, and comes from the heads' sizes (`calibrate.head_cost_scales`)."""
    c = dataclasses.replace(COSTS, head_scale=((3, 0.25),))
    assert c.stage(0, 3, 1) == pytest.approx(3 * c.layer(1) + 0.25 * c.head(1) + c.pass_s)
    assert c.stage(3, 24, 4) == pytest.approx(COSTS.stage(3, 24, 4))  # exit 24: shared head
    assert Costs.from_json(json.loads(json.dumps(c.to_json()))) == c
    assert Costs.from_json({k: v for k, v in COSTS.to_json().items() if k != "head_scale"}) == COSTS
    assert (latency.predict((3, 24), (2,), [0.5], c).seconds_per_token
            < latency.predict((3, 24), (2,), [0.5], COSTS).seconds_per_token)

    from hispec_jax.planner import calibrate
    from hispec_jax.train_heads import draft_vocab
    from test_engine import VOCAB, tiny_model
    from test_draft_vocab import _trained_heads, _with_heads

    model = tiny_model(4, 0)  # D = 32, V = 64
    model = _with_heads(model, _trained_heads(model, {1: None, 2: 4}))
    model = _with_heads(model, draft_vocab.restrict_heads(model, (2, 3), np.arange(0, VOCAB, 4)))
    scales = dict(calibrate.head_cost_scales(model))
    assert list(scales) == [1, 2, 3]
    assert [scales[e] for e in (1, 2, 3)] == pytest.approx(
        [1.0, (32 * 4 + 4 * 16) / (32 * 64), 16 / 64])


def test_expected_emitted_closed_form():
    for alpha in (0.0, 0.3, 0.9):
        for n in (1, 3, 7):
            dist = latency.emitted_distribution(alpha, n)
            assert dist.sum() == pytest.approx(1.0)
            assert np.dot(np.arange(n + 1), dist) == pytest.approx(
                (1 - alpha ** n) / (1 - alpha))
    assert latency.expected_emitted(1.0, 5) == 5


def test_ar_and_layerskip_match_closed_forms():
    c = COSTS
    ar = latency.predict((24,), (), [], c)
    assert ar.seconds_per_token == pytest.approx(24 * c.layer(1) + c.head(1) + c.pass_s + c.round_s)
    d, nd, a = 3, 2, 0.7
    ls = latency.predict((d, 24), (nd,), [a], c)
    tokens = (1 - a ** (nd + 1)) / (1 - a)
    round_s = (c.round_s + (nd + 1) * c.stage(0, d, 1) + c.stage(d, 24, nd + 1))
    assert ls.tokens_per_round == pytest.approx(tokens)
    assert ls.seconds_per_token == pytest.approx(round_s / tokens)


def _iid_trace(alphas: dict[int, float], prompts: int = 2, new_tokens: int = 400,
               seed: int = 0) -> latency.Trace:
    """A trace whose exit e agrees with the continuation at each position with probability
    `alphas[e]`, independently (else it picks a token the continuation never holds)."""
    rng = np.random.default_rng(seed)
    sequences = [tuple(range(10, 12)) + tuple(int(t) for t in rng.integers(100, 10_000, new_tokens))
                 for _ in range(prompts)]
    return latency.Trace(max_ngram=1, sequences=tuple(sequences), starts=(2,) * prompts,
                         predictions=tuple(
                             (e, tuple(tuple(int(t) if rng.random() < a else -1
                                             for t in s[3:] + (0,)) for s in sequences))
                             for e, a in sorted(alphas.items())))


@pytest.mark.parametrize("exits,windows,agree", [
    ((3, 24), (2,), {3: 0.6}), ((2, 24), (5,), {2: 0.9}),
    ((1, 4, 24), (2, 3), {1: 1.0, 4: 1.0}), ((1, 4, 24), (1, 4), {1: 0.0, 4: 1.0})])
def test_the_formulas_are_the_replay_where_they_hold(exits, windows, agree):
    """K <= 3 at batch 1: the renewal formulas and the engine's round replayed on a trace of
    i.i.d. agreement give the same tokens per round and seconds per token (up to the
    replay's sampling and the continuations' ends)."""
    trace = _iid_trace(agree)
    alphas = [agree[exits[0]]] + [agree[e] for e in exits[1:-1]]  # exit i: against L
    exact = latency.predict(exits, windows, alphas, COSTS)
    replayed = latency.price(latency.replay(trace, exits, windows), COSTS)
    assert replayed.tokens_per_round == pytest.approx(exact.tokens_per_round, rel=0.06)
    assert replayed.seconds_per_token == pytest.approx(exact.seconds_per_token, rel=0.06)


def test_hsd_f_is_the_expected_number_of_deliveries():
    # deliveries of exactly 1 token: reaching 5 takes 5; of exactly 2: reaching 5 takes 3
    one = np.array([0.0, 1.0])
    assert latency.collect(one, 5)[0] == pytest.approx(5)
    two = np.array([0.0, 0.0, 1.0])
    f, held = latency.collect(two, 5)
    assert f == pytest.approx(3) and held[6] == pytest.approx(1.0)


def test_the_predictor_replays_batches_and_deep_hierarchies():
    """`Predictor` uses the formulas at batch 1 for K <= 3, the replay for K = 4 and for
    batches (with a trace); a batch of always-accepting sequences stays in phase: B times
    batch 1's tokens per second."""
    trace = _iid_trace({2: 1.0, 3: 1.0, 6: 1.0, 12: 1.0}, prompts=4, new_tokens=200)
    one = latency.Predictor(lambda a, b: 1.0, COSTS, trace)
    assert not one.replays((3, 6, 24)) and one.replays((2, 6, 12, 24)) and one.replays((24,), 8)
    assert one((3, 6, 24), (2, 4))[0] == latency.predict((3, 6, 24), (2, 4), [1.0, 1.0], COSTS)
    deep = one((2, 6, 12, 24), (2, 4, 4))[0]
    assert deep == latency.price(latency.replay(trace, (2, 6, 12, 24), (2, 4, 4)), COSTS)
    eight = latency.Predictor(lambda a, b: 1.0, dataclasses.replace(COSTS, batch=8), trace)
    assert eight.replays((3, 6, 24)) and not eight.replays((24,))
    b1, b8 = one((3, 6, 24), (2, 4))[0], eight((3, 6, 24), (2, 4))[0]
    assert b8.tokens_per_round == pytest.approx(b1.tokens_per_round, rel=0.03)
    assert b8.tokens_per_second == pytest.approx(8 * b1.tokens_per_second, rel=0.03)
    with pytest.raises(ValueError, match="trace"):
        latency.Predictor(lambda a, b: 1.0, COSTS)((24,), (), 8)


def test_search_always_agree_speculates_deep_from_the_cheapest_exit():
    plans = search_lib.search(EXITS, lambda a, b: 1.0, COSTS, verify_windows=range(2, 9))
    best = plans[0]
    assert best.exits[0] == 1 and len(best.exits) >= 2
    assert best.predicted_speedup > 3 and best.tokens_per_round >= 4
    assert best.predicted_tokens_per_second == max(p.predicted_tokens_per_second for p in plans)
    assert search_lib.best_of_kind(plans, "ar") is not None  # kept for the side-by-side


def test_search_never_agree_picks_ar():
    plans = search_lib.search(EXITS, lambda a, b: 0.0, COSTS, verify_windows=range(2, 5))
    assert plans[0].exits == (24,) and plans[0].method == "ar"
    assert plans[0].predicted_speedup == pytest.approx(1.0)


def test_search_prefers_hispec_when_an_intermediate_exit_filters_well():
    # cheap draft exit 1 agrees 0.9 with exit 6, exit 6 agrees 0.95 with the top, but the
    # draft agrees only 0.3 with the top: a middle verifier pays off
    table = {(1, 6): 0.9, (6, 24): 0.95, (1, 24): 0.3}
    alpha = lambda a, b: table.get((a, b), 0.05)
    plans = search_lib.search(EXITS, alpha, COSTS, verify_windows=range(2, 9))
    assert plans[0].exits == (1, 6, 24)
    assert search_lib.best_of_kind(plans, "layerskip") is not None
    assert search_lib.best_of_kind(plans, "ar") is not None


def test_plan_json_round_trip_and_options():
    p = plan_lib.Plan(exits=(2, 5, 24), windows=(3, 6), predicted_tokens_per_second=12.5,
                      predicted_speedup=1.3, tokens_per_round=2.2)
    assert plan_lib.Plan.from_json(json.loads(json.dumps(p.to_json()))) == p
    assert p.method == "hispec" and p.method_options() == {
        "draft_exit": 2, "draft_len": 3, "verify_exits": (5,), "verify_window": 6}
    assert plan_lib.Plan(exits=(24,)).method_options() == {}
    assert plan_lib.Plan(exits=(4, 24), windows=(2,)).name() == "layerskip d=4 nd=2"


# ---------------------------------------------------------------- with a tiny model (JAX)
def _tiny():
    import jax

    from hispec_jax import Model, ModelConfig
    from hispec_jax.models.params import init_params, with_layer_layout

    cfg = ModelConfig(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=48,
                      num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8,
                      max_position_embeddings=256)
    params = init_params(cfg, jax.random.PRNGKey(1), init_std=0.3)
    return Model(cfg=cfg, params=with_layer_layout(params, "unrolled"))


def test_plan_files_are_keyed_by_model_device_and_batch(tmp_path, monkeypatch):
    monkeypatch.setattr("hispec_jax.planner.plan.cache_dir", lambda: tmp_path / "plans")
    model = _tiny()
    p = plan_lib.Plan(exits=(1, 4), windows=(2,))
    plan_lib.save_plan_file(plan_lib.plan_path(model, 2), plan_lib.plan_payload(model, 2, [p]))
    assert plan_lib.load_plan(model, 2) == p
    assert plan_lib.load_plan(model, 1) is None  # another batch size
    other = dataclasses.replace(model, params={**model.params, "embed": model.params["embed"] + 1})
    assert plan_lib.load_plan(other, 2) is None  # another model


def test_generate_auto_uses_the_saved_plan_and_equals_ar(tmp_path, monkeypatch):
    from hispec_jax import generate

    monkeypatch.setattr("hispec_jax.planner.plan.cache_dir", lambda: tmp_path / "plans")
    model = _tiny()
    p = plan_lib.Plan(exits=(1, 4), windows=(2,))
    plan_lib.save_plan_file(plan_lib.plan_path(model, 2), plan_lib.plan_payload(model, 2, [p]))
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    auto = generate(model, prompts, method="auto", max_new_tokens=12, ignore_eos=True)
    ar = generate(model, prompts, method="ar", max_new_tokens=12, ignore_eos=True)
    assert auto.stats["plan"] == "layerskip d=1 nd=2"
    assert auto.stats["exits"] == [1, 4]
    assert auto.token_ids == ar.token_ids
    with pytest.raises(ValueError, match="does not take draft_exit"):
        generate(model, prompts, method="auto", draft_exit=2)


def test_tune_cli_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    """The whole pipeline once, at the smallest settings: calibrate (AR and LayerSkip
    loops, acceptance, stage costs), search, save; then method='auto' finds the plan."""
    from hispec_jax import cli, generate, save_model
    from hispec_jax.models.model import load_model
    from hispec_jax.planner import calibrate, tune

    monkeypatch.setattr("hispec_jax.planner.plan.cache_dir", lambda: tmp_path / "cache" / "plans")
    monkeypatch.setattr(calibrate.Settings, "quick", classmethod(lambda cls: cls(
        num_prompts=2, max_prompt_tokens=8, new_tokens=12, block_sizes=(1, 4), repeats=1,
        capacity=64)))
    save_model(_tiny(), tmp_path / "tiny")
    assert cli.main(["tune", "--model", str(tmp_path / "tiny"), "--quick", "--top", "3",
                     "--recommend"]) == 0
    out = capsys.readouterr().out
    assert "pred tok/s" in out and "work x AR" in out and "saved the plan" in out
    assert "recommended plan" in out  # --recommend: the best LayerSkip / HiSpec plans
    rec = json.loads((tmp_path / "tiny" / "recommended_plan.json").read_text())
    assert set(rec["methods"]) == {"layerskip", "hispec"}
    assert rec["source"].startswith("hispec tune --quick on ")
    model = load_model(tmp_path / "tiny")
    saved = plan_lib.load_plan(model, 1)
    assert saved is not None
    payload = json.loads(plan_lib.plan_path(model, 1).read_text())
    alpha = np.asarray(payload["calibration"]["alpha"])
    assert alpha.shape == (4, 4) and np.allclose(np.diag(alpha), 1) and np.allclose(alpha, alpha.T)
    assert ((alpha >= 0) & (alpha <= 1)).all()
    lookup = latency.LookupProfile.from_json(payload["calibration"]["lookup"])  # measured
    assert lookup.k == DEFAULT_LOOKUP and sum(lookup.verified) >= lookup.rounds > 0 and lookup.tokens > 0
    assert any(p["method"] == "lookup" for p in payload["plans"])  # a candidate, ranked
    assert lookup.trace is not None and {e for e, _ in lookup.trace.predictions} == {1, 2, 3}
    kinds = {p["kind"] for p in payload["plans"]}  # and under exits, printed
    assert {"layerskip+lookup", "hispec+lookup"} <= kinds and "+ lookup k=" in out
    under = {p["lookup"] for p in payload["plans"] if p["kind"].endswith("+lookup")}
    assert under <= {DEFAULT_LOOKUP, DEFAULT_LOOKUP // 2}  # under exits: k and half of it
    assert tune.auto_decoder(model, 1)[1] == saved
    result = generate(model, [[5, 6, 7]], method="auto", max_new_tokens=6, ignore_eos=True)
    assert result.stats["plan"] == saved.name()


def test_rank_by_measurement_puts_the_fastest_measured_plan_first():
    from hispec_jax.planner.tune import rank_by_measurement

    ar, ls, hs = (plan_lib.Plan(exits=(24,)), plan_lib.Plan(exits=(8, 24), windows=(2,)),
                  plan_lib.Plan(exits=(3, 12, 24), windows=(2, 4)))
    rows = [{"plan": ar.name(), "measured_tokens_per_second": 100.0},
            {"plan": ls.name(), "measured_tokens_per_second": 120.0},
            {"plan": hs.name(), "measured_tokens_per_second": 100.0}]
    assert rank_by_measurement([ar, ls, hs], rows) == [ls, ar, hs]  # ties keep predicted order


def test_tune_verify_measures_every_plan_and_saves_the_fastest(tmp_path, monkeypatch):
    """--verify on a tiny model, calibration replaced by a fixed report: every plan is
    timed (interleaved), the plan file is rewritten fastest-measured first, and
    method="auto" then runs that plan."""
    from hispec_jax import generate
    from hispec_jax.planner import tune as tune_lib

    monkeypatch.setattr("hispec_jax.planner.plan.cache_dir", lambda: tmp_path / "plans")
    model = _tiny()
    plans = [plan_lib.Plan(exits=(4,), predicted_tokens_per_second=50.0),
             plan_lib.Plan(exits=(1, 4), windows=(2,), predicted_tokens_per_second=49.0,
                           tokens_per_round=1.5)]
    cal = type("Cal", (), {"costs": dataclasses.replace(COSTS, num_layers=4), "tokens": 0,
                           "seconds": 0.0})()
    path = plan_lib.save_plan_file(plan_lib.plan_path(model, 1),
                                   plan_lib.plan_payload(model, 1, plans))
    monkeypatch.setattr(tune_lib, "tune", lambda *a, **k: {"plans": list(plans),
                                                          "calibration": cal, "path": path})
    report = tune_lib.tune_and_verify(model, 1, verify=True, verify_prompts=2, verify_tokens=6,
                                      verify_repeats=2)
    rows = {r["plan"]: r for r in report["verify"]}
    assert set(rows) == {p.name() for p in plans}
    assert all(r["measured_tokens_per_second"] > 0 for r in rows.values())
    fastest = max(rows, key=lambda n: rows[n]["measured_tokens_per_second"])
    assert report["plans"][0].name() == fastest
    payload = json.loads(path.read_text())
    assert payload["chosen_by"].startswith("measurement") and len(payload["verify"]) == 2
    assert plan_lib.load_plan(model, 1).name() == fastest
    assert generate(model, [[5, 6, 7]], method="auto", max_new_tokens=4,
                    ignore_eos=True).stats["plan"] == fastest
    assert any(fastest in line for line in tune_lib.summary_lines(report))


def _loops(costs, *, p=0.0, s=1.0, draft=6, nd=2, rounds=30):
    """AR seconds per token and LayerSkip(draft, nd) seconds of `rounds` all-accepted rounds
    under a known truth: every stage s x its cost alone, plus p per pass."""
    L, blk = costs.num_layers, latency.blocks((nd,))[0]
    ar = s * (L * costs.layer(1) + costs.head(1)) + p
    drafts, verifies = rounds * (nd + 1), rounds
    ls = (drafts * s * (draft * costs.layer(1) + costs.head(1))
          + verifies * s * ((L - draft) * costs.layer(blk) + costs.head(blk))
          + (drafts + verifies) * p)
    return ar, ls, dict(draft=draft, nd=nd, drafts=drafts, verifies=verifies)


@pytest.mark.parametrize("truth", [dict(s=1.0, p=3e-5), dict(s=1.7, p=0.0),
                                   dict(s=0.8, p=3e-5), dict(s=1.3, p=1e-4)])
def test_loop_fit_recovers_the_stage_scale_and_the_cost_per_pass(truth):
    from hispec_jax.planner.calibrate import fit_loop_costs

    stages = dataclasses.replace(COSTS, pass_s=0.0, round_s=0.0)
    ar, ls, counts = _loops(stages, **truth)
    costs, info = fit_loop_costs(stages, ar, ls, **counts)
    assert info["matches_layerskip"]
    assert info["stage_scale"] == pytest.approx(truth["s"])
    assert costs.pass_s == pytest.approx(truth["p"], abs=1e-9) and costs.round_s == 0.0
    assert costs.layer(4) / costs.layer(1) == pytest.approx(stages.layer(4) / stages.layer(1))
    # the fitted costs reproduce both loops through the formulas
    assert latency.predict((24,), (), [], costs).seconds_per_token == pytest.approx(ar)
    ls_pred = latency.predict((counts["draft"], 24), (counts["nd"],), [1.0], costs)
    assert ls_pred.seconds_per_token * (counts["nd"] + 1) * 30 == pytest.approx(ls)


def test_loop_fit_without_a_solution_scales_the_stages_to_match_ar():
    """A LayerSkip loop that only a negative cost per pass explains (timing noise): no cost
    per pass, one scale that matches AR's loop."""
    from hispec_jax.planner.calibrate import fit_loop_costs

    stages = dataclasses.replace(COSTS, pass_s=0.0, round_s=0.0)
    ar, ls, counts = _loops(stages, s=2.0)
    costs, info = fit_loop_costs(stages, ar, 3.0 * ls, **counts)  # LayerSkip inexplicably slow
    assert not info["matches_layerskip"] and costs.pass_s == 0.0
    assert info["stage_scale"] == pytest.approx(2.0)
    assert latency.predict((24,), (), [], costs).seconds_per_token == pytest.approx(ar)


@pytest.mark.parametrize("method,exits,windows", [
    ("ar", (6,), ()), ("layerskip", (2, 6), (3,)), ("hispec", (1, 3, 6), (2, 4))])
def test_predicted_work_per_token_is_what_the_engine_counts(method, exits, windows):
    """On the always-agree model (every draft accepted: alpha = 1) the work model
    (`latency.work_costs`, layer passes + heads in layer equivalents) predicts exactly the
    engine's measured `work_per_token` for whole rounds."""
    from hispec_jax import generate
    from test_engine import tiny_model

    model = tiny_model(6, 0, layer_scale=0.0)
    work = latency.work_costs(model)
    pred = latency.predict(exits, windows, [1.0] * (len(exits) - 1), work)
    plan = plan_lib.Plan(exits=exits, windows=windows)
    tokens_per_cycle = {"ar": 1, "layerskip": 4, "hispec": 6}[method]  # Ni + 1 at the top
    got = generate(model, [[4, 5]], method=plan.decoder(model),
                   max_new_tokens=1 + 4 * tokens_per_cycle, ignore_eos=True)
    assert got.stats["work_per_token"] == pytest.approx(pred.seconds_per_token)
    planned = search_lib.scored_plan(latency.Predictor(lambda a, b: 1.0, work, work=work),
                                     exits, windows)
    assert planned.predicted_work_per_token == pytest.approx(pred.seconds_per_token)
    assert planned.predicted_work_speedup == pytest.approx(
        got.stats["ar_work_per_token"] / got.stats["work_per_token"])


# ----- the prompt-lookup drafter as a planner candidate -------------------------------------
# A CPU-like cost curve: a block of 2+ positions costs far more than 1, then grows slowly.
STEP_COSTS = Costs(batch=1, num_layers=24, block_sizes=(1, 2, 4, 8),
                   layer_s=(1e-3, 1.7e-3, 1.8e-3, 2.0e-3), head_s=(4e-3, 8e-3, 9e-3, 1e-2),
                   pass_s=1e-4, round_s=1e-4)


def test_price_charges_each_pass_its_block_and_each_round_its_cost():
    c = STEP_COSTS
    run = latency.Run(level_exits=(0, 4, 24), batch=1, rounds=3,
                      passes=(((0, 1), 3), ((1, 1), 1), ((1, 4), 2), ((2, 8), 1)),
                      proposed=(0, 9, 5), accepted=(0, 6, 5), emitted=9.0,
                      verified=(0,) * 8 + (1,))
    seconds = (3 * c.round_s + c.stage(0, 4, 1) + 2 * c.stage(0, 4, 4)
               + c.stage(4, 24, 8))  # the lookup's own passes run no layers
    pred = latency.price(run, c)
    assert pred.seconds_per_token == pytest.approx(seconds / 9)
    assert pred.tokens_per_round == pytest.approx(3.0)
    assert run.actions_per_level() == [3, 3, 1]
    exits = dataclasses.replace(run, level_exits=(4, 24), passes=(((0, 1), 6), ((1, 8), 2)))
    assert latency.price(exits, c).seconds_per_token == pytest.approx(
        (3 * c.round_s + 6 * c.stage(0, 4, 1) + 2 * c.stage(4, 24, 8)) / 9)


def test_lookup_plan_round_trips_and_auto_runs_it_equal_to_ar(tmp_path, monkeypatch):
    from hispec_jax import generate

    p = plan_lib.Plan(exits=(4,), lookup=3, predicted_speedup=1.4)
    assert (p.method, p.method_options(), p.name()) == ("lookup", {"lookup": 3}, "lookup k=3")
    assert plan_lib.Plan.from_json(json.loads(json.dumps(p.to_json()))) == p
    with pytest.raises(ValueError, match="fixed windows"):
        plan_lib.Plan(exits=(1, 4), windows=(2,), lookup=3, adaptive=True)
    monkeypatch.setattr("hispec_jax.planner.plan.cache_dir", lambda: tmp_path / "plans")
    model = _tiny()
    plan_lib.save_plan_file(plan_lib.plan_path(model, 1), plan_lib.plan_payload(model, 1, [p]))
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]]  # copyable context: the lookup drafts
    auto = generate(model, prompts, method="auto", max_new_tokens=12, ignore_eos=True)
    ar = generate(model, prompts, method="ar", max_new_tokens=12, ignore_eos=True)
    assert auto.stats["plan"] == "lookup k=3" and auto.stats["lookup"]["k"] == 3
    assert auto.stats["lookup"]["matches"] > 0
    assert auto.token_ids == ar.token_ids


def test_calibration_times_its_loops_over_every_prompt_at_their_mean_context(monkeypatch):
    """The AR and LayerSkip loops are timed over all calibration prompts (not the first
    alone), their times taken per batch, and the stage costs measured at the prompts' mean
    context plus half the continuation: a step's cost grows with its context, and loops
    and stages timed at different contexts cannot be reconciled (`fit_loop_costs`)."""
    from hispec_jax.planner import calibrate

    seen, contexts = [], []
    real_generate_seconds = calibrate.generate_seconds
    real_stage_costs = calibrate.measure_stage_costs

    def generate_seconds(model, prompts, repeats, **kwargs):
        seen.append((kwargs["method"], kwargs["max_new_tokens"], [list(p) for p in prompts]))
        return real_generate_seconds(model, prompts, repeats, **kwargs)

    def stage_costs(*args, context, **kwargs):
        contexts.append(context)
        return real_stage_costs(*args, context=context, **kwargs)

    monkeypatch.setattr(calibrate, "generate_seconds", generate_seconds)
    monkeypatch.setattr(calibrate, "measure_stage_costs", stage_costs)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15, 16, 17, 18, 19]]
    settings = calibrate.Settings(num_prompts=3, max_prompt_tokens=8, new_tokens=8,
                                  block_sizes=(1, 4), repeats=1, capacity=64)
    cal = calibrate.calibrate(_tiny(), 1, prompts=prompts, settings=settings)
    assert [m for m, _, _ in seen] == ["ar", "ar", "layerskip"]
    assert all(p == prompts for _, _, p in seen)
    assert cal.loop["timed_batches"] == 3
    assert contexts == [sum(map(len, prompts)) // 3 + 8 // 2] == [cal.loop["stage_context"]]
    two = calibrate.calibrate(_tiny(), 2, prompts=prompts[:1], settings=settings)
    assert two.loop["timed_batches"] == 1  # fewer prompts than the batch: one batch, repeated
