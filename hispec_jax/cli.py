"""The `hispec` command line: parses, calls library functions, prints.

    hispec generate [--model PATH] [--method ar|exit|layerskip|hispec] [--exit-layer N]
                    [--draft-exit N] [--verify-exits N[,N...]] [--draft-len N] [--verify-window N]
                    [--adaptive] [--acceptance tokenwise|blockwise]
                    [--max-new-tokens N] [--batch-size N] [--ignore-eos]
                    [--temperature T] [--top-k K] [--top-p P] [--seed S] [--json] PROMPT [PROMPT ...]
    hispec init-model OUT_DIR [--config PRESET_OR_FILE] [--seed S] [--init-std X]
                      [--config.KEY=VALUE ...]
    hispec pretrain [--config configs/pretrain_default.py] [--small] [--config.KEY=VALUE ...]
    hispec train-heads [--config configs/train_heads_default.py] [--config.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import sys


def _exits(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layers, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hispec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text with an early-exit model")
    gen.add_argument("--model", default=None,
                     help="local Hugging Face model directory (default: the shipped model)")
    gen.add_argument("--method", default="ar", choices=["ar", "exit", "layerskip", "hispec"])
    gen.add_argument("--exit-layer", type=int, default=None, help="exit layer for --method exit")
    gen.add_argument("--draft-exit", type=int, default=None, help="draft exit Ld")
    gen.add_argument("--verify-exits", type=_exits, default=None,
                     help="intermediate verifier exits Li (comma-separated)")
    gen.add_argument("--draft-len", type=int, default=None, help="draft tokens per step Nd")
    gen.add_argument("--verify-window", type=int, default=None,
                     help="tokens an intermediate verifier accumulates before full verification Ni")
    gen.add_argument("--adaptive", action="store_true", help="adapt Nd and Ni to acceptance rates")
    gen.add_argument("--acceptance", default=None, choices=["tokenwise", "blockwise"],
                     help="sampling-mode verification rule of speculative methods")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--batch-size", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument("prompts", nargs="+", metavar="PROMPT")

    init = sub.add_parser(
        "init-model", help="write a random-initialized model (random text!) in HF layout",
        description="Writes a model with random weights and a byte-level tokenizer to OUT_DIR "
                    "(loadable by `hispec generate --model OUT_DIR` and transformers). Its "
                    "output is random text. Override config keys with --config.KEY=VALUE.")
    init.add_argument("out_dir", metavar="OUT_DIR")
    init.add_argument("--config", default="tiny",
                      help="a configs/model_*.py file, or a preset name such as tiny, "
                           "llama3_8b (default: tiny)")
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--init-std", type=float, default=0.02,
                      help="standard deviation of the random weights")

    pre = sub.add_parser(
        "pretrain", help="train an early-exit model from scratch on ShareGPT",
        description="Trains a Llama-architecture model with a LayerSkip-style early-exit loss "
                    "and writes it in HF layout (default: the package's default_model). "
                    "Override config keys with --config.KEY=VALUE (e.g. --config.num_steps=100, "
                    "--config.optim.peak_lr=1e-3).")
    pre.add_argument("--config", default=None,
                     help="a pretrain config file (default: configs/pretrain_default.py)")
    pre.add_argument("--small", action="store_true",
                     help="the config's 'small' variant: a tiny model, a few steps (~1 minute)")
    pre.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")

    heads = sub.add_parser(
        "train-heads", help="distill exit heads into a frozen model (HiSpec App. I)",
        description="Trains exit heads against the final layer and saves them beside the "
                    "model. Override config keys with --config.KEY=VALUE.")
    heads.add_argument("--config", default="train_heads_default",
                       help="a configs/train_heads_*.py file or name (default: train_heads_default)")
    return parser


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
    print(f"trained {summary['steps']} steps ({summary['tokens_seen']:,} tokens, "
          f"{summary['tokens_per_second']:.0f} tokens/s); loss {summary['first_loss']:.3f} -> "
          f"{summary['last_loss']:.3f}; held-out perplexity {ev['perplexity']:.2f}; "
          f"top-1 agreement with the final layer by exit: {agreement}")
    return 0


def cmd_train_heads(args, extra: list[str]) -> int:
    from hispec_jax.train_heads.config import load_config
    from hispec_jax.train_heads.train import train

    train(load_config(args.config, _config_overrides(extra)))
    return 0


def _default_model_dir():
    import hispec_jax

    path = getattr(hispec_jax, "DEFAULT_MODEL_DIR", None)
    if path is None:
        raise SystemExit("hispec: --model is required (no default model is shipped yet)")
    return path


def cmd_generate(args) -> int:
    from hispec_jax.decoding.generate import generate
    from hispec_jax.models.model import load_model

    model = load_model(args.model or _default_model_dir())
    options = {"exit_layer": args.exit_layer, "draft_exit": args.draft_exit,
               "verify_exits": args.verify_exits, "draft_len": args.draft_len,
               "verify_window": args.verify_window, "adaptive": args.adaptive,
               "acceptance": args.acceptance}
    result = generate(model, list(args.prompts), method=args.method,
                      max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                      ignore_eos=args.ignore_eos, temperature=args.temperature, top_k=args.top_k,
                      top_p=args.top_p, seed=args.seed, **options)
    texts = result.texts or [""] * len(result.token_ids)
    if args.json:
        outputs = [{"prompt": p, "token_ids": ids, "text": t}
                   for p, ids, t in zip(args.prompts, result.token_ids, texts)]
        print(json.dumps({"outputs": outputs, "stats": result.stats}))
    else:
        for prompt, text in zip(args.prompts, texts):
            print(f"{prompt}{text}\n")
        s = result.stats
        print(f"[{s['method']}] {s['new_tokens']} tokens, {s['tokens_per_second']:.1f} tokens/s, "
              f"compile {s['compile_seconds']:.1f} s", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command not in ("init-model", "pretrain", "train-heads"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "init-model":
            return cmd_init_model(args, extra)
        if args.command == "pretrain":
            return cmd_pretrain(args, extra)
        if args.command == "train-heads":
            return cmd_train_heads(args, extra)
    except ValueError as e:
        print(f"hispec: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
