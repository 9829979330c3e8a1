"""The same decoding loops compiled several ways on a GPU, timed side by side: does a
change to what XLA is given close AR's gap to the roofline?

    python benchmarks/results_accelerator/engine_variants.py --study STUDY [--no-8b] [--out FILE.json]

Each variant of a study is set up, the engine's compiled loops are dropped, and the loops
are compiled again and timed with the oracle tool (`bench/oracle.py`: always-agree models,
decoding loop time, median of 3 interleaved rounds): AR at Llama-3-8B shapes in bf16
(unrolled layout, random weights) with its share of the roofline, and AR and LayerSkip on
the shipped default model. The first variant (what ships) is timed first and last, to
bracket drift. Studies:

  command-buffers        XLA's command buffers (CUDA graphs; `xla_gpu_enable_command_buffer`)
                         as XLA sets them, off, and with the while loop and conditionals too,
                         through the engine's per-compile knob `engine.COMPILER_OPTIONS`. The
                         H200 run of 2026-11-26 had found the default model's AR step at 1.05
                         ms where its layers and head, timed alone, take 0.58 ms.
  flat-attention-output  the attention output flattened behind an optimization barrier before
                         the o projection (`ModelConfig.flat_attention_output`): the 8B
                         profile of 2026-11-27 found XLA writing x_i * wo_io out in full.
  fused-projections      q/k/v as one product and gate/up as another (`params.fuse_layer`,
                         `load_model(fused=True)`): the models' weights
                         are laid out again for each variant, 4 products a layer instead of 7.
  int8-weights           weight-only int8 layer projections (`params.quantize_layer`) against
                         the model's dtype; the default model's departures from its own
                         greedy output: `int8_departures.py`.

(The command-buffers run of 2026-11-27, then `command_buffers.py`, also counted
command-buffer computations in each loop's HLO, `command_buffers_per_loop` in its JSON; the
pattern missed XLA's naming and read 0 everywhere, so it was removed.)
"""

import argparse
import dataclasses
import json
import os
import time

import jax

from hispec_jax import DEFAULT_MODEL_DIR, load_model
from hispec_jax.bench import oracle
from hispec_jax.bench.accelerator import Settings, agree_preset
from hispec_jax.bench.oracle import in_layout
from hispec_jax.bench.suite import MethodSpec, device_description
from hispec_jax.decoding import engine as engine_lib
from hispec_jax.models import params as params_lib

LOOP_COMMANDS = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE"


def compiler_options(options: dict):
    return lambda: engine_lib.COMPILER_OPTIONS.__setitem__(jax.default_backend(), options)


# The studies' model switches, read by `relaid`.
LAYOUT = {"int8": False, "fused": False, "flat_attention_output": False}


def layout(**switches):
    return lambda: LAYOUT.update(switches)


SHIPPED_OPTIONS = {k: dict(v) for k, v in engine_lib.COMPILER_OPTIONS.items()}


def int8_weights(on: bool, triton_gemm: bool = False):
    """int8 weights on or off, with XLA's compiler options as shipped or, with
    `triton_gemm`, XLA:GPU's Triton GEMM emitter for every dot (a product whose operand is
    converted from int8 is then one fusion reading the int8 weight)."""
    def set_up():
        LAYOUT["int8"] = on
        options = dict(SHIPPED_OPTIONS.get(jax.default_backend(), {}))
        if triton_gemm:
            options["xla_gpu_triton_gemm_any"] = True
        engine_lib.COMPILER_OPTIONS[jax.default_backend()] = options
    return set_up


def relaid(model):
    """`model` with the study's switches: fused projections, int8 weights (unrolled layout
    only) and the flattened attention output (`LAYOUT`)."""
    kind = params_lib.layer_layout(model.params)
    unrolled = kind == "unrolled"
    return dataclasses.replace(
        model, cfg=model.cfg.replace(flat_attention_output=LAYOUT["flat_attention_output"]),
        params=params_lib.with_layer_layout(model.params, kind,
                                            fused=LAYOUT["fused"] and unrolled,
                                            int8=LAYOUT["int8"] and unrolled))


STUDIES = {  # study -> variant label -> set-up (the first label is what ships)
    "command-buffers": {
        "xla default": compiler_options({}),
        "command buffers off": compiler_options({"xla_gpu_enable_command_buffer": ""}),
        "loop in command buffers": compiler_options(
            {"xla_gpu_enable_command_buffer": LOOP_COMMANDS})},
    "flat-attention-output": {
        "as shipped": layout(flat_attention_output=False),
        "barrier before the o projection": layout(flat_attention_output=True)},
    "fused-projections": {
        "as shipped": layout(fused=False),
        "q/k/v and gate/up fused": layout(fused=True)},
    "int8-weights": {
        "as shipped": int8_weights(False),
        "weight-only int8": int8_weights(True),
        "weight-only int8, Triton GEMM for every dot": int8_weights(True, triton_gemm=True)},
}


def time_variant(set_up, models: dict, progress) -> dict:
    set_up()
    engine_lib.clear_compiled()
    for name, (model, specs, always_agree) in list(models.items()):  # in place: one copy
        models[name] = (relaid(model), specs, always_agree)
    out = {"compiler_options": engine_lib.compiler_options(),
           "flat_attention_output": LAYOUT["flat_attention_output"],
           "fused_projections": LAYOUT["fused"], "int8_weights": LAYOUT["int8"]}
    for name, (model, specs, always_agree) in models.items():
        t0 = time.perf_counter()
        try:
            report = oracle.run(model, specs, prompts=2, prompt_len=32, max_new_tokens=64,
                                batch_size=1, rounds=3, stage_model=False, progress=progress,
                                model_is_always_agree=always_agree)
        except Exception as e:  # an option XLA cannot apply here: recorded, not fatal
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            continue
        out[name] = {"rows": {r["name"]: {"tokens_per_second": r["tokens_per_second"],
                                          "identical_to_ar": r["identical_to_ar"]}
                              for r in report["rows"]},
                     "fraction_of_roofline": report["ar_fraction_of_roofline"],
                     "seconds": time.perf_counter() - t0}
        engine_lib.clear_compiled()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--study", choices=sorted(STUDIES), required=True)
    p.add_argument("--no-8b", action="store_true", help="only the default model")
    p.add_argument("--out", default="engine_variants.json")
    args = p.parse_args()
    t_start = time.perf_counter()
    progress = lambda msg: print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)
    print(f"# {device_description()}; jax {jax.__version__}; "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
    default = load_model(DEFAULT_MODEL_DIR)
    models = {"default model": (default, oracle.default_specs(default)[:2], False)}
    if not args.no_8b:
        agree = in_layout(agree_preset(Settings()), "unrolled")
        models = {"8b ar": (agree, [MethodSpec.of("ar", "ar")], True), **models}
    variants = STUDIES[args.study]
    order = list(variants) + [next(iter(variants))]
    results = []
    for label in order:
        progress(f"variant: {label}")
        results.append({"variant": label, **time_variant(variants[label], models, progress)})
        with open(args.out, "w") as f:
            json.dump({"study": args.study, "device": device_description(), "jax": jax.__version__,
                       "xla_flags": os.environ.get("XLA_FLAGS", ""), "results": results},
                      f, indent=1)
        for name in models:
            r = results[-1][name]
            rows = r.get("rows", {})
            print(f"  {label} | {name}: " + (r.get("error") or ", ".join(
                f"{m} {v['tokens_per_second']:.1f} tok/s" for m, v in rows.items())
                + (f"; roofline {r['fraction_of_roofline']:.0%}"
                   if r.get("fraction_of_roofline") else "")), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
