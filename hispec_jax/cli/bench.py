"""`hispec bench` (the whole benchmark: prompts to report.md and plots) and `hispec
bench-tool TOOL` (one benchmark tool: `hispec_jax/bench/tools.py` lists them)."""

from __future__ import annotations

import sys
from pathlib import Path

from hispec_jax.cli import common, load_options
from hispec_jax.cli import distributed as distributed_cli


def wrong_oracle_spelling(argv: list[str]) -> str | None:
    """The error for `hispec bench-oracle` and `hispec bench --oracle`, spellings of the
    oracle benchmark that the command does not take: it names `hispec bench-tool oracle`;
    else None."""
    if argv[:1] == ["bench-oracle"] or (argv[:1] == ["bench"] and "--oracle" in argv):
        return "the oracle benchmark is `hispec bench-tool oracle` (same flags)"
    return None


def add_parsers(subparsers) -> None:
    bench = common.add_command(
        subparsers, "bench", run_bench,
        help="every method and transformers side by side: report.md and plots",
        description="Greedy decoding of ShareGPT evaluation and HumanEval prompts with AR, a "
                    "LayerSkip sweep, HiSpec (defaults, adaptive, tuned on an exit grid), SV, "
                    "SpecBound (batch sizes 1, 4, 16 too) and transformers' generate / "
                    "assistant_early_exit on the same weights, timed in "
                    "interleaved rounds; checks every output equals AR's. Writes report.json, "
                    "report.md and PNG plots to --out-dir. See hispec_jax/bench/run.py. The "
                    "single-purpose tools (methods side by side on any model, the always-agree "
                    "oracle, accelerator checks, serving load, work per token) are `hispec "
                    "bench-tool`; the memory of every loop is `hispec plan-memory --compare`.")
    bench.add_argument("--model", default=None,
                       help="local Hugging Face model directory or Hub id org/name (default: the "
                            "shipped model)")
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
    bench.add_argument("--draft-exits", type=common.int_list, default=None,
                       help="LayerSkip draft exits to sweep (default: every exit <= L/4, every "
                            "other one <= L/2)")
    bench.add_argument("--draft-lens", type=common.int_list, default=None,
                       help="LayerSkip draft lengths to sweep (default: 2,4; --quick 2)")
    bench.add_argument("--grid-exits", default=None,
                       help="exits of the HiSpec (Ld, Li) grid (default: as --draft-exits; "
                            "'none' skips the grid)")
    bench.add_argument("--tuned", type=common.int_list, default=None,
                       help="Ld,Li,Nd,Ni of 'hispec tuned' instead of tuning on the grid")
    bench.add_argument("--batch-sizes", default=None,
                       help="throughput of AR, LayerSkip, HiSpec, SV and SpecBound at these "
                            "batch sizes ('none' skips; default: 1,4,16; --quick 1,2)")
    bench.add_argument("--no-transformers", action="store_true",
                       help="skip the transformers (PyTorch) baselines")
    bench.add_argument("--no-seed-methods", action="store_true", dest="no_sv_specbound",
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
    bench.add_argument("--tasks", default=None, metavar="TASK[,TASK...]",
                       help="instead of the whole benchmark: the task mix (chat, summarize, "
                            "extract, code) with AR, prompt lookup alone and under an exit, "
                            "transformers greedy and prompt-lookup, one table per task "
                            "(hispec_jax/bench/tasks.py; uses --model, --prompts (default 3), "
                            "--max-prompt-tokens, --max-new-tokens (default 96), --rounds, "
                            "--no-transformers, --chat, --stop-at-eos, --out-dir)")
    bench.add_argument("--chat", action="store_true",
                       help="--tasks: render prompts with the model's chat template")
    bench.add_argument("--stop-at-eos", action="store_true",
                       help="--tasks: each prompt stops at EOS (and, with --chat, at the end "
                            "of its turn), --max-new-tokens a cap; default: EOS ignored (not "
                            "with --auto)")
    bench.add_argument("--lookup", type=int, default=None, metavar="K",
                       help="--tasks: k of our lookup drafter (default 16 alone, 8 under exits)")
    bench.add_argument("--recommended", action="store_true",
                       help="--tasks: also the model's recommended layerskip and hispec, each "
                            "alone and with the lookup drafter below it")
    bench.add_argument("--auto", action="store_true",
                       help="--tasks: also method='auto', tuned per task on --auto-prompts "
                            "prompts disjoint from the measured ones, with its ratio to the "
                            "best fixed choice")
    bench.add_argument("--auto-prompts", type=int, default=None, metavar="N",
                       help="--tasks --auto: calibration prompts per task (default 4)")
    bench.add_argument("--auto-verify", action="store_true",
                       help="--tasks --auto: choose auto's plan by timing the tune's plans on "
                            "the calibration prompts (as hispec tune --verify)")
    bench.add_argument("--draft-model", default=None, metavar="PATH",
                       help="--tasks: also a draft model row (method draft): PATH, a smaller "
                            "model of the same vocabulary (Hugging Face directory, Hub id or "
                            "GGUF file), drafts for --model; greedy-checked against AR as "
                            "every row")
    bench.add_argument("--draft-k", type=int, default=None, metavar="K",
                       help="--tasks --draft-model: most drafts a round (default 5)")
    bench.add_argument("--no-draft-gate", dest="draft_gate", action="store_const", const=False,
                       default=None,
                       help="--tasks --draft-model: K drafts every round, no acceptance gate")
    bench.add_argument("--cross-request", action="store_true",
                       help="--tasks: also the lookup drafting from the task's earlier prompts "
                            "and outputs (a new store each round; batch 1, prompts in order)")
    load_options.add_load_flags(bench)
    common.add_mesh_flag(bench)
    distributed_cli.add_distributed_flags(bench)

    tool = common.add_command(
        subparsers, "bench-tool", run_bench_tool, add_help=False,
        help="run one benchmark tool: bench-tool TOOL [args] (without TOOL: the list)")
    tool.set_defaults(passthrough=True)


def run_bench_tool(args) -> int:
    from hispec_jax.bench import tools

    return tools.main(args.extra, prog="hispec bench-tool")


def run_tasks(args) -> int:
    """`hispec bench --tasks ...`: the task-mix tool with the bench's flags (with --auto,
    method="auto" tuned per task beside the fixed choices)."""
    from hispec_jax.bench import tasks

    if args.model is not None:
        common.check_model_path(common.model_path(args))
    argv = ["--tasks", args.tasks, "--prompts", str(args.prompts or 3),
            "--max-prompt-tokens", str(max(args.max_prompt_tokens, 512)
                                       if args.max_prompt_tokens == 256 else args.max_prompt_tokens),
            "--max-new-tokens", str(args.max_new_tokens or 96), "--rounds", str(args.rounds or 3),
            "--out", str(Path(args.out_dir) / "tasks.json")]
    argv += ["--model", args.model] if args.model else []
    argv += ["--chat"] if args.chat else []
    argv += ["--stop-at-eos"] if args.stop_at_eos else []
    argv += ["--no-transformers"] if args.no_transformers else []
    argv += ["--lookup", str(args.lookup)] if args.lookup is not None else []
    argv += ["--recommended"] if args.recommended else []
    argv += ["--auto"] if args.auto else []
    argv += ["--auto-verify"] if args.auto_verify else []
    argv += ["--auto-prompts", str(args.auto_prompts)] if args.auto_prompts is not None else []
    common.check_draft_model(args, common.model_path(args) if args.model is not None
                             else common.default_model_dir())
    argv += ["--cross-request"] if args.cross_request else []
    argv += ["--draft-model", args.draft_model] if args.draft_model is not None else []
    argv += ["--draft-k", str(args.draft_k)] if args.draft_k is not None else []
    argv += ["--no-draft-gate"] if args.draft_gate is False else []
    parsed = tasks.parse_args(argv)
    tasks.check_args(parsed)  # one-line errors (ValueError) before anything loads
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    print(load_options.startup_line(args.model or common.default_model_dir(), args),
          file=sys.stderr, flush=True)
    tasks.run(parsed, load_options.load_kwargs(args))
    return 0


def run_bench(args) -> int:
    if args.tasks is not None:
        if distributed_cli.distributed_arg(args) is not None:
            raise ValueError("--tasks: on one host only (the task mix takes no multi-host "
                             "flags)")
        return run_tasks(args)
    for name in ("stop_at_eos", "lookup", "recommended", "auto", "auto_prompts", "auto_verify",
                 "draft_model", "draft_k", "draft_gate", "cross_request"):
        if getattr(args, name) not in (None, False):
            raise ValueError(f"{common.flag(name)} is a --tasks flag: give --tasks too")
    mesh_shape = common.mesh_arg(args)  # before importing JAX
    several_hosts = distributed_cli.distributed_arg(args, needs_mesh=True)
    if several_hosts is not None and not args.no_transformers:
        raise ValueError("--no-transformers: give it on several hosts (the PyTorch "
                         "baselines run on one host: `hispec bench --mesh` there)")
    if several_hosts is not None and not (args.no_sv_specbound or args.sv_profile):
        raise ValueError("--sv-profile: on several hosts give an SV profile (hispec "
                         "profile-sv, on one host) or --no-seed-methods: a quick profile "
                         "times the host it runs on, and every process must decode with one")
    if args.model is not None:
        common.check_model_path(common.model_path(args))
    if args.tuned is not None and len(args.tuned) != 4:
        raise ValueError(f"--tuned takes Ld,Li,Nd,Ni, got {args.tuned}")
    from hispec_jax.bench.report import summary_lines
    from hispec_jax.bench.run import BenchConfig, run_bench as run

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
                    else common.optional_ints(args.grid_exits, "--grid-exits")),
        tuned=args.tuned, transformers=not args.no_transformers,
        batch_sizes=common.optional_ints(batch_sizes, "--batch-sizes"),
        agreement=not args.no_agreement, sv_specbound=not args.no_sv_specbound,
        sv_profile=args.sv_profile, out_dir=args.out_dir, progress=not args.no_progress,
        load_options=load_options.load_kwargs(args))
    if args.quick:
        if args.draft_exits is None:
            config.draft_exits = None if args.model else (2, 4)
        if args.grid_exits is None and not args.model:
            config.grid_exits = (2, 4, 6)
    distributed_cli.initialize(several_hosts)  # every process runs the same benchmark
    common.use_mesh(mesh_shape)  # the bench's load_model shards onto it
    leader = distributed_cli.is_leader()  # prints and writes the report
    config.write_report = leader
    config.progress = config.progress and leader
    print(load_options.startup_line(args.model or common.default_model_dir(), args),
          file=sys.stderr, flush=True)
    report = run(config)
    if not leader:
        return 0
    print("\n".join(summary_lines(report)))
    print(f"wrote {args.out_dir}/report.md, report.json and {len(report['plots'])} plots")
    return 0
