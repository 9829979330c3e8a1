"""SV and SpecBound beside LayerSkip and HiSpec, side by side, and the SpecBound sweep.

    python -m hispec_jax.bench.seed_methods [--model DIR] [--prompts N] [--max-new-tokens N]
        [--batch-sizes 1,4,16] [--rounds R] [--sweep] [--out FILE]

1. SV profile: `sv_profile.json` of the model directory if it fits the default exits, else a
   quick `planner.sv_profile.profile_sv` run (calibration prompts: ShareGPT training split),
   written next to --out.
2. --sweep: SpecBound over (tau, anneal, depth bound, width) on calibration prompts (the
   training split, not the benchmark's held-out prompts): layer passes per token (what
   predicts an accelerator's speedup) and tokens/s on this machine.
3. At every batch size: AR, LayerSkip, HiSpec, SV and SpecBound (defaults) on held-out
   ShareGPT prompts, timed in interleaved rounds (`suite.compare`), each checked against AR.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from hispec_jax.bench import prompts as prompts_lib
from hispec_jax.bench import suite
from hispec_jax.bench.suite import MethodSpec


def sv_profile_path(model, out_dir: Path, progress) -> str:
    """A profile for the model's default SV exits: the model directory's, else a new one."""
    from hispec_jax.decoding import methods, sv as sv_lib
    from hispec_jax.planner import calibrate, sv_profile

    d, c = methods.default_exits(model)
    try:
        table = sv_lib.find_table(model.path)
        if (table.draft_exit, table.companion_exit) == (d, c):
            return str(Path(model.path) / sv_lib.PROFILE_FILE)
    except FileNotFoundError:
        pass
    progress("profiling SV (quick)")
    table = sv_profile.profile_sv(model, d, c, settings=calibrate.Settings.quick())
    out_dir.mkdir(parents=True, exist_ok=True)
    return str(table.save(out_dir / sv_lib.PROFILE_FILE))


def specs(sv_path: str) -> list[MethodSpec]:
    return [MethodSpec.of("ar", "ar"),
            MethodSpec.of("layerskip defaults", "layerskip"),
            MethodSpec.of("hispec defaults", "hispec"),
            MethodSpec.of("sv defaults", "sv", sv_profile=sv_path),
            MethodSpec.of("specbound defaults", "specbound")]


def specbound_sweep(model, prompts, new_tokens: int, grid: dict[str, list]) -> list[dict]:
    """Every combination of `grid` (keys: tau, anneal, depth_bound, width) on `prompts`:
    layer passes per token and tokens/s (second call: compiled)."""
    from hispec_jax.decoding.generate import generate

    rows = []
    keys = sorted(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
        options = dict(zip(keys, values))
        kwargs = dict(method="specbound", max_new_tokens=new_tokens, ignore_eos=True, **options)
        generate(model, prompts, **kwargs)  # compile
        r = generate(model, prompts, **kwargs)
        rows.append({**options, "layer_passes_per_token": r.stats["layer_passes_per_token"],
                     "tokens_per_second": r.stats["tokens_per_second"],
                     "acceptance": r.stats["acceptance_rate_per_level"][1],
                     "tokens_per_round": r.stats["tokens_per_round"],
                     "draft_exit_histogram": r.stats["draft_exit_histogram"]})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hispec_jax.bench.seed_methods",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: shipped)")
    p.add_argument("--prompts", type=int, default=4, help="held-out ShareGPT prompts")
    p.add_argument("--max-prompt-tokens", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--batch-sizes", default="1,4,16")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sweep", action="store_true", help="also sweep SpecBound's parameters")
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
                              "command": "python -m hispec_jax.bench.seed_methods "
                                         + " ".join(argv if argv is not None else sys.argv[1:])}
    sv_path = sv_profile_path(model, out.parent, tick)
    report["sv_profile"] = sv_path
    if args.sweep:
        calib = calibrate.calibration_prompts(model, 4, 64)
        L = model.cfg.num_layers
        grid = {"tau": [0.5, 0.7, 0.9], "anneal": [0.0, 1.0], "depth_bound": [L // 2],
                "width": [4]}
        tick(f"SpecBound sweep over {grid}")
        report["specbound_sweep"] = specbound_sweep(model, calib, 32, grid)
    held_out = prompts_lib.load_prompts("sharegpt", model.tokenizer, max(batch_sizes + [args.prompts]),
                                        args.max_prompt_tokens)
    method_specs = specs(sv_path)
    report["batch"] = {}
    for b in batch_sizes:
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
    out.write_text(json.dumps(report, indent=1, default=str))
    tick(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
