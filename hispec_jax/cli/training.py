"""`hispec pretrain`, `hispec train-heads`, `hispec draft-vocab`: making and training
early-exit models (`hispec_jax/train_heads/`)."""

from __future__ import annotations

from hispec_jax.cli import common
from hispec_jax.cli import distributed as distributed_cli

TRAINING_MESH_HELP = ("train over a device mesh: the batch split over 'data', the model (and "
                      "exit heads' vocabulary) over 'model'; the sizes multiply to the device "
                      "count (every host's, with the flags below); checkpoints resume on any "
                      "mesh (default: one device)")


def add_parsers(subparsers) -> None:
    pre = common.add_command(
        subparsers, "pretrain", run_pretrain,
        help="train an early-exit model on ShareGPT or on a model's own continuations",
        description="Trains a Llama-architecture model with an early-exit loss (exit weights, "
                    "KL distillation, LayerSkip curricula and layer dropout: "
                    "docs/early_exit_recipes.md), on ShareGPT text or, with "
                    "--config.data.source=on_policy, on the init_from model's own greedy or "
                    "sampled continuations, and writes it in HF layout to the config's "
                    "out_dir (configs/finetune_default.py: the package's default_model). "
                    "Override config keys with --config.KEY=VALUE (e.g. --config.num_steps=100, "
                    "--config.optim.peak_lr=1e-3).")
    pre.set_defaults(takes_overrides=True)
    pre.add_argument("--config", default=None,
                     help="a pretrain config file (default: configs/pretrain_default.py)")
    pre.add_argument("--small", action="store_true",
                     help="the config's 'small' variant: a tiny model, a few steps (~1 minute)")
    pre.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    common.add_mesh_flag(pre, TRAINING_MESH_HELP)
    distributed_cli.add_distributed_flags(pre)

    heads = common.add_command(
        subparsers, "train-heads", run_train_heads,
        help="distill exit heads into a frozen model (HiSpec App. I)",
        description="Trains exit heads against the final layer and saves them beside the "
                    "model. Override config keys with --config.KEY=VALUE.")
    heads.set_defaults(takes_overrides=True)
    heads.add_argument("--config", default="train_heads_default",
                       help="a configs/train_heads_*.py file or name (default: train_heads_default)")
    common.add_mesh_flag(heads, TRAINING_MESH_HELP)
    distributed_cli.add_distributed_flags(heads)

    vocab = common.add_command(
        subparsers, "draft-vocab", run_draft_vocab,
        help="restrict draft exit heads to the K most frequent tokens",
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
    vocab.add_argument("--exits", type=common.int_list, required=True, metavar="N[,N...]",
                       help="exit layers whose heads to restrict (each below the last layer)")
    vocab.add_argument("--out", required=True, metavar="OUT_DIR", help="directory to write")
    vocab.add_argument("--docs", type=int, default=2000,
                       help="ShareGPT training conversations to count tokens in")


def run_pretrain(args) -> int:
    mesh_shape = common.mesh_arg(args)  # before JAX
    several_hosts = distributed_cli.distributed_arg(args, needs_mesh=True)
    from hispec_jax.models.presets import PRESETS_DIR, apply_overrides
    from hispec_jax.train_heads.pretrain import load_pretrain_config, pretrain

    config = load_pretrain_config(args.config or PRESETS_DIR / "pretrain_default.py",
                                  small=args.small)
    apply_overrides(config, common.config_overrides(args.extra))
    distributed_cli.initialize(several_hosts)
    common.use_mesh(mesh_shape)  # pretrain() trains over it
    summary = pretrain(config, progress=not args.no_progress)
    if not distributed_cli.is_leader():
        return 0
    ev = summary["eval"]
    agreement = ", ".join(f"{e + 1}:{a:.3f}" for e, a in enumerate(ev["agreement_exits"]))
    loss = ("no steps this run" if summary["first_loss"] is None else
            f"loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f}")
    print(f"trained {summary['steps']} steps ({summary['tokens_seen']:,} tokens, "
          f"{summary['tokens_per_second']:.0f} tokens/s); {loss}; "
          f"held-out perplexity {ev['perplexity']:.2f}; "
          f"top-1 agreement with the final layer by exit: {agreement}")
    return 0


def run_train_heads(args) -> int:
    mesh_shape = common.mesh_arg(args)  # before JAX
    several_hosts = distributed_cli.distributed_arg(args, needs_mesh=True)
    from hispec_jax.train_heads.config import load_config
    from hispec_jax.train_heads.train import train

    config = load_config(args.config, common.config_overrides(args.extra))
    distributed_cli.initialize(several_hosts)
    common.use_mesh(mesh_shape)  # train() trains over it
    train(config, log=print if distributed_cli.is_leader() else lambda line: None)
    return 0


def run_draft_vocab(args) -> int:
    num_layers = common.check_model_path(common.model_path(args))
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
