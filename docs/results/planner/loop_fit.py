"""The planner's loop fit (docs/planner.md §1), measured on the shipped model.

    python docs/results/planner/loop_fit.py > docs/results/planner/loop_fit.txt
    python docs/results/planner/loop_fit.py --plan benchmarks/results_planner/loop_fit/plan.json

One `hispec tune` (`tune.tune`: calibration, search), its printed plans without the
prompt-lookup ones timed as `--verify` times them (`tune.measure_plans`: `generate` on 4
held-out prompts x 64 tokens, 5 interleaved rounds; the lookup plans are replayed, not priced
by these formulas), and the same measured plans predicted three ways from that one
calibration:

  kept       the fit `calibrate.fit_loop_costs` chose (what the plan file holds)
  uniform    the earlier fallback: every stage cost times one scale that matches AR's loop
  stack      stage programs over the whole stack (layers [0, L-4) vs [0, L), the weights
             streaming from memory as in decoding) instead of [0, 2) vs [0, 6), then
             `fit_loop_costs` on the same AR and LayerSkip loop timings

Printed: the raw stage costs, how much slower one token's layers run inside AR's loop than
alone, each variant's fit, and measured / predicted end-to-end tokens/s per plan.
Load average at the start and the end is printed; the JSON goes next to this file.
With `--plan FILE` (a kept `hispec tune --verify` plan file) it measures nothing: the kept
and uniform fits of that file's calibration against its own `verify` rows.
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hispec_jax import DEFAULT_MODEL_DIR, load_model
from hispec_jax.bench.suite import device_description
from hispec_jax.decoding import generate as generate_lib
from hispec_jax.decoding import methods
from hispec_jax.planner import calibrate, latency, plan as plan_lib, search, tune

NEW_TOKENS, VERIFY_PROMPTS, VERIFY_REPEATS = 64, 4, 5
OUT_JSON = Path(__file__).with_name("loop_fit.json")


def load() -> tuple[float, ...]:
    return tuple(round(x, 2) for x in os.getloadavg())


def raw_costs(costs, loop):
    """The stage costs as timed alone: the fit's scales undone, no fixed costs."""
    scale, single = loop["stage_scale"], loop["single_token_scale"]
    undo = lambda values: tuple(v / (single if T == 1 else scale)
                                for T, v in zip(costs.block_sizes, values))
    return dataclasses.replace(costs, layer_s=undo(costs.layer_s), head_s=undo(costs.head_s),
                               pass_s=0.0, round_s=0.0)


def stack_stage_costs(model, batch, capacity, block_sizes, repeats, context):
    """`calibrate.measure_stage_costs` with programs over [0, L-4) and [0, L) (the variant
    tried and rejected on 2026-11-24)."""
    L = model.cfg.num_layers
    return calibrate.measure_stage_costs(model, batch, capacity, block_sizes, repeats, context,
                                         layer_counts=(L - 4, L))


def predicted_e2e(plan, cal, costs):
    p = search.with_prediction(plan, cal.alpha_of, costs)
    pred = latency.Prediction(p.tokens_per_round, 1.0 / p.predicted_tokens_per_second,
                              p.predicted_tokens_per_second)
    return latency.end_to_end_tokens_per_second(pred, costs, NEW_TOKENS)



def table(cal, plans_by_name, verify_rows, variants):
    """Prints measured / predicted end-to-end tokens/s of every measured plan under each
    variant's costs; returns the rows."""
    print("| plan | measured e2e tok/s | " + " | ".join(
        f"{v}: predicted | measured / predicted" for v in variants) + " |")
    print("|---|---|" + "---|---|" * len(variants))
    rows = []
    for v in verify_rows:
        plan = plans_by_name.get(v["plan"])
        if plan is None or plan.lookup:  # replayed, not priced by the renewal formulas
            continue
        row = {"plan": v["plan"], "measured": v["measured_tokens_per_second"]}
        for name, costs in variants.items():
            row[name] = predicted_e2e(plan, cal, costs)
        rows.append(row)
        print(f"| {row['plan']} | {row['measured']:.1f} | " + " | ".join(
            f"{row[n]:.1f} | {row['measured'] / row[n]:.2f}" for n in variants) + " |")
    print()
    for name in variants:
        for kind in ("layerskip", "hispec"):
            ratios = [r["measured"] / r[name] for r in rows if r["plan"].startswith(kind)]
            if ratios:
                print(f"{name}: {kind} plans measured / predicted {min(ratios):.2f}-{max(ratios):.2f}")
    return rows


def offline(path):
    """The kept and uniform fits of a kept `hispec tune --verify` plan file (its calibration
    and `verify` rows): no measurement, the same numbers on any machine."""
    payload = json.loads(Path(path).read_text())
    cal = calibrate.Calibration.from_json(payload["calibration"])
    loop, kept = cal.loop, cal.costs
    raw = raw_costs(kept, loop)
    per_round_ar = loop["ar_seconds_per_round"]
    w_ar = cal.costs.num_layers * raw.layer(1) + raw.head(1)
    uniform = dataclasses.replace(raw, layer_s=tuple(v * per_round_ar / w_ar for v in raw.layer_s),
                                  head_s=tuple(v * per_round_ar / w_ar for v in raw.head_s))
    us = lambda x: f"{x * 1e6:.0f} us"
    print(f"# {path} ({payload.get('device')}; calibration {cal.seconds:.1f} s)")
    print(f"stage costs alone: layer T=1 {us(raw.layer(1))}, head T=1 {us(raw.head(1))}; AR loop "
          f"{per_round_ar * 1e3:.2f} ms per token = {per_round_ar / w_ar:.2f}x the stages alone")
    print(f"kept fit: {loop['loop_fit']}, single_token_scale {loop['single_token_scale']:.2f}; "
          f"uniform fit: every stage cost x {per_round_ar / w_ar:.2f}\n")
    plans = {p.name(): p for p in map(plan_lib.Plan.from_json, payload["plans"])}
    table(cal, plans, payload["verify"], {"kept": kept, "uniform": uniform})


def main():
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    start = load()
    print(f"# {device_description()}; commit {commit}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load at start {start}")
    model = load_model(DEFAULT_MODEL_DIR)
    L = model.cfg.num_layers
    s = calibrate.Settings()
    progress = lambda m: print(f"  .. {m}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        report = tune.tune(model, 1, settings=s, out=Path(tmp) / "plan.json", progress=progress)
    cal, loop = report["calibration"], report["calibration"].loop
    # `hispec tune --verify`'s measurement of the printed plans, the lookup plans left out
    # (the renewal formulas do not price them; they are replayed)
    plans = [p for p in report["plans"] if not p.lookup]
    report["verify"] = tune.measure_plans(model, plans, 1, tune.holdout_prompts(model, VERIFY_PROMPTS),
                                          NEW_TOKENS, cal.costs, repeats=VERIFY_REPEATS,
                                          progress=progress)
    kept = cal.costs
    raw = raw_costs(kept, loop)
    per_round_ar = loop["ar_seconds_per_round"]
    w_ar = L * raw.layer(1) + raw.head(1)
    uniform = dataclasses.replace(raw, layer_s=tuple(v * per_round_ar / w_ar for v in raw.layer_s),
                                  head_s=tuple(v * per_round_ar / w_ar for v in raw.head_s))

    # LayerSkip's counters as the calibration ran it (greedy: deterministic).
    draft, nd = methods.default_exits(model)[0], 2
    prompts = calibrate.calibration_prompts(model, s.num_prompts, s.max_prompt_tokens)
    r = generate_lib.generate(model, prompts, method="layerskip", draft_exit=draft, draft_len=nd,
                              max_new_tokens=s.new_tokens, ignore_eos=True, batch_size=1,
                              max_cache_len=s.capacity)
    drafts, verifies = r.stats["actions_per_level"]
    # (per batch since 2026-11-26, when calibration began timing every prompt: totals here)
    ls_seconds = (loop["layerskip_seconds"] - loop["prefill_seconds"]) * loop.get("timed_batches", 1)
    context = loop.get("stage_context", min(s.capacity // 2, s.max_prompt_tokens + s.new_tokens // 2))
    st_layer, st_head = stack_stage_costs(model, 1, s.capacity, s.block_sizes, s.repeats, context)
    stack_raw = dataclasses.replace(raw, layer_s=tuple(st_layer), head_s=tuple(st_head))
    stack, stack_fit = calibrate.fit_loop_costs(stack_raw, per_round_ar, ls_seconds, draft, nd,
                                                drafts, verifies, r.stats["rounds"])
    end = load()

    us = lambda x: f"{x * 1e6:.0f} us"
    print(f"# load at end {end}; calibration {cal.seconds:.1f} s, {cal.tokens} positions; "
          f"search {report['search_seconds']:.1f} s")
    print(f"stage costs alone ([0, 2) vs [0, 6)): layer T=1 {us(raw.layer(1))}, "
          + ", ".join(f"T={T} {us(raw.layer(T))}" for T in raw.block_sizes[1:])
          + f"; head T=1 {us(raw.head(1))}")
    print(f"AR loop: {per_round_ar * 1e3:.2f} ms per token = {per_round_ar / w_ar:.2f}x "
          f"L * layer(1) + head(1) = {w_ar * 1e3:.2f} ms timed alone")
    print(f"kept fit: {loop['loop_fit']}, single_token_scale {loop['single_token_scale']:.2f}, "
          f"stage_scale {loop['stage_scale']:.2f}, pass {us(kept.pass_s)}, round {us(kept.round_s)}")
    print(f"uniform fit: every stage cost x {per_round_ar / w_ar:.2f}, no fixed cost")
    print(f"stack programs ([0, {L - 4}) vs [0, {L})): layer T=1 {us(stack_raw.layer(1))}; "
          f"fit {stack_fit['loop_fit']}, single_token_scale {stack_fit['single_token_scale']:.2f}, "
          f"pass {us(stack.pass_s)}, round {us(stack.round_s)}")
    print(f"LayerSkip d={draft} nd={nd} loop: {ls_seconds:.3f} s, {drafts} draft passes, "
          f"{verifies} verifications, {r.stats['rounds']} rounds")
    print()
    variants = {"kept": kept, "uniform": uniform, "stack": stack}
    rows = table(cal, {p.name(): p for p in report["plans"]}, report["verify"], variants)
    OUT_JSON.write_text(json.dumps({
        "commit": commit, "load_start": start, "load_end": end, "loop": loop,
        "raw_costs": raw.to_json(), "kept_costs": kept.to_json(), "uniform_costs": uniform.to_json(),
        "stack_costs": stack.to_json(), "stack_fit": stack_fit,
        "layerskip": {"draft_exit": draft, "draft_len": nd, "drafts": drafts, "verifies": verifies,
                      "rounds": r.stats["rounds"]},
        "verify": report["verify"], "rows": rows}, indent=1, default=float))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--plan":
        offline(sys.argv[2])
    else:
        main()
