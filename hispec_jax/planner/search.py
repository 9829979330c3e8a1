"""Exhaustive search over exits and windows with the predictor (HSD, docs/algorithms.md).

    K = 1   AR
    K = 2   LayerSkip: every exit d < L with a head, Nd in `draft_lens`
    K = 3   HiSpec: every pair d < i < L, Nd in `draft_lens`, Ni in `verify_windows`
    K = 4   (max_levels >= 4) a coarse grid: exits from `coarse_exits`, Nd in 1..3,
            windows in {2, 4, 8}
    lookup  with a calibrated `LookupProfile`: the prompt-lookup drafter alone, and as
            level 0 under LayerSkip / HiSpec exits (`lookup_plans`)

Every exit hierarchy is ranked by the renewal formulas (`latency.predict`, tens of
thousands of candidates in seconds); the front of that ranking is then scored by
`latency.Predictor`, which replays the calibration trace where the formulas do not hold
(batches, K >= 4). The lookup plans are always replayed. The plan chosen is the best
predicted; `tune --verify` times the printed plans and keeps the fastest measured.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

from hispec_jax.decoding import options as options_lib
from hispec_jax.planner import latency
from hispec_jax.planner.latency import AlphaFn, Costs
from hispec_jax.planner.plan import Plan

LOOKUP_HISPEC_WINDOWS = ((1, 4), (2, 4), (2, 8), (4, 8))  # (Nd, Ni) under HiSpec
LOOKUP_EXITS_KEPT = 3  # the draft exits of LayerSkip + lookup swept over every Nd


def scored_plan(predictor: latency.Predictor, exits, windows=(), lookup: int = 0) -> Plan:
    """The hierarchy as a `Plan` with `predictor`'s prediction (and work per token)."""
    exits, windows = tuple(exits), tuple(windows)
    pred, work = predictor(exits, windows, lookup)
    ar, ar_work = predictor((exits[-1],), ())
    return Plan(exits=exits, windows=windows, lookup=lookup,
                predicted_tokens_per_second=pred.tokens_per_second,
                predicted_speedup=pred.tokens_per_second / ar.tokens_per_second,
                tokens_per_round=pred.tokens_per_round, predicted_work_per_token=work,
                predicted_work_speedup=ar_work / work if work is not None else None)


def search(exits: Sequence[int], alpha: AlphaFn, costs: Costs, *, max_levels: int = 3,
           draft_lens: Sequence[int] = range(1, 9), verify_windows: Sequence[int] = range(2, 17),
           coarse_exits: Sequence[int] | None = None, rescore: int = 24, top: int = 8,
           work: Costs | None = None, lookup: latency.LookupProfile | None = None,
           known: Sequence[tuple[tuple[int, ...], tuple[int, ...], bool]] = ()) -> list[Plan]:
    """Plans ranked by predicted tokens/s (best first), at most `top`, always followed by
    the best plan of each kind (`Plan.kind`: AR, LayerSkip, HiSpec, lookup, LayerSkip +
    lookup, HiSpec + lookup) when it is not among them, then by the `known` plans when
    they are not among them either.

    Args:
      exits: exits with a head, ascending; the last is the final layer L.
      alpha: alpha(a, b), acceptance of exit a's tokens by exit b.
      costs: measured costs (their batch size is the plans').
      rescore: how many of the formulas' best exit hierarchies the predictor scores.
      work: `latency.work_costs` of the model: each plan also gets its predicted work per
        token (hardware-free; the ranking stays by predicted tokens/s).
      lookup: what `method="lookup"` did on the calibration prompts, with the trace the
        predictor replays (None: no lookup candidate, and the formulas alone).
      known: (exits, windows, adaptive) hierarchies that are always scored and returned,
        the model's recommended plans (`decoding/recommended.py`): a coarse search grid
        or a small calibration sample must not hide the plan a recorded sweep chose, and
        `tune --verify` times it beside the predicted best. Each is scored alone and, with
        a trace, with the lookup under it (`known_plans`).
    """
    trace = lookup.trace if lookup is not None else None
    predictor = latency.Predictor(alpha, costs, trace, work)
    plans = _exit_plans(exits, predictor, max_levels=max_levels, draft_lens=draft_lens,
                        verify_windows=verify_windows, coarse_exits=coarse_exits,
                        rescore=rescore)
    if lookup is not None:
        plans += lookup_plans(exits, costs, lookup, work=work, draft_lens=draft_lens,
                              max_levels=max_levels)
    # (a stable sort: a tie keeps the exit plan, AR first, ahead of lookup)
    ranked = sorted(plans, key=lambda p: -p.predicted_tokens_per_second)
    chosen = ranked[:top]
    for plan in ranked[top:]:  # the best of each kind, for the side-by-side table
        if all(p.kind != plan.kind for p in chosen):
            chosen.append(plan)
    names = {p.name() for p in chosen}
    return chosen + [p for p in known_plans(known, exits, predictor, lookup)
                     if p.name() not in names]


def _exit_plans(exits, predictor: latency.Predictor, *, max_levels, draft_lens,
                verify_windows, coarse_exits, rescore) -> list[Plan]:
    """AR, LayerSkip, HiSpec and (max_levels >= 4) K = 4 hierarchies: all ranked by the
    formulas, the best `rescore` and the best of each K scored by the predictor."""
    L = exits[-1]
    lower = [e for e in exits if e < L]
    candidates = [((L,), ())]
    candidates += [((d, L), (nd,)) for d in lower for nd in draft_lens]
    if max_levels >= 3:
        candidates += [((d, i, L), (nd, ni)) for d, i in itertools.combinations(lower, 2)
                       for nd in draft_lens for ni in verify_windows]
    if max_levels >= 4:
        coarse = list(coarse_exits) if coarse_exits is not None else [
            e for e in lower if e <= L // 2 and e % 2 == 0] or lower
        candidates += [((a, b, c, L), w) for a, b, c in itertools.combinations(coarse, 3)
                       for w in itertools.product((1, 2, 3), (2, 4, 8), (2, 4, 8))]
    formulas = dataclasses.replace(predictor, trace=None, work=None)
    ranked = sorted(candidates, key=lambda c: -formulas(*c)[0].tokens_per_second)
    front = ranked[:rescore]
    for K in sorted({len(e) for e, _ in candidates}):  # the best of each K, for the table
        best = next(c for c in ranked if len(c[0]) == K)
        if best not in front:
            front.append(best)
    predictor.prepare([(e, w, 0) for e, w in front])
    return [scored_plan(predictor, e, w) for e, w in front]


def known_plans(known, exits: Sequence[int], predictor: latency.Predictor,
                lookup: latency.LookupProfile | None) -> list[Plan]:
    """`search`'s `known` hierarchies as plans, best first: each (exits, windows, adaptive)
    with fixed windows whose exits all have a head here (and end at L) scored as it is and,
    when the predictor has a trace with every exit below L in it, with the lookup drafter
    under it at k and at `options.lookup_under_exits(k)` (as `lookup_plans`). Adaptive
    windows are not predicted: such an entry is skipped, as is one that does not fit."""
    L = exits[-1]
    traced = dict(predictor.trace.predictions) if predictor.trace is not None else {}
    out = []
    for hierarchy, windows, adaptive in known:
        hierarchy, windows = tuple(hierarchy), tuple(windows)
        if (adaptive or hierarchy[-1] != L or len(windows) != len(hierarchy) - 1
                or any(e not in exits for e in hierarchy)):
            continue
        out.append(scored_plan(predictor, hierarchy, windows))
        if lookup is not None and traced and all(e in traced for e in hierarchy[:-1]):
            out += [scored_plan(predictor, hierarchy, windows, k) for k in _lookup_ks(lookup.k)]
    return sorted(out, key=lambda p: -p.predicted_tokens_per_second)


def lookup_plans(exits: Sequence[int], costs: Costs, lookup: latency.LookupProfile, *,
                 work: Costs | None = None, draft_lens: Sequence[int] = range(1, 9),
                 max_levels: int = 3) -> list[Plan]:
    """The prompt-lookup drafter's plans, best first, each replayed on the profile's trace:
    alone at the profile's k and, under exits, at that k and at half of it: LayerSkip +
    lookup over every draft exit at Nd = 2, the best `LOOKUP_EXITS_KEPT` (exit, k) of them
    over every Nd; HiSpec + lookup (max_levels >= 3) from the best two draft exits, at both
    k, with intermediate exits above them (at most six, evenly spread) and
    `LOOKUP_HISPEC_WINDOWS`. None without a trace.

    Half k: `options.lookup_under_exits` (passes above the lookup grow with its k)."""
    trace = lookup.trace
    if trace is None:
        return []
    L = exits[-1]
    predictor = latency.Predictor(None, costs, trace, work)
    lower = [e for e in exits if e < L and e in dict(trace.predictions)]
    ks = _lookup_ks(lookup.k)
    # Every program this search may replay, compiled together: a replay's program depends
    # on the plan's number of levels, not on its exits (`trace_model.py`), so placeholder
    # exits stand for the ones the rounds below pick.
    shapes = [((L,), (), lookup.k)]
    if lower:
        shapes += [((1, L), (nd,), k) for k in ks for nd in draft_lens]
    if lower and max_levels >= 3 and L > 2:
        shapes += [((1, 2, L), w, k) for w in LOOKUP_HISPEC_WINDOWS for k in ks]
    predictor.prepare(shapes)
    plans = [scored_plan(predictor, (L,), (), lookup.k)]
    if not lower:
        return plans
    first = sorted((scored_plan(predictor, (d, L), (2,), k) for d in lower for k in ks),
                   key=lambda p: -p.predicted_tokens_per_second)
    kept = [(p.exits[0], p.lookup) for p in first[:LOOKUP_EXITS_KEPT]]
    plans += first + [scored_plan(predictor, (d, L), (nd,), k)
                      for d, k in kept for nd in draft_lens if nd != 2]
    if max_levels >= 3:
        for d in list(dict.fromkeys(p.exits[0] for p in first))[:2]:
            above = [e for e in lower if e > d]
            above = [above[i] for i in sorted({round(j * (len(above) - 1) / 5)
                                               for j in range(6)})] if len(above) > 6 else above
            plans += [scored_plan(predictor, (d, i, L), w, k) for i in above
                      for w in LOOKUP_HISPEC_WINDOWS for k in ks]
    return sorted(plans, key=lambda p: -p.predicted_tokens_per_second)


def _lookup_ks(k: int) -> list[int]:
    """The lookup's k tried under exits: k and `options.lookup_under_exits(k)`, largest first."""
    return sorted({k, options_lib.lookup_under_exits(k)}, reverse=True)


def best_of_kind(plans: list[Plan], kind: str) -> Plan | None:
    """The first plan of `kind` (`Plan.kind`: "layerskip" is LayerSkip without lookup)."""
    return next((p for p in plans if p.kind == kind), None)
