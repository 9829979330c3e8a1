"""A draft model in `hispec bench --tasks` and `hispec tune` (`--draft-model`, `--draft-k`,
`--no-draft-gate`): its row is timed beside AR and checked equal to it, its plans are priced
by measured acceptance and this device's costs and ranked with the others, and bad input is
a one-line error (exit status 2) before anything compiles. Tiny random models."""

import dataclasses
import json

import jax
import pytest

from hispec_jax import cli
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.model import Model
from hispec_jax.models.params import init_params, with_layer_layout
from hispec_jax.planner import draft_plans, latency, plan as plan_lib
from hispec_jax.planner.latency import Costs

COSTS = Costs(batch=1, num_layers=4, block_sizes=(1, 4, 16, 32),
              layer_s=(1e-4, 1.3e-4, 2.5e-4, 4e-4), head_s=(5e-5, 6e-5, 1e-4, 1.6e-4),
              pass_s=3e-5, round_s=5e-5)


def _tiny(layers: int = 4, seed: int = 1, vocab: int = 96) -> Model:
    cfg = ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=32, intermediate_size=48,
                      num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=8,
                      max_position_embeddings=256)
    params = init_params(cfg, jax.random.PRNGKey(seed), init_std=0.3)
    return Model(cfg=cfg, params=with_layer_layout(params, "unrolled"))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """{name: directory} of a tiny target, a draft of its vocabulary and one of another."""
    from hispec_jax import save_model

    root = tmp_path_factory.mktemp("pair")
    out = {"target": root / "target", "draft": root / "draft", "other": root / "other"}
    save_model(_tiny(), out["target"])
    save_model(_tiny(layers=1, seed=2), out["draft"])
    save_model(_tiny(layers=1, seed=3, vocab=80), out["other"])
    return out


# ---- bad input: one line, exit status 2, nothing compiled --------------------------------
def _rejects(argv, capsys, *expected):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for text in expected:
        assert text in err, (text, err)


def test_bench_and_tune_reject_bad_draft_flags(dirs, capsys):
    target, draft, other = (str(dirs[k]) for k in ("target", "draft", "other"))
    _rejects(["bench", "--model", target, "--draft-model", draft], capsys,
             "--draft-model is a --tasks flag")
    _rejects(["bench", "--tasks", "chat", "--model", target, "--draft-k", "3"], capsys,
             "--draft-k", "give --draft-model too")
    _rejects(["bench", "--tasks", "chat", "--model", target, "--no-draft-gate"], capsys,
             "--no-draft-gate", "give --draft-model too")
    _rejects(["bench", "--tasks", "chat", "--model", target, "--draft-model", "/nonexistent"],
             capsys, "--draft-model /nonexistent")
    _rejects(["bench", "--tasks", "chat", "--model", target, "--draft-model", other], capsys,
             "vocabulary has 80 entries, the model's 96")
    _rejects(["bench", "--tasks", "chat", "--model", target, "--draft-model", draft,
              "--draft-k", "0"], capsys, "--draft-k 0")
    _rejects(["tune", "--model", target, "--draft-k", "3"], capsys, "--draft-k",
             "give --draft-model too")
    _rejects(["tune", "--model", target, "--draft-model", "/nonexistent"], capsys,
             "--draft-model /nonexistent")
    _rejects(["tune", "--model", target, "--draft-model", other], capsys,
             "vocabulary has 80 entries, the model's 96")
    _rejects(["tune", "--model", target, "--draft-model", draft, "--draft-k", "99"], capsys,
             "--draft-k 99")
    _rejects(["tune", "--model", target, "--smaller-draft-model", draft], capsys,
             "--smaller-draft-model", "needs --draft-model")
    _rejects(["tune", "--model", target, "--draft-model", draft, "--smaller-draft-model",
              other], capsys, "--smaller-draft-model", "vocabulary has 80 entries")


def test_bench_tasks_passes_the_draft_flags_on(dirs, tmp_path, monkeypatch, capsys):
    from hispec_jax.bench import tasks

    seen = {}
    monkeypatch.setattr(tasks, "run", lambda args, load_options=None: seen.update(vars(args)))
    assert cli.main(["bench", "--tasks", "chat", "--model", str(dirs["target"]), "--draft-model",
                     str(dirs["draft"]), "--draft-k", "3", "--no-draft-gate",
                     "--no-transformers", "--out-dir", str(tmp_path)]) == 0
    assert seen["draft_model"] == str(dirs["draft"])
    assert seen["draft_k"] == 3 and seen["draft_gate"] is False


def test_the_draft_row_runs_on_the_pair_and_equals_ar():
    """`tasks.specs` with a draft model: its row decodes with the draft (the other rows
    without it), and the comparison checks it token-identical to AR."""
    from hispec_jax.bench import suite, tasks

    target, draft = _tiny(), _tiny(layers=1, seed=2)
    specs = tasks.specs(target, None, draft=draft, draft_k=3, draft_gate=False)
    assert specs[-1].name == "draft model k=3 ungated" and specs[-1].method == "draft"
    assert all(s.draft is None for s in specs[:-1])
    chosen = [specs[0], specs[-1]]
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    runners, _ = suite.loop_time_runners(target, prompts, chosen, 10)
    ar, got = suite.compare(runners, 1)
    assert got.identical_to_ar and got.token_ids == ar.token_ids
    assert got.stats["draft_model"]["k"] == 3 and got.stats["draft_model"]["proposed"] > 0


# ---- the planner ----------------------------------------------------------------------------
def test_draft_plan_round_trips_and_needs_its_draft_model():
    from hispec_jax.decoding import methods

    plan = plan_lib.Plan(exits=(4,), draft_k=3, draft_gate=False)
    assert plan.method == "draft" and plan.kind == "draft"
    assert plan.method_options() == {"draft_k": 3, "draft_gate": False}
    assert plan.name() == "draft model k=3 ungated"
    assert plan_lib.Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    target, draft = _tiny(), _tiny(layers=1, seed=2)
    pair = target.with_draft(draft)
    decoder = plan.decoder(pair)
    assert plan_lib.Plan.of_decoder(decoder) == plan
    assert plan_lib.Plan.of_decoder(methods.make_method(pair, "draft", draft_k=4)) == \
        plan_lib.Plan(exits=(4,), draft_k=4)
    with pytest.raises(ValueError, match="drafts with a draft model"):
        plan.decoder(target)
    assert plan_lib.model_key(pair) != plan_lib.model_key(target)  # the pair's plan file


@pytest.mark.parametrize("plan, kind, name, options", [
    (plan_lib.Plan(exits=(4,), draft_k=4, lookup=3), "draft+lookup",
     "draft model k=4 + lookup k=3", {"draft_k": 4, "lookup": 3}),
    (plan_lib.Plan(exits=(4,), draft_k=4, inner_k=2), "draft+draft",
     "draft model k=4 + smaller draft model k=2", {"draft_k": (2, 4)}),
    (plan_lib.Plan(exits=(1, 4), windows=(3,), draft_k=2), "layerskip+draft",
     "layerskip d=1 nd=3 + draft model k=2", {"draft_exit": 1, "draft_len": 3, "draft_k": 2}),
    (plan_lib.Plan(exits=(1, 2, 4), windows=(1, 4), draft_k=3), "hispec+draft",
     "hispec d=1 i=2 nd=1 ni=4 + draft model k=3",
     {"draft_exit": 1, "draft_len": 1, "verify_exits": (2,), "verify_window": 4, "draft_k": 3}),
])
def test_plans_over_and_under_a_draft_model_round_trip(plan, kind, name, options):
    """Each hierarchy a tune prices with a draft model is a plan that names itself, saves,
    builds its decoder on the models `tune.plan_model` gives it and reads back from it."""
    from hispec_jax.planner import tune as tune_lib

    assert (plan.kind, plan.name(), plan.method_options()) == (kind, name, options)
    assert plan_lib.Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    target, draft, small = _tiny(), _tiny(layers=2, seed=2), _tiny(layers=1, seed=5)
    both = target.with_draft(draft.with_draft(small))
    model = tune_lib.plan_model(both, plan)
    assert (model.draft.params.get("draft") is not None) == bool(plan.inner_k)
    assert plan_lib.Plan.of_decoder(plan.decoder(model)) == plan
    if plan.inner_k:
        with pytest.raises(ValueError, match="two draft models"):
            plan.decoder(target.with_draft(draft))


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7, 0.95, 1.0])
def test_per_token_acceptance_inverts_the_expected_run(alpha):
    k = 6
    kept = sum(alpha ** i for i in range(1, k + 1))  # expected drafts kept a round
    got = draft_plans.per_token_acceptance(round(kept * 1000), k * 1000, k)
    assert got == pytest.approx(alpha, abs=2e-3)


def _measured(alpha: float, ratio: float = 0.1, **structures) -> dict:
    """What `draft_plans.measure` returns, for a draft model alone (and `structures`)."""
    return {"k": 8, "proposed": 80, "accepted": 0, "alpha": alpha, "steps_per_draft": 1.0,
            "wide_share": 0.0, "below_k": 0, "below_per_draft": 0.0, "step_ratio": ratio,
            "agreement": {}, **structures}


def test_draft_plans_are_priced_by_the_renewal_formula():
    ar = latency.predict((4,), (), [], COSTS)
    step = 0.1 * COSTS.stage(0, 4, 1)
    agree = draft_plans.plans(_measured(1.0), COSTS, 4, ks=(2, 4))
    for plan, k in zip(agree, (2, 4)):
        assert plan.tokens_per_round == k + 1
        block = latency.blocks((k,))[0]
        cost = COSTS.round_s + k * step + COSTS.stage(0, 4, block)
        assert plan.predicted_tokens_per_second == pytest.approx((k + 1) / cost)
        assert plan.predicted_speedup == pytest.approx(plan.predicted_tokens_per_second
                                                       / ar.tokens_per_second)
        assert plan.predicted_speedup > 1
    assert all(p.predicted_speedup < 1 for p in draft_plans.plans(_measured(0.0), COSTS, 4))


def test_the_timed_loops_scale_every_draft_step():
    """g: the ungated loop's seconds less its prefills and the target's passes, per draft
    pass, over the step's price from the passes alone; g': the same of the loop over the
    smaller model, less the draft model's passes at g too, per smaller-model pass. Each
    step is priced at its scale, and timing noise that leaves nothing keeps 1 (g' then g)."""
    L, k, g, g_small = 4, 8, 1.5, 2.5
    costs = dataclasses.replace(COSTS, prefill_s=2e-3)
    one = costs.stage(0, L, 1)
    step, small_step = 0.1 * one, 0.02 * one
    rounds, batches = 10, 2
    fixed = batches * costs.prefill_s + rounds * (costs.round_s + costs.stage(0, L, k + 1))
    loop = {"seconds": fixed + 80 * g * step, "batches": batches, "rounds": rounds,
            "draft_passes": 80, "below_passes": 0}
    smaller = dict(_measured(1.0), below_k=3, below_per_draft=2.0, step_ratio=0.02)
    t_pass = draft_plans.pass_seconds(smaller, g * step, costs, L)
    smaller["loop"] = {"seconds": fixed + 30 * t_pass + 90 * g_small * small_step,
                       "batches": batches, "rounds": rounds, "draft_passes": 30,
                       "below_passes": 90}
    measured = _measured(1.0, loop=loop, smaller=smaller)
    assert draft_plans.loop_scale(measured, costs, L) == pytest.approx(g)
    assert draft_plans.smaller_loop_scale(measured, costs, L) == pytest.approx(g_small)
    plans = {p.name(): p for p in draft_plans.plans(measured, costs, L, ks=(4,))}
    verify = costs.round_s + costs.stage(0, L, latency.blocks((4,))[0])
    assert plans["draft model k=4"].predicted_tokens_per_second == pytest.approx(
        5 / (verify + 4 * g * step))
    assert plans["draft model k=4 + smaller draft model k=3"].predicted_tokens_per_second == \
        pytest.approx(5 / (verify + draft_plans.draft_seconds(4, smaller, g * step, costs, L,
                                                               g_small * small_step)))
    noisy = dict(measured, loop=dict(loop, seconds=0.0))
    assert draft_plans.loop_scale(noisy, costs, L) == 1.0
    assert draft_plans.smaller_loop_scale(dict(measured, smaller=dict(smaller, loop=None)),
                                          costs, L) == pytest.approx(g)
    assert draft_plans.loop_scale(_measured(1.0), costs, L) == 1.0  # no timed loop


def test_measure_times_the_loops_of_two_draft_models():
    """`measure` on a target with two draft models (each the target itself: every draft
    kept) times the draft model's loop and the loop over the smaller model, whose passes
    it counts apart."""
    target = _tiny()
    trio = target.with_draft(target.with_draft(target))
    measured = draft_plans.measure(trio, [[5, 6, 7, 8], [9, 10, 11]], 10, 1, 64, k=4)
    loop, smaller = measured["loop"], measured["smaller"]
    assert measured["alpha"] > 0.99 and smaller["alpha"] > 0.99
    assert loop["seconds"] > 0 and loop["draft_passes"] > 0 and loop["below_passes"] == 0
    assert smaller["loop"]["below_passes"] > 0 and smaller["loop"]["draft_passes"] > 0
    assert smaller["loop"]["draft_passes"] < loop["draft_passes"]  # its tokens save passes


def test_drafts_below_and_exits_above_a_draft_model_are_priced():
    """A lookup (or a smaller draft model) that halves the draft model's passes per draft
    costs their share of wide passes (and the smaller model's steps); the draft model under
    exit d is checked at its agreement with d, then the calibration's alpha(d, L)."""
    k, one = 4, COSTS.stage(0, 4, 1)
    t_draft, t_small = 0.1 * one, 0.02 * one
    lookup = dict(_measured(1.0), steps_per_draft=0.5, wide_share=0.5, below_k=7,
                  below_per_draft=0.75)
    smaller = dict(lookup, below_k=3, below_per_draft=2.0, step_ratio=0.02)
    measured = _measured(1.0, lookup=lookup, smaller=smaller, agreement={"1": 0.9, "4": 1.0})
    alpha_of = lambda a, b: 0.6  # noqa: E731
    plans = {p.name(): p for p in draft_plans.plans(measured, COSTS, 4, ks=(k,),
                                                    alpha_of=alpha_of, exits=(1, 2, 4))}
    block = latency.blocks((k,))[0]

    def speed(draft_s):
        return (k + 1) / (COSTS.round_s + draft_s + COSTS.stage(0, 4, block))

    wide = COSTS.stage(0, 4, 2 + k - 1) / one  # the lookup's k - 1 at k
    assert plans["draft model k=4 + lookup k=3"].predicted_tokens_per_second == pytest.approx(
        speed(k * 0.5 * t_draft * (0.5 + 0.5 * wide)))
    wide = COSTS.stage(0, 4, 2 + 3) / one
    assert plans["draft model k=4 + smaller draft model k=3"].predicted_tokens_per_second == \
        pytest.approx(speed(k * (0.5 * t_draft * (0.5 + 0.5 * wide) + 2.0 * t_small)))
    assert plans["draft model k=4"].predicted_tokens_per_second == pytest.approx(
        speed(k * t_draft))
    under = plans["layerskip d=1 nd=2 + draft model k=4"]
    want = latency.predict((0, 1, 4), (k, 2), [0.9, 0.6], COSTS, draft_s=k * t_draft)
    assert under.predicted_tokens_per_second == pytest.approx(want.tokens_per_second)
    assert under.method_options()["draft_exit"] == 1
    assert any(p.kind == "hispec+draft" and p.exits == (1, 2, 4) for p in plans.values())
    assert not any(p.exits[0] == 2 for p in plans.values() if p.draft_k)  # no agreement known


def test_tune_ranks_measured_draft_plans_with_the_others(tmp_path, monkeypatch):
    """`tune` on a pair (calibration replaced by fixed costs and acceptance): the draft
    model's acceptance, step cost and agreement with the exits are measured, alone and over
    a lookup; its plans join the ranking (the best of each kind always kept), the plan file
    is the pair's, and --verify times them on the pair."""
    from hispec_jax.planner import calibrate, tune as tune_lib

    monkeypatch.setattr("hispec_jax.planner.plan.cache_dir", lambda: tmp_path / "plans")
    target = _tiny()
    pair = target.with_draft(target)  # the target drafting for itself: always agrees
    cal = calibrate.Calibration(exits=(1, 2, 3, 4), alpha=jax.numpy.full((4, 4), 0.5),
                                costs=COSTS, tokens=0, seconds=0.0, loop={})
    seen = {}

    def fake_calibrate(model, *a, **k):
        seen["calibrated"] = model
        return cal

    monkeypatch.setattr(calibrate, "calibrate", fake_calibrate)
    settings = calibrate.Settings(num_prompts=2, max_prompt_tokens=8, new_tokens=12,
                                  block_sizes=(1, 4), repeats=1, capacity=64, lookup=0)
    report = tune_lib.tune_and_verify(pair, 1, settings=settings, top=3, verify=True,
                                      verify_prompts=2, verify_tokens=8, verify_repeats=1,
                                      draft_ks=(2, 3))
    assert seen["calibrated"].draft is None  # the exits are the target's alone
    draft = report["draft_model"]
    assert draft["alpha"] > 0.99 and draft["k"] == 3 and 0 < draft["step_ratio"]
    assert draft["loop"]["rounds"] > 0 and draft["loop"]["draft_passes"] > 0 and \
        draft["loop"]["seconds"] > 0
    names = [p.name() for p in report["plans"]]
    assert any(n.startswith("draft model k=") for n in names)
    # the best of each draft kind is listed: over a lookup, under exits (LayerSkip, HiSpec)
    assert {"draft", "draft+lookup", "layerskip+draft", "hispec+draft"} <= {
        p.kind for p in report["plans"]}
    assert draft["lookup"]["steps_per_draft"] <= 1 and set(draft["agreement"]) == {"1", "2", "3", "4"}
    assert report["chosen_by"].startswith("measurement")  # --verify ranks by measurement
    rows = {r["plan"]: r for r in report["verify"]}
    drafted = [n for n in names if n.startswith("draft model")]
    assert all(rows[n]["measured_tokens_per_second"] > 0 for n in drafted)
    payload = json.loads(plan_lib.plan_path(pair, 1).read_text())
    assert payload["model"] == plan_lib.model_key(pair) and payload["draft_model"]["k"] == 3
    lines = tune_lib.summary_lines(report)
    assert any("draft model: per-token acceptance" in line for line in lines)
    assert any("draft model over a lookup: per-token acceptance" in line for line in lines)


# ---- method="auto" with a draft model -------------------------------------------------------
def _pair_whose_exits_disagree(layers: int = 4, n: int = 1) -> tuple[Model, Model]:
    """(a target whose first L - n layers add nothing to the residual stream, its last n
    layers with its embedding, norm and head as the draft): the draft's greedy token is the
    target's (every draft kept), while the target's own exits below L - n see only the
    embeddings."""
    target = _tiny(layers)
    stacked = dict(with_layer_layout(target.params, "scan")["layers"])
    for name in ("wo", "w_down"):
        stacked[name] = stacked[name].at[:layers - n].set(0)
    params = {**target.params, "layers": stacked}
    draft = {**params, "layers": jax.tree.map(lambda x: x[layers - n:], stacked)}
    return (Model(cfg=target.cfg, params=with_layer_layout(params, "unrolled")),
            Model(cfg=target.cfg.replace(num_layers=n),
                  params=with_layer_layout(draft, "unrolled")))


def test_auto_with_a_draft_model_runs_the_pairs_plan(tmp_path, monkeypatch, capsys):
    """generate(method="auto", draft=...) without a plan tunes the pair quickly (its draft
    plans ranked with the target's own), decodes with the chosen draft plan, AR's tokens;
    the saved plan is the pair's and the next call runs it without tuning; a pair's plan
    without the draft model decodes on the target alone; two draft models get theirs."""
    from hispec_jax import generate
    from hispec_jax.planner import calibrate, tune as tune_lib

    monkeypatch.setattr("hispec_jax.planner.plan.cache_dir", lambda: tmp_path / "plans")
    target, draft = _pair_whose_exits_disagree()
    # the calibration of the target's exits, fixed: they rarely agree with the final layer
    cal = calibrate.Calibration(exits=(1, 2, 3, 4), alpha=jax.numpy.full((4, 4), 0.05),
                                costs=COSTS, tokens=0, seconds=0.0, loop={})
    monkeypatch.setattr(calibrate, "calibrate", lambda *a, **k: cal)
    # (the fixed costs are no device's: the draft loops are not timed against them, g = 1)
    monkeypatch.setattr(draft_plans, "LOOP_REPEATS", 0)
    monkeypatch.setattr(calibrate.Settings, "quick", classmethod(lambda cls: cls(
        num_prompts=2, max_prompt_tokens=8, new_tokens=12, block_sizes=(1, 4), repeats=1,
        capacity=64, lookup=0)))
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    ar = generate(target, prompts, method="ar", max_new_tokens=12, ignore_eos=True)
    auto = generate(target, prompts, method="auto", draft=draft, max_new_tokens=12,
                    ignore_eos=True)
    assert "running a quick tune" in capsys.readouterr().err
    assert auto.token_ids == ar.token_ids
    assert auto.stats["plan"].startswith("draft model k=")
    assert auto.stats["draft_model"]["accepted"] == auto.stats["draft_model"]["proposed"] > 0
    pair = target.with_draft(draft)
    saved = plan_lib.load_plan(pair, 2)
    assert saved is not None and saved.name() == auto.stats["plan"]

    def no_tune(*a, **k):
        raise AssertionError("a saved plan is run without tuning")

    real_tune = tune_lib.tune
    monkeypatch.setattr(tune_lib, "tune", no_tune)
    again = generate(target, prompts, method="auto", draft=draft, max_new_tokens=12,
                     ignore_eos=True)
    assert again.token_ids == ar.token_ids and again.stats["plan"] == saved.name()
    # the pair's tune may choose a plan of the target alone: it runs without the draft model
    plan_lib.save_plan_file(plan_lib.plan_path(pair, 2), plan_lib.plan_payload(
        pair, 2, [plan_lib.Plan(exits=(1, 4), windows=(2,))]))
    alone = generate(target, prompts, method="auto", draft=draft, max_new_tokens=12,
                     ignore_eos=True)
    assert alone.token_ids == ar.token_ids and alone.stats["plan"] == "layerskip d=1 nd=2"
    assert "draft_model" not in alone.stats
    # two draft models: the tune prices the plans of both beside the others
    monkeypatch.setattr(tune_lib, "tune", real_tune)
    small = _tiny(1, seed=5)
    both = generate(target, prompts, method="auto", draft=(small, draft), max_new_tokens=12,
                    ignore_eos=True)
    assert both.token_ids == ar.token_ids
    three = target.with_draft(draft.with_draft(small))
    chosen = plan_lib.load_plan(three, 2)
    assert chosen is not None and chosen.name() == both.stats["plan"]
    assert plan_lib.model_key(three) != plan_lib.model_key(pair)  # a plan file of its own


def test_saved_agreeing_pair_agrees_at_both_levels(tmp_path):
    """`hispec bench-tool draft-model --save-pair DIR` writes a target, its draft and a
    smaller draft whose greedy tokens agree: every draft kept at both levels, AR's tokens."""
    from hispec_jax import generate, load_model
    from hispec_jax.bench import draft_pair

    assert draft_pair.main(["--save-pair", str(tmp_path), "--layers", "4", "--hidden", "64",
                            "--vocab", "128", "--draft-layers", "3", "--smaller-layers", "1"]) == 0
    target, draft, small = (load_model(tmp_path / name) for name in ("target", "draft", "smaller"))
    assert (draft.cfg.num_layers, small.cfg.num_layers) == (3, 1)
    prompts = [[5, 6, 7, 8, 9]]
    ar = generate(target, prompts, method="ar", max_new_tokens=10, ignore_eos=True)
    out = generate(target, prompts, draft=(small, draft), draft_k=(2, 3), draft_gate=False,
                   max_new_tokens=10, ignore_eos=True)
    stats = out.stats["draft_model"]
    assert out.token_ids == ar.token_ids
    assert stats["accepted"] == stats["proposed"] > 0
    inner = stats["inner_draft_model"]
    assert inner["accepted"] == inner["proposed"] > 0
