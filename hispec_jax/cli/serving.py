"""`hispec chat` (a streamed multi-turn conversation) and `hispec serve` (the
OpenAI-compatible server): `hispec_jax/serving/`, docs/serving.md. Argument checks run before
JAX is imported or weights are read."""

from __future__ import annotations

import argparse
import sys

from hispec_jax.cli import common, load_options
from hispec_jax.cli import distributed as distributed_cli
from hispec_jax.cli import generate as generate_cli
from hispec_jax.decoding import options as options_lib


def add_decoding_arguments(parser, with_budget: bool = True) -> None:
    """--model, --method and its options, sampling flags (the names `generate` uses)."""
    parser.add_argument("--model", default=None,
                        help="local Hugging Face model directory or .gguf file, or a Hub id "
                             "org/name (huggingface_hub's cache) (default: the shipped model)")
    parser.add_argument("--method", default=None, choices=list(options_lib.METHODS),
                        help="decoding method (see `hispec generate --help`; default: the "
                             "model's recommended plan, its HiSpec plan for the shipped model, "
                             "or prompt lookup for a model without one)")
    parser.add_argument("--exit-layer", type=int, default=None, metavar="N",
                        help="exit layer of --method exit")
    parser.add_argument("--draft-exit", type=int, default=None, metavar="N", help="draft exit Ld")
    parser.add_argument("--verify-exits", type=common.int_list, default=None, metavar="N[,N...]",
                        help="intermediate verifier exits Li (hispec, sv)")
    parser.add_argument("--draft-len", type=int, default=None, metavar="N",
                        help="draft tokens per round Nd")
    parser.add_argument("--verify-window", type=int, default=None, metavar="N",
                        help="intermediate verifier window Ni (hispec)")
    parser.add_argument("--adaptive", action="store_true", help="adaptive Nd and Ni (App. J)")
    parser.add_argument("--acceptance", default=None, choices=list(options_lib.ACCEPTANCE_RULES),
                        help="verification rule when sampling")
    generate_cli.add_method_arguments(parser)
    common.add_mesh_flag(parser)
    load_options.add_load_flags(parser)
    parser.add_argument("--max-cache-len", type=int, default=None, metavar="S",
                        help="KV-cache positions per sequence (prompt + answer + the method's "
                             "lookahead); default: chat the model's context, serve 1024")
    if with_budget:
        parser.add_argument("--max-new-tokens", type=int, default=256, metavar="N",
                            help="new tokens per answer, at most")
        parser.add_argument("--temperature", type=float, default=0.0, metavar="T",
                            help="sampling temperature, >= 0; 0 is greedy decoding")
        parser.add_argument("--top-k", type=int, default=0, metavar="K", help="top-k (0: off)")
        parser.add_argument("--top-p", type=float, default=1.0, metavar="P", help="top-p (1: off)")
        parser.add_argument("--seed", type=int, default=0, metavar="S", help="random seed")


def add_parsers(subparsers) -> None:
    chat = common.add_command(
        subparsers, "chat", run_chat, help="talk to a model: multi-turn, streamed",
        description="Reads your messages from standard input and streams each answer as it "
                    "is decoded, keeping the conversation (the model's chat template, or a "
                    "plain transcript for a model without one). /reset forgets the "
                    "conversation, /quit (or end of input) leaves. After each answer the "
                    "method, tokens/s and time to first token go to stderr.")
    add_decoding_arguments(chat)
    chat.add_argument("--system", default=None, metavar="TEXT", help="a system message")
    chat.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                      help="compile what the first answer runs before showing the prompt "
                           "(default: on; --no-warmup compiles at the first answer)")

    serve = common.add_command(
        subparsers, "serve", run_serve, help="an OpenAI-compatible HTTP server with continuous batching",
        description="Serves /v1/chat/completions, /v1/completions, /v1/models and /health "
                    "(streaming with server-sent events, or not). Requests share --slots "
                    "sequences of one compiled engine (a second one for sampling requests); "
                    "a finished request's slot takes the next waiting one at once. "
                    "SIGTERM or Ctrl-C stops it cleanly. See docs/serving.md.")
    add_decoding_arguments(serve, with_budget=False)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    serve.add_argument("--slots", type=int, default=8, metavar="N",
                       help="sequences decoded together per engine")
    serve.add_argument("--served-model-name", default=None, metavar="NAME",
                       help="the model id clients send (default: --model's Hub id, else the "
                            "model's directory or file name)")
    serve.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                       help="compile every program before taking requests; /health answers "
                            "503 \"loading\" until then, and serving compiles nothing "
                            "afterwards (default: on; --no-warmup compiles each program at "
                            "its first use)")
    serve.add_argument("--rounds-per-step", type=int, default=1, metavar="R",
                       help="speculation rounds between two looks at the request queue")
    serve.add_argument("--prefill-chunk", type=int, default=None, metavar="C",
                       help="prompt positions per prefill chunk (default: 64, at most "
                            "--max-cache-len): between the decoding slots' rounds a prompt "
                            "enters its slot for about a round's time at a time, in chunks "
                            "of C positions where one fits that time, else of C/4 (at "
                            "least 16); smaller: shorter pauses for the streams, larger: "
                            "faster prompts")
    serve.add_argument("--ride-prefill", action=argparse.BooleanOptionalAction, default=False,
                       help="while slots decode, let the next chunk of a waiting prompt "
                            "ride each round's pass (AR and prompt lookup) instead of running "
                            "chunks between the rounds: C positions while prompts queue and "
                            "such a round fits the --prefill-share budget, else C/4; shorter "
                            "pauses in the streams (docs/serving.md; default: off)")
    serve.add_argument("--measure-pass-cost", action=argparse.BooleanOptionalAction,
                       default=False,
                       help="after the warm-up, once the server is quiet, measure this host's "
                            "pass costs for the lookup gate where none are kept (minutes on a "
                            "CPU; `hispec bench-tool pass-cost` does it beforehand; "
                            "docs/lookup.md; default: off)")
    serve.add_argument("--cross-request", action=argparse.BooleanOptionalAction, default=False,
                       help="where the plan has prompt lookup, draft also from the tokens of "
                            "earlier requests (a store in this process's memory, never on "
                            "disk, scoped per API key and request `user`; a request opts out "
                            "with \"hispec\": {\"cross_request\": false} or the header "
                            "X-Hispec-Cross-Request: false); outputs never change "
                            "(docs/serving.md; default: off: it pays where requests share "
                            "their shape, and lost on open chat: BENCHMARKS.md)")
    serve.add_argument("--store-tokens", type=int, default=None, metavar="R",
                       help="tokens the store of earlier requests holds, the oldest evicted "
                            "first (default: 16384)")
    serve.add_argument("--prefill-share", type=float, default=1.0, metavar="X",
                       help="prefill time between two rounds of the decoding slots, as a "
                            "multiple of a round's (default: 1; at least one chunk each "
                            "time): larger, the waiting prompts' first tokens sooner and "
                            "longer pauses in the streams; 0, one chunk a round")
    serve.add_argument("--step-log", default=None, metavar="PATH",
                       help="write each engine step to PATH as one JSON line (its prefill "
                            "chunks and seconds; its round's rows, seconds and tokens, and "
                            "the tokens each level verified and kept): which of the two made "
                            "a gap in the streams long, and which rounds paid "
                            "(docs/serving.md)")
    distributed_cli.add_distributed_flags(serve)


def _check(args, sampling: bool) -> None:
    """Checks that need neither JAX nor weights. Without --method, the model's default plan
    is chosen here (`common.apply_default_plan`) and its options checked with the given
    ones; `args.plan_reason` says why it runs."""
    model_path = common.model_path(args)
    num_layers = common.check_model_path(model_path)
    args.mesh_shape = common.mesh_arg(args)
    common.check_draft_model(args, model_path)
    common.apply_default_plan(args, model_path, num_layers)
    try:
        if sampling:
            options_lib.check_positive_int("max_new_tokens", args.max_new_tokens)
            options_lib.check_sampling(args.temperature, args.top_k, args.top_p, args.seed)
        if args.max_cache_len is not None:
            options_lib.check_positive_int("max_cache_len", args.max_cache_len)
        options_lib.check_method_options(args.method, num_layers=num_layers,
                                         draft=args.draft_model,
                                         **generate_cli.method_options(args))
    except options_lib.OptionError as e:
        raise common.usage_error(e) from None


def _load(args, startup: str | None = None):
    """The model with the load flags, sharded over `--mesh` where one is given
    (`common.use_mesh`)."""
    common.use_mesh(args.mesh_shape)
    model = load_options.load(args, args.model or common.default_model_dir(), startup=startup)
    return load_options.with_draft_model(args, model)


def run_chat(args) -> int:
    _check(args, sampling=True)
    # the config read before anything is printed: a bad one is the only line
    startup = load_options.startup_line(args.model or common.default_model_dir(), args)
    from hispec_jax.serving.chat_loop import StartupProgress, chat_loop

    print(f"plan: {args.method} ({args.plan_reason})", file=sys.stderr, flush=True)
    progress = StartupProgress(sys.stderr)
    progress.update(f"loading {args.model or 'the shipped model'}")
    try:
        model = _load(args, startup)
    except BaseException:
        progress.done()
        raise
    return chat_loop(model, method=args.method, max_new_tokens=args.max_new_tokens,
                     max_cache_len=args.max_cache_len, system=args.system,
                     temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                     seed=args.seed, warmup=args.warmup, progress=progress,
                     **generate_cli.method_options(args))


def run_serve(args) -> int:
    _check(args, sampling=False)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: must be in [0, 65535]")
    for name in ("slots", "rounds_per_step", "prefill_chunk"):
        if getattr(args, name) is None:
            continue
        try:
            options_lib.check_positive_int(name, getattr(args, name))
        except options_lib.OptionError as e:
            raise ValueError(f"--{name.replace('_', '-')} {e.value}: {e.allowed}") from None
    if args.store_tokens is not None and not (
            2 <= args.store_tokens <= options_lib.MAX_STORE_TOKENS):
        raise ValueError(f"--store-tokens {args.store_tokens}: must be an integer in "
                         f"[2, {options_lib.MAX_STORE_TOKENS}]")
    data = (args.mesh_shape or {}).get("data", 1)
    if args.slots % data:
        raise ValueError(f"--slots {args.slots}: must be a multiple of the mesh's data axis "
                         f"({data}, --mesh {args.mesh})")
    if not 0 <= args.prefill_share <= 100:  # (NaN fails too)
        raise ValueError(f"--prefill-share {args.prefill_share}: must be a number in [0, 100]")
    if (args.prefill_chunk is not None and args.max_cache_len is not None
            and args.prefill_chunk > args.max_cache_len):
        raise ValueError(f"--prefill-chunk {args.prefill_chunk}: must be at most --max-cache-len "
                         f"{args.max_cache_len}")
    several_hosts = distributed_cli.distributed_arg(args, needs_mesh=True)
    if several_hosts is not None and args.measure_pass_cost:
        raise ValueError("--measure-pass-cost: not on several hosts (the measurement would run "
                         "on process 0 alone); measure on process 0's host beforehand "
                         "(hispec bench-tool pass-cost): every process weighs process 0's")
    if args.step_log is not None and several_hosts is None:  # else on process 0 alone
        _check_step_log(args.step_log)
    import logging

    from hispec_jax.serving import server

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    distributed_cli.initialize(several_hosts)  # before the first computation
    leader = distributed_cli.is_leader()
    if several_hosts is not None and leader and args.step_log is not None:
        try:
            _check_step_log(args.step_log)
        except ValueError as e:  # the followers wait for process 0: it ends alone
            print(f"hispec: error: {e}", file=sys.stderr)
            _exit_alone(2)
    # the engines' arguments, the same in every process
    engines = dict(slots=args.slots, max_cache_len=args.max_cache_len,
                   plan_reason=args.plan_reason, ride_prefill=args.ride_prefill,
                   cross_request=args.cross_request,
                   **({} if args.store_tokens is None else {"store_tokens": args.store_tokens}),
                   **({} if args.prefill_chunk is None
                      else {"prefill_chunk": args.prefill_chunk}),
                   **generate_cli.method_options(args))
    if several_hosts is not None and not _same_as_process_0(args, engines):
        _exit_alone(1)
    model = _load(args)
    if not leader:  # a follower of process 0, which takes the requests: no port
        from hispec_jax.serving.follower import FollowerError, LeaderFailed

        try:
            server.follow(model, args.method, **engines)
        except LeaderFailed as e:  # process 0 stops too: they shut down together
            print(f"hispec: error: {e}", file=sys.stderr)
            return 1
        except FollowerError as e:
            print(f"hispec: error: {e}", file=sys.stderr)
            _exit_alone(1)
        return 0
    app = server.build_app(model, args.method, warmup=args.warmup,
                           rounds_per_step=args.rounds_per_step,
                           served_name=args.served_model_name or args.hub_id,
                           prefill_share=args.prefill_share, step_log=args.step_log,
                           measure_pass_cost=args.measure_pass_cost,
                           several_hosts=several_hosts is not None, **engines)
    return server.serve(app, host=args.host, port=args.port)


def _same_as_process_0(args, engines: dict) -> bool:
    """Whether this process serves with process 0's settings (the method, its options,
    the slots, the mesh, the load flags), checked before anything loads: every process
    runs each program together, so one built otherwise would stall them. False (after a
    line naming the difference) on a follower whose settings differ."""
    import json

    from hispec_jax import distributed

    mine = json.loads(json.dumps({"method": args.method, "mesh": args.mesh, "dtype": args.dtype,
                                  "quantize": args.quantize,
                                  "matmul_precision": args.matmul_precision, **engines}))
    theirs = distributed.broadcast_work(mine if distributed.is_leader() else None)
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if differ:
        print(f"hispec: error: process {distributed.process_index()} serves with "
              + ", ".join(f"{k}={mine.get(k)!r}" for k in differ) + " where process 0 has "
              + ", ".join(f"{k}={theirs.get(k)!r}" for k in differ)
              + ": give every process the same command", file=sys.stderr)
    return not differ


def _exit_alone(status: int) -> None:
    """Ends this process now, without JAX's shutdown at exit: that waits for every other
    process to shut down too, and process 0 goes on (until it misses this one's
    heartbeats, which stops it)."""
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _check_step_log(path: str) -> None:
    try:
        open(path, "w").close()
    except OSError as e:
        raise ValueError(f"--step-log {path}: {e.strerror.lower()}") from None
