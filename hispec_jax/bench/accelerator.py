"""The accelerator checks in one run: roofline, layouts, oracle, numerics, each with a target.

Meant for a GPU or TPU machine that is only lent for minutes: every check runs from one
command, each part writes its results as soon as it ends (a run cut off at its time limit
keeps the parts it finished), and the summary judges each number against its target.

    layouts         AR tokens/s at the preset's shapes (random weights), scanned and
                    unrolled layer layout, each with its share of the HBM roofline.
                    Target: unrolled (the GPU default) >= 90 % of the roofline.
    oracle          `bench-tool oracle` at the preset's shapes: each method's speedup on the
                    always-agree model against its layer-pass prediction (also passes +
                    heads, and the stage model). Target: >= 90 % of the prediction.
    oracle-default  the same on the default model (24 layers, D = 256). Target: >= 80 %.
    numerics        the default model's greedy output by every method against AR's on
                    ShareGPT prompts, at float32 "highest" (the default), float32
                    "default" (TF32 on GPUs) and bfloat16: where each sequence first
                    departs. Target: 0 departures at float32 "highest"; the others are
                    reported, not judged.

    python -m hispec_jax.bench accelerator --out-dir OUT                       # every part
    python -m hispec_jax.bench accelerator --parts layouts,oracle --out-dir OUT
    python -m hispec_jax.bench accelerator --shapes tiny --dtype float32 --quick   # a CPU smoke run

Writes OUT/accelerator.json and OUT/accelerator.md (rewritten after every part). Exit
status 1 when any method's output departs from AR where it must not (the oracle's, and
"highest" in the numerics part); targets that are missed are reported, not failed: on a
CPU none of them applies (its memory bandwidth is unknown, and a block of T tokens costs
more than one). docs/accelerator_checks.md gives the commands for a lent GPU machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax

from hispec_jax.bench import args as args_lib
from hispec_jax.bench import oracle, suite
from hispec_jax.bench.oracle import in_layout
from hispec_jax.bench.suite import MethodSpec
from hispec_jax.models.model import Model, load_model

PARTS = ("layouts", "oracle", "oracle-default", "numerics")
TARGETS = {"roofline": 0.90, "oracle": 0.90, "oracle-default": 0.80}
# key: (label, dtype, matmul precision) of the numerics part; only the first must be exact.
NUMERICS = {"f32-highest": ("float32 highest", "float32", "highest"),
            "f32-default": ("float32 default (TF32 on GPUs)", "float32", "default"),
            "bf16-highest": ("bfloat16 highest", "bfloat16", "highest")}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every part runs with (the command's flags)."""

    shapes: str = "llama3-8b"
    dtype: str = "bfloat16"
    default_model: str | None = None     # None: the shipped default model
    prompts: int = 2
    prompt_len: int = 32
    max_new_tokens: int = 64
    rounds: int = 3
    numerics_prompts: int = 16
    numerics_new_tokens: int = 128
    numerics: tuple[str, ...] = tuple(NUMERICS)   # keys of NUMERICS, in order


def agree_preset(settings: Settings) -> Model:
    """The always-agree variant of the preset's random model, in the scanned layout (one
    copy of the weights: the variant is made before any other layout exists)."""
    return oracle.always_agree(in_layout(oracle.preset_model(settings.shapes, settings.dtype),
                                         "scan"))


def layouts_part(settings: Settings, progress: Callable[[str], None]) -> dict[str, Any]:
    """AR in each layer layout, with its share of the roofline where the bandwidth is known."""
    agree = agree_preset(settings)
    rows = {}
    for layout in ("scan", "unrolled"):
        progress(f"layouts: AR, {layout}")
        model = in_layout(agree, layout)
        report = oracle.run(model, [MethodSpec.of("ar", "ar")], prompts=settings.prompts,
                            prompt_len=settings.prompt_len,
                            max_new_tokens=settings.max_new_tokens, batch_size=1,
                            rounds=settings.rounds, stage_model=False, progress=progress,
                            model_is_always_agree=True)
        del model
        rows[layout] = {"tokens_per_second": report["rows"][0]["tokens_per_second"],
                        "fraction_of_roofline": report["ar_fraction_of_roofline"]}
    return {"model": report["model"], "ar_bytes_per_token": report["ar_bytes_per_token"],
            "bandwidth": report["bandwidth"], "layouts": rows,
            "unrolled_over_scan": (rows["unrolled"]["tokens_per_second"]
                                   / rows["scan"]["tokens_per_second"])}


def oracle_part(model: Model, settings: Settings, progress: Callable[[str], None],
                model_is_always_agree: bool) -> dict[str, Any]:
    """The oracle tool's report for `model` with its default methods."""
    return oracle.run(model, oracle.default_specs(model), prompts=settings.prompts,
                      prompt_len=settings.prompt_len, max_new_tokens=settings.max_new_tokens,
                      batch_size=1, rounds=settings.rounds, progress=progress,
                      model_is_always_agree=model_is_always_agree)


def first_departures(model: Model, prompts: list[list[int]], specs: list[MethodSpec],
                     max_new_tokens: int) -> dict[str, list[int | None]]:
    """Per method (AR first, the reference), the first position where each prompt's greedy
    output departs from AR's (None: identical). All prompts in one batch, EOS ignored."""
    from hispec_jax.decoding.generate import generate

    reference = None
    departures = {}
    for spec in specs:
        out = generate(model, prompts, method=spec.decoder(model), max_new_tokens=max_new_tokens,
                       batch_size=len(prompts), ignore_eos=True).token_ids
        reference = reference or out
        departures[spec.name] = [suite.first_departure(ours, ar)
                                 for ours, ar in zip(out, reference)]
    return departures


def numerics_part(settings: Settings, progress: Callable[[str], None]) -> dict[str, Any]:
    """The default model's departures from AR at each (dtype, precision) of
    `settings.numerics`."""
    from hispec_jax import datasets as prompts_lib

    path = default_model_path(settings)
    configurations = []
    for label, dtype, precision in (NUMERICS[key] for key in settings.numerics):
        progress(f"numerics: {label}")
        model = load_model(path, dtype=dtype, matmul_precision=precision)
        prompts = prompts_lib.load_prompts("sharegpt", model.tokenizer,
                                           settings.numerics_prompts, max_prompt_tokens=256)
        profile = Path(path) / "sv_profile.json"
        specs = suite.default_specs(str(profile) if profile.exists() else None)
        departures = first_departures(model, prompts, specs, settings.numerics_new_tokens)
        configurations.append({"label": label, "dtype": dtype, "matmul_precision": precision,
                               "must_be_exact": precision == "highest" and dtype == "float32",
                               "departures": departures})
    return {"model": str(path), "prompts": settings.numerics_prompts,
            "max_new_tokens": settings.numerics_new_tokens, "configurations": configurations}


def default_model_path(settings: Settings) -> str:
    import hispec_jax

    return settings.default_model or hispec_jax.DEFAULT_MODEL_DIR


def run_part(part: str, settings: Settings, progress: Callable[[str], None]) -> dict[str, Any]:
    if part == "layouts":
        return layouts_part(settings, progress)
    if part == "oracle":
        return oracle_part(in_layout(agree_preset(settings), "unrolled"), settings, progress,
                           model_is_always_agree=True)
    if part == "oracle-default":
        return oracle_part(load_model(default_model_path(settings)), settings, progress,
                           model_is_always_agree=False)
    if part == "numerics":
        return numerics_part(settings, progress)
    raise ValueError(f"unknown part {part!r}; choose from {', '.join(PARTS)}")


# ---------------------------------------------------------------------------- the summary

def judgements(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target: what was measured, the target, and whether it is met (None: not
    measurable here, e.g. the roofline on a device of unknown bandwidth)."""
    rows = []
    if "layouts" in results:
        r = results["layouts"]
        for layout, row in r["layouts"].items():
            share = row["fraction_of_roofline"]
            rows.append({"what": f"AR, {layout} layout: share of the HBM roofline",
                         "value": share, "target": TARGETS["roofline"] if layout == "unrolled"
                         else None, "met": None if share is None or layout != "unrolled"
                         else share >= TARGETS["roofline"]})
    for part in ("oracle", "oracle-default"):
        if part not in results:
            continue
        for row in results[part]["rows"][1:]:
            eff = row["efficiency"]
            rows.append({"what": f"{part}: {row['name']}: speedup / layer-pass prediction "
                                 f"(passes + heads: {row['efficiency_with_heads']:.0%})",
                         "value": eff, "target": TARGETS[part], "met": eff >= TARGETS[part]})
    if "numerics" in results:
        for config in results["numerics"]["configurations"]:
            departed = sum(d is not None for ds in config["departures"].values() for d in ds)
            rows.append({"what": f"numerics, {config['label']}: sequences departing from AR",
                         "value": departed, "target": 0 if config["must_be_exact"] else None,
                         "met": departed == 0 if config["must_be_exact"] else None})
    return rows


def exact(results: dict[str, Any]) -> bool:
    """False when an output departed from AR where it must not."""
    for part in ("oracle", "oracle-default"):
        if part in results and not all(r["identical_to_ar"] for r in results[part]["rows"]):
            return False
    if "numerics" in results:
        for config in results["numerics"]["configurations"]:
            if config["must_be_exact"] and any(d is not None for ds in config["departures"].values()
                                               for d in ds):
                return False
    return True


def markdown(results: dict[str, Any], seconds: dict[str, float]) -> str:
    pct = lambda x: "-" if x is None else f"{x:.0%}"
    lines = [f"Device: {suite.device_description()}; jax {jax.__version__}.", "",
             "| check | measured | target | met |", "|---|---|---|---|"]
    for j in judgements(results):
        value = j["value"] if isinstance(j["value"], int) else pct(j["value"])
        target = ("-" if j["target"] is None else
                  j["target"] if isinstance(j["target"], int) else f">= {j['target']:.0%}")
        met = {None: "-", True: "yes", False: "**no**"}[j["met"]]
        lines.append(f"| {j['what']} | {value} | {target} | {met} |")
    if "layouts" in results:
        r = results["layouts"]
        lines += ["", f"Layouts ({r['model']}, AR, batch 1): " + "; ".join(
            f"{layout} {row['tokens_per_second']:.1f} tokens/s"
            for layout, row in r["layouts"].items())
            + f"; unrolled / scan {r['unrolled_over_scan']:.2f}x; "
              f"{r['ar_bytes_per_token'] / 1e9:.3f} GB per token."]
    for part in ("oracle", "oracle-default"):
        if part in results:
            lines += ["", f"### {part}", "", oracle.markdown(results[part])]
    if "numerics" in results:
        r = results["numerics"]
        lines += ["", f"### numerics ({r['model']}, {r['prompts']} ShareGPT prompts, "
                      f"{r['max_new_tokens']} new tokens, one batch)", "",
                  "| configuration | method | sequences departing | first departure |",
                  "|---|---|---|---|"]
        for config in r["configurations"]:
            for name, ds in list(config["departures"].items())[1:]:
                departed = [d for d in ds if d is not None]
                lines.append(f"| {config['label']} | {name} | {len(departed)}/{len(ds)} "
                             f"| {min(departed) if departed else '-'} |")
    lines += ["", "Seconds per part (compilation included): "
              + ", ".join(f"{p} {s:.0f}" for p, s in seconds.items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = args_lib.Parser(prog="hispec bench-tool accelerator",
                                 description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated, from: {', '.join(PARTS)}")
    ap.add_argument("--shapes", default=Settings.shapes,
                    help="the preset of the layouts and oracle parts (random weights)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=Settings.dtype,
                    help="the preset's dtype")
    ap.add_argument("--default-model", default=None,
                    help="the model of oracle-default and numerics (default: the shipped one)")
    ap.add_argument("--rounds", type=int, default=Settings.rounds)
    ap.add_argument("--quick", action="store_true",
                    help="1 prompt of 8 tokens, 8 new tokens, 1 round; numerics: 2 prompts, "
                         "16 tokens (a smoke run, e.g. on a CPU)")
    ap.add_argument("--numerics", default=",".join(NUMERICS),
                    help="the numerics part's configurations, comma-separated, from: "
                         f"{', '.join(NUMERICS)} (only f32-highest must be exact)")
    ap.add_argument("--out-dir", default=None, help="write accelerator.json and .md here")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        ap.error(f"--parts: {', '.join(unknown) or 'none given'}; choose from {', '.join(PARTS)}")
    numerics = tuple(k.strip() for k in args.numerics.split(",") if k.strip())
    if not numerics or any(k not in NUMERICS for k in numerics):
        ap.error(f"--numerics: {args.numerics!r}; choose from {', '.join(NUMERICS)}")
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    from hispec_jax.models import presets
    try:
        presets.resolve_preset(args.shapes.replace("-", "_"))
    except ValueError as e:
        ap.error(f"--shapes: {e}")
    if args.default_model and not Path(args.default_model).exists():
        ap.error(f"--default-model {args.default_model} does not exist")
    settings = Settings(shapes=args.shapes, dtype=args.dtype, default_model=args.default_model,
                        rounds=args.rounds, numerics=numerics)
    if args.quick:
        settings = dataclasses.replace(settings, prompts=1, prompt_len=8, max_new_tokens=8,
                                       rounds=1, numerics_prompts=2, numerics_new_tokens=16)
    out_dir = Path(args.out_dir) if args.out_dir else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    progress = lambda msg: print(f"[accelerator] {msg}", file=sys.stderr, flush=True)
    results: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for part in parts:
        t0 = time.perf_counter()
        results[part] = run_part(part, settings, progress)
        seconds[part] = time.perf_counter() - t0
        progress(f"{part} done in {seconds[part]:.0f} s")
        if out_dir:
            (out_dir / "accelerator.json").write_text(json.dumps(
                {"device": suite.device_description(), "jax": jax.__version__,
                 "settings": dataclasses.asdict(settings), "seconds": seconds,
                 "judgements": judgements(results), "results": results},
                indent=1, default=str))
            (out_dir / "accelerator.md").write_text(markdown(results, seconds))
        jax.clear_caches()
    print(markdown(results, seconds))
    return 0 if exact(results) else 1


if __name__ == "__main__":
    sys.exit(main())
