"""The benchmark tools behind one entry point: `python -m hispec_jax.bench TOOL [args]`, the
same as `hispec bench-tool TOOL [args]`.

    python -m hispec_jax.bench                 # lists the tools, one line each
    python -m hispec_jax.bench TOOL --help     # a tool's own flags
    python -m hispec_jax.bench TOOL [args]     # runs TOOL's main(args)

Each tool is a module of this package with a `main(argv) -> int`; its one-line description
is the first line of the module's docstring, read from the source without importing it, so
listing the tools (or naming one that does not exist) imports neither JAX nor PyTorch.
`hispec bench` (the whole benchmark, `bench/run.py`) is not a tool here: it is the
`hispec bench` command.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys

# tool name -> module of hispec_jax.bench
TOOLS: dict[str, str] = {
    "compare": "compare",
    "draft-model": "draft_pair",
    "oracle": "oracle",
    "pass-cost": "pass_cost",
    "accelerator": "accelerator",
    "serve": "serve_load",
    "tasks": "tasks",
    "work": "work",
}

PROG = "python -m hispec_jax.bench"


def module_name(tool: str) -> str:
    return f"hispec_jax.bench.{TOOLS[tool]}"


def description(tool: str) -> str:
    """The first line of the tool module's docstring (the module is parsed, not imported)."""
    spec = importlib.util.find_spec(module_name(tool))
    with open(spec.origin, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    return doc.strip().split("\n")[0].strip()


def listing(prog: str = PROG) -> str:
    width = max(map(len, TOOLS))
    lines = [f"usage: {prog} TOOL [args]   ({prog} TOOL --help for a tool's flags)", "",
             "tools:"]
    lines += [f"  {tool:<{width}}  {description(tool)}" for tool in TOOLS]
    lines += ["", "The whole benchmark (prompts to report.md and plots) is `hispec bench`."]
    return "\n".join(lines)


def resolve(name: str) -> str | None:
    """The tool a command-line name means (underscores read as hyphens), or None."""
    tool = name.replace("_", "-")
    return tool if tool in TOOLS else None


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Runs `TOOL`'s `main(args)` for argv = [TOOL, *args]; lists the tools for [] or --help.
    An unknown tool: a message naming it and the tools on stderr, exit status 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(listing(prog))
        return 0
    tool = resolve(argv[0])
    if tool is None:
        print(f"{prog}: error: unknown tool {argv[0]!r}; choose from: {', '.join(TOOLS)}",
              file=sys.stderr)
        return 2
    status = importlib.import_module(module_name(tool)).main(argv[1:])
    return 0 if status is None else int(status)
