"""Exhaustive search over exits and windows with the latency model (HSD, SPEC section 5).

    K = 1   AR
    K = 2   LayerSkip: every exit d < L with a head, Nd in `draft_lens`
    K = 3   HiSpec: every pair d < i < L, Nd in `draft_lens`, Ni in `verify_windows`
    K = 4   (max_levels >= 4) a coarse grid: exits from `coarse_exits`, Nd in 1..3,
            windows in {2, 4, 8}

    lookup  with a calibrated `LookupProfile`: the prompt-lookup drafter alone, and as
            level 0 under LayerSkip / HiSpec exits (`lookup_plans`: simulated on the
            calibration continuations, `latency.simulate_lookup`)

The plan chosen is the best predicted (`choose`, rule "prediction"); rule "held-up"
(`held_up_on_both_halves`, the default until 2026-11-27) keeps the model's recommended plan
unless a plan predicted above it is also predicted 10 % faster on each half of the
calibration prompts, rule "worse-half" (`best_on_the_worse_half`) takes the best prediction
on the slower half.

Batch 1 ranks with the exact renewal formulas (`latency.predict`). At larger batches the
best `rescore` candidates (and K >= 4 ones) are re-scored with the engine-faithful
simulator, which sees the "sync" schedule; adaptive (App. J) windows are scored by
simulation for the best exits of K = 2 and K = 3. A few thousand candidates take seconds.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Sequence

import numpy as np

from hispec_jax.decoding import options as options_lib
from hispec_jax.planner import latency
from hispec_jax.planner.latency import Costs
from hispec_jax.planner.plan import Plan

AlphaFn = Callable[[int, int], float]


def score(exits, windows, alpha: AlphaFn, costs: Costs, *, adaptive: bool = False,
          simulate: bool = False, rounds: int = 3000) -> latency.Prediction:
    alphas = latency.level_alphas(tuple(exits), alpha)
    if adaptive or simulate:
        return latency.simulate(tuple(exits), tuple(windows), alphas, costs, rounds=rounds,
                                adaptive=adaptive)
    return latency.predict(tuple(exits), tuple(windows), alphas, costs)


def _plan(exits, windows, pred: latency.Prediction, ar_tps: float, adaptive=False,
          alpha: AlphaFn | None = None, work: Costs | None = None) -> Plan:
    plan = Plan(exits=tuple(exits), windows=tuple(windows), adaptive=adaptive,
                predicted_tokens_per_second=pred.tokens_per_second,
                predicted_speedup=pred.tokens_per_second / ar_tps,
                tokens_per_round=pred.tokens_per_round)
    return with_work(plan, alpha, work) if work is not None else plan


def with_work(plan: Plan, alpha: AlphaFn, work: Costs) -> Plan:
    """`plan` with its predicted work per token (`work`: `latency.work_costs`)."""
    per_token = score(plan.exits, plan.windows, alpha, work,
                      adaptive=plan.adaptive).seconds_per_token
    ar = latency.predict((plan.exits[-1],), (), [], work).seconds_per_token
    return dataclasses.replace(plan, predicted_work_per_token=per_token,
                               predicted_work_speedup=ar / per_token)


def search(exits: Sequence[int], alpha: AlphaFn, costs: Costs, *, max_levels: int = 3,
           draft_lens: Sequence[int] = range(1, 9), verify_windows: Sequence[int] = range(2, 17),
           coarse_exits: Sequence[int] | None = None, adaptive: bool = True,
           rescore: int = 24, top: int = 8, work: Costs | None = None,
           lookup: latency.LookupProfile | None = None,
           known: Sequence[tuple[tuple[int, ...], tuple[int, ...], bool]] = ()) -> list[Plan]:
    """Plans ranked by predicted tokens/s (best first), at most `top`, always followed by
    the best plan of each kind (`Plan.kind`: AR, LayerSkip, HiSpec, lookup, LayerSkip +
    lookup, HiSpec + lookup) when it is not among them, then by the `known` plans when
    they are not among them either.

    Args:
      exits: exits with a head, ascending; the last is the final layer L.
      alpha: alpha(a, b), acceptance of exit a's tokens by exit b.
      costs: measured costs (their batch size is the plans').
      work: `latency.work_costs` of the model: each plan also gets its predicted work per
        token (hardware-free; the ranking stays by predicted tokens/s).
      lookup: what `method="lookup"` did on the calibration prompts, with the trace the
        lookup under exits is simulated on (`lookup_plans`; None: no lookup candidate).
      known: (exits, windows, adaptive) hierarchies that are always scored and returned,
        the model's recommended plans (`decoding/recommended.py`): a coarse search grid
        or a small calibration sample must not hide the plan a recorded sweep chose, and
        `tune --verify` times it beside the predicted best. Each is scored alone and, with
        a lookup profile, with the lookup under it (`known_plans`).
    """
    plans = _search_exits(exits, alpha, costs, max_levels=max_levels, draft_lens=draft_lens,
                          verify_windows=verify_windows, coarse_exits=coarse_exits,
                          adaptive=adaptive, rescore=rescore, top=top, work=work)
    extra = known_plans(known, exits, alpha, costs, lookup, work=work)
    if lookup is not None:
        looked = lookup_plans(exits, costs, lookup, work=work, draft_lens=draft_lens,
                              max_levels=max_levels)
        # (a stable sort: a tie keeps the exit plan, AR first, ahead of lookup)
        ranked = sorted(plans + looked, key=lambda p: -p.predicted_tokens_per_second)
        plans = ranked[:top]
        for plan in ranked[top:]:  # the best of each kind, for the side-by-side table
            if all(p.kind != plan.kind for p in plans):
                plans.append(plan)
    names = {p.name() for p in plans}
    return plans + [p for p in extra if p.name() not in names]


def known_plans(known, exits: Sequence[int], alpha: AlphaFn, costs: Costs,
                lookup: latency.LookupProfile | None, *, work: Costs | None = None
                ) -> list[Plan]:
    """`search`'s `known` hierarchies as plans, best first: each (exits, windows, adaptive)
    whose exits all have a head here (and end at L) scored as it is and, when `lookup` has
    a trace with every exit below L in it, with the lookup drafter under it at k and at
    `options.lookup_under_exits(k)` (as `lookup_plans`; those run fixed windows, the
    replay has no adaptive ones). Others are skipped."""
    ar_tps = latency.predict((exits[-1],), (), [], costs).tokens_per_second
    out = []
    for hierarchy, windows, adaptive, ks in _known_entries(known, exits, lookup):
        pred = score(hierarchy, windows, alpha, costs, adaptive=adaptive,
                     simulate=costs.batch > 1)
        out.append(_plan(hierarchy, windows, pred, ar_tps, adaptive, alpha, work))
        out += [_lookup_plan(lookup.trace, hierarchy, windows, k, costs, ar_tps, work)
                for k in ks]
    return sorted(out, key=lambda p: -p.predicted_tokens_per_second)


def known_plan_names(known, exits: Sequence[int],
                     lookup: latency.LookupProfile | None) -> set[str]:
    """The names of the plans `known_plans` returns, without scoring them."""
    names = set()
    for hierarchy, windows, adaptive, ks in _known_entries(known, exits, lookup):
        plan = Plan(exits=hierarchy, windows=windows, adaptive=adaptive)
        names |= {plan.name()} | {dataclasses.replace(plan, lookup=k).name() for k in ks}
    return names


def _known_entries(known, exits: Sequence[int], lookup: latency.LookupProfile | None):
    """(hierarchy, windows, adaptive, the lookup's k to put under it) of every `known`
    hierarchy that ends at L with a head at each exit; no k without a trace holding every
    exit below L."""
    L = exits[-1]
    trace = lookup.trace if lookup is not None else None
    traced = dict(trace.predictions) if trace is not None else {}
    for hierarchy, windows, adaptive in known:
        hierarchy, windows = tuple(hierarchy), tuple(windows)
        if (hierarchy[-1] != L or len(windows) != len(hierarchy) - 1
                or any(e not in exits for e in hierarchy)):
            continue
        ks = (_lookup_ks(lookup.k) if trace is not None
              and all(e in traced for e in hierarchy[:-1]) else [])
        yield hierarchy, windows, adaptive, ks


LOOKUP_HISPEC_WINDOWS = ((1, 4), (2, 4), (2, 8), (4, 8))  # (Nd, Ni) under HiSpec
LOOKUP_EXITS_KEPT = 3  # the draft exits of LayerSkip + lookup swept over every Nd


def lookup_plans(exits: Sequence[int], costs: Costs, lookup: latency.LookupProfile, *,
                 work: Costs | None = None, draft_lens: Sequence[int] = range(1, 9),
                 max_levels: int = 3) -> list[Plan]:
    """The prompt-lookup drafter's plans, best first: alone (`latency.predict_lookup` on
    its measured run, at the profile's k) and, when the profile has a trace, under exits
    (`latency.simulate_lookup`) at that k and at half of it: LayerSkip + lookup over every
    draft exit at Nd = 2, the best `LOOKUP_EXITS_KEPT` (exit, k) of them over every Nd;
    HiSpec + lookup (max_levels >= 3) from the best two draft exits, at both k, with
    intermediate exits above them (at most six, evenly spread) and `LOOKUP_HISPEC_WINDOWS`.

    Half k: `options.lookup_under_exits` (passes above the lookup grow with its k)."""
    L = exits[-1]
    ar_tps = latency.predict((L,), (), [], costs).tokens_per_second
    pred = latency.predict_lookup(lookup, costs, L)
    alone = dataclasses.replace(_plan((L,), (), pred, ar_tps), lookup=lookup.k)
    if work is not None:  # a full pass (layers and head) per verification, any block
        per_token = latency.predict_lookup(lookup, dataclasses.replace(work, batch=costs.batch),
                                           L).seconds_per_token
        alone = dataclasses.replace(alone, predicted_work_per_token=per_token,
                                    predicted_work_speedup=work.stage(0, L, 1) / per_token)
    plans = [alone]
    trace = lookup.trace
    lower = [e for e in exits if e < L and e in dict(trace.predictions)] if trace else []
    if not lower:
        return plans

    def plan(hierarchy: tuple[int, ...], windows: tuple[int, ...], k: int) -> Plan:
        return _lookup_plan(trace, hierarchy, windows, k, costs, ar_tps, work)

    ks = _lookup_ks(lookup.k)
    first = sorted((plan((d, L), (2,), k) for d in lower for k in ks),
                   key=lambda p: -p.predicted_tokens_per_second)
    kept = [(p.exits[0], p.lookup) for p in first[:LOOKUP_EXITS_KEPT]]
    layerskip = first + [plan((d, L), (nd,), k) for d, k in kept for nd in draft_lens if nd != 2]
    plans += layerskip
    if max_levels >= 3:
        for d in list(dict.fromkeys(p.exits[0] for p in first))[:2]:
            above = [e for e in lower if e > d]
            above = [above[i] for i in sorted({round(j * (len(above) - 1) / 5)
                                               for j in range(6)})] if len(above) > 6 else above
            plans += [plan((d, i, L), w, k) for i in above for w in LOOKUP_HISPEC_WINDOWS
                      for k in ks]
    return sorted(plans, key=lambda p: -p.predicted_tokens_per_second)


def _lookup_ks(k: int) -> list[int]:
    """The lookup's k tried under exits: k and `options.lookup_under_exits(k)`, largest first."""
    return sorted({k, options_lib.lookup_under_exits(k)}, reverse=True)


def _lookup_plan(trace: latency.LookupTrace, hierarchy: tuple[int, ...],
                 windows: tuple[int, ...], k: int, costs: Costs, ar_tps: float,
                 work: Costs | None) -> Plan:
    """The lookup drafter at `k` under `hierarchy`, replayed on `trace`
    (`latency.simulate_lookup`) and priced at `costs` (and `work`)."""
    L = hierarchy[-1]
    run = latency.simulate_lookup(trace, k, hierarchy, windows, batch=costs.batch)
    p = dataclasses.replace(_plan(hierarchy, windows,
                                  latency.predict_lookup_run(run, hierarchy, costs), ar_tps),
                            lookup=k)
    if work is None:
        return p
    per_token = latency.predict_lookup_run(run, hierarchy, work).seconds_per_token
    return dataclasses.replace(p, predicted_work_per_token=per_token,
                               predicted_work_speedup=work.stage(0, L, 1) / per_token)


def _search_exits(exits, alpha, costs, *, max_levels, draft_lens, verify_windows, coarse_exits,
                  adaptive, rescore, top, work=None) -> list[Plan]:
    """`search` over exit hierarchies (AR, LayerSkip, HiSpec, K >= 4)."""
    L = exits[-1]
    lower = [e for e in exits if e < L]
    ar = latency.predict((L,), (), [], costs)
    ar_tps = ar.tokens_per_second
    scored: list[tuple[float, tuple, tuple, bool]] = [(ar_tps, (L,), (), False)]
    for d in lower:
        for nd in draft_lens:
            p = score((d, L), (nd,), alpha, costs)
            scored.append((p.tokens_per_second, (d, L), (nd,), False))
    if max_levels >= 3:
        for d, i in itertools.combinations(lower, 2):
            for nd in draft_lens:
                for ni in verify_windows:
                    p = score((d, i, L), (nd, ni), alpha, costs)
                    scored.append((p.tokens_per_second, (d, i, L), (nd, ni), False))
    batch = costs.batch > 1
    if max_levels >= 4:
        coarse = list(coarse_exits) if coarse_exits is not None else [
            e for e in lower if e <= L // 2 and e % 2 == 0] or lower
        for a, b, c in itertools.combinations(coarse, 3):
            for nd, n2, n3 in itertools.product((1, 2, 3), (2, 4, 8), (2, 4, 8)):
                p = score((a, b, c, L), (nd, n2, n3), alpha, costs, simulate=True, rounds=600)
                scored.append((p.tokens_per_second, (a, b, c, L), (nd, n2, n3), False))
    scored.sort(key=lambda s: -s[0])
    if batch:  # the exact formulas are batch-1 formulas: re-score the front by simulation
        front = [s for s in scored[:rescore] if len(s[1]) > 1]
        rest = [s for s in scored[rescore:]]
        front = [(score(e, w, alpha, costs, simulate=True).tokens_per_second, e, w, a)
                 for _, e, w, a in front]
        scored = sorted(front + [s for s in scored[:rescore] if len(s[1]) == 1], key=lambda s: -s[0]) + rest
    if adaptive:
        for K in (2, 3):
            best = next((s for s in scored if len(s[1]) == K), None)
            if best is not None:
                init = (2,) if K == 2 else (2, 4)
                p = score(best[1], init, alpha, costs, adaptive=True)
                scored.append((p.tokens_per_second, best[1], init, True))
        scored.sort(key=lambda s: -s[0])
    plans, seen = [], set()
    for tps, e, w, a in scored:
        if (e, w, a) in seen:
            continue
        seen.add((e, w, a))
        pred = score(e, w, alpha, costs, adaptive=a, simulate=batch and len(e) > 1) \
            if len(plans) < top else None
        if pred is None:
            break
        plans.append(_plan(e, w, pred, ar_tps, a, alpha, work))
    for K in (1, 2, 3):  # the best of each kind, for the side-by-side table
        if any(len(p.exits) == K or (K == 3 and len(p.exits) > 3) for p in plans):
            continue
        best = next((s for s in scored if len(s[1]) == K), None)
        if best is not None:
            _, e, w, a = best
            plans.append(_plan(e, w, score(e, w, alpha, costs, adaptive=a,
                                           simulate=batch and len(e) > 1), ar_tps, a,
                               alpha, work))
    return plans


def best_of_kind(plans: list[Plan], kind: str) -> Plan | None:
    """The first plan of `kind` (`Plan.kind`: "layerskip" is LayerSkip without lookup)."""
    return next((p for p in plans if p.kind == kind), None)


def with_prediction(plan: Plan, alpha: AlphaFn, costs: Costs) -> Plan:
    """`plan` re-scored (e.g. for another batch size's costs)."""
    ar = latency.predict((plan.exits[-1],), (), [], costs).tokens_per_second
    pred = score(plan.exits, plan.windows, alpha, costs, adaptive=plan.adaptive,
                 simulate=costs.batch > 1 and len(plan.exits) > 1)
    return dataclasses.replace(plan, predicted_tokens_per_second=pred.tokens_per_second,
                               predicted_speedup=pred.tokens_per_second / ar,
                               tokens_per_round=pred.tokens_per_round)


# ----------------------------------------------------------- choosing among close plans
def trace_halves(trace: latency.LookupTrace) -> list[latency.LookupTrace]:
    """The calibration trace split into its first and second half of prompts (each with
    every exit's choices on them): two independent samples of the same workload."""
    n = len(trace.sequences)
    halves = []
    for part in (range(0, n // 2), range(n // 2, n)):
        halves.append(latency.LookupTrace(
            max_ngram=trace.max_ngram, sequences=tuple(trace.sequences[i] for i in part),
            starts=tuple(trace.starts[i] for i in part),
            predictions=tuple((e, tuple(per[i] for i in part)) for e, per in trace.predictions)))
    return halves


def trace_alpha(trace: latency.LookupTrace) -> AlphaFn:
    """Greedy alpha(a, b) on `trace`'s continuations: how often exit a's choice after a
    position equals exit b's (the final layer's: the next token of the sequence)."""
    preds = dict(trace.predictions)

    def choices(e):  # the final layer is the exit the trace has no choices for
        if e in preds:
            return np.concatenate([np.asarray(c[:len(s) - p - 1], np.int64)
                                   for c, s, p in zip(preds[e], trace.sequences, trace.starts)])
        return np.concatenate([np.asarray(s[p + 1:], np.int64)
                               for s, p in zip(trace.sequences, trace.starts)])

    cache: dict = {}

    def alpha(a: int, b: int) -> float:
        for e in (a, b):
            if e not in cache:
                cache[e] = choices(e)
        x, y = cache[a], cache[b]
        return float(np.mean(x == y)) if len(x) else 0.0

    return alpha


def rescore(plan: Plan, alpha: AlphaFn, trace: latency.LookupTrace, costs: Costs) -> float:
    """`plan`'s predicted tokens/s with acceptance and lookup replays from `alpha` and
    `trace` (e.g. one half of the calibration prompts) at `costs`."""
    if plan.lookup:
        run = latency.simulate_lookup(trace, plan.lookup, plan.exits, plan.windows,
                                      batch=costs.batch)
        return latency.predict_lookup_run(run, plan.exits, costs).tokens_per_second
    return score(plan.exits, plan.windows, alpha, costs, adaptive=plan.adaptive,
                 simulate=costs.batch > 1).tokens_per_second


# How much faster than the recommended plan a plan must be predicted on each half of the
# calibration prompts to replace it: the halves share the cost model, so a margin covers
# what they cannot (on this CPU the stage and loop timings of one calibration move by 10-20 %
# between runs; BENCHMARKS.md "`method="auto"` by prediction").
HELD_UP_MARGIN = 1.10


def held_up_on_both_halves(plans: list[Plan], known: set[str], trace: latency.LookupTrace | None,
                           costs: Costs) -> tuple[list[Plan], str]:
    """`plans` (best predicted first) with the chosen plan first, and why.

    The prediction ranks plans on a few calibration prompts, and the best of many noisy
    estimates is optimistic (the winner's curse): on the default model's chat prompts the
    planner's pick, LayerSkip at exit 7 + lookup, was predicted 11-24 % above the model's
    recommended plans with the lookup and ran 3-12 % below the best of them (BENCHMARKS.md
    "`method="auto"` by prediction"). So a plan predicted above the best of the `known`
    plans (the model's recommended hierarchies, alone and with the lookup, chosen by a
    larger recorded sweep) is chosen only if it is also predicted at least
    `HELD_UP_MARGIN` times as fast as that plan on each half of the calibration prompts,
    scored alone; the first such plan by prediction wins, else the known plan does.
    Without known plans, a trace (the replays and per-prompt choices live there) or at
    least 4 prompts, the ranking stands."""
    known_here = [p for p in plans if p.name() in known]
    if not known_here or trace is None or len(trace.sequences) < 4 or not plans:
        return plans, "prediction"
    # (`search` lists the top plans, then the best of each kind, then the known plans:
    # not one ranking, so the anchor and its rivals are picked by their predictions)
    speed = lambda p: p.predicted_tokens_per_second
    anchor = max(known_here, key=speed)
    above = sorted((p for p in plans if speed(p) > speed(anchor)), key=lambda p: -speed(p))
    if not above:
        return ([anchor] + [p for p in plans if p is not anchor],
                "prediction (the model's recommended plan)")
    halves = [(trace_alpha(h), h) for h in trace_halves(trace)]
    anchor_scores = [rescore(anchor, a, h, costs) for a, h in halves]
    for plan in above:
        if all(rescore(plan, a, h, costs) >= HELD_UP_MARGIN * s
               for (a, h), s in zip(halves, anchor_scores)):
            chosen, why = plan, "prediction, held up on both halves of the calibration prompts"
            break
    else:
        chosen = anchor
        why = (f"the model's recommended plan: no plan predicted faster was predicted "
               f"{HELD_UP_MARGIN:.2f}x as fast on both halves of the calibration prompts "
               f"(best predicted: {plans[0].name()})")
    return [chosen] + [p for p in plans if p is not chosen], why


def best_on_the_worse_half(plans: list[Plan], trace: latency.LookupTrace | None,
                           costs: Costs) -> tuple[list[Plan], str]:
    """`plans` with the plan whose *slower* half of the calibration prompts is predicted
    fastest first (each plan re-scored alone on each half, `rescore`), and why.

    A plan that wins the whole calibration on one lucky half (the lookup on prompts that
    happen to quote their passage, an exit on prompts it happens to agree on) loses here to
    one that is good on both; no anchor, no margin. Without a trace or with fewer than 4
    prompts, the ranking stands."""
    if trace is None or len(trace.sequences) < 4 or not plans:
        return plans, "prediction"
    halves = [(trace_alpha(h), h) for h in trace_halves(trace)]
    worse = {p.name(): min(rescore(p, a, h, costs) for a, h in halves) for p in plans}
    chosen = max(plans, key=lambda p: worse[p.name()])  # (the first of equals: the ranking's)
    why = (f"prediction on the slower half of the calibration prompts "
           f"({worse[chosen.name()]:.1f} tokens/s; best predicted on all: {plans[0].name()})")
    return [chosen] + [p for p in plans if p is not chosen], why


# How `tune` picks among its plans (greedy tunes with a lookup trace), the first the
# default: "prediction" the predicted ranking as it is, "held-up" `held_up_on_both_halves`
# (the default until 2026-11-27: its anchor cost 4-19 % on the long-prompt tasks with 16
# calibration prompts, BENCHMARKS.md "auto's choice rules and a cost per pass"),
# "worse-half" `best_on_the_worse_half`.
CHOICE_RULES = ("prediction", "held-up", "worse-half")


def choose(plans: list[Plan], rule: str, known: set[str], trace: latency.LookupTrace | None,
           costs: Costs) -> tuple[list[Plan], str]:
    """`plans` (best predicted first) with `rule`'s choice first, and why (`CHOICE_RULES`)."""
    if rule == "held-up":
        return held_up_on_both_halves(plans, known, trace, costs)
    if rule == "worse-half":
        return best_on_the_worse_half(plans, trace, costs)
    if rule == "prediction":
        return plans, "prediction"
    raise ValueError(f"choice rule {rule!r} is not one of {', '.join(CHOICE_RULES)}")
