"""The predictor's replay of the engine's round (`latency.replay`) against the engine's own
counters, the prompt-lookup drafter (alone and under exits) as a planner candidate: the
search's choice on copy-heavy and open-chat calibrations, plan files and method="auto"."""

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
    return ar, calibrate.measure_trace(model, sequences, [len(p) for p in prompts])


PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 12], [20, 21, 22, 23],
           [30, 31, 30, 31, 30]]


def _counters(stats: dict) -> dict:
    """The engine's counters a replay reproduces."""
    return {"rounds": stats["rounds"], "actions_per_level": stats["actions_per_level"],
            "emitted": stats["emitted_in_loop"],
            "verified": stats["verified_length_histogram"],
            "acceptance": stats["acceptance_rate_per_level"][1:]}


def _replayed(run: latency.Run) -> dict:
    return {"rounds": run.rounds, "actions_per_level": run.actions_per_level(),
            "emitted": round(run.emitted * run.batch), "verified": list(run.verified),
            "acceptance": [a / p if p else None for a, p in zip(run.accepted[1:],
                                                                run.proposed[1:])]}


LAYERSKIP = dict(method="layerskip", draft_exit=2, draft_len=3)
HISPEC = dict(method="hispec", draft_exit=1, verify_exits=(3,), draft_len=2, verify_window=4)


@pytest.mark.parametrize("always_agree,exits,windows,lookup,options,batch", [
    # any model: LayerSkip (a draft after a rejected one is discarded unread; the lookup
    # alone: `test_the_replay_of_lookup_alone_is_the_measured_profile`)
    (False, (2, 6), (3,), 0, LAYERSKIP, 1),
    (False, (2, 6), (3,), 0, LAYERSKIP, 2),
    # the always-agree model: every level above the drafter keeps only correct tokens
    (True, (1, 3, 6), (2, 4), 0, HISPEC, 1),
    (True, (2, 6), (3,), 4, dict(LAYERSKIP, lookup=4), 1),
    (True, (1, 3, 6), (2, 4), 4, dict(HISPEC, lookup=4), 2)])
def test_the_replay_counts_what_the_engine_counts(always_agree, exits, windows, lookup, options,
                                                  batch):
    """The compiled engine and the replay on the same trace (the model's greedy
    continuations and its exits' choices along them): the same rounds, passes per level,
    tokens accepted per level, tokens emitted, verified lengths and work per token."""
    from hispec_jax.decoding import generate as generate_lib

    model = tiny_model(6, 1, layer_scale=0.0 if always_agree else 1.0)
    ar, trace = _trace_of(model, PROMPTS, 20)
    run = latency.replay(trace, exits, windows, lookup, batch)
    got = generate_lib.generate(model, PROMPTS, max_new_tokens=20, ignore_eos=True,
                                batch_size=batch, **options)
    assert got.token_ids == ar.token_ids
    assert run.proposed[1] > 0
    assert _replayed(run) == _counters(got.stats)
    work = latency.price(run, latency.work_costs(model))
    assert work.seconds_per_token == pytest.approx(got.stats["work_per_token"])


def test_replays_of_one_plan_shape_share_one_program_and_count_passes_by_block():
    """The trace model numbers its exits 1..K: plans that differ only in their exits replay
    on one compiled program (their tables differ), and the engine's passes by block add
    up to its passes per level."""
    from hispec_jax.decoding import generate as generate_lib
    from hispec_jax.decoding.engine import compile_cache

    model = tiny_model(6, 1)
    _, trace = _trace_of(model, PROMPTS, 20)
    latency.replay(trace, (2, 6), (3,), lookup=4)
    before = compile_cache.compilations
    for exits in ((1, 6), (3, 6), (5, 6)):
        run = latency.replay(trace, exits, (3,), lookup=4)
        assert sum(n for (level, _), n in run.passes if level == 2) == run.actions_per_level()[2]
    assert compile_cache.compilations == before
    stats = generate_lib.generate(model, PROMPTS, max_new_tokens=20, ignore_eos=True,
                                  **dict(LAYERSKIP, lookup=4)).stats
    assert [sum(per.values()) for per in stats["passes_per_block"][1:]] == \
        stats["actions_per_level"][1:]
    assert set(stats["passes_per_block"][1]) <= {1, 2, 4}  # the lookup's power-of-two blocks


def test_the_replay_of_lookup_alone_is_the_measured_profile():
    """`measure_lookup`'s run of `method="lookup"` is what the replay counts."""
    model = tiny_model(4, 1)
    _, trace = _trace_of(model, PROMPTS, 16)
    measured = calibrate.measure_lookup(model, PROMPTS, 8, 16)
    run = latency.replay(trace, (4,), (), lookup=8)
    assert (run.rounds, run.emitted, run.verified) == (measured.rounds, measured.tokens,
                                                       measured.verified)
    profile = dataclasses.replace(measured, trace=trace)
    assert latency.LookupProfile.from_json(json.loads(json.dumps(profile.to_json()))) == profile


# Synthetic calibrations (L = 24, exits 4 and 8): a continuation that copies its prompt in
# runs of 12 tokens (one new token between runs) or one that copies nothing; exits whose
# choices are the continuation's (agree) or random (disagree).
def _synthetic_trace(copy: bool, agree: bool, prompts: int = 2, new_tokens: int = 48):
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

    return latency.Trace(
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
    run = latency.replay(trace, (24,), (), lookup=8)
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


def test_lookup_under_exit_plans_carry_the_replayed_work():
    """A plan's predicted work per token is its replayed loop's, in layer equivalents."""
    model = tiny_model(6, 0, layer_scale=0.0)
    _, trace = _trace_of(model, PROMPTS, 20)
    profile = latency.LookupProfile(k=4, rounds=1, tokens=1, verified=(0, 1), trace=trace)
    work = latency.work_costs(model)
    plans = search_lib.lookup_plans(tuple(range(1, 7)), STEP_COSTS, profile, work=work,
                                    draft_lens=(2, 3))
    plan = next(p for p in plans if p.kind == "hispec+lookup")
    run = latency.replay(trace, plan.exits, plan.windows, plan.lookup)
    assert plan.predicted_work_per_token == pytest.approx(latency.price(run, work).seconds_per_token)
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
    monkeypatch.setattr("hispec_jax.planner.plan.cache_dir", lambda: tmp_path / "plans")
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
    run = latency.replay(trace, (24,), (), lookup=8)
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
        latency.predict((8, 24), (7,), [0.5], STEP_COSTS).tokens_per_second)
    under = by_name["layerskip d=8 nd=7 + lookup k=4"]
    assert under.predicted_tokens_per_second == pytest.approx(latency.price(
        latency.replay(trace, (8, 24), (7,), 4), STEP_COSTS).tokens_per_second)
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
