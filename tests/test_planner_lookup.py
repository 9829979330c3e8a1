"""The prompt-lookup drafter under exits as a planner candidate (issue 28): the replayed
engine loop (`latency.simulate_lookup`) against the engine's own counts, the search's choice
on copy-heavy and open-chat calibrations, plan files and method="auto"."""

import dataclasses
import json

import numpy as np
import pytest

from hispec_jax.planner import calibrate, latency, plan as plan_lib, search as search_lib
from test_engine import tiny_model
from test_planner import STEP_COSTS


def _trace_of(model, prompts, new_tokens):
    from hispec_jax.decoding import generate as generate_lib

    ar = generate_lib.generate(model, prompts, method="ar", max_new_tokens=new_tokens,
                               ignore_eos=True, batch_size=1)
    sequences = [p + t for p, t in zip(ar.prompt_token_ids, ar.token_ids)]
    return ar, calibrate.measure_lookup_trace(model, sequences, [len(p) for p in prompts])


PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 12], [20, 21, 22, 23]]


@pytest.mark.parametrize("exits,windows,options", [
    ((6,), (), dict(method="lookup")),
    ((2, 6), (3,), dict(method="layerskip", draft_exit=2, draft_len=3)),
    ((1, 3, 6), (2, 4), dict(method="hispec", draft_exit=1, verify_exits=(3,), draft_len=2,
                             verify_window=4))])
def test_simulated_lookup_is_what_the_engine_counts_on_the_always_agree_model(exits, windows,
                                                                             options):
    """Every exit gives the final layer's token: the replayed loop is the engine's, round for
    round (rounds, tokens, the top level's verified lengths, work per token)."""
    from hispec_jax.decoding import generate as generate_lib

    model = tiny_model(6, 0, layer_scale=0.0)
    ar, trace = _trace_of(model, PROMPTS, 20)
    run = latency.simulate_lookup(trace, 4, exits, windows)
    got = generate_lib.generate(model, PROMPTS, max_new_tokens=20, ignore_eos=True,
                                batch_size=1, lookup=4, **options)
    assert got.token_ids == ar.token_ids
    assert got.stats["lookup"]["matches"] > 0
    assert (run.rounds, run.emitted) == (got.stats["rounds"], got.stats["emitted_in_loop"])
    assert list(run.verified) == got.stats["verified_length_histogram"]
    work = latency.predict_lookup_run(run, exits, latency.work_costs(model))
    assert work.seconds_per_token == pytest.approx(got.stats["work_per_token"])


def test_simulated_lookup_alone_is_the_measured_profile_on_a_random_model():
    """With the final layer as the only verifier the replay is exact on any model: it
    reproduces `measure_lookup`'s run."""
    model = tiny_model(4, 1)
    _, trace = _trace_of(model, PROMPTS, 16)
    measured = calibrate.measure_lookup(model, PROMPTS, 8, 16)
    run = latency.simulate_lookup(trace, 8, (4,), ())
    assert (run.rounds, run.emitted, run.verified) == (measured.rounds, measured.tokens,
                                                       measured.verified)
    profile = dataclasses.replace(measured, trace=trace)
    assert latency.LookupProfile.from_json(json.loads(json.dumps(profile.to_json()))) == profile


# Synthetic calibrations (L = 24, exits 4 and 8): a continuation that copies its prompt in
# runs of 12 tokens (one new token between runs) or one that copies nothing; exits whose
# choices are the continuation's (agree) or random (disagree).
def _synthetic_trace(copy: bool, agree: bool, prompts: int = 4, new_tokens: int = 48):
    rng = np.random.default_rng(0)
    sequences, starts = [], []
    for _ in range(prompts):
        prompt = rng.integers(100, 1000, 60).tolist()
        cont: list[int] = []
        while len(cont) < new_tokens:
            if copy:
                at = int(rng.integers(0, 48))
                cont += prompt[at:at + 12] + [int(rng.integers(1000, 2000))]
            else:
                cont.append(int(rng.integers(1000, 5000)))
        sequences.append(tuple(prompt + cont[:new_tokens]))
        starts.append(len(prompt))

    def choices(seq, p):
        if agree:
            return tuple(seq[p + 1:]) + (0,)
        return tuple(int(t) for t in rng.integers(5000, 6000, len(seq) - p))

    return latency.LookupTrace(
        max_ngram=3, sequences=tuple(sequences), starts=tuple(starts),
        predictions=tuple((e, tuple(choices(s, p) for s, p in zip(sequences, starts)))
                          for e in (4, 8)))


@pytest.mark.parametrize("copy,agree,chosen", [
    (True, True, "layerskip+lookup"),  # copies, checked cheaply by an exit that agrees
    (True, False, "lookup"),           # copies, but the exits would reject them
    (False, False, "ar")])             # nothing to copy, exits that disagree
def test_search_picks_lookup_under_an_exit_only_when_the_calibration_says_it_pays(copy, agree,
                                                                                 chosen):
    trace = _synthetic_trace(copy, agree)
    run = latency.simulate_lookup(trace, 8, (24,), ())
    profile = latency.LookupProfile(k=8, rounds=run.rounds, tokens=int(run.emitted),
                                    verified=run.verified, trace=trace)
    alpha = (lambda a, b: 1.0) if agree else (lambda a, b: 0.1)
    plans = search_lib.search((4, 8, 24), alpha, STEP_COSTS, top=3, lookup=profile)
    assert plans[0].kind == chosen
    kinds = [p.kind for p in plans]
    for kind in ("ar", "layerskip", "hispec", "lookup", "layerskip+lookup", "hispec+lookup"):
        assert kind in kinds  # every kind is listed, ranked
    under = search_lib.best_of_kind(plans, "layerskip+lookup")
    assert under.method == "layerskip" and under.lookup in (8, 4)  # k, or half k under exits
    alone = search_lib.best_of_kind(plans, "lookup")
    layerskip = search_lib.best_of_kind(plans, "layerskip")
    beats_parts = (under.predicted_tokens_per_second > alone.predicted_tokens_per_second
                   and under.predicted_tokens_per_second > layerskip.predicted_tokens_per_second)
    assert beats_parts == (chosen == "layerskip+lookup")


def test_lookup_under_exit_plans_carry_the_simulated_work():
    """A plan's predicted work per token is its replayed loop's, in layer equivalents."""
    model = tiny_model(6, 0, layer_scale=0.0)
    _, trace = _trace_of(model, PROMPTS, 20)
    profile = latency.LookupProfile(k=4, rounds=1, tokens=1, verified=(0, 1), trace=trace)
    work = latency.work_costs(model)
    plans = search_lib.lookup_plans(tuple(range(1, 7)), STEP_COSTS, profile, work=work,
                                    draft_lens=(2, 3))
    plan = next(p for p in plans if p.kind == "hispec+lookup")
    run = latency.simulate_lookup(trace, plan.lookup, plan.exits, plan.windows)
    assert plan.predicted_work_per_token == pytest.approx(
        latency.predict_lookup_run(run, plan.exits, work).seconds_per_token)
    assert plan.predicted_work_speedup == pytest.approx(
        work.stage(0, 6, 1) / plan.predicted_work_per_token)


@pytest.mark.parametrize("plan,name,options", [
    (plan_lib.Plan(exits=(1, 4), windows=(2,), lookup=3), "layerskip d=1 nd=2 + lookup k=3",
     {"draft_exit": 1, "draft_len": 2, "lookup": 3}),
    (plan_lib.Plan(exits=(1, 2, 4), windows=(1, 3), lookup=3),
     "hispec d=1 i=2 nd=1 ni=3 + lookup k=3",
     {"draft_exit": 1, "draft_len": 1, "verify_exits": (2,), "verify_window": 3, "lookup": 3})])
def test_lookup_under_exit_plan_round_trips_and_auto_runs_it_equal_to_ar(tmp_path, monkeypatch,
                                                                        plan, name, options):
    from hispec_jax import generate
    from test_planner import _tiny

    assert (plan.name(), plan.method_options()) == (name, options)
    assert plan_lib.Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    monkeypatch.setenv("HISPEC_CACHE_DIR", str(tmp_path))
    model = _tiny()
    plan_lib.save_plan_file(plan_lib.plan_path(model, 1), plan_lib.plan_payload(model, 1, [plan]))
    assert plan_lib.load_plan(model, 1) == plan  # the cached tune
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6]]
    auto = generate(model, prompts, method="auto", max_new_tokens=12, ignore_eos=True)
    ar = generate(model, prompts, method="ar", max_new_tokens=12, ignore_eos=True)
    assert auto.stats["plan"] == name
    assert auto.stats["exits"] == [0, *plan.exits] and auto.stats["lookup"]["verified_by_exit"] == 1
    assert auto.token_ids == ar.token_ids


def test_tasks_auto_row_is_tuned_on_other_prompts_and_timed_in_the_run(monkeypatch,
                                                                           capsys):
    """`bench --tasks ... --auto`: per task a tune on the prompts after the measured ones,
    its plan timed beside the fixed choices, its ratio to the best of them from the rows."""
    import types

    from hispec_jax.bench import tasks
    from test_planner import _tiny

    monkeypatch.setattr(calibrate.Settings, "quick", classmethod(lambda cls: cls(
        num_prompts=2, max_prompt_tokens=8, new_tokens=6, block_sizes=(1, 4), repeats=1,
        capacity=64)))
    pool = [[5, 6, 7, 8, 5, 6, 7], [9, 10, 11, 9, 10], [12, 13, 12, 13, 12, 13],
            [14, 15, 16, 14, 15, 16, 14, 15]]
    monkeypatch.setattr(tasks, "task_prompts", lambda model, task, n, m, chat: pool[:n])
    specs = tasks.specs  # the fixed choices: AR and lookup (fewer loops to compile)
    monkeypatch.setattr(tasks, "specs", lambda *a: specs(*a)[:2])
    tuned_on = []
    tune = tasks.tune_for_task
    monkeypatch.setattr(tasks, "tune_for_task", lambda model, calibration, args, progress=None,
                        costs_from=None: (tuned_on.append(calibration),
                                          tune(model, calibration, args, costs_from=costs_from))[1])
    args = types.SimpleNamespace(prompts=2, auto_prompts=2, auto=True, recommended=False,
                                 max_prompt_tokens=64, max_new_tokens=6, rounds=1, lookup=4,
                                 chat=False)
    result = tasks.run_task(_tiny(), None, "summarize", args)
    assert tuned_on == [pool[2:4]] and result["prompt_lengths"] == [7, 5]  # disjoint
    auto = result["auto"]
    rows = {r["name"]: r for r in result["rows"]}
    assert auto["row"] in rows  # its own row, or the fixed row that runs the same program:
    assert auto["row"] == auto["same_as"] or auto["plan"]["name"] in auto["row"]
    fixed = [r for n, r in rows.items() if not n.startswith("auto: ")]
    best = max(fixed, key=lambda r: r["tokens_per_second"])
    assert auto["best_fixed"] == best["name"]
    assert auto["auto_vs_best_fixed"] == pytest.approx(
        rows[auto["row"]]["tokens_per_second"] / best["tokens_per_second"])
    assert all(r["identical_to_ar"] for r in rows.values())
    # the prefill alone, timed in the same rounds: each row's speed-up in the loop alone
    assert len(result["prefill_seconds"]) == args.rounds and "prefill" not in str(list(rows))
    assert rows["ar"]["loop_x_ar"] == pytest.approx(1.0)
    prefill = result["prefill_seconds"][0]
    for row in rows.values():
        assert row["loop_x_ar"] == pytest.approx(
            (rows["ar"]["seconds"][0] - prefill) / (row["seconds"][0] - prefill))
    # each row the tune scored carries its prediction (AR's: 1), keyed by the tune's name
    assert rows["ar"]["predicted_loop_x_ar"] == pytest.approx(1.0)
    assert plan_lib.Plan.of_decoder(tasks.specs(_tiny(), 4)[1].decoder(_tiny())).name() == "lookup k=4"
    for plan in (plan_lib.Plan((4,)), plan_lib.Plan((2, 4), (3,)), plan_lib.Plan((1, 2, 4), (2, 3)),
                 plan_lib.Plan((2, 4), (3,), lookup=4), plan_lib.Plan((1, 2, 4), (2, 3), True)):
        assert plan_lib.Plan.of_decoder(plan.decoder(_tiny())) == plan  # the inverse
    assert rows["lookup"]["predicted_loop_x_ar"] == auto["tune_predicted_x_ar"].get("lookup k=4")
    text = tasks.markdown(result)
    assert "| x our AR | loop x our AR | auto's tune predicted (loop) |" in text
    assert "auto (tuned on 2 other prompts of the task): " + auto["plan"]["name"] in text
    assert "/ best fixed choice (" + best["name"] in text
    # a second task reuses the first's costs: only acceptance and the lookup are measured
    first = result["calibration"]
    args.auto_verify = True  # the plan chosen by timing the tune's plans on those prompts
    monkeypatch.setattr(tasks, "tune_for_task", lambda *a, **k: (lambda r: {
        **r, "plans": r["plans"][:2]})(tune(*a, **k)))  # two plans: fewer loops to compile
    again = tasks.run_task(_tiny(), None, "extract", args, costs_from=first)
    assert again["auto"]["costs_reused"] and again["calibration"].costs == first.costs
    timed = {r["plan"]: r["measured_tokens_per_second"] for r in again["auto"]["verify"]}
    assert again["auto"]["plan"]["name"] == max(timed, key=timed.get)
    assert again["auto"]["chosen_by"] == "measurement (2 calibration prompts)"
    assert again["calibration"].lookup.trace is not None
    # --auto-choose with several rules: one tune, each rule's pick on its ranking timed
    args.auto_verify, args.auto_choose = False, ("held-up", "worse-half", "prediction")
    monkeypatch.setattr(tasks, "tune_for_task", lambda *a, **k: tune(*a, **k))
    picked = {}
    choose = search_lib.choose
    monkeypatch.setattr(search_lib, "choose", lambda plans, rule, *a: (lambda r: (
        picked.setdefault(rule, r[0][0]), r)[1])(choose(plans, rule, *a)))
    third = tasks.run_task(_tiny(), None, "code", args, costs_from=first)
    rules = third["auto"]["rules"]
    assert list(rules) == ["worse-half", "prediction"]
    names = [r["name"] for r in third["rows"]]
    for rule, info in rules.items():
        assert info["plan"] == picked[rule].name()
        row = info["same_as"] or f"auto ({rule}): {info['plan']}"
        assert row in names and info["row"] == row
        assert info["auto_vs_best_fixed"] == pytest.approx(
            info["tokens_per_second"] / info["best_fixed_tokens_per_second"])
        assert not info["best_fixed"].startswith("auto")
    assert len(names) == len(set(names))  # a pick equal to another row is timed once
    assert "auto by worse-half: " + rules["worse-half"]["plan"] in tasks.markdown(third)


def test_held_out_ratio_picks_the_best_fixed_row_on_the_other_rounds():
    """The best fixed row is chosen on the rounds other than the one it is judged in: a row
    that was fastest only by one lucky round does not set the bar in that round."""
    import statistics
    import types

    from hispec_jax.bench import tasks

    def row(name, *seconds):
        return types.SimpleNamespace(name=name, seconds=list(seconds),
                                     tokens_per_second=statistics.median(1 / s for s in seconds))

    steady = row("steady", 1.0, 1.0, 1.0)
    lucky = row("lucky", 0.8, 1.2, 1.2)  # fast in round 0 only
    auto = row("auto", 1.0, 1.0, 1.0)
    # round 0 left out: on rounds 1, 2 steady is best (speed 1 against 0.83); 1.0 / 1.0
    # round 1 left out: on rounds 0, 2 lucky's median speed is (1.25 + 0.83) / 2 = 1.04 > 1,
    #   so lucky is judged in round 1: 1.2 / 1.0; round 2 likewise
    assert tasks.held_out_ratio(auto, [steady, lucky]) == pytest.approx((1.0 + 1.2 + 1.2) / 3)
    assert tasks.held_out_ratio(row("auto", 1.0), [row("a", 1.0)]) is None
    ratios = tasks.auto_ratios([steady, lucky, auto], "auto", ["auto"])
    assert ratios["auto_vs_best_fixed_held_out"] == pytest.approx(3.4 / 3)


def test_greedy_alpha_from_the_exits_choices_is_measure_alpha():
    """calibrate computes greedy acceptance from `exit_choices` (one exit's logits at a time:
    a large vocabulary over many exits does not fit at once): the same numbers."""
    model = tiny_model(4, 1)
    seqs, starts = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25, 26]], [4, 3]
    exits, alpha, total = calibrate.measure_alpha(model, seqs, starts)
    got = calibrate.alpha_from_choices(calibrate.exit_choices(model, seqs), starts)
    assert got[0] == exits and got[2] == total and np.allclose(got[1], alpha)


def test_known_plans_are_always_scored_and_returned_with_the_lookup_under_them():
    """`search(known=...)`: the model's recommended hierarchies come back even when they
    are not among the `top` predicted, alone and with the lookup under them at k and k / 2,
    each priced as `lookup_plans` prices such a plan; a hierarchy with an exit that has no
    head here is skipped."""
    trace = _synthetic_trace(copy=True, agree=True)
    run = latency.simulate_lookup(trace, 8, (24,), ())
    profile = latency.LookupProfile(k=8, rounds=run.rounds, tokens=int(run.emitted),
                                    verified=run.verified, trace=trace)
    alpha = lambda a, b: 0.5
    known = [((8, 24), (7,), False), ((4, 8, 24), (1, 3), False), ((5, 24), (6,), False)]
    plans = search_lib.search((4, 8, 24), alpha, STEP_COSTS, top=1, lookup=profile, known=known)
    names = [p.name() for p in plans]
    for expected in ("layerskip d=8 nd=7", "layerskip d=8 nd=7 + lookup k=8",
                     "layerskip d=8 nd=7 + lookup k=4", "hispec d=4 i=8 nd=1 ni=3",
                     "hispec d=4 i=8 nd=1 ni=3 + lookup k=8"):
        assert names.count(expected) == 1
    assert not any("d=5" in n for n in names)  # exit 5 has no head in this calibration
    by_name = {p.name(): p for p in plans}
    ls = by_name["layerskip d=8 nd=7"]
    assert ls.predicted_tokens_per_second == pytest.approx(
        search_lib.score((8, 24), (7,), alpha, STEP_COSTS).tokens_per_second)
    under = by_name["layerskip d=8 nd=7 + lookup k=4"]
    assert under.predicted_tokens_per_second == pytest.approx(latency.predict_lookup_run(
        latency.simulate_lookup(trace, 4, (8, 24), (7,)), (8, 24), STEP_COSTS).tokens_per_second)
    # without a lookup profile: the exit plans alone
    plain = [p.name() for p in search_lib.search((4, 8, 24), alpha, STEP_COSTS, top=1,
                                                 known=known)]
    assert "layerskip d=8 nd=7" in plain and not any("lookup" in n for n in plain)


def test_tune_scores_the_models_recommended_plans(tmp_path):
    """`tune.recommended_hierarchies`: what a model directory's recommended_plan.json holds,
    as `search`'s `known`; none without the file."""
    from hispec_jax.decoding import recommended
    from hispec_jax.planner import tune as tune_lib

    model = dataclasses.replace(tiny_model(6, 0), path=str(tmp_path))
    assert tune_lib.recommended_hierarchies(model) == []
    recommended.save(str(tmp_path), {
        "layerskip": {"exits": (2, 6), "windows": (3,)},
        "hispec": {"exits": (1, 3, 6), "windows": (2, 4), "adaptive": True}}, "test")
    assert tune_lib.recommended_hierarchies(model) == [((2, 6), (3,), False),
                                                       ((1, 3, 6), (2, 4), True)]


def _halves_trace():
    """4 prompts (first tokens 0..3): halves {0, 1} and {2, 3}; exit 2's choices agree with
    the continuation at 3 of 4 positions in the first half, 1 of 4 in the second."""
    seqs = ((0, 5, 6, 7), (1, 5, 6, 7), (2, 5, 6, 7), (3, 5, 6, 7))
    preds = ((6, 7, 9), (6, 9, 9), (6, 9, 9), (9, 9, 9))  # after positions 1, 2, 3
    return latency.LookupTrace(max_ngram=2, sequences=seqs, starts=(1, 1, 1, 1),
                               predictions=((2, preds),))


def test_trace_halves_and_their_alpha():
    first, second = search_lib.trace_halves(_halves_trace())
    assert [s[0] for s in first.sequences] == [0, 1] and [s[0] for s in second.sequences] == [2, 3]
    assert dict(first.predictions)[2] == ((6, 7, 9), (6, 9, 9))
    # exit 2 against the final layer (4, not in the trace): 2 positions compared per prompt
    assert search_lib.trace_alpha(first)(2, 4) == pytest.approx(3 / 4)
    assert search_lib.trace_alpha(second)(2, 4) == pytest.approx(1 / 4)
    assert search_lib.trace_alpha(first)(2, 2) == 1.0


@pytest.mark.parametrize("halves, chosen, why", [
    ({"a": (3.0, 3.0), "b": (2.5, 2.5), "rec": (2.0, 2.0)}, "a", "held up"),
    ({"a": (3.0, 1.0), "b": (2.5, 2.5), "rec": (2.0, 2.0)}, "b", "held up"),
    ({"a": (3.0, 1.0), "b": (1.0, 2.5), "rec": (2.0, 2.0)}, "rec", "recommended"),
    # faster on both halves, but within the margin: a near tie is noise, the sweep's plan stays
    ({"a": (2.1, 2.1), "b": (2.1, 2.15), "rec": (2.0, 2.0)}, "rec", "recommended")])
def test_a_plan_predicted_above_the_recommended_must_beat_it_on_both_halves(
        monkeypatch, halves, chosen, why):
    """The winner's curse: the best of many noisy predictions is optimistic, so a plan
    ranked above the model's recommended plan is chosen only if it is also predicted
    `HELD_UP_MARGIN` times as fast on each half of the calibration prompts; the first that
    is wins, else the recommended one."""
    plans = [plan_lib.Plan(exits=(e, 8), windows=(n,), predicted_tokens_per_second=t)
             for e, n, t in ((1, 1, 30.0), (2, 2, 25.0), (3, 3, 20.0), (4, 4, 10.0))]
    names = dict(zip(("a", "b", "rec", "other"), plans))
    by_name = {p.name(): key for key, p in names.items()}
    monkeypatch.setattr(search_lib, "rescore", lambda plan, alpha, trace, costs:
                        halves[by_name[plan.name()]][trace.sequences[0][0] // 2])
    got, reason = search_lib.held_up_on_both_halves(plans, {names["rec"].name()},
                                                    _halves_trace(), STEP_COSTS)
    assert got[0] is names[chosen] and why in reason
    assert sorted(p.name() for p in got) == sorted(p.name() for p in plans)
    # nothing known, or too few prompts: the predicted ranking stands
    assert search_lib.held_up_on_both_halves(plans, set(), _halves_trace(), STEP_COSTS)[0] == plans
    short = dataclasses.replace(_halves_trace(), sequences=_halves_trace().sequences[:3])
    assert search_lib.held_up_on_both_halves(plans, {names["rec"].name()}, short,
                                             STEP_COSTS)[0] == plans


@pytest.mark.parametrize("halves, chosen", [
    ({"a": (3.0, 3.0), "b": (2.5, 2.5), "rec": (2.0, 2.0)}, "a"),
    ({"a": (3.0, 1.0), "b": (2.5, 2.4), "rec": (2.0, 2.0)}, "b"),  # a: one lucky half
    ({"a": (3.0, 1.0), "b": (1.0, 2.5), "rec": (2.0, 2.0)}, "rec"),
    ({"a": (1.0, 1.0), "b": (1.0, 1.0), "rec": (1.0, 1.0)}, "a")])  # ties: the ranking's first
def test_worse_half_picks_the_plan_whose_slower_half_is_fastest(monkeypatch, halves, chosen):
    """`best_on_the_worse_half`: every plan re-scored on each half of the calibration
    prompts, the one whose slower half is predicted fastest first; no anchor or margin.
    `choose` dispatches the rules and refuses an unknown one."""
    plans = [plan_lib.Plan(exits=(e, 8), windows=(n,), predicted_tokens_per_second=t)
             for e, n, t in ((1, 1, 30.0), (2, 2, 25.0), (3, 3, 20.0))]
    names = dict(zip(("a", "b", "rec"), plans))
    by_name = {p.name(): key for key, p in names.items()}
    monkeypatch.setattr(search_lib, "rescore", lambda plan, alpha, trace, costs:
                        halves[by_name[plan.name()]][trace.sequences[0][0] // 2])
    got, reason = search_lib.choose(plans, "worse-half", set(), _halves_trace(), STEP_COSTS)
    assert got[0] is names[chosen] and "slower half" in reason
    assert sorted(p.name() for p in got) == sorted(p.name() for p in plans)
    assert search_lib.choose(plans, "prediction", {names["rec"].name()}, _halves_trace(),
                             STEP_COSTS) == (plans, "prediction")
    short = dataclasses.replace(_halves_trace(), sequences=_halves_trace().sequences[:3])
    assert search_lib.best_on_the_worse_half(plans, short, STEP_COSTS)[0] == plans
    with pytest.raises(ValueError, match="not one of prediction, held-up, worse-half"):
        search_lib.choose(plans, "fastest", set(), _halves_trace(), STEP_COSTS)


def test_the_rule_names_outside_the_planner_are_the_planners():
    """The CLI and the task bench name the rules without importing JAX: the same tuple."""
    from hispec_jax.bench import tasks
    from hispec_jax.cli import planner as cli_planner

    assert tasks.CHOICE_RULES == search_lib.CHOICE_RULES
    assert f"choices=({', '.join(repr(r).replace(chr(39), chr(34)) for r in search_lib.CHOICE_RULES)})" \
        in open(cli_planner.__file__).read()


def test_the_anchor_is_the_best_predicted_known_plan_wherever_the_list_puts_it(monkeypatch):
    """`search` returns its top plans, then the best of each kind, then the known plans: a
    known plan listed early as the best of its kind may be predicted below another known
    plan listed later. The anchor is the faster of them, and only plans predicted above it
    must hold up."""
    speeds = {"top": 40.0, "rec_alone": 20.0, "other": 15.0, "rec_lookup": 30.0}
    plans = [plan_lib.Plan(exits=(e, 8), windows=(1,), predicted_tokens_per_second=t)
             for e, t in zip((1, 2, 3, 4), speeds.values())]
    names = dict(zip(speeds, plans))
    known = {names["rec_alone"].name(), names["rec_lookup"].name()}
    monkeypatch.setattr(search_lib, "rescore", lambda plan, alpha, trace, costs:
                        plan.predicted_tokens_per_second)  # the halves agree with the whole
    got, reason = search_lib.held_up_on_both_halves(plans, known, _halves_trace(), STEP_COSTS)
    assert got[0] is names["top"] and "held up" in reason  # 40 >= 1.1 x 30 on both halves
    names["top"] = dataclasses.replace(names["top"], predicted_tokens_per_second=31.0)
    plans[0] = names["top"]
    got, reason = search_lib.held_up_on_both_halves(plans, known, _halves_trace(), STEP_COSTS)
    assert got[0] is names["rec_lookup"] and "recommended" in reason  # 31 < 1.1 x 30
    # the best predicted known plan, listed after the others: chosen, the ranking's own
    slow_top = [dataclasses.replace(names["top"], predicted_tokens_per_second=10.0)] + plans[1:]
    got, reason = search_lib.held_up_on_both_halves(slow_top, known, _halves_trace(), STEP_COSTS)
    assert got[0] is names["rec_lookup"] and reason == "prediction (the model's recommended plan)"
    assert sorted(p.name() for p in got) == sorted(p.name() for p in slow_top)


def test_rescore_is_the_search_score_on_the_whole_trace():
    """On the whole trace, `rescore` of an exit plan is `score` with the trace's alpha, and of
    a lookup plan the replay the search priced."""
    trace = _halves_trace()
    alpha = search_lib.trace_alpha(trace)
    exit_plan = plan_lib.Plan(exits=(2, 4), windows=(2,))
    assert search_lib.rescore(exit_plan, alpha, trace, STEP_COSTS) == pytest.approx(
        search_lib.score((2, 4), (2,), alpha, STEP_COSTS).tokens_per_second)
    looked = plan_lib.Plan(exits=(2, 4), windows=(2,), lookup=4)
    run = latency.simulate_lookup(trace, 4, (2, 4), (2,))
    assert search_lib.rescore(looked, alpha, trace, STEP_COSTS) == pytest.approx(
        latency.predict_lookup_run(run, (2, 4), STEP_COSTS).tokens_per_second)


def test_known_plan_names_are_the_names_of_the_known_plans():
    """`known_plan_names` (what `tune` gives `held_up_on_both_halves`) names exactly the
    plans `known_plans` scores, without scoring them."""
    model = tiny_model(6, 0)
    _, trace = _trace_of(model, PROMPTS, 12)
    profile = latency.LookupProfile(k=8, rounds=1, tokens=1, verified=(0, 1), trace=trace)
    exits = (1, 2, 3, 4, 5, 6)
    known = [((2, 6), (3,), False), ((1, 3, 6), (2, 4), False), ((2, 7), (3,), False)]
    alpha = lambda a, b: 0.5
    for lookup in (profile, None):
        scored = search_lib.known_plans(known, exits, alpha, STEP_COSTS, lookup)
        assert search_lib.known_plan_names(known, exits, lookup) == {p.name() for p in scored}
