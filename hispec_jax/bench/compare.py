"""Decoding methods side by side on one model, greedy or sampling, one table per batch size.

    hispec bench-tool compare                                       # the shipped model
    hispec bench-tool compare --model PATH --methods ar,layerskip,hispec,sv,specbound \\
        --batch-sizes 1,4,16
    hispec bench-tool compare --synthetic agree:0.05 --draft-exits 1,2,4 --loop-time
    hispec bench-tool compare --synthetic random --methods ar --transformers \\
        --batch-sizes 1,8 --prompts 1 --prompt-len 32:64          # our AR vs transformers
    hispec bench-tool compare --model PATH --methods ar,hispec --temperatures 0.6,1.0
    hispec bench-tool compare --model PATH --specbound-sweep

Methods (`--methods`; AR always comes first: every output is checked against its tokens):

    ar               autoregressive decoding
    layerskip        LayerSkip at its defaults, or one row per `--draft-exits` exit
    hispec           HiSpec at its defaults (sampling: token-wise and blockwise rows)
    hispec-adaptive  HiSpec with adaptive windows
    sv               SV with the model's `sv_profile.json`, else a quick profile written
                     next to --out, or to the working directory (calibration prompts: the
                     ShareGPT training split)
    specbound        SpecBound at its defaults
    lookup           prompt lookup
    auto             the plan `hispec tune` saved for the batch size (a quick tune first
                     when there is none)

Per batch size B one `suite.compare`: the first max(B, --prompts) prompts, B decoded
together; every method warmed up (compiled, tokens checked against AR's), then timed in
interleaved rounds. tokens/s is the median over rounds of one call's wall time, or with
`--loop-time` of its compiled loop alone (request building and host copies excluded).
`--transformers` adds transformers' greedy `generate` on the same weights (B prompts
left-padded in one call). Greedy columns: tokens/s, x AR, acceptance per level, final
acceptance, true reject rate, tokens per full pass, layer passes and work per token, loop
trips per token, wall ms per sequential layer pass, that over AR's, and the compiled loop's
extra memory over AR's (XLA's memory analysis). Exit status 1 when one of our methods
departs from AR, or transformers from our AR at batch 1.

Sampling (`--temperatures`): at each temperature every method samples with seed `--seed` +
r in timed round r: tokens/s, x AR, block efficiency (tokens per full pass, mean over
rounds) and acceptance per level (last round).

`--specbound-sweep`: SpecBound on calibration prompts (the ShareGPT training split, never
the held-out ones), each stage side by side with AR: tau x anneal at D = L/2, W = 4, then
depth bound x width at the best of those: speedup, layer passes per token (what predicts
an accelerator's speedup), tokens per round and the exit-depth histogram.

Models: `--model` (a Hugging Face directory or GGUF file; default: the shipped model), or
`--synthetic`: a random Llama-style model whose layers' residual contributions are scaled
(`agree:S`, `oracle.scaled_residuals`: small S makes every exit's argmax the last layer's,
the regime an early-exit-trained model is in; `random`: S = 1, exits disagree). Prompts:
random token ids of `--prompt-len` tokens (N, or MIN:MAX drawn per prompt), or held-out
ShareGPT / HumanEval prompts of at most that many tokens (`hispec_jax/datasets.py`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hispec_jax.bench import args as args_lib

PROG = "hispec bench-tool compare"
METHODS = ("ar", "layerskip", "hispec", "hispec-adaptive", "sv", "specbound", "lookup", "auto")


def residual_scale(kind: str) -> float:
    """`--synthetic` text -> the factor on every layer's residual contribution:
    "random" -> 1.0, "agree:S" -> S (S >= 0)."""
    if kind == "random":
        return 1.0
    name, _, value = kind.partition(":")
    try:
        scale = float(value)
    except ValueError:
        scale = -1.0
    if name != "agree" or scale < 0:
        raise argparse.ArgumentTypeError(
            f"expected 'random' or 'agree:S' with S >= 0, got {kind!r}")
    return scale


def prompt_lengths(text: str) -> tuple[int, int]:
    """`"48"` -> (48, 48); `"32:64"` -> (32, 64). argparse type."""
    low, _, high = text.partition(":")
    try:
        lengths = (int(low), int(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN:MAX, got {text!r}")
    if not 1 <= lengths[0] <= lengths[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return lengths


def method_list(text: str) -> tuple[str, ...]:
    """`"layerskip,hispec"` -> ("ar", "layerskip", "hispec"): known names, AR first."""
    names = tuple(dict.fromkeys(m for m in text.split(",") if m))
    bad = [m for m in names if m not in METHODS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)}; choose from "
                                         f"{', '.join(METHODS)}")
    return ("ar",) + tuple(m for m in names if m != "ar")


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Appends a flag's default to its help unless the help already says it."""

    def _get_help_string(self, action):
        if "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def parse_args(argv=None) -> argparse.Namespace:
    ap = args_lib.Parser(prog=PROG, description=__doc__.split("\n")[0],
                         formatter_class=_DefaultsHelp)
    ap.add_argument("--model", default=None,
                    help="Hugging Face directory or .gguf file (default: the shipped model)")
    ap.add_argument("--synthetic", default=None, help="a random model instead: random | agree:S")
    ap.add_argument("--layers", type=int, default=16, help="synthetic: layers")
    ap.add_argument("--hidden", type=int, default=512, help="synthetic: hidden size")
    ap.add_argument("--heads", type=int, default=None,
                    help="synthetic: attention heads (default: hidden / 64)")
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="synthetic: key/value heads (default: heads / 4, at least 1)")
    ap.add_argument("--intermediate", type=int, default=None,
                    help="synthetic: MLP size (default: 8/3 hidden, a multiple of 64)")
    ap.add_argument("--vocab", type=int, default=4096, help="synthetic: vocabulary size")
    ap.add_argument("--methods", type=method_list, default=method_list(
        "ar,layerskip,hispec,hispec-adaptive"), help="comma-separated: " + ", ".join(METHODS))
    ap.add_argument("--draft-exits", type=args_lib.int_list, default=(),
                    help="layerskip: one row per draft exit, e.g. 1,2,4 (default: one row at "
                         "its defaults)")
    ap.add_argument("--dataset", default=None, choices=["random", "sharegpt", "humaneval"],
                    help="prompts (default: sharegpt for --model, random for --synthetic)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts (at least the batch size)")
    ap.add_argument("--prompt-len", type=prompt_lengths, default=(64, 64), metavar="N|MIN:MAX",
                    help="random prompts: this many ids; dataset prompts: longer ones skipped")
    ap.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--batch-sizes", type=args_lib.positive_int_list, default=(1,),
                    help="one comparison per batch size")
    ap.add_argument("--rounds", type=int, default=3, help="timed interleaved rounds (median)")
    ap.add_argument("--loop-time", action="store_true",
                    help="time the compiled loop alone, not the whole call")
    ap.add_argument("--transformers", action="store_true",
                    help="also transformers' greedy generate on the same weights (PyTorch)")
    ap.add_argument("--temperatures", type=args_lib.float_list, default=(),
                    help="sampling instead of greedy, at each temperature, e.g. 0.6,1.0")
    ap.add_argument("--specbound-sweep", action="store_true",
                    help="instead of the tables: sweep SpecBound's parameters")
    ap.add_argument("--sweep-prompts", type=int, default=4, help="sweep: calibration prompts")
    ap.add_argument("--sweep-tokens", type=int, default=32, help="sweep: new tokens per prompt")
    ap.add_argument("--layer-layout", default=None, choices=["scan", "unrolled"],
                    help="layer weights layout (default: the backend's)")
    ap.add_argument("--threads", type=int, default=None,
                    help="pin this process (JAX and PyTorch) to this many CPU cores")
    ap.add_argument("--seed", type=int, default=0, help="synthetic weights, prompts, sampling")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        ap.error(str(e))
    return args


def check_args(args) -> None:
    """Bad combinations: ValueError before anything heavy is imported."""
    for name in ("layers", "hidden", "vocab", "prompts", "max_new_tokens", "rounds",
                 "sweep_prompts", "sweep_tokens", "heads", "kv_heads", "intermediate"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.synthetic is not None:
        try:
            residual_scale(args.synthetic)
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"--synthetic: {e}")
        if args.model:
            raise ValueError("--model or --synthetic: give one")
        heads, kv_heads = synthetic_heads(args)
        if heads < 1 or args.hidden % heads:
            raise ValueError(f"--hidden {args.hidden}: must be a multiple of the heads ({heads})")
        if heads % kv_heads:
            raise ValueError(f"--kv-heads {kv_heads}: must divide the heads ({heads})")
        needs_text = [m for m in args.methods if m in ("sv", "auto")]
        if (args.dataset or "random") != "random" or needs_text or args.specbound_sweep:
            what = (f"--dataset {args.dataset}" if args.dataset not in (None, "random")
                    else "--specbound-sweep" if args.specbound_sweep else needs_text[0])
            raise ValueError(f"{what} calibrates or reads text: needs --model (a tokenizer)")
    if any(t <= 0 for t in args.temperatures):
        raise ValueError("--temperatures must be > 0 (greedy is the default)")
    if args.transformers and (args.temperatures or args.loop_time):
        raise ValueError("--transformers times greedy calls end to end: leave out "
                         + ("--temperatures" if args.temperatures else "--loop-time"))
    cores = len(os.sched_getaffinity(0))
    if args.threads is not None and not 1 <= args.threads <= cores:
        raise ValueError(f"--threads must be in [1, {cores}], got {args.threads}")
    if args.model is not None and not os.path.exists(args.model):
        raise ValueError(f"--model {args.model}: no such file or directory")


def synthetic_heads(args) -> tuple[int, int]:
    """(attention heads, key/value heads) of the synthetic model: the flags, else hidden /
    64 heads (head dim 64) and a quarter as many key/value heads."""
    heads = args.heads or args.hidden // 64
    return heads, args.kv_heads or max(1, heads // 4)


def synthetic_model(args):
    """A random Llama-style model (scan layout) whose layers' residual contributions are
    scaled by `residual_scale(args.synthetic)`."""
    import jax
    import numpy as np

    from hispec_jax import Model, ModelConfig
    from hispec_jax.bench import oracle
    from hispec_jax.models.params import init_params

    hidden = args.hidden
    heads, kv_heads = synthetic_heads(args)
    cfg = ModelConfig(model_type="llama", vocab_size=args.vocab, hidden_size=hidden,
                      intermediate_size=args.intermediate or hidden * 8 // 3 // 64 * 64,
                      num_layers=args.layers, num_heads=heads,
                      num_kv_heads=kv_heads,
                      head_dim=hidden // heads, max_position_embeddings=4096)
    params = init_params(cfg, jax.random.PRNGKey(args.seed),
                         init_std=0.3 / np.sqrt(hidden / 64))
    model = Model(cfg=cfg, params=params, generation_config={})
    return oracle.scaled_residuals(model, residual_scale(args.synthetic))


def load(args):
    """(our model in `--layer-layout`, the transformers model on the same weights or None)."""
    from hispec_jax import DEFAULT_MODEL_DIR, load_model
    from hispec_jax.bench import hf_baselines
    from hispec_jax.models import hf_io
    from hispec_jax.models.params import default_layer_layout, with_layer_layout

    if args.synthetic is None:
        path = args.model or DEFAULT_MODEL_DIR
        model = load_model(path, layer_layout=args.layer_layout)
        hf_model = (hf_baselines.load_hf_model(path, threads=args.threads)
                    if args.transformers else None)
        return model, hf_model
    model = synthetic_model(args)
    hf_model = None
    if args.transformers:  # the same weights, written as a Hugging Face directory
        with tempfile.TemporaryDirectory(prefix="hispec_compare_") as workdir:
            hf_io.save_checkpoint(workdir, model.cfg, model.params)
            hf_model = hf_baselines.load_hf_model(workdir, threads=args.threads)
    layout = args.layer_layout or default_layer_layout()
    return dataclasses.replace(model, params=with_layer_layout(model.params, layout)), hf_model


def prompts_for(model, args, count: int) -> list[list[int]]:
    """`count` prompts as token ids: random ids in [3, vocab) with lengths drawn from
    `--prompt-len`, or the dataset's first prompts of at most its longest."""
    import numpy as np

    from hispec_jax import datasets as prompts_lib

    low, high = args.prompt_len
    dataset = args.dataset or ("random" if args.synthetic else "sharegpt")
    if dataset != "random":
        return prompts_lib.load_prompts(dataset, model.tokenizer, count, high)
    rng = np.random.RandomState(args.seed)
    return [rng.randint(3, model.cfg.vocab_size, n).tolist()
            for n in rng.randint(low, high + 1, size=count)]


def method_specs(model, args, batch_size: int, sv_profile: str | None, tick) -> list:
    """The `suite.MethodSpec`s of `--methods` at `batch_size`, AR first."""
    from hispec_jax.bench.suite import MethodSpec

    specs = []
    for name in args.methods:
        if name == "layerskip" and args.draft_exits:
            specs += [MethodSpec.of(f"layerskip d={e}", "layerskip", draft_exit=e)
                      for e in args.draft_exits]
        elif name == "hispec-adaptive":
            specs.append(MethodSpec.of("hispec adaptive", "hispec", adaptive=True))
        elif name == "sv":
            specs.append(MethodSpec.of("sv defaults", "sv", sv_profile=sv_profile))
        elif name == "auto":
            specs.append(auto_spec(model, batch_size, tick))
        else:
            specs.append(MethodSpec.of(name if name in ("ar", "lookup") else f"{name} defaults",
                                       name))
    return specs


def auto_spec(model, batch_size: int, tick):
    """What method="auto" runs at `batch_size`: the saved plan, else a quick tune's best."""
    from hispec_jax.bench.suite import MethodSpec
    from hispec_jax.planner import plan as plan_lib, tune as tune_lib

    plan = plan_lib.load_plan(model, batch_size)
    if plan is None:
        tick(f"no saved plan for batch {batch_size}: tuning quickly")
        plan = tune_lib.tune(model, batch_size, quick=True)["plans"][0]
    return MethodSpec.of(f"auto: {plan.name()}", plan.method, **plan.method_options())


def transformers_runner(hf_model, prompts: list[list[int]], new_tokens: int, batch_size: int):
    """transformers' batched greedy `generate` (`batch_size` prompts a call) as a Runner."""
    from hispec_jax.bench import hf_baselines, suite

    def run() -> tuple[list[list[int]], float]:
        tokens, seconds = [], 0.0
        for i in range(0, len(prompts), batch_size):
            new, s = hf_baselines.hf_generate_batch(hf_model, prompts[i:i + batch_size],
                                                    new_tokens)
            tokens, seconds = tokens + new, seconds + s
        return tokens, seconds

    def warmup() -> suite.Result:
        return suite.Result(name="transformers", token_ids=run()[0],
                            new_tokens=len(prompts) * new_tokens,
                            options={"method": "transformers"})

    return suite.Runner("transformers", warmup, lambda: run()[1])


def cost_columns(stats: dict[str, Any], tokens_per_second: float, num_prompts: int,
                 batch_size: int) -> dict[str, float]:
    """Loop trips per generated token and wall ms per sequential layer pass, per sequence of
    the batch (a trip: one round of the engine, else one action)."""
    trips = stats.get("rounds") or sum(stats.get("actions_per_level") or [0])
    per_sequence_tokens = stats["new_tokens"] / num_prompts
    batches = -(-num_prompts // batch_size)
    return {"trips_per_token": trips / batches / per_sequence_tokens,
            "ms_per_layer_pass": 1e3 / (tokens_per_second * stats["layer_passes_per_token"])
            * batch_size}


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def greedy_table(model, hf_model, prompts, specs, batch_size: int, args, tick) -> dict:
    """One greedy comparison at `batch_size`: prints its table, returns its rows by name."""
    from hispec_jax.bench import suite

    N = args.max_new_tokens
    capacity = suite.common_cache_len(model, prompts, specs, N)
    runners = [suite.hispec_runner(model, prompts, s, max_new_tokens=N, batch_size=batch_size,
                                   max_cache_len=capacity, loop_time_only=args.loop_time)
               for s in specs]
    if hf_model is not None:
        runners.append(transformers_runner(hf_model, prompts, N, batch_size))
    results = suite.compare(runners, args.rounds, lambda n: tick(f"batch {batch_size}: {n}"))
    ar = results[0]
    ar_cost = cost_columns(ar.stats, ar.tokens_per_second, len(prompts), batch_size)
    print("| method | exits | tokens/s | x AR | same tokens as AR | accept/level | final acc "
          "| true rej | tok/full pass | layer passes/tok | work/tok | work speedup "
          "| loop trips/tok | ms/layer pass | vs AR's ms/pass | extra mem vs AR |")
    print("|---" * 16 + "|")
    rows = {}
    for r in results:
        s, row = r.stats, r.to_json(ar)
        cells = ["-"] * 11
        if s:
            cost = cost_columns(s, r.tokens_per_second, len(prompts), batch_size)
            relative = cost["ms_per_layer_pass"] / ar_cost["ms_per_layer_pass"]
            extra = (r.memory_bytes - ar.memory_bytes) / ar.memory_bytes * 100
            row.update(cost, time_vs_prediction=relative, extra_memory_percent=extra)
            levels = (s.get("acceptance_rate_per_level") or [None])[1:]
            cells = ["/".join(map(_f, levels)) or "-", _f(s.get("final_acceptance_rate")),
                     _f(s.get("true_reject_rate")), _f(s.get("tokens_per_full_pass")),
                     _f(s.get("layer_passes_per_token")), _f(s.get("work_per_token")),
                     _f(s.get("work_speedup")), f"{cost['trips_per_token']:.2f}",
                     f"{cost['ms_per_layer_pass']:.3f}", f"{relative:.2f}", f"{extra:+.2f}%"]
        rows[r.name] = row
        print(f"| {r.name} | {s.get('exits', '-')} | {r.tokens_per_second:.1f} "
              f"| {r.tokens_per_second / ar.tokens_per_second:.2f}x | {r.identical_to_ar} | "
              + " | ".join(cells) + " |")
    return rows


def sampling_runner(model, prompts, spec, temperature: float, seed: int, common: dict,
                    loop_time: bool):
    """A sampling `suite.Runner` (warm-up samples with `seed`, timed round r with `seed` +
    r) and the list its timed rounds append their `generate` stats to."""
    from hispec_jax import generate
    from hispec_jax.bench import suite

    round_stats: list[dict] = []

    def run(s: int):
        return generate(model, prompts, method=spec.method, temperature=temperature, seed=s,
                        **common, **dict(spec.options))

    def warmup() -> suite.Result:
        r = run(seed)
        return suite.Result(name=spec.name, token_ids=r.token_ids,
                            new_tokens=r.stats["new_tokens"],
                            compile_seconds=r.stats["program_seconds"],
                            stats={k: r.stats.get(k) for k in suite.STAT_KEYS},
                            options=dict(spec.options))

    def timed_round() -> float:
        t0 = time.perf_counter()
        r = run(seed + len(round_stats))
        seconds = time.perf_counter() - t0
        round_stats.append(r.stats)
        return r.stats["decode_seconds"] if loop_time else seconds

    return suite.Runner(spec.name, warmup, timed_round), round_stats


def sampling_table(model, prompts, specs, batch_size: int, temperature: float, args,
                   tick) -> dict:
    """One sampling comparison: prints its table, returns its rows by name. HiSpec's rows
    are token-wise and blockwise verification."""
    from hispec_jax.bench import suite

    expanded = []
    for s in specs:
        if s.method == "hispec" and "acceptance" not in dict(s.options):
            expanded += [suite.MethodSpec.of(f"{s.name} {a}", "hispec", acceptance=a,
                                             **dict(s.options))
                         for a in ("tokenwise", "blockwise")]
        else:
            expanded.append(s)
    common = dict(max_new_tokens=args.max_new_tokens, ignore_eos=True, batch_size=batch_size)
    runners, per_round = [], []
    for spec in expanded:
        runner, stats = sampling_runner(model, prompts, spec, temperature, args.seed, common,
                                        args.loop_time)
        runners.append(runner)
        per_round.append(stats)
    results = suite.compare(runners, args.rounds,
                            lambda n: tick(f"batch {batch_size} T={temperature}: {n}"))
    print("| method | tokens/s | x AR | tokens per full pass (block efficiency) "
          "| acceptance per level (last round) |")
    print("|---|---|---|---|---|")
    rows = {}
    for r, stats in zip(results, per_round):
        efficiency = statistics.mean(s["tokens_per_full_pass"] or 1.0 for s in stats)
        last = stats[-1]["acceptance_rate_per_level"] or []
        speedup = r.tokens_per_second / results[0].tokens_per_second
        rows[r.name] = {"tokens_per_second": r.tokens_per_second, "seconds": r.seconds,
                        "speedup_vs_ar": speedup, "tokens_per_full_pass": efficiency,
                        "acceptance_last_round": last}
        print(f"| {r.name} | {r.tokens_per_second:.1f} | {speedup:.2f}x | {efficiency:.2f} "
              f"| {'/'.join(map(_f, last[1:])) or '-'} |")
    return rows


def specbound_sweep(model, prompts, new_tokens: int, grid: dict[str, list], rounds: int,
                    progress=None) -> list[dict]:
    """SpecBound at every combination of `grid` (keys: tau, anneal, depth_bound, width) on
    `prompts`, side by side with AR in one `suite.compare` (interleaved rounds): speedup,
    layer passes per token, tokens per round and the exit-depth histogram. Rows in grid
    order, AR's first."""
    from hispec_jax.bench import suite

    keys = sorted(grid)
    specs = [suite.MethodSpec.of("ar", "ar")]
    for values in itertools.product(*(grid[k] for k in keys)):
        options = dict(zip(keys, values))
        name = "specbound " + " ".join(f"{k}={v}" for k, v in options.items())
        specs.append(suite.MethodSpec.of(name, "specbound", **options))
    cache_len = suite.common_cache_len(model, prompts, specs, new_tokens)
    runners = [suite.hispec_runner(model, prompts, spec, max_new_tokens=new_tokens,
                                   batch_size=1, max_cache_len=cache_len) for spec in specs]
    results = suite.compare(runners, rounds, progress)
    return [{"name": spec.name, **dict(spec.options),
             "speedup_vs_ar": r.tokens_per_second / results[0].tokens_per_second,
             "tokens_per_second": r.tokens_per_second, "identical_to_ar": r.identical_to_ar,
             "layer_passes_per_token": r.stats["layer_passes_per_token"],
             "tokens_per_round": r.stats["tokens_per_round"],
             "draft_exit_histogram": r.stats["draft_exit_histogram"]}
            for spec, r in zip(specs, results)]


def best_row(rows: list[dict]) -> dict:
    """The fastest SpecBound row (AR's excluded), every row checked lossless."""
    if not all(r["identical_to_ar"] for r in rows):
        raise AssertionError("a SpecBound setting departed from AR: "
                             + ", ".join(r["name"] for r in rows if not r["identical_to_ar"]))
    return max(rows[1:], key=lambda r: r["speedup_vs_ar"])


def sweep(model, args, report: dict, save, tick) -> None:
    """The two-stage SpecBound sweep into `report`: confidence (tau x anneal) at D = L/2,
    W = 4, then (D, W) at the best of those."""
    from hispec_jax.planner import calibrate

    calib = calibrate.calibration_prompts(model, args.sweep_prompts, 64)
    L = model.cfg.num_layers
    grid = {"tau": [0.3, 0.5, 0.7, 0.9], "anneal": [0.0, 1.0, 2.0], "depth_bound": [L // 2],
            "width": [4]}
    for stage in (1, 2):
        tick(f"SpecBound sweep, stage {stage}: {grid}")
        rows = specbound_sweep(model, calib, args.sweep_tokens, grid, args.rounds,
                               lambda n: tick(f"sweep: {n}"))
        report[f"specbound_sweep_stage{stage}"] = rows
        best = report["specbound_best"] = best_row(rows)
        save()
        print(f"\n# SpecBound sweep, stage {stage}: {len(calib)} calibration prompts, "
              f"{args.sweep_tokens} new tokens, {args.rounds} rounds")
        print("| setting | x AR | layer passes/tok | tokens/round | same tokens as AR |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['name']} | {r['speedup_vs_ar']:.2f}x "
                  f"| {_f(r['layer_passes_per_token'])} | {_f(r['tokens_per_round'])} "
                  f"| {r['identical_to_ar']} |")
        grid = {"tau": [best["tau"]], "anneal": [best["anneal"]],
                "depth_bound": sorted({L // 4, L // 3, L // 2, 2 * L // 3}), "width": [2, 4, 8]}
    tick(f"best SpecBound setting: {report['specbound_best']['name']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None:  # before JAX and PyTorch start their thread pools
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.threads])
    from hispec_jax.bench import suite

    tick = lambda msg: print(f"[compare] {msg}", file=sys.stderr, flush=True)
    model, hf_model = load(args)
    cfg = model.cfg
    described = (f"{args.synthetic or args.model or 'the shipped model'} L={cfg.num_layers} "
                 f"D={cfg.hidden_size} V={cfg.vocab_size} {cfg.dtype}")
    report: dict[str, Any] = {
        "command": f"{PROG} " + " ".join(sys.argv[1:] if argv is None else argv),
        "device": suite.device_description(), "model": described, "args": vars(args),
        "loadavg_start": os.getloadavg(), "tables": {}}
    out = Path(args.out or "compare.json")

    def save():
        if args.out:
            report["loadavg_end"] = os.getloadavg()
            out.write_text(json.dumps(report, indent=1, default=str))

    if args.specbound_sweep:
        sweep(model, args, report, save, tick)
        return 0
    sv_profile = (suite.sv_profile_path(model, out.parent, tick) if "sv" in args.methods
                  else None)
    report["sv_profile"] = sv_profile
    prompts = prompts_for(model, args, max(max(args.batch_sizes), args.prompts))
    ok = True
    for b in args.batch_sizes:
        batch = prompts[:max(b, args.prompts)]
        specs = method_specs(model, args, b, sv_profile, tick)
        for t in args.temperatures or (None,):
            print(f"\n# {report['device']}; {described}; {len(batch)} prompts "
                  f"({min(map(len, batch))}-{max(map(len, batch))} tokens), batch {b}, "
                  f"{args.max_new_tokens} new tokens, {args.rounds} rounds"
                  + ("" if t is None else f", sampling at temperature {t}")
                  + (", compiled loop time" if args.loop_time else ""))
            if t is None:
                rows = greedy_table(model, hf_model, batch, specs, b, args, tick)
                ours = [r for name, r in rows.items() if name != "transformers"]
                ok &= all(r["identical_to_ar"] for r in ours)
                ok &= b != 1 or rows.get("transformers", {}).get("identical_to_ar", True)
                report["tables"][f"batch {b}"] = rows
            else:
                report["tables"][f"batch {b} T={t}"] = sampling_table(
                    model, batch, specs, b, t, args, tick)
            save()
    if not ok:
        print("ERROR: an output departs from AR's (see 'same tokens as AR')", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
