"""`hispec tune`, `hispec profile-sv`: measuring a model on this device to choose how to
decode it (`hispec_jax/planner/`)."""

from __future__ import annotations

import dataclasses
import sys

from hispec_jax.cli import common, load_options
from hispec_jax.decoding import options as options_lib


def add_parsers(subparsers) -> None:
    tune = common.add_command(
        subparsers, "tune", run_tune,
        help="choose the fastest hierarchy (HSD) for a model on this device: --method auto",
        description="Measures exit-pair acceptance on calibration prompts (ShareGPT training "
                    "split) and the engine's stage costs on this device, searches exits and "
                    "windows with the latency model, prints the top plans and saves the best "
                    "predicted (with --verify: the fastest measured) for --method auto. See "
                    "docs/planner.md.")
    tune.add_argument("--model", default=None, help="local model directory or Hub id org/name "
                                                   "(default: shipped)")
    load_options.add_load_flags(tune)
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
    tune.add_argument("--recommend", action="store_true",
                      help="also write the best LayerSkip and HiSpec plans as the model's "
                           "recommended_plan.json (in its directory): what --method "
                           "layerskip / hispec use when no exits are given")
    tune.add_argument("--task", default=None, metavar="TASK",
                      help="calibrate on the prompts of a `hispec bench --tasks` task (chat, "
                           "summarize, extract, code) instead of ShareGPT chat: the workload "
                           "decides whether prompt lookup pays (prompts up to 512 tokens)")
    tune.add_argument("--chat", action="store_true",
                      help="with --task: render the prompts with the model's chat template")
    tune.add_argument("--draft-model", default=None, metavar="PATH",
                      help="also a draft model's plans (method draft): PATH, a smaller model of "
                           "the same vocabulary, priced by its acceptance on the calibration "
                           "prompts and its step's cost here, ranked with the other plans; the "
                           "plan file is the pair's")
    tune.add_argument("--smaller-draft-model", default=None, metavar="PATH",
                      help="--draft-model: a second, smaller draft model of the same vocabulary "
                           "drafting for it (HSD's two draft models): their plans join too")
    tune.add_argument("--draft-k", type=int, default=None, metavar="K",
                      help="--draft-model: price only k = K (default: k = "
                           + ", ".join(map(str, (1, 2, 3, 4, 5, 6, 8))) + ")")
    tune.add_argument("--no-draft-gate", dest="draft_gate", action="store_const", const=False,
                      default=None,
                      help="--draft-model: its plans draft k tokens every round (no gate)")
    common.add_mesh_flag(tune)

    prof = common.add_command(
        subparsers, "profile-sv", run_profile_sv,
        help="profile a model's SV signals on this device: --method sv",
        description="Bins the companion's agreement signals (S, A) of the draft tokens on "
                    "the model's own greedy continuations of calibration prompts into "
                    "equal-count bins, with the final layer's mean acceptance per bin, and "
                    "measures the stage costs on this device; saves sv_profile.json in the "
                    "model directory (or --out). See docs/sv_specbound.md.")
    prof.add_argument("--model", default=None, help="local model directory or Hub id org/name "
                                                   "(default: shipped)")
    load_options.add_load_flags(prof)
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


def run_tune(args) -> int:
    from hispec_jax.planner import tune as tune_lib

    for flag in ("batch_size", "verify_prompts", "verify_tokens", "verify_repeats", "top"):
        if getattr(args, flag) < 1:
            raise ValueError(f"{common.flag(flag)} must be >= 1, got {getattr(args, flag)}")
    if args.task is not None:
        from hispec_jax.bench import tasks as tasks_lib

        if args.task not in tasks_lib.TASKS:
            raise ValueError(f"--task {args.task}: expected one of {', '.join(tasks_lib.TASKS)}")
    elif args.chat:
        raise ValueError("--chat renders --task prompts; give --task too")
    draft = check_draft_flags(args)
    common.check_model_path(common.model_path(args))
    common.check_draft_model(args, args.model or common.default_model_dir())
    common.use_mesh(common.mesh_arg(args))  # load_model shards onto it
    model = load_options.load(args, args.model or common.default_model_dir())
    model = load_options.with_draft_model(args, model)
    settings, prompts = None, None
    if args.task is not None:  # the task's prompts (long: passages, code), a cache to hold them
        from hispec_jax.planner import calibrate

        settings = calibrate.Settings.quick() if args.quick else calibrate.Settings()
        settings = dataclasses.replace(settings, max_prompt_tokens=512, capacity=1024)
        prompts = tasks_lib.task_prompts(model, args.task, settings.num_prompts,
                                         settings.max_prompt_tokens, args.chat)
    report = tune_lib.tune_and_verify(
        model, args.batch_size, quick=args.quick, settings=settings, prompts=prompts,
        max_levels=args.max_levels, top=args.top,
        out=args.out, verify=args.verify, verify_prompts=args.verify_prompts,
        verify_tokens=args.verify_tokens, verify_repeats=args.verify_repeats,
        choose_measured=not args.keep_predicted, plot=args.plot,
        progress=lambda msg: print(f"[tune] {msg}", file=sys.stderr), **draft)
    print("\n".join(tune_lib.summary_lines(report)))
    if args.recommend:
        command = "hispec tune" + (" --verify" if args.verify else "") + (
            " --quick" if args.quick else "")
        path = tune_lib.save_recommended(model, report, command)
        print(f"wrote the model's recommended plan to {path}")
    return 0


def check_draft_flags(args) -> dict:
    """--draft-model's companions (one-line errors): `tune`'s draft keyword arguments."""
    if args.draft_model is None:
        for name in ("draft_k", "draft_gate"):
            if getattr(args, name) is not None:
                raise ValueError(f"{common.flag(name)} prices a draft model's plans: give "
                                 "--draft-model too")
        return {}
    draft = {}
    if args.draft_k is not None:
        try:
            options_lib.check_method_options("draft", draft=args.draft_model, draft_k=args.draft_k)
        except options_lib.OptionError as e:
            raise common.usage_error(e) from None
        draft["draft_ks"] = (args.draft_k,)
    if args.draft_gate is False:
        draft["draft_gate"] = False
    return draft


def run_profile_sv(args) -> int:
    for name in ("batch_size", "s_bins", "a_bins", "prompts", "new_tokens"):
        if getattr(args, name) is not None:
            options_lib.check_positive_int(name, getattr(args, name))
    model_dir = common.model_path(args)
    num_layers = common.check_model_path(model_dir)
    try:
        options_lib.check_method_options("sv", num_layers=num_layers, draft_exit=args.draft_exit,
                                         verify_exits=args.verify_exits)
    except options_lib.OptionError as e:
        raise common.usage_error(e) from None

    from hispec_jax.planner import calibrate, sv_profile

    model = load_options.load(args, model_dir)
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
