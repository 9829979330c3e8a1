"""What the command groups share: the help format, argument types, model-path checks, the
default plan, the device-mesh flag and `--config.KEY=VALUE` overrides.

Standard library and `options` / `method_spec` / `mesh_spec` (all standard-library only) at
import time:
arguments are checked before JAX is imported or weights are read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hispec_jax.bench.args import int_list, positive_int_list
from hispec_jax.decoding import options as options_lib
from hispec_jax.models import mesh_spec


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to an option's help, unless the default is None / False (not
    given) or the help text already states it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or "default" in text):
            return text
        return super()._get_help_string(action)


def add_command(subparsers, name: str, run, **kwargs) -> argparse.ArgumentParser:
    """A subcommand `name` whose `run(args) -> int` does the work (`args.extra` holds what
    the parser did not recognize, for commands that take `--config.KEY=VALUE` overrides)."""
    parser = subparsers.add_parser(name, formatter_class=HelpFormatter, **kwargs)
    parser.set_defaults(run=run, takes_overrides=False, passthrough=False)
    return parser


def optional_ints(text: str, flag: str) -> tuple[int, ...]:
    """`args.int_list`, or () for "none"; ValueError naming `flag`."""
    if text.strip().lower() == "none":
        return ()
    try:
        return int_list(text)
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"{flag}: {e}")


def default_model_dir() -> str:
    import hispec_jax  # cheap: its public names are imported lazily

    return hispec_jax.DEFAULT_MODEL_DIR


# Options whose flag is not "--" + their name (the flag turns a default off).
FLAGS = {"lookup_gate": "--no-lookup-gate", "draft": "--draft-model",
         "draft_gate": "--no-draft-gate"}


def flag(name: str) -> str:
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def usage_error(e: options_lib.OptionError) -> ValueError:
    """An `OptionError` in the command line's terms: the flag, the value given, what is allowed."""
    if e.value is None or isinstance(e.value, bool):
        return ValueError(f"{flag(e.name)}: {e.allowed}")
    value = ",".join(map(str, e.value)) if isinstance(e.value, tuple) else e.value
    return ValueError(f"{flag(e.name)} {value}: {e.allowed}")


GIVEN_METHOD = "--method given"


def apply_default_plan(args, model_path: str, num_layers: int | None) -> None:
    """Without --method (`args.method` None): the model's default plan, as the one resolver
    gives it to Python's `generate` (`method_spec.resolve`: the draft model's with
    --draft-model, else the model's recommended plan, else gated prompt lookup) becomes
    `args.method`, its options filling the ones not given. `args.plan_reason` says why the
    method runs (`GIVEN_METHOD` when one was given). Reads no weights."""
    from hispec_jax.decoding import method_spec  # standard library only

    args.plan_reason = GIVEN_METHOD
    if args.method is not None:
        return
    has_draft = getattr(args, "draft_model", None) is not None
    spec, args.plan_reason = method_spec.resolve(None, {}, model_path=model_path,
                                                 num_layers=num_layers, has_draft=has_draft)
    if has_draft:
        args.plan_reason += " (--draft-model)"
    args.method = spec.method
    for name, value in spec.options().items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def check_draft_model(args, model_path: str) -> None:
    """`--draft-model` (when given): a local path or a Hub id (resolved into
    `args.draft_model`) whose config.json gives the target's vocabulary size (the rest of
    `Model.with_draft`'s checks, GGUF files' and the tokenizers', run once both are
    loaded). Reads no weights."""
    if getattr(args, "draft_model", None) is None:
        if getattr(args, "smaller_draft_model", None) is not None:
            raise ValueError(f"--smaller-draft-model {args.smaller_draft_model}: needs "
                             "--draft-model (the smaller model drafts for it)")
        return
    from hispec_jax.models import hub  # standard library until a Hub id needs resolving

    args.draft_model = hub.resolve(args.draft_model)
    check_model_path(args.draft_model, "--draft-model")
    ours = _vocab_size(model_path)
    flags = [("--draft-model", "draft_model")]
    if getattr(args, "smaller_draft_model", None) is not None:
        args.smaller_draft_model = hub.resolve(args.smaller_draft_model)
        check_model_path(args.smaller_draft_model, "--smaller-draft-model")
        flags.append(("--smaller-draft-model", "smaller_draft_model"))
    for flag, name in flags:
        theirs = _vocab_size(getattr(args, name))
        if theirs is not None and ours is not None and theirs != ours:
            raise ValueError(f"{flag} {getattr(args, name)}: its vocabulary has {theirs} "
                             f"entries, the model's {ours}: a draft model must share its "
                             "target's vocabulary (a smaller model of the same family)")
    two = len(flags) == 2
    k = getattr(args, "draft_k", None)
    if isinstance(k, tuple) and len(k) == 2 and not two:
        raise ValueError(f"--draft-k {','.join(map(str, k))}: two values need "
                         "--smaller-draft-model (the first is its k)")
    if two and getattr(args, "lookup", None) is not None:
        raise ValueError(f"--lookup {args.lookup}: does not combine with "
                         "--smaller-draft-model (the smaller model drafts for the draft model)")


def draft_ks(text: str):
    """`--draft-k`: "K" -> K, "K',K" -> (K', K) (argparse type; ranges: `options.py`)."""
    values = int_list(text)
    return values[0] if len(values) == 1 else values


def _vocab_size(model: str) -> int | None:
    """The vocabulary size a HF directory's config.json gives (None: a GGUF file, or none
    given)."""
    config_file = Path(model) / "config.json"
    if not config_file.is_file():
        return None
    size = json.loads(config_file.read_text()).get("vocab_size")
    return size if isinstance(size, int) else None


def model_path(args) -> str:
    """`args.model` as a local path, stored back in `args.model`: None is the shipped
    model; a Hugging Face Hub id (`org/name`, no such local path) is its snapshot in
    huggingface_hub's cache, downloaded first where the network allows (`hub.resolve`;
    `args.hub_id` keeps the id, else None). Raises ValueError naming the id and the cache
    when there is none."""
    args.hub_id = None
    if args.model is None:
        return default_model_dir()
    from hispec_jax.models import hub  # standard library until a Hub id needs resolving

    resolved = hub.resolve(args.model)
    if resolved != args.model:
        args.hub_id, args.model = args.model, resolved
    return args.model


def check_model_path(model: str, flag: str = "--model") -> int | None:
    """Checks `--model` (or another `flag` naming a model) without reading weights; returns
    the model's layer count when its config.json says it (HF directories), else None.
    Raises ValueError naming the problem."""
    path = Path(model)
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ValueError(f"{flag} {model}: no such GGUF file")
        return None
    if not path.exists():
        raise ValueError(f"{flag} {model}: no such directory (expected a Hugging Face model "
                         "directory or a .gguf file)")
    if not path.is_dir():
        raise ValueError(f"{flag} {model}: not a directory or a .gguf file")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{flag} {model}: the directory has no config.json (expected a "
                         "Hugging Face model directory or a .gguf file)")
    try:
        layers = json.loads(config_file.read_text()).get("num_hidden_layers")
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{flag} {model}: config.json is not readable JSON ({e})")
    return layers if isinstance(layers, int) and layers >= 1 else None


# ---- device meshes ---------------------------------------------------------------------

MESH_HELP = ("decode over a device mesh: sequences split over 'data', weights and KV heads "
             "over 'model' (tensor parallel); the sizes must multiply to the device count; an "
             "axis left out has size 1 (default: one device; docs/tpu.md)")


def add_mesh_flag(parser, help: str = MESH_HELP) -> None:
    """`--mesh data=D,model=M` (parsed by `mesh_arg`); `help` says what the command splits."""
    parser.add_argument("--mesh", default=None, metavar="data=D,model=M", help=help)


def mesh_arg(args) -> dict[str, int] | None:
    """`--mesh` parsed without JAX; raises ValueError naming the flag and the problem."""
    if args.mesh is None:
        return None
    try:
        return mesh_spec.parse_mesh(args.mesh)
    except mesh_spec.MeshSpecError as e:
        raise ValueError(f"--mesh {args.mesh}: {e.reason}") from None


COMPILATION_CACHE_MAX_BYTES = 4 * 2**30  # a run that finds `hispec`'s cache above this ...
COMPILATION_CACHE_KEEP_BYTES = 3 * 2**30  # ... drops its least recently used entries to this


def use_cpu_codegen() -> None:
    """Every program a `hispec` command compiles for a CPU is compiled as the decoding loops
    are (`xla_options.PLATFORM_OPTIONS["cpu"]`: XLA's YNNPACK fusions off, for speed and
    fast executable loads), so the planner's and the gates' timed passes price the kernels
    the loops run: each option joins XLA_FLAGS unless XLA_FLAGS already names it (yours
    wins). Must run before JAX starts its backend. Flags XLA:CPU reads only."""
    import os

    from hispec_jax.decoding.xla_options import PLATFORM_OPTIONS, as_flags  # imports no JAX

    flags = os.environ.get("XLA_FLAGS", "")
    missing = {k: v for k, v in PLATFORM_OPTIONS["cpu"].items() if k not in flags}
    if missing:
        os.environ["XLA_FLAGS"] = f"{flags} {as_flags(missing)}".strip()


def use_compilation_cache() -> str | None:
    """Keeps the compiled decoding loops between runs of `hispec`: JAX's persistent
    compilation cache in `$HISPEC_CACHE/jax` (`pull.default_cache_dir()`, next to the pulled
    models), so XLA compiles a loop once per machine, not once per process (tracing and
    lowering still run in each). A run that finds the cache above
    `COMPILATION_CACHE_MAX_BYTES` drops its least recently used entries down to
    `COMPILATION_CACHE_KEEP_BYTES` (`pull.prune_cache_dir`: one directory listing per run,
    where JAX's own size bound lists the directory on every write). Leaves
    JAX_COMPILATION_CACHE_DIR alone when it is set (yours wins); HISPEC_COMPILATION_CACHE=0
    turns it off. Programs that compile in under a second are kept too
    (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0, unless set): a start compiles some 35 of
    them, seconds together on a 2-core CPU (docs/startup.md). Must run before JAX is
    imported (the CLI imports it lazily). Returns the directory used, or None."""
    import os

    if os.environ.get("HISPEC_COMPILATION_CACHE") == "0":
        return None
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        from hispec_jax.models.pull import default_cache_dir, prune_cache_dir  # import no JAX

        os.environ["JAX_COMPILATION_CACHE_DIR"] = str(default_cache_dir() / "jax")
        prune_cache_dir(os.environ["JAX_COMPILATION_CACHE_DIR"], COMPILATION_CACHE_MAX_BYTES,
                        COMPILATION_CACHE_KEEP_BYTES)
    return os.environ["JAX_COMPILATION_CACHE_DIR"]


def use_mesh(shape: dict[str, int] | None) -> None:
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


# ---- --config.KEY=VALUE ------------------------------------------------------------------

OVERRIDE_PREFIX = "--config."


def config_overrides(extra: list[str]) -> dict[str, str]:
    """`--config.KEY=VALUE` arguments -> {KEY: VALUE}; raises ValueError on anything else."""
    overrides = {}
    for arg in extra:
        key, sep, value = arg[len(OVERRIDE_PREFIX):].partition("=")
        if not arg.startswith(OVERRIDE_PREFIX) or not sep or not key:
            raise ValueError(f"unrecognized argument {arg!r} (config overrides are "
                             f"{OVERRIDE_PREFIX}KEY=VALUE)")
        overrides[key] = value
    return overrides
