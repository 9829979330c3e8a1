"""How a command loads its model: `--dtype`, `--quantize`, `--matmul-precision`, the same on
every command that loads one (generate, chat, serve, bench, tune, profile-sv) and on
`plan-memory`, which plans for them.

    --dtype float32|bfloat16        the weights' and activations' dtype (default: the
                                    checkpoint's; a GGUF file dequantizes to float32)
    --quantize int8                 weight-only int8 layer projections (`params.quantize_layer`;
                                    the unrolled layer layout, so it is asked for)
    --matmul-precision default|high|highest
                                    `jax.lax.Precision` of every matmul (default: highest,
                                    exact float32 on GPUs and TPUs: docs/numerics.md)

A bad value is argparse's one-line usage error (exit status 2) before anything is imported.
`load` prints the startup line, what the weights will take in memory as computed from the
config (`models.weight_memory`), before it reads a weight. Standard library only at import
time: the flags are checked before JAX starts.
"""

from __future__ import annotations

import sys

# As `models.config.MATMUL_PRECISIONS`, `models.params.WEIGHT_QUANTIZATIONS` and the dtypes
# `ModelConfig` takes (those modules import JAX; tests/test_load_options.py keeps them equal).
DTYPES = ("float32", "bfloat16")
QUANTIZATIONS = ("int8",)
MATMUL_PRECISIONS = ("default", "high", "highest")


def add_load_flags(parser, dtype_help: str | None = None) -> None:
    """The three flags, on `parser`."""
    parser.add_argument("--dtype", default=None, choices=list(DTYPES),
                        help=dtype_help or "dtype of the weights and activations (default: "
                                           "the checkpoint's; GGUF files: float32)")
    parser.add_argument("--quantize", default=None, choices=list(QUANTIZATIONS),
                        help="int8: weight-only int8 layer projections, a scale per output "
                             "channel (not exact: greedy output can depart from the "
                             "unquantized model's at near-ties; on CPU it saves memory, "
                             "not time; docs/numerics.md)")
    parser.add_argument("--matmul-precision", default=None, choices=list(MATMUL_PRECISIONS),
                        help="precision of every matmul, as jax.lax.Precision names it "
                             "(default: highest, exact float32 on GPUs and TPUs; high, "
                             "default: TF32 / bfloat16 passes there, faster, and greedy "
                             "speculative output may depart from AR's; docs/numerics.md)")


def load_kwargs(args) -> dict:
    """`load_model` keyword arguments of the flags (those not given left out)."""
    kwargs = {}
    if args.dtype is not None:
        kwargs["dtype"] = args.dtype
    if args.quantize is not None:
        kwargs["quantize"] = args.quantize
        kwargs["layer_layout"] = "unrolled"  # int8 weights live in the unrolled layout only
    if args.matmul_precision is not None:
        kwargs["matmul_precision"] = args.matmul_precision
    return kwargs


def startup_line(path: str, args) -> str:
    """`model PATH: 30 layers, 134.5M parameters, bfloat16: weights 269.0 MB (matmul
    precision highest)`, from the config alone. Raises ValueError for a config the model
    code does not take."""
    from hispec_jax.models import weight_memory

    memory = weight_memory.describe(path, dtype=args.dtype, quantize=args.quantize)
    return (f"model {path}: {memory.summary()} (matmul precision "
            f"{args.matmul_precision or 'highest'})")


def load(args, path: str, startup: str | None = None, **kwargs):
    """Prints the startup line on stderr (`startup`, or `startup_line`'s), then
    `load_model(path, ...)` with the flags and `kwargs` (a `layer_layout` there wins unless
    --quantize needs the unrolled one)."""
    print(startup or startup_line(path, args), file=sys.stderr, flush=True)
    from hispec_jax.models.model import load_model

    options = {**kwargs, **load_kwargs(args)}
    return load_model(path, **options)


def with_draft_model(args, model):
    """`model` with `--draft-model` (loaded with the same flags, on the same mesh: its own
    startup line first) as its draft model (`Model.with_draft`), with
    `--smaller-draft-model` as the draft model's own; `model` itself without one."""
    if getattr(args, "draft_model", None) is None:
        return model
    print("draft " + startup_line(args.draft_model, args), file=sys.stderr, flush=True)
    from hispec_jax.models.model import load_model

    draft = load_model(args.draft_model, mesh=model.mesh, **load_kwargs(args))
    smaller = getattr(args, "smaller_draft_model", None)
    if smaller is not None:
        print("smaller draft " + startup_line(smaller, args), file=sys.stderr, flush=True)
        try:
            draft = draft.with_draft(load_model(smaller, mesh=model.mesh, **load_kwargs(args)))
        except ValueError as e:
            raise ValueError(f"--smaller-draft-model {smaller}: {e}") from None
    try:
        return model.with_draft(draft)
    except ValueError as e:
        raise ValueError(f"--draft-model {args.draft_model}: {e}") from None
