"""`hispec generate`: continue prompts with a decoding method."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hispec_jax.cli import common, load_options
from hispec_jax.cli import distributed as distributed_cli
from hispec_jax.decoding import options as options_lib


def add_parsers(subparsers) -> None:
    gen = common.add_command(
        subparsers, "generate", run_generate, help="continue prompts with a decoding method (ar, layerskip, hispec, ...)",
        description="Continues each PROMPT with a decoding method and prints it; a one-line "
                    "summary (model, method, decode tokens/s, compile time apart from it) "
                    "goes to stderr. Without --method it runs the model's default plan, as "
                    "serve and chat do. Greedy "
                    "output of every speculative method equals ar's token for token; whether they "
                    "are faster depends on how often the model's early exits agree with its "
                    "final layer (README.md says which method helps which model; "
                    "BENCHMARKS.md has the figures).")
    gen.add_argument("--model", default=None,
                     help="local Hugging Face model directory or .gguf file, or a Hub id "
                          "org/name (from huggingface_hub's cache, downloaded where the "
                          "network allows) (default: the shipped 24-layer model, "
                          "hispec_jax/default_model)")
    gen.add_argument("--method", default=None, choices=list(options_lib.METHODS),
                     help="ar: autoregressive; exit: early-exit inference from --exit-layer "
                          "(lossy); layerskip: self-speculation (--draft-exit, L); hispec: "
                          "hierarchical speculation (--draft-exit, --verify-exits, L); sv: "
                          "the companion exit (--verify-exits) chooses how many drafts the "
                          "final layer verifies (from the model's SV profile: without one, a "
                          "quick one is made and cached first); specbound: "
                          "each draft exits at its first confident layer (--tau, --anneal, "
                          "--depth-bound, --width); lookup: prompt-lookup n-gram drafts "
                          "(--lookup, --max-ngram) verified by the final layer; auto: "
                          "the plan `hispec tune` saved for this model, device and batch size "
                          "(a quick tune first when there is none); default: the model's "
                          "recommended plan (its HiSpec plan for the shipped model), else "
                          "lookup with its acceptance gate, as serve and chat run (the plan "
                          "and why go to stderr)")
    gen.add_argument("--exit-layer", type=int, default=None, metavar="N",
                     help="exit layer of --method exit (required there), 1..L")
    gen.add_argument("--draft-exit", type=int, default=None, metavar="N",
                     help="draft exit Ld (default: ~L/8, snapped to a layer with a head)")
    gen.add_argument("--verify-exits", type=common.int_list, default=None, metavar="N[,N...]",
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
    load_options.add_load_flags(gen)
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
    common.add_mesh_flag(gen)
    distributed_cli.add_distributed_flags(gen)
    gen.add_argument("--stream", action="store_true",
                     help="print each prompt's text as it is decoded (prompts one after "
                          "another; docs/serving.md)")
    gen.add_argument("--prompts-file", metavar="PATH", default=None,
                     help="also continue the prompts of this file, one per line after the "
                          "PROMPTs (a line that is a JSON string, \"...\", may hold "
                          "newlines; blank lines are skipped)")
    gen.add_argument("--cross-request", action="store_true",
                     help="with prompt lookup, also draft from the prompts and outputs of the "
                          "batches before (in memory; outputs never change): one instruction "
                          "over many inputs (with --batch-size 1 every prompt drafts from all "
                          "earlier ones)")
    gen.add_argument("prompts", nargs="*", metavar="PROMPT", help="text to continue (non-empty)")


def add_method_arguments(parser) -> None:
    """The options of methods sv, specbound and lookup (`hispec generate`)."""
    d = options_lib.SPECBOUND_DEFAULTS
    parser.add_argument("--sv-profile", default=None, metavar="PATH",
                        help="sv: the profile `hispec profile-sv` wrote (default: "
                             "sv_profile.json in the model directory if it is for these exits, "
                             "else one made now and cached per model, device and exits)")
    parser.add_argument("--tau", type=float, default=None, metavar="X",
                        help=f"specbound: confidence threshold in (0, 1] (default: {d['tau']})")
    parser.add_argument("--anneal", type=float, default=None, metavar="A",
                        help="specbound: temperature schedule T_l = 1 + A (1 - l/L), A >= 0 "
                             f"(default: {d['anneal']})")
    parser.add_argument("--depth-bound", type=int, default=None, metavar="D",
                        help="specbound: deepest draft exit (default: ~2L/3)")
    parser.add_argument("--width", type=int, default=None, metavar="W",
                        help=f"specbound: most drafts per round (default: {d['width']})")
    parser.add_argument("--lookup", type=int, default=None, metavar="K",
                        help="prompt-lookup drafts of up to K tokens, 1.."
                             f"{options_lib.MAX_LOOKUP}: method lookup (default: "
                             f"{options_lib.DEFAULT_LOOKUP}), or under the draft exit of "
                             "layerskip / hispec (n-gram drafts checked by the exit first)")
    parser.add_argument("--max-ngram", type=int, default=None, metavar="N",
                        help="prompt lookup: longest suffix matched, 1.."
                             f"{options_lib.MAX_NGRAM} (default: {options_lib.DEFAULT_MAX_NGRAM})")
    parser.add_argument("--no-lookup-gate", dest="lookup_gate", action="store_const",
                        const=False, default=None,
                        help="prompt lookup: propose every matched token, without the "
                             "acceptance gate that shortens proposals to what their estimated "
                             "acceptance pays for (for A/B measurement; docs/lookup.md)")
    parser.add_argument("--draft-model", default=None, metavar="PATH",
                        help="a draft model: a smaller model of the same vocabulary (Hugging "
                             "Face directory, .gguf file or Hub id; loaded with the same "
                             "--dtype / --quantize / --matmul-precision) as level 0: method "
                             "draft (the default with it) verifies its drafts with the final "
                             "layer, layerskip / hispec with their exits first")
    parser.add_argument("--smaller-draft-model", default=None, metavar="PATH",
                        help="a second, smaller draft model of the same vocabulary that drafts "
                             "for --draft-model (HSD's two draft models; loaded the same way)")
    parser.add_argument("--draft-k", type=common.draft_ks, default=None, metavar="K",
                        help="draft model: most tokens drafted per round, 1.."
                             f"{options_lib.MAX_DRAFT_K} (default: {options_lib.DEFAULT_DRAFT_K}); "
                             "with --smaller-draft-model K',K: the smaller model's tokens per "
                             f"pass of the draft model first (default: "
                             f"{options_lib.DEFAULT_INNER_DRAFT_K},{options_lib.DEFAULT_DRAFT_K})")
    parser.add_argument("--no-draft-gate", dest="draft_gate", action="store_const",
                        const=False, default=None,
                        help="draft model: draft K tokens every round, without the acceptance "
                             "gate that drafts fewer where they do not pay")
    parser.add_argument("--exit-gate", action="store_true",
                        help="layerskip / hispec without --lookup: shorten each sequence's "
                             "draft window to what its drafts' estimated acceptance pays for "
                             "(docs/engine.md, \"The exit drafter's gate\")")


def method_options(args) -> dict:
    """The method options of `hispec generate`'s arguments (None: not given)."""
    return {"exit_layer": args.exit_layer, "draft_exit": args.draft_exit,
            "verify_exits": args.verify_exits, "draft_len": args.draft_len,
            "verify_window": args.verify_window, "adaptive": args.adaptive,
            "acceptance": args.acceptance, "sv_profile": args.sv_profile, "tau": args.tau,
            "anneal": args.anneal, "depth_bound": args.depth_bound, "width": args.width,
            "lookup": args.lookup, "max_ngram": args.max_ngram,
            "lookup_gate": args.lookup_gate, "exit_gate": args.exit_gate,
            "draft_k": args.draft_k, "draft_gate": args.draft_gate}


def check_generate_args(args) -> None:
    """Every check of `hispec generate` that needs neither JAX nor the weights: the model
    path, the method (without --method, the model's default plan: `common.apply_default_plan`)
    and its options (layer ranges from config.json), sampling values, the token budget and
    the prompts. Raises ValueError naming the flag, the value and what is allowed."""
    model_path = common.model_path(args)
    num_layers = common.check_model_path(model_path)
    common.check_draft_model(args, model_path)
    common.apply_default_plan(args, model_path, num_layers)
    try:
        options_lib.check_positive_int("max_new_tokens", args.max_new_tokens)
        if args.batch_size is not None:
            options_lib.check_positive_int("batch_size", args.batch_size)
        options_lib.check_sampling(args.temperature, args.top_k, args.top_p, args.seed)
        options_lib.check_method_options(args.method, num_layers=num_layers,
                                         draft=args.draft_model, **method_options(args))
    except options_lib.OptionError as e:
        raise common.usage_error(e) from None
    if args.sv_profile is not None and not Path(args.sv_profile).exists():
        raise ValueError(f"--sv-profile {args.sv_profile}: no such file or directory (make a "
                         "profile with hispec profile-sv, or leave the flag out)")
    if args.stream:
        for flag, given in (("--json", args.json), ("--batch-size", args.batch_size is not None),
                            ("--mesh", args.mesh is not None)):
            if given:
                raise ValueError(f"--stream prints one prompt's text at a time as it is "
                                 f"decoded; it does not combine with {flag}")
    for i, prompt in enumerate(args.prompts):
        if not prompt.strip():
            raise ValueError(f"PROMPT {i + 1} is empty ({prompt!r}): give the text to continue"
                             + (" (the user message)" if args.chat else ""))
    args.prompts = list(args.prompts) + read_prompts_file(args.prompts_file)
    if not args.prompts:
        raise ValueError("no prompt: give PROMPT arguments or --prompts-file PATH")
    if args.cross_request:
        if args.method != "lookup" and args.lookup is None:
            raise ValueError(f"--cross-request: needs prompt lookup (--method lookup, or "
                             f"--lookup K under layerskip, hispec or --draft-model), not "
                             f"--method {args.method}")
        if args.stream:
            raise ValueError("--cross-request drafts from earlier batches; it does not combine "
                             "with --stream")


def read_prompts_file(path) -> list[str]:
    """The prompts of `--prompts-file` (None: none): one per line, a line that is a JSON
    string decoded (a prompt with newlines), blank lines skipped; an unreadable file or a
    bad JSON line is a ValueError naming the line."""
    if path is None:
        return []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--prompts-file {path}: cannot read it ({e})") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.lstrip().startswith('"'):
            try:
                line = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"--prompts-file {path}, line {number}: not a JSON string "
                                 f"({e.msg})") from None
            if not isinstance(line, str) or not line.strip():
                raise ValueError(f"--prompts-file {path}, line {number}: an empty prompt")
        prompts.append(line)
    if not prompts:
        raise ValueError(f"--prompts-file {path}: no prompt in it (every line is blank)")
    return prompts


def summary_line(stats: dict) -> str:
    """The one-line summary `generate` prints on stderr: the decode speed (the compiled
    runs alone: `compile_seconds` is apart from it) and, where the stats have it, the time
    to the first token."""
    source = stats.get("hierarchy_source", "")  # the whole source is in --json's stats
    source = ("; the model's recommended plan" if source.startswith("recommended")
              else "; the paper's L/8, L/4" if source.startswith("paper") else "")
    ttft = stats.get("time_to_first_token")
    return (f"[{stats['method']}] {stats['model']} ({stats['num_layers']} layers, exits "
            f"{','.join(map(str, stats['exits']))}{source}): {stats['new_tokens']} tokens, "
            f"{stats['tokens_per_second']:.1f} tokens/s"
            + (f", first token {ttft:.2f} s" if ttft is not None else "")
            + f" (compile {stats['compile_seconds']:.1f} s excluded)"
            + (f", SV profile {stats['sv_profile']}" if "sv_profile" in stats else ""))


def stream_summary_line(stats: dict) -> str:
    """The line `generate --stream` prints after a prompt: the time to the first token
    (compilation included: the stream compiles at its first use) and the decode speed after
    it (tokens after the first over the seconds after it)."""
    ttft, new = stats["time_to_first_token"], stats["new_tokens"]
    after = stats["seconds"] - ttft if ttft is not None else 0.0
    speed = ((new - 1) / after if new > 1 and after > 0 else stats["tokens_per_second"])
    compiled = stats.get("compile_count") or 0
    return (f"[{stats['method']}] {stats['model']}: {new} tokens, first token "
            f"{ttft or 0:.2f} s" + (f" ({compiled} programs compiled)" if compiled else "")
            + f", then {speed:.1f} tokens/s")


def run_generate(args) -> int:
    check_generate_args(args)  # before importing JAX or reading weights
    mesh_shape = common.mesh_arg(args)
    several_hosts = distributed_cli.distributed_arg(args, needs_mesh=True)

    from hispec_jax.api import generate

    distributed_cli.initialize(several_hosts)  # SPMD: every process decodes the same prompts
    common.use_mesh(mesh_shape)  # load_model shards onto it
    model_path = args.model or common.default_model_dir()
    startup = load_options.startup_line(model_path, args)  # a bad config fails here, alone
    if args.plan_reason != common.GIVEN_METHOD:  # the default plan: which, and why
        print(f"plan: {args.method} ({args.plan_reason})", file=sys.stderr, flush=True)
    model = load_options.load(args, model_path, startup=startup)
    model = load_options.with_draft_model(args, model)
    options = method_options(args)
    if args.stream:
        if args.method == "sv" and args.sv_profile is None:  # as `generate` (api.py) does
            from hispec_jax.planner import sv_profile

            companion = args.verify_exits[0] if args.verify_exits else None
            options["sv_profile"] = sv_profile.profile_for(
                model, args.draft_exit, companion, progress=lambda msg: print(f"[sv] {msg}",
                                                                              file=sys.stderr))
        return stream_generate(args, model, options)
    # method sv without --sv-profile: the library finds or makes one (progress on stderr)
    result = generate(model, list(args.prompts), method=args.method,
                      max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                      ignore_eos=args.ignore_eos, temperature=args.temperature, top_k=args.top_k,
                      top_p=args.top_p, seed=args.seed, chat=args.chat,
                      cross_request=args.cross_request, **options)
    texts = result.texts or [""] * len(result.token_ids)
    if not distributed_cli.is_leader():  # process 0 prints the output
        return 0
    if args.json:
        outputs = [{"prompt": p, "token_ids": ids, "text": t}
                   for p, ids, t in zip(args.prompts, result.token_ids, texts)]
        print(json.dumps({"outputs": outputs, "stats": result.stats}))
    else:
        for prompt, text in zip(args.prompts, texts):
            print(f"{prompt}\n{text}\n" if args.chat else f"{prompt}{text}\n")
        print(summary_line(result.stats), file=sys.stderr)
    return 0


def stream_generate(args, model, options: dict) -> int:
    """`hispec generate --stream`: each prompt's text as it is decoded, then its summary."""
    from hispec_jax.serving.stream import generate_stream

    for prompt in args.prompts:
        stream = generate_stream(model, prompt, method=args.method,
                                 max_new_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos,
                                 temperature=args.temperature, top_k=args.top_k,
                                 top_p=args.top_p, seed=args.seed, chat=args.chat,
                      cross_request=args.cross_request, **options)
        sys.stdout.write(prompt + ("\n" if args.chat else ""))
        sys.stdout.flush()
        for delta in stream:
            sys.stdout.write(delta)
            sys.stdout.flush()
        sys.stdout.write("\n\n")
        print(stream_summary_line(stream.result.stats), file=sys.stderr)
    return 0
