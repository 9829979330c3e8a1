"""The engine against its own prediction, on an always-agree model (`hispec bench-tool oracle`).

The always-agree variant of a model zeroes every layer's attention-output and MLP-down
weights, so each layer adds nothing to the residual stream: every exit's hidden state is
the token's embedding, every exit agrees with the final layer, and every draft is
accepted. What is left to measure is the engine: how close a speculative method's wall
time comes to the work it does.

    prediction      AR's cost per token / the method's, in units of one layer pass:
                    layer passes per token, and, in the second column, also the exit-head
                    evaluations, each worth (head bytes / layer bytes) layer passes
    efficiency      measured speedup / predicted speedup (1.0: no overhead beyond the work)
    stage model     the planner's latency model (docs/planner.md) at acceptance 1 with this
                    device's measured cost of one layer and one head over a block of T
                    tokens, and no fixed cost per pass or round: the time the passes the
                    method runs take here, blocks included. Its efficiency isolates the
                    engine's own overhead where a block of T tokens costs more than one token
                    (a CPU: T = 9 costs ~2x T = 1), which the layer-pass count assumes away
    roofline        AR's bytes per token (weights, with the LM head, + KV at the mean
                    context) x tokens/s / the device's memory bandwidth (accelerators whose
                    bandwidth is known)

    hispec bench-tool oracle --shapes tiny                     # a preset, random weights
    hispec bench-tool oracle --model hispec_jax/default_model
    hispec bench-tool oracle --shapes llama3-8b --dtype bfloat16   # on a GPU

Prompts are random token ids (the oracle needs no tokenizer); greedy; EOS ignored; the
methods are timed in interleaved rounds (`suite.compare`) and checked token-identical to AR.
A round's time is the decoding loop's (`stats["decode_seconds"]`): prefill and request
building cost every method the same and are not part of what the layer passes predict.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.bench import args as args_lib
from hispec_jax.bench import suite
from hispec_jax.bench.roofline import nbytes, step_weight_bytes
from hispec_jax.bench.suite import MethodSpec
from hispec_jax.models.heads import head_kind, projection_kind
from hispec_jax.models.model import Model, load_model
from hispec_jax.models.params import (default_layer_layout, init_params, layer_layout,
                                      with_layer_layout)

# Peak memory bandwidth (bytes/s) by device kind (substring match, first wins).
HBM_BANDWIDTH = (("H200", 4.8e12), ("H100", 3.35e12), ("A100", 2.0e12), ("L4", 0.3e12),
                 ("TPU v5 lite", 0.819e12), ("TPU v5e", 0.819e12), ("TPU v5p", 2.765e12),
                 ("TPU v4", 1.2e12), ("TPU v6", 1.64e12))


def scaled_residuals(model: Model, scale: float) -> Model:
    """`model` with every layer's attention-output and MLP-down weights times `scale` (any
    layout): each layer's contribution to the residual stream shrinks by `scale`, so small
    scales make every exit's argmax (nearly) the final layer's; 0 zeroes them."""
    layout = layer_layout(model.params)
    stacked = dict(with_layer_layout(model.params, "scan")["layers"])
    for name in ("wo", "w_down"):
        stacked[name] = (jnp.zeros_like(stacked[name]) if scale == 0
                         else stacked[name] * jnp.asarray(scale, stacked[name].dtype))
    params = with_layer_layout({**model.params, "layers": stacked}, layout)
    return dataclasses.replace(model, params=params)


def in_layout(model: Model, layout: str) -> Model:
    """`model` with its layer weights in `layout` ("scan" or "unrolled")."""
    return dataclasses.replace(model, params=with_layer_layout(model.params, layout))


def always_agree(model: Model) -> Model:
    """`model` with every layer's attention-output and MLP-down weights zeroed (any layout)
    and no trained exit heads: every exit's hidden state is the token's embedding."""
    return dataclasses.replace(scaled_residuals(model, 0.0), heads={})


def preset_model(name: str, dtype: str | None, seed: int = 0) -> Model:
    """A random-weight model of a preset's shapes (`configs/model_NAME.py`, e.g. llama3-8b)."""
    from hispec_jax.models import presets

    cfg = presets.model_config_from_ml_collections(presets.load_config(name.replace("-", "_")))
    if dtype:
        cfg = cfg.replace(dtype=dtype)
    params = init_params(cfg, jax.random.key(seed))
    return Model(cfg=cfg, params=params, generation_config={})


def head_cost_in_layers(model: Model, exit_layer: int) -> float:
    """One evaluation of exit `exit_layer`'s head, in units of one layer's weight bytes."""
    cfg = model.cfg
    layer_bytes = nbytes(model.params["layers"]) / cfg.num_layers
    head_bytes = 0
    if head_kind(cfg, model.heads, exit_layer) != "shared":
        head_bytes = nbytes(model.heads[str(exit_layer)])
    if projection_kind(cfg, model.heads, exit_layer) == "shared":  # (an adapter's too)
        head_bytes += cfg.hidden_size * cfg.vocab_size * jnp.dtype(cfg.dtype).itemsize
    return head_bytes / layer_bytes


def ar_bytes_per_token(model: Model, context: float) -> float:
    """Weights read per AR step (the LM head included, the embedding table not) + KV read
    at `context` positions, per sequence at batch 1."""
    cfg = model.cfg
    weights = step_weight_bytes(model)
    kv_per_position = (2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim
                       * jnp.dtype(cfg.dtype).itemsize)
    return weights + kv_per_position * context


def device_bandwidth() -> float | None:
    kind = jax.devices()[0].device_kind
    return next((bw for name, bw in HBM_BANDWIDTH if name.lower() in kind.lower()), None)


def default_specs(model: Model) -> list[MethodSpec]:
    L = model.cfg.num_layers
    d, m = max(1, L // 8), max(2, L // 4)
    return [MethodSpec.of("ar", "ar"),
            MethodSpec.of(f"layerskip d={m} n=8", "layerskip", draft_exit=m, draft_len=8),
            MethodSpec.of(f"hispec {d}->{m}", "hispec", draft_exit=d, verify_exits=(m,)),
            MethodSpec.of(f"hispec {d}->{m} Nd=4 Ni=12", "hispec", draft_exit=d,
                          verify_exits=(m,), draft_len=4, verify_window=12)]


def cost_units(model: Model, stats: dict[str, Any]) -> tuple[float, float]:
    """(layer passes per token, layer passes + head evaluations in layer units per token)."""
    tokens = stats["new_tokens"]
    passes = stats["layer_passes"] / tokens
    heads = sum(n * head_cost_in_layers(model, e)
                for n, e in zip(stats["actions_per_level"], stats["exits"]))
    return passes, passes + heads / tokens


def stage_model_seconds(model: Model, decoders: list, batch_size: int, capacity: int,
                        context: int, repeats: int = 5) -> tuple[list[float], Any]:
    """Seconds per token of each decoder by the latency model at acceptance 1, with the
    stage costs (`planner.calibrate.measure_stage_costs`) measured here at the blocks the
    decoders run; (per decoder, the measured `latency.Costs`)."""
    from hispec_jax.decoding import windows as windows_lib
    from hispec_jax.planner import calibrate, latency

    blocks = sorted({1}.union(*(latency.blocks(d.windows) for d in decoders if d.windows)))
    layer_s, head_s = calibrate.measure_stage_costs(model, batch_size, capacity, blocks,
                                                    repeats, context=context)
    costs = latency.Costs(batch=batch_size, num_layers=model.cfg.num_layers,
                          block_sizes=tuple(blocks), layer_s=tuple(layer_s), head_s=tuple(head_s),
                          head_scale=calibrate.head_cost_scales(model))
    seconds = []
    for d in decoders:
        exits, K = d.hierarchy.exits, d.hierarchy.num_levels
        # at acceptance 1 adaptive windows settle at their bounds and a batch stays in phase
        adaptive = isinstance(d.hierarchy.window_policy, windows_lib.AdaptiveWindows)
        windows = d.hierarchy.max_windows if adaptive else d.windows
        pred = latency.predict(exits, windows, [1.0] * (K - 1), costs)
        seconds.append(pred.seconds_per_token / batch_size)
    return seconds, costs


def run(model: Model, specs: list[MethodSpec], *, prompts: int, prompt_len: int,
        max_new_tokens: int, batch_size: int, rounds: int, seed: int = 0,
        stage_model: bool = True, progress=None,
        model_is_always_agree: bool = False) -> dict[str, Any]:
    """Times `specs` (the first must be AR) on the always-agree variant of `model`
    (`model` itself with `model_is_always_agree`: no second copy of an 8B model's weights)."""
    if specs[0].method != "ar":
        raise ValueError("the first method of an oracle run must be AR (the reference)")
    oracle = model if model_is_always_agree else always_agree(model)
    rng = np.random.RandomState(seed)
    token_prompts = [rng.randint(0, model.cfg.vocab_size, prompt_len).tolist()
                     for _ in range(prompts)]
    capacity = suite.common_cache_len(oracle, token_prompts, specs, max_new_tokens)
    runners = [suite.hispec_runner(oracle, token_prompts, spec, max_new_tokens=max_new_tokens,
                                   batch_size=batch_size, max_cache_len=capacity,
                                   loop_time_only=True)
               for spec in specs]
    results = suite.compare(runners, rounds, progress)
    stats_keys = ("new_tokens", "layer_passes", "actions_per_level", "exits", "rounds")
    rows = [{"name": spec.name, "tokens_per_second": result.tokens_per_second,
             "identical_to_ar": result.identical_to_ar,
             **{k: result.stats[k] for k in stats_keys}}
            for spec, result in zip(specs, results)]
    ar = rows[0]
    ar_passes, ar_units = cost_units(oracle, ar)
    for row in rows:
        passes, units = cost_units(oracle, row)
        row["speedup"] = row["tokens_per_second"] / ar["tokens_per_second"]
        row["layer_passes_per_token"] = passes
        row["predicted_speedup"] = ar_passes / passes
        row["predicted_speedup_with_heads"] = ar_units / units
        row["efficiency"] = row["speedup"] / row["predicted_speedup"]
        row["efficiency_with_heads"] = row["speedup"] / row["predicted_speedup_with_heads"]
        row["loop_trips_per_token"] = row["rounds"] / (row["new_tokens"] / batch_size)
    context = prompt_len + max_new_tokens / 2
    costs = None
    if stage_model:
        if progress:
            progress("stage costs")
        seconds, costs = stage_model_seconds(oracle, [s.decoder(oracle) for s in specs],
                                             batch_size, capacity, int(context))
        for row, sec in zip(rows, seconds):
            row["predicted_speedup_stages"] = seconds[0] / sec
            row["efficiency_stages"] = row["speedup"] / row["predicted_speedup_stages"]
            # the engine's own share of a token's time, AR's included
            row["stage_model_tokens_per_second"] = 1.0 / sec
    bandwidth = device_bandwidth()
    bytes_per_token = ar_bytes_per_token(oracle, context)
    roofline = None
    if bandwidth:
        roofline = bytes_per_token * ar["tokens_per_second"] / batch_size / bandwidth
    return {"device": suite.device_description(), "model": _describe(model),
            "prompts": prompts, "prompt_len": prompt_len, "max_new_tokens": max_new_tokens,
            "batch_size": batch_size, "rounds": rounds, "capacity": capacity,
            "head_cost_in_layers": head_cost_in_layers(oracle, model.cfg.num_layers),
            "ar_bytes_per_token": bytes_per_token, "bandwidth": bandwidth,
            "stage_costs": costs.to_json() if costs is not None else None,
            "ar_fraction_of_roofline": roofline, "rows": rows}


def _describe(model: Model) -> str:
    cfg = model.cfg
    return (f"{model.path or 'random weights'} (L={cfg.num_layers}, D={cfg.hidden_size}, "
            f"V={cfg.vocab_size}, {cfg.dtype}, {layer_layout(model.params)})")


def markdown(report: dict[str, Any]) -> str:
    f = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"
    lines = [f"Device: {report['device']}. Model (always-agree variant): {report['model']}; "
             f"{report['prompts']} random prompts of {report['prompt_len']} tokens, "
             f"{report['max_new_tokens']} new tokens, batch {report['batch_size']}, "
             f"{report['rounds']} interleaved rounds (median, decoding loop time). One "
             f"exit-head evaluation costs {report['head_cost_in_layers']:.2f} layer passes "
             "(weight bytes).", "",
             "| method | tokens/s | speedup | predicted (layer passes) | efficiency | "
             "predicted (passes + heads) | efficiency | predicted (stage model) | efficiency "
             "| layer passes / token | loop trips / token | identical |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    pct = lambda x: "-" if x is None else f"{x:.0%}"
    for r in report["rows"]:
        stages = r.get("predicted_speedup_stages")
        lines.append(f"| {r['name']} | {r['tokens_per_second']:.1f} | {r['speedup']:.2f}x "
                     f"| {r['predicted_speedup']:.2f}x | {r['efficiency']:.0%} "
                     f"| {r['predicted_speedup_with_heads']:.2f}x | {r['efficiency_with_heads']:.0%} "
                     f"| {f(stages)}x | {pct(r.get('efficiency_stages'))} "
                     f"| {r['layer_passes_per_token']:.1f} | {r['loop_trips_per_token']:.2f} "
                     f"| {r['identical_to_ar']} |")
    c = report.get("stage_costs")
    if c:
        per_T = ", ".join(f"T={T}: {1e3 * l:.2f} / {1e3 * h:.2f}"
                          for T, l, h in zip(c["block_sizes"], c["layer_s"], c["head_s"]))
        ar = report["rows"][0]
        lines += ["", f"Stage costs measured here (ms, one layer / one head, block of T tokens): "
                      f"{per_T}. AR by the stage model {ar['stage_model_tokens_per_second']:.1f} "
                      f"tokens/s, measured {ar['tokens_per_second'] / report['batch_size']:.1f} "
                      f"per sequence."]
    if report["ar_fraction_of_roofline"] is not None:
        lines += ["", f"AR: {report['ar_bytes_per_token'] / 1e9:.3f} GB per token at "
                      f"{report['bandwidth'] / 1e12:.2f} TB/s -> "
                      f"{report['ar_fraction_of_roofline']:.0%} of the HBM roofline."]
    else:
        lines += ["", "AR's share of the memory roofline: the device's bandwidth is unknown "
                      "(CPU), not reported."]
    return "\n".join(lines) + "\n"


def _parse_specs(text: str, model: Model) -> list[MethodSpec]:
    """'layerskip:4:8,hispec:2:4:4:12' -> specs (AR first, always)."""
    if not text:
        return default_specs(model)
    specs = [MethodSpec.of("ar", "ar")]
    for item in text.split(","):
        method, *numbers = item.split(":")
        n = [int(x) for x in numbers]
        if method == "layerskip" and len(n) == 2:
            specs.append(MethodSpec.of(f"layerskip d={n[0]} n={n[1]}", "layerskip",
                                       draft_exit=n[0], draft_len=n[1]))
        elif method == "hispec" and len(n) == 4:
            specs.append(MethodSpec.of(f"hispec {n[0]}->{n[1]} Nd={n[2]} Ni={n[3]}", "hispec",
                                       draft_exit=n[0], verify_exits=(n[1],), draft_len=n[2],
                                       verify_window=n[3]))
        else:
            raise ValueError(f"--methods: {item!r} is not layerskip:D:N or hispec:D:M:ND:NI")
    return specs


def finish(report: dict, table: str, out: str | None) -> int:
    """A tool's end: the table printed, the report written to `out` (JSON), exit status 1
    when a row's tokens departed from AR's."""
    print(table)
    if out:
        Path(out).write_text(json.dumps(report, indent=1, default=str))
    return 0 if all(r["identical_to_ar"] for r in report["rows"]) else 1


def main(argv=None) -> int:
    ap = args_lib.Parser(prog="hispec bench-tool oracle", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--model", help="a HF directory or .gguf file (its always-agree variant)")
    source.add_argument("--shapes", default="tiny",
                        help="a model preset with random weights: tiny, llama3-8b, "
                             "llama3_1-8b, qwen3-8b, llama2-70b")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    ap.add_argument("--layer-layout", choices=["scan", "unrolled"], default=None,
                    help="default: the backend's (unrolled on CPU/GPU, scan on TPU)")
    ap.add_argument("--methods", default="",
                    help="besides AR, e.g. layerskip:4:8,hispec:2:4:4:12 "
                         "(default: LayerSkip L/4 n=8 and HiSpec L/8->L/4 two window settings)")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-stage-model", action="store_true",
                    help="skip timing one layer and one head per block length (the stage-model "
                         "prediction)")
    ap.add_argument("--out", default=None, help="write the report as JSON here")
    args = ap.parse_args(argv)
    for name in ("prompts", "prompt_len", "max_new_tokens", "batch_size", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.model:
        model = load_model(args.model, dtype=args.dtype, layer_layout=args.layer_layout)
    else:
        model = preset_model(args.shapes, args.dtype)
    layout = args.layer_layout or default_layer_layout()
    model = in_layout(model, layout)
    try:
        specs = _parse_specs(args.methods, model)
        for spec in specs:
            spec.decoder(model)
    except ValueError as e:
        ap.error(str(e))
    report = run(model, specs, prompts=args.prompts, prompt_len=args.prompt_len,
                 max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                 rounds=args.rounds, stage_model=not args.no_stage_model,
                 progress=lambda name: print(f"[oracle] {name}", file=sys.stderr))
    return finish(report, markdown(report), args.out)


if __name__ == "__main__":
    sys.exit(main())
