"""A draft model's plans for `tune`: what the draft model (and what drafts below it) did on
the calibration prompts, priced by this device's costs and ranked with the exit and lookup
hierarchies.

The hierarchies priced, lowest level first (k: the draft model's drafts a round):

    draft model -> L                          classic (method "draft")
    lookup k - 1 -> draft model -> L          the lookup's tokens checked in its passes
    smaller draft model -> draft model -> L   HSD's two draft models (k' per pass)
    draft model -> d -> L                     LayerSkip over a draft model
    draft model -> d -> i -> L                HiSpec over a draft model

A round at k costs round_s + draft_s(k) + the target's levels, `latency.predict` with
e_0 = 0 (level 1 checks the k drafts and its own next token, the bonus), where

    draft_s(k) = k (s t_pass + i t_small)
    t_pass     = t_draft ((1 - w) + w stage(0, L, 2 + k_below) / stage(0, L, 1))

s is the draft model's passes per drafted token (1 alone; fewer where a pass keeps tokens
from below), w the share of its passes that ran the wide block holding the tokens from
below (k_below of them at most), i the smaller model's passes per drafted token; t_draft and
t_small are their steps in the loop:

    t_draft = g r stage(0, L, 1),    t_small = g' r' stage(0, L, 1)

r (r') the ratio of the model's pass to the target's, timed side by side here
(`gate.time_passes`), and g (g') its loop scale: a draft step in the loop pays more than
its pass alone (its sampling, cache and ring writes, the step loop's trip; on the CPU a
round took 1.3-1.6 times its passes alone against AR's 1.18, docs/draft_model.md). g is the
ungated loop timed at the largest k, less its prefills and the target's passes, per draft
pass, over r stage(0, L, 1) (`loop_scale`); g' the same of the loop over the smaller model,
less the draft model's passes at g as well, per smaller-model pass (`smaller_loop_scale`).
The target's block costs stand for the draft model's growth with the block's length. s, w
and i are measured at the largest k, ungated, and taken per drafted token at every k. A
lookup under the draft model proposes at most the round's drafts after the step's own, so
each k is priced with lookup k - 1 (a longer one only widens the block).

Acceptance. The final layer's of the draft model's drafts: the i.i.d. per-token a whose
geometric run of at most k kept drafts keeps what the ungated drafts kept
(`per_token_acceptance`), for each structure apart. Exit d's: the share of positions where
the draft model's and exit d's greedy choices agree along the same continuations,
teacher-forced (`agreement`); above d, the calibration's alpha(d, ...) as for the exit
hierarchies. The gate that the plans run with (default on) drafts less where drafts do not
pay; the price here is the fixed-window one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hispec_jax.decoding import options as options_lib
from hispec_jax.decoding.costs import Costs
from hispec_jax.models.draft_weights import DraftWeights
from hispec_jax.models.model import Model
from hispec_jax.planner import latency
from hispec_jax.planner.plan import Plan

# the k a tune prices (and the k its acceptance is measured at: the largest)
CANDIDATE_KS = (1, 2, 3, 4, 5, 6, 8)
# the final layer's window Nd above exit d (LayerSkip over a draft model), and HiSpec's
EXIT_WINDOWS = (1, 2, 3, 4, 6, 8)
VERIFY_WINDOWS = (2, 4, 6, 8, 12, 16)
HISPEC_DRAFT_EXITS_KEPT = 3  # the best draft exits of LayerSkip over a draft model, for HiSpec's
LOOP_REPEATS = 3  # timed calls of an ungated loop after its first (`_ungated`)


def per_token_acceptance(accepted: int, proposed: int, k: int) -> float:
    """The i.i.d. per-token acceptance a whose geometric run of at most k drafts keeps, in
    expectation, accepted / proposed of them: a + a^2 + ... + a^k = k accepted / proposed
    (bisection)."""
    if proposed <= 0:
        return 0.0
    want = k * accepted / proposed
    kept = lambda a: sum(a ** i for i in range(1, k + 1))  # noqa: E731
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if kept(mid) < want else (lo, mid)
    return (lo + hi) / 2


# ---- the models of a pair --------------------------------------------------------------------
def smaller_of(model: Model) -> DraftWeights | None:
    """The draft model's own draft model (HSD's smaller one), or None."""
    draft = model.draft
    if draft is None or not isinstance(draft.params, dict):
        return None
    return draft.params.get("draft")


def with_one_draft(model: Model) -> Model:
    """`model` with its draft model but not the draft model's own (itself when it has none)."""
    if smaller_of(model) is None:
        return model
    draft = model.draft
    mid = dataclasses.replace(draft, params={k: v for k, v in draft.params.items()
                                             if k != "draft"})
    return dataclasses.replace(model, params={**model.params, "draft": mid})


def without_draft(model: Model) -> Model:
    """`model` without its draft model (itself when it has none)."""
    if model.draft is None:
        return model
    return dataclasses.replace(model, params={k: v for k, v in model.params.items()
                                              if k != "draft"})


def alone(weights: DraftWeights | Model) -> Model:
    """A draft model's weights as a `Model` of its own (without a draft model)."""
    params = {k: v for k, v in weights.params.items() if k != "draft"}
    return Model(cfg=weights.cfg, params=params, generation_config={})


# ---- measuring ------------------------------------------------------------------------------
def _ungated(model: Model, prompts, new_tokens: int, batch_size: int, capacity: int, k,
             lookup: int = 0, repeats: int = 0):
    """An ungated draft run at k (greedy, EOS ignored, the calibration's cache capacity):
    (its `stats["draft_model"]`, the sequences prompt + continuation, its loop timed as the
    calibration times its loops (the fastest of `repeats` calls after a first that
    compiles): {"seconds" (summed over the batches), "batches", "rounds", "draft_passes"
    and "below_passes" (the draft model's and the smaller model's passes, each over the
    batch)}, None when `repeats` is 0)."""
    from hispec_jax.decoding.generate import generate
    from hispec_jax.planner.calibrate import generate_seconds

    kwargs = dict(method="draft", draft_k=k, draft_gate=False, max_new_tokens=new_tokens,
                  batch_size=batch_size, max_cache_len=capacity,
                  **({"lookup": lookup} if lookup else {}))
    loop = None
    if repeats:
        seconds, out = generate_seconds(model, prompts, repeats, **kwargs)
        stats = out.stats["draft_model"]
        loop = {"seconds": seconds, "batches": out.stats["batches"],
                "rounds": out.stats["rounds"], "draft_passes": stats["draft_steps"] / batch_size,
                "below_passes": stats.get("inner_draft_model", {}).get("proposed", 0) / batch_size}
    else:
        out = generate(model, prompts, ignore_eos=True, **kwargs)
    return (out.stats["draft_model"], [list(p) + list(t) for p, t in zip(prompts, out.token_ids)],
            loop)


def _structure(stats: dict, k: int) -> dict[str, Any]:
    """What an ungated run at k says of its structure: acceptance and passes per draft."""
    drafted, steps = max(stats["drafted"], 1), max(stats["draft_steps"], 1)
    below = stats.get("lookup") or stats.get("inner_draft_model") or {}
    return {"k": k, "proposed": stats["proposed"], "accepted": stats["accepted"],
            "alpha": per_token_acceptance(stats["accepted"], stats["proposed"], k),
            "steps_per_draft": stats["draft_steps"] / drafted,
            "wide_share": stats.get("wide_steps", 0) / steps,
            "below_k": below.get("k", 0), "below_per_draft": below.get("proposed", 0) / drafted}


def step_ratio(target: Model, draft: Model, batch_size: int, context: int, capacity: int,
               repeats: int = 5) -> float:
    """`draft`'s AR step over `target`'s, both timed here (`gate.time_passes`, the fastest of
    `repeats`)."""
    from hispec_jax.decoding import gate

    shape = [(batch_size, 1)]
    t = gate.time_passes(target, shape, context=context, capacity=capacity, repeats=repeats)
    d = gate.time_passes(draft, shape, context=context, capacity=capacity, repeats=repeats)
    return d[shape[0]] / t[shape[0]]


def agreement(target: Model, draft: Model, sequences: list[list[int]],
              starts: list[int]) -> dict[str, float]:
    """{str(exit): the share of the continuations' positions where `draft`'s greedy choice
    is exit's} for every exit of `target` with a head, teacher-forced."""
    from hispec_jax.planner.calibrate import exit_choices

    mine = exit_choices(draft, sequences)[draft.cfg.num_layers]
    theirs = exit_choices(target, sequences)
    cut = lambda c, p: c[max(p - 1, 0):len(c) - 1]  # noqa: E731 (the continuation's predictions)
    ours = np.concatenate([cut(c, p) for c, p in zip(mine, starts)])
    return {str(e): float(np.mean(ours == np.concatenate([cut(c, p) for c, p in zip(per, starts)])))
            for e, per in sorted(theirs.items())}


def measure(model: Model, prompts: list[list[int]], new_tokens: int, batch_size: int,
            capacity: int, progress=None, k: int = max(CANDIDATE_KS)) -> dict[str, Any]:
    """Everything `plans` prices by: the draft model's ungated drafts of `k` tokens on
    `prompts` alone ({"k", "proposed", "accepted", "alpha", "steps_per_draft", ...}), its
    step's cost ratio ("step_ratio"), its loop timed ("loop", `_ungated`), its agreement
    with the target's exits ("agreement"), and the same for a lookup of k - 1 below it
    ("lookup") and, when the draft model has one, its smaller draft model below it
    ("smaller", with its own "step_ratio" and "loop")."""
    say = progress or (lambda msg: None)
    pair, target = with_one_draft(model), without_draft(model)
    say("draft model: its drafts on the calibration prompts")
    stats, sequences, loop = _ungated(pair, prompts, new_tokens, batch_size, capacity, k,
                                      repeats=LOOP_REPEATS)
    measured = dict(_structure(stats, k), loop=loop)
    context = min(capacity // 2, int(np.mean([len(p) for p in prompts])) + new_tokens // 2)
    say("draft model: its step's cost against the target's, alone and in the loop")
    measured["step_ratio"] = step_ratio(target, alone(model.draft), batch_size, context, capacity)
    say("draft model: its agreement with the target's exits")
    measured["agreement"] = agreement(target, alone(model.draft), sequences,
                                      [len(p) for p in prompts])
    measured["lookup"] = measured["smaller"] = None
    if k >= 2:
        say(f"draft model: over a prompt lookup of {k - 1}")
        measured["lookup"] = _structure(_ungated(pair, prompts, new_tokens, batch_size, capacity,
                                                 k, lookup=k - 1)[0], k)
    smaller = smaller_of(model)
    if smaller is not None and k >= 2:
        inner_k = options_lib.DEFAULT_INNER_DRAFT_K
        say(f"smaller draft model: its drafts of {inner_k} for the draft model's passes")
        stats, _, loop = _ungated(model, prompts, new_tokens, batch_size, capacity,
                                  (inner_k, k), repeats=LOOP_REPEATS)
        measured["smaller"] = dict(_structure(stats, k), loop=loop)
        measured["smaller"]["step_ratio"] = step_ratio(target, alone(smaller), batch_size,
                                                       context, capacity)
    return measured


# ---- pricing --------------------------------------------------------------------------------
def pass_seconds(structure: dict[str, Any], t_draft: float, costs: Costs,
                 num_layers: int) -> float:
    """t_pass of the module docstring: a draft-model pass of `structure`, its wide share
    priced by the target's growth with the block."""
    wide = 1.0
    if structure["below_k"]:
        one = costs.stage(0, num_layers, 1)
        wide = costs.stage(0, num_layers, 2 + structure["below_k"]) / one
    return t_draft * ((1 - structure["wide_share"]) + structure["wide_share"] * wide)


def draft_seconds(k: int, structure: dict[str, Any], t_draft: float, costs: Costs,
                  num_layers: int, t_smaller: float = 0.0) -> float:
    """draft_s(k) of the module docstring: a round's k drafts of `structure`."""
    t_pass = pass_seconds(structure, t_draft, costs, num_layers)
    return k * (structure["steps_per_draft"] * t_pass + structure["below_per_draft"] * t_smaller)


def _unexplained(loop: dict[str, float], k: int, costs: Costs, num_layers: int) -> float:
    """A timed ungated loop's seconds less the batches' prefills and, each round, round_s
    and the target's pass over the block of k + 1."""
    return (loop["seconds"] - loop["batches"] * costs.prefill_s
            - loop["rounds"] * (costs.round_s + costs.stage(0, num_layers, k + 1)))


def _per_pass_over_price(seconds: float, passes: float, priced: float) -> float:
    if seconds <= 0 or passes <= 0 or priced <= 0:
        return 1.0
    return float(np.clip(seconds / passes / priced, 0.5, 4.0))


def loop_scale(measured: dict[str, Any], costs: Costs, num_layers: int) -> float:
    """g of the module docstring: the draft step's seconds in the timed ungated loop (what
    `_unexplained` leaves, per draft pass) over its price from the passes alone,
    r stage(0, L, 1); clipped to [1/2, 4] against timing noise, and 1 without a timed loop
    or where nothing is left."""
    loop = measured.get("loop")
    if not loop:
        return 1.0
    return _per_pass_over_price(_unexplained(loop, measured["k"], costs, num_layers),
                                loop["draft_passes"],
                                measured["step_ratio"] * costs.stage(0, num_layers, 1))


def smaller_loop_scale(measured: dict[str, Any], costs: Costs, num_layers: int) -> float:
    """g' of the module docstring: the smaller model's step in its own timed loop (what
    `_unexplained` leaves less the draft model's passes at g, per smaller-model pass) over
    r' stage(0, L, 1); clipped as g, and g without that loop."""
    g = loop_scale(measured, costs, num_layers)
    smaller = measured.get("smaller") or {}
    loop = smaller.get("loop")
    if not loop:
        return g
    one = costs.stage(0, num_layers, 1)
    t_pass = pass_seconds(smaller, g * measured["step_ratio"] * one, costs, num_layers)
    rest = _unexplained(loop, smaller["k"], costs, num_layers) - loop["draft_passes"] * t_pass
    return _per_pass_over_price(rest, loop["below_passes"], smaller["step_ratio"] * one)


def _scored(plan: Plan, pred: latency.Prediction, ar: latency.Prediction) -> Plan:
    return dataclasses.replace(plan, predicted_tokens_per_second=pred.tokens_per_second,
                               predicted_speedup=pred.tokens_per_second / ar.tokens_per_second,
                               tokens_per_round=pred.tokens_per_round)


def plans(measured: dict[str, Any], costs: Costs, num_layers: int, ks=CANDIDATE_KS,
          gate: bool = True, alpha_of=None, exits=()) -> list[Plan]:
    """Every priced plan (module docstring), speedups over AR at the same costs; `gate`:
    the plans run with the acceptance gate; `alpha_of(a, b)` and `exits` (ascending, the
    last L): the calibration's, for the plans over the target's exits (none without)."""
    L = num_layers
    ar = latency.predict((L,), (), [], costs)
    t_draft = loop_scale(measured, costs, L) * measured["step_ratio"] * costs.stage(0, L, 1)
    base = Plan(exits=(L,), draft_gate=gate)
    smaller = measured.get("smaller")
    t_small = (smaller_loop_scale(measured, costs, L) * smaller["step_ratio"]
               * costs.stage(0, L, 1) if smaller else 0.0)
    out = []
    for k in ks:
        # (plan fields, what its drafts did, the smaller model's step)
        variants = [({}, measured, 0.0)]
        if k >= 2 and measured.get("lookup"):
            variants.append(({"lookup": k - 1}, dict(measured["lookup"], below_k=k - 1), 0.0))
        if k >= 2 and smaller:
            variants.append(({"inner_k": smaller["below_k"]}, smaller, t_small))
        for fields, structure, t_s in variants:
            d_s = draft_seconds(k, structure, t_draft, costs, L, t_s)
            pred = latency.predict((0, L), (k,), [structure["alpha"]], costs, draft_s=d_s)
            out.append(_scored(dataclasses.replace(base, draft_k=k, **fields), pred, ar))
    out += _over_exits(measured, costs, L, ks, base, ar, t_draft, alpha_of, exits)
    return out


def _over_exits(measured, costs, L, ks, base, ar, t_draft, alpha_of, exits) -> list[Plan]:
    """LayerSkip and HiSpec over the draft model: exit d checks its drafts first."""
    agree = measured.get("agreement") or {}
    lower = [e for e in exits if e < L and str(e) in agree]
    if alpha_of is None or not lower:
        return []
    layerskip, hispec = [], []
    for d in lower:
        for k in ks:
            d_s = draft_seconds(k, measured, t_draft, costs, L)
            for nd in EXIT_WINDOWS:
                pred = latency.predict((0, d, L), (k, nd), [agree[str(d)], alpha_of(d, L)],
                                       costs, draft_s=d_s)
                layerskip.append(_scored(dataclasses.replace(base, exits=(d, L), windows=(nd,),
                                                             draft_k=k), pred, ar))
    best = dict.fromkeys(p.exits[0] for p in sorted(layerskip, key=_slower))  # draft exits, best first
    for d in list(best)[:HISPEC_DRAFT_EXITS_KEPT]:
        for i in (e for e in exits if d < e < L):
            alphas = [agree[str(d)], alpha_of(d, i), alpha_of(i, L)]
            for k in ks:
                d_s = draft_seconds(k, measured, t_draft, costs, L)
                for nd in EXIT_WINDOWS[:4]:
                    for ni in VERIFY_WINDOWS:
                        pred = latency.predict((0, d, i, L), (k, nd, ni), alphas, costs,
                                               draft_s=d_s)
                        hispec.append(_scored(dataclasses.replace(
                            base, exits=(d, i, L), windows=(nd, ni), draft_k=k), pred, ar))
    return layerskip + hispec


def _slower(plan: Plan) -> float:
    return -plan.predicted_tokens_per_second
