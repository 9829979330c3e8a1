"""`tune` = measure -> model -> search -> plan file, and what method="auto" runs.

    report = tune(model, batch_size=1)          # calibrate, search, save, return the plans
    decoder = auto_decoder(model, batch_size)   # the saved plan, else a quick tune first
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from hispec_jax import datasets
from hispec_jax.decoding import costs as costs_lib
from hispec_jax.decoding import generate as generate_lib
from hispec_jax.decoding import recommended as recommended_lib
from hispec_jax.models.model import Model
from hispec_jax.planner import calibrate as calibrate_lib
from hispec_jax.planner import draft_plans
from hispec_jax.planner import latency, plan as plan_lib, search as search_lib
from hispec_jax.planner.draft_plans import without_draft


def tune(model: Model, batch_size: int = 1, *, quick: bool = False,
         settings: calibrate_lib.Settings | None = None, prompts=None, max_levels: int = 3,
         top: int = 8, out: str | Path | None = None, save: bool = True,
         progress=None, costs_from: calibrate_lib.Calibration | None = None,
         draft_ks=draft_plans.CANDIDATE_KS, draft_gate: bool = True) -> dict[str, Any]:
    """Calibrates on this device, searches, saves the plan file; returns
    {"plans": [Plan, ...] best predicted first, "calibration": Calibration, "path": saved
    file, "search_seconds", "chosen_by": "prediction"}.
    `costs_from`: reuse an earlier calibration's costs (`calibrate.calibrate`).
    A model with a draft model (`Model.with_draft`): its plans at each k of `draft_ks`
    (`draft_plans`: alone, over a lookup, over its own smaller draft model when it has one,
    under the target's exits; measured acceptance, this device's costs) are ranked with the
    others, the best of them always kept; the plan file is the pair's (`plan.model_key`)."""
    settings = settings or (calibrate_lib.Settings.quick() if quick else calibrate_lib.Settings())
    target = without_draft(model)  # the exits and lookup are the target's alone
    cal = calibrate_lib.calibrate(target, batch_size, prompts=prompts, settings=settings,
                                  progress=progress, costs_from=costs_from)
    t0 = time.perf_counter()
    plans = search_lib.search(cal.exits, cal.alpha_of, cal.costs, max_levels=max_levels, top=top,
                              work=latency.work_costs(target), lookup=cal.lookup,
                              known=recommended_hierarchies(target))
    search_seconds = time.perf_counter() - t0
    draft = None
    if model.draft is not None:  # its plans, priced by the same costs, join the ranking
        draft = draft_plans.measure(
            model, prompts or calibrate_lib.calibration_prompts(target, settings.num_prompts,
                                                                settings.max_prompt_tokens),
            settings.new_tokens, batch_size, settings.capacity, progress, k=max(draft_ks))
        priced = draft_plans.plans(draft, cal.costs, model.cfg.num_layers, draft_ks, draft_gate,
                                   alpha_of=cal.alpha_of, exits=cal.exits)
        # the search's list stays whole (its top, then the best of each kind); the draft
        # plans that rank among the top join it, and the best of each draft kind
        speed = lambda p: -p.predicted_tokens_per_second  # noqa: E731
        ranked = sorted(plans + priced, key=speed)[:top]
        best = {}
        for p in sorted(priced, key=speed):
            best.setdefault(p.kind, p)
        joining = [p for p in priced if p in ranked]
        joining += [p for p in best.values() if p not in joining]
        plans = sorted(plans + joining, key=speed)
    path = None
    if save:
        payload = plan_lib.plan_payload(model, batch_size, plans, cal,
                                        {"search_seconds": round(search_seconds, 2),
                                         "chosen_by": "prediction", "draft_model": draft,
                                         "settings": vars(settings) if hasattr(settings, "__dict__")
                                         else None})
        path = plan_lib.save_plan_file(Path(out) if out else plan_lib.plan_path(model, batch_size),
                                       payload)
    return {"plans": plans, "calibration": cal, "path": path, "search_seconds": search_seconds,
            "chosen_by": "prediction", "draft_model": draft}


def recommended_hierarchies(model: Model) -> list[tuple[tuple[int, ...], tuple[int, ...], bool]]:
    """The model's recommended plans (`decoding/recommended.py`) as `search`'s `known`
    (exits, windows, adaptive): always scored, so a tune compares against them."""
    plans = (recommended_lib.load(model.path, method, model.cfg.num_layers)
             for method in recommended_lib.METHODS)
    return [(r.exits, r.windows, r.adaptive) for r in plans if r is not None]


def auto_decoder(model: Model, batch_size: int, greedy: bool = True, plan_file=None):
    """(the `Decoder` of the saved plan for (model, device, batch size), the plan); tunes
    quickly first (saying so on stderr) when there is none. A model with a draft model
    (`Model.with_draft`) gets the pair's plan: its draft plans ranked with the target's own
    exit and lookup plans (`tune`); a plan runs on the models it was priced on
    (`plan_model`)."""
    plan = plan_lib.load_plan(model, batch_size, plan_file)
    if plan is None:
        what = "model" if model.draft is None else "model and draft model"
        print(f"hispec: no tuned plan for this {what}, device and batch size {batch_size}; "
              "running a quick tune (hispec tune --model ... to tune fully)", file=sys.stderr)
        plan = tune(model, batch_size, quick=True)["plans"][0]
    return plan.decoder(plan_model(model, plan), greedy=greedy), plan


def plan_model(model: Model, plan) -> Model:
    """The model `plan` decodes on, as `tune` priced it: with both draft models for a plan
    of two, with the draft model alone for a plan of one, else the target alone."""
    if plan.inner_k:
        return model
    return draft_plans.with_one_draft(model) if plan.draft_k else without_draft(model)


def measure_plans(model: Model, plans: list, batch_size: int, prompts: list[list[int]],
                  new_tokens: int, costs: latency.Costs, repeats: int = 3,
                  max_cache_len: int | None = None, progress=None) -> list[dict[str, Any]]:
    """Measured tokens/s of each plan (generate's own figure) beside its predicted
    end-to-end tokens/s for the same request. Every plan is compiled first (one call
    each), then timed in `repeats` interleaved rounds (plan 1, plan 2, ..., plan 1, ...)
    and the median kept, so a change of the machine's load hits every plan alike."""
    # a draft model's plans run on the pair, the others on the target alone
    models = [plan_model(model, plan) for plan in plans]
    decoders = [plan.decoder(m) for plan, m in zip(plans, models)]

    def call(model, decoder):
        return generate_lib.generate(model, prompts, method=decoder, max_new_tokens=new_tokens,
                                     batch_size=batch_size, ignore_eos=True,
                                     max_cache_len=max_cache_len)

    results = []
    for plan, m, decoder in zip(plans, models, decoders):
        if progress:
            progress(f"verify {plan.name()} (compile)")
        results.append(call(m, decoder))
    seconds: list[list[float]] = [[] for _ in plans]
    for r in range(repeats):
        if progress:
            progress(f"verify: timing round {r + 1}/{repeats}")
        for i, (m, decoder) in enumerate(zip(models, decoders)):
            results[i] = call(m, decoder)
            seconds[i].append(results[i].stats["decode_seconds"])
    rows = []
    batches = -(-len(prompts) // batch_size)
    for plan, result, secs in zip(plans, results, seconds):
        tokens = result.stats["new_tokens"]
        measured = float(np.median([tokens / s for s in secs]))
        pred = latency.Prediction(plan.tokens_per_round, batch_size / plan.predicted_tokens_per_second,
                                  plan.predicted_tokens_per_second)
        per_call = latency.end_to_end_tokens_per_second(pred, costs, new_tokens)
        rows.append({"plan": plan.name(), "predicted_tokens_per_second": plan.predicted_tokens_per_second,
                     "predicted_end_to_end": per_call * (len(prompts) / (batches * batch_size)),
                     "measured_tokens_per_second": measured,
                     "tokens_per_round_predicted": plan.tokens_per_round,
                     # per sequence per loop trip (each sequence's first token is prefill's)
                     "tokens_per_round_measured": (tokens - len(prompts)) * batches
                     / (len(prompts) * max(result.stats["rounds"], 1)),
                     "acceptance_per_level": result.stats["acceptance_rate_per_level"]})
    return rows


def rank_by_measurement(plans: list, rows: list[dict[str, Any]]) -> list:
    """`plans` reordered by measured tokens/s, fastest first (ties keep the predicted order).
    The latency model ranks plans by prediction; when the top plans are predicted within a
    few per cent of each other (common on CPUs), the measurement decides."""
    measured = {r["plan"]: r["measured_tokens_per_second"] for r in rows}
    order = sorted(range(len(plans)), key=lambda i: (-measured.get(plans[i].name(), 0.0), i))
    return [plans[i] for i in order]


def holdout_prompts(model: Model, num_prompts: int, max_prompt_tokens: int = 64) -> list[list[int]]:
    """Held-out prompts for --verify: the ShareGPT evaluation split (never calibrated on),
    or seeded random prompts for a model without a tokenizer."""
    if model.tokenizer is not None:
        try:
            return datasets.load_prompts("sharegpt", model.tokenizer, num_prompts,
                                            max_prompt_tokens)
        except (ImportError, FileNotFoundError, ValueError):
            pass
    rng = np.random.default_rng(1)  # not the calibration prompts' seed
    return [rng.integers(3, model.cfg.vocab_size, size=12).tolist() for _ in range(num_prompts)]


def tune_and_verify(model: Model, batch_size: int = 1, *, quick: bool = False,
                    max_levels: int = 3, top: int = 8, out=None, verify: bool = False,
                    verify_prompts: int = 4, verify_tokens: int = 64, verify_repeats: int = 3,
                    choose_measured: bool = True,
                    plot=None, settings: calibrate_lib.Settings | None = None,
                    prompts=None, progress=None, **draft) -> dict[str, Any]:
    """`hispec tune`: `tune` (`draft`: its draft_ks, draft_gate), then (with `verify`) measured tokens/s of the printed plans on
    held-out prompts and a predicted-vs-measured plot; with `choose_measured` the plan file
    is saved again with the fastest measured plan first (what method="auto" runs)."""
    report = tune(model, batch_size, quick=quick, settings=settings, prompts=prompts,
                  max_levels=max_levels, top=top, out=out, progress=progress, **draft)
    report["verify"] = None
    if verify:
        if progress:
            progress(f"verify: {len(report['plans'])} plans on {verify_prompts} held-out prompts")
        prompts = holdout_prompts(model, verify_prompts)
        report["verify"] = measure_plans(model, report["plans"], batch_size, prompts, verify_tokens,
                                         report["calibration"].costs, repeats=verify_repeats,
                                         progress=progress)
        if choose_measured:
            report["predicted_best"] = report["plans"][0]
            report["plans"] = rank_by_measurement(report["plans"], report["verify"])
            report["chosen_by"] = f"measurement ({verify_prompts} held-out prompts)"
            if report.get("path"):
                payload = json.loads(Path(report["path"]).read_text())
                payload["plans"] = [p.to_json() for p in report["plans"]]
                payload["chosen_by"] = report["chosen_by"]
                payload["verify"] = report["verify"]
                plan_lib.save_plan_file(Path(report["path"]), payload)
        if plot:
            report["plot"] = predicted_vs_measured_plot(report["verify"], plot)
    return report


def save_recommended(model: Model, report: dict[str, Any], command: str) -> Path:
    """Writes the model's recommended plan (`decoding/recommended.py`) from a tune report:
    the first (best: measured when verified, else predicted) LayerSkip and HiSpec plans,
    with their predicted (and measured) figures as evidence."""
    measured = {r["plan"]: r for r in (report.get("verify") or [])}
    chosen, evidence = {}, {}
    for kind in recommended_lib.METHODS:
        plan = search_lib.best_of_kind(report["plans"], kind)
        if plan is None:
            continue
        chosen[kind] = {"exits": plan.exits, "windows": plan.windows, "adaptive": plan.adaptive}
        evidence[kind] = {"plan": plan.name(),
                          "predicted_speedup": round(plan.predicted_speedup, 3),
                          "predicted_work_speedup": plan.predicted_work_speedup,
                          **({"measured_tokens_per_second":
                              measured[plan.name()]["measured_tokens_per_second"]}
                             if plan.name() in measured else {})}
    if not chosen:
        raise ValueError("the tune found no LayerSkip or HiSpec plan to recommend")
    source = (f"{command} on {costs_lib.device_key()}, {time.strftime('%Y-%m-%d')}, chosen by "
              f"{report.get('chosen_by', 'prediction')}")
    return recommended_lib.save(model.path, chosen, source, evidence)


def predicted_vs_measured_plot(rows: list[dict[str, Any]], path) -> str:
    """Predicted (end to end) vs measured tokens/s per plan (cf. HiSpec Fig. 9)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    pred = [r["predicted_end_to_end"] for r in rows]
    meas = [r["measured_tokens_per_second"] for r in rows]
    ax.scatter(pred, meas)
    for r, x, y in zip(rows, pred, meas):
        ax.annotate(r["plan"], (x, y), fontsize=6)
    lo, hi = min(pred + meas) * 0.9, max(pred + meas) * 1.1
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], alpha=0.1)
    ax.set_xlabel("predicted tokens/s")
    ax.set_ylabel("measured tokens/s")
    ax.set_title("hispec tune: predicted vs measured (band: ±15 %)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The table `hispec tune` prints."""
    cal = report["calibration"]
    c = cal.costs
    lines = [f"calibration: {cal.tokens} positions, {cal.seconds:.1f} s; batch {c.batch}; "
             f"layer {1e6 * c.layer(1):.0f} us (T=1), head {1e6 * c.head(1):.0f} us, "
             f"pass {1e6 * c.pass_s:.0f} us, round {1e6 * c.round_s:.0f} us, "
             f"prefill {1e3 * c.prefill_s:.1f} ms"]
    draft = report.get("draft_model")
    if draft:
        L = c.num_layers
        g = draft_plans.loop_scale(draft, c, L)
        lines.append(f"draft model: per-token acceptance {draft['alpha']:.3f} ({draft['accepted']} "
                     f"of {draft['proposed']} drafts kept at k={draft['k']}, ungated); a draft "
                     f"step costs {draft['step_ratio']:.3f} of the target's AR step alone, "
                     f"{g:.2f} times that in the loop")
        for name, s in (("over a lookup", draft.get("lookup")),
                        ("over the smaller draft model", draft.get("smaller"))):
            if s:
                lines.append(f"draft model {name}: per-token acceptance {s['alpha']:.3f}, "
                             f"{s['steps_per_draft']:.2f} of its passes per draft "
                             f"({s['wide_share']:.0%} with tokens from below)"
                             + (f"; a smaller model's step costs {s['step_ratio']:.3f} "
                                f"alone, {draft_plans.smaller_loop_scale(draft, c, L):.2f} "
                                "times that in the loop" if "step_ratio" in s else ""))
    measured = {r["plan"]: r for r in (report.get("verify") or [])}
    header = (f"{'plan':40s} {'pred tok/s':>10s} {'pred x AR':>9s} {'tok/round':>9s} "
              f"{'work/tok':>8s} {'work x AR':>9s}")
    if measured:
        header += f" {'pred e2e':>9s} {'measured':>9s} {'meas/pred':>9s} {'meas tok/rnd':>12s}"
    lines.append(header)
    for p in report["plans"]:
        work = lambda x, w: f"{x:{w}.2f}" if x is not None else f"{'-':>{w}s}"
        line = (f"{p.name():40s} {p.predicted_tokens_per_second:10.1f} "
                f"{p.predicted_speedup:9.2f} {p.tokens_per_round:9.2f} "
                f"{work(p.predicted_work_per_token, 8)} {work(p.predicted_work_speedup, 9)}")
        r = measured.get(p.name())
        if r:
            line += (f" {r['predicted_end_to_end']:9.1f} {r['measured_tokens_per_second']:9.1f} "
                     f"{r['measured_tokens_per_second'] / r['predicted_end_to_end']:9.2f} "
                     f"{r['tokens_per_round_measured']:12.2f}")
        lines.append(line)
    if report.get("predicted_best") is not None and report["predicted_best"] != report["plans"][0]:
        lines.append(f"the fastest measured plan ({report['plans'][0].name()}) replaces the "
                     f"predicted best ({report['predicted_best'].name()})")
    if report.get("path"):
        lines.append(f"saved the plan ({report['plans'][0].name()}, chosen by "
                     f"{report.get('chosen_by', 'prediction')}) to {report['path']}")
    if report.get("plot"):
        lines.append(f"wrote {report['plot']}")
    return lines
