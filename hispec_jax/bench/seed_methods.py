"""SV and SpecBound beside LayerSkip and HiSpec, side by side, and the SpecBound sweep.

    python -m hispec_jax.bench seed-methods [--model DIR] [--prompts N] [--max-new-tokens N]
        [--batch-sizes 1,4,16] [--rounds R] [--sweep [--sweep-prompts N] [--sweep-tokens N]]
        [--no-batches] [--out FILE]

1. SV profile: `sv_profile.json` of the model directory if it fits the default exits, else a
   quick `planner.sv_profile.profile_sv` run (calibration prompts: ShareGPT training split),
   written next to --out.
2. --sweep: SpecBound on calibration prompts (the training split, not the benchmark's
   held-out prompts), each stage side by side with AR: stage 1 tau x anneal at D = L/2,
   W = 4; stage 2 depth bound x width at stage 1's best. Speedup on this machine, layer
   passes per token (what predicts an accelerator's speedup), tokens per round, depths.
   The JSON is rewritten after every stage and batch size.
3. At every batch size: AR, LayerSkip, HiSpec, SV and SpecBound (defaults) on held-out
   ShareGPT prompts, timed in interleaved rounds (`suite.compare`), each checked against AR.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

from hispec_jax import datasets as prompts_lib
from hispec_jax.bench import args as args_lib
from hispec_jax.bench import suite
from hispec_jax.bench.suite import MethodSpec


def specbound_sweep(model, prompts, new_tokens: int, grid: dict[str, list], rounds: int,
                    progress=None) -> list[dict]:
    """SpecBound at every combination of `grid` (keys: tau, anneal, depth_bound, width) on
    `prompts`, side by side with AR in one `suite.compare` (interleaved rounds): speedup,
    layer passes per token (what predicts an accelerator's speedup), tokens per round and
    the exit-depth histogram. Rows in grid order, AR's first."""
    keys = sorted(grid)
    specs = [MethodSpec.of("ar", "ar")]
    for values in itertools.product(*(grid[k] for k in keys)):
        options = dict(zip(keys, values))
        name = "specbound " + " ".join(f"{k}={v}" for k, v in options.items())
        specs.append(MethodSpec.of(name, "specbound", **options))
    cache_len = suite.common_cache_len(model, prompts, specs, new_tokens)
    runners = [suite.hispec_runner(model, prompts, spec, max_new_tokens=new_tokens,
                                   batch_size=1, max_cache_len=cache_len) for spec in specs]
    results = suite.compare(runners, rounds, progress)
    rows = []
    for spec, r in zip(specs, results):
        rows.append({"name": spec.name, **dict(spec.options),
                     "speedup_vs_ar": r.tokens_per_second / results[0].tokens_per_second,
                     "tokens_per_second": r.tokens_per_second,
                     "identical_to_ar": r.identical_to_ar,
                     "layer_passes_per_token": r.stats["layer_passes_per_token"],
                     "tokens_per_round": r.stats["tokens_per_round"],
                     "draft_exit_histogram": r.stats["draft_exit_histogram"]})
    return rows


def best_row(rows: list[dict]) -> dict:
    """The fastest SpecBound row (AR's excluded), every row checked lossless."""
    if not all(r["identical_to_ar"] for r in rows):
        raise AssertionError("a SpecBound setting departed from AR: "
                             + ", ".join(r["name"] for r in rows if not r["identical_to_ar"]))
    return max(rows[1:], key=lambda r: r["speedup_vs_ar"])


def main(argv=None) -> int:
    p = args_lib.Parser(prog="hispec bench-tool seed-methods",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: shipped)")
    p.add_argument("--prompts", type=int, default=4, help="held-out ShareGPT prompts")
    p.add_argument("--max-prompt-tokens", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--batch-sizes", default="1,4,16")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sweep", action="store_true", help="also sweep SpecBound's parameters")
    p.add_argument("--sweep-prompts", type=int, default=4, help="calibration prompts")
    p.add_argument("--sweep-tokens", type=int, default=32, help="new tokens per prompt")
    p.add_argument("--no-batches", action="store_true", help="only the sweep")
    p.add_argument("--out", default="seed_methods.json")
    args = p.parse_args(argv)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    from hispec_jax import DEFAULT_MODEL_DIR
    from hispec_jax.models.model import load_model
    from hispec_jax.planner import calibrate

    tick = lambda msg: print(f"[seed-methods] {msg}", file=sys.stderr, flush=True)
    model = load_model(args.model or DEFAULT_MODEL_DIR)
    out = Path(args.out)
    report: dict[str, Any] = {"device": suite.device_description(), "model": model.path,
                              "command": "python -m hispec_jax.bench seed-methods "
                                         + " ".join(argv if argv is not None else sys.argv[1:])}
    sv_path = suite.sv_profile_path(model, out.parent, tick)
    report["sv_profile"] = sv_path
    save = lambda: out.write_text(json.dumps(report, indent=1, default=str))
    if args.sweep:
        # Two stages on calibration prompts (training split, never the held-out ones):
        # confidence (tau x anneal) at D = L/2, W = 4; then (D, W) at the best of those.
        calib = calibrate.calibration_prompts(model, args.sweep_prompts, 64)
        L = model.cfg.num_layers
        stage1 = {"tau": [0.3, 0.5, 0.7, 0.9], "anneal": [0.0, 1.0, 2.0],
                  "depth_bound": [L // 2], "width": [4]}
        tick(f"SpecBound sweep, stage 1: {stage1}")
        report["specbound_sweep"] = rows = specbound_sweep(
            model, calib, args.sweep_tokens, stage1, args.rounds, lambda n: tick(f"sweep: {n}"))
        save()
        best = best_row(rows)
        stage2 = {"tau": [best["tau"]], "anneal": [best["anneal"]],
                  "depth_bound": sorted({L // 4, L // 3, L // 2, 2 * L // 3}),
                  "width": [2, 4, 8]}
        tick(f"SpecBound sweep, stage 2: {stage2}")
        report["specbound_sweep_stage2"] = rows2 = specbound_sweep(
            model, calib, args.sweep_tokens, stage2, args.rounds, lambda n: tick(f"sweep: {n}"))
        report["specbound_best"] = best_row(rows2)
        save()
        tick(f"best SpecBound setting: {report['specbound_best']}")
    held_out = prompts_lib.load_prompts("sharegpt", model.tokenizer, max(batch_sizes + [args.prompts]),
                                        args.max_prompt_tokens)
    method_specs = suite.default_specs(sv_path)
    report["batch"] = {}
    for b in ([] if args.no_batches else batch_sizes):
        prompts = held_out[:max(b, args.prompts)]
        cache_len = suite.common_cache_len(model, prompts, method_specs, args.max_new_tokens)
        runners = [suite.hispec_runner(model, prompts, s, max_new_tokens=args.max_new_tokens,
                                       batch_size=b, max_cache_len=cache_len)
                   for s in method_specs]
        results = suite.compare(runners, args.rounds, lambda n: tick(f"batch {b}: {n}"))
        ar = results[0]
        report["batch"][str(b)] = [r.to_json(ar) for r in results]
        for r in results:
            tick(f"batch {b} {r.name}: {r.tokens_per_second:.1f} tok/s "
                 f"({r.tokens_per_second / ar.tokens_per_second:.2f}x AR), identical "
                 f"{r.identical_to_ar}, passes/token {r.stats.get('layer_passes_per_token')}")
        save()
    tick(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
