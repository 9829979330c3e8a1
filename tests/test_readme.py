"""The README's examples run as written: its Python blocks (in order, in one interpreter, from
the repository root), its fresh-machine command (a) minus the install, and its test command
(b) is exactly the one .ci/run runs."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def fresh_machine_commands() -> tuple[str, str]:
    """Commands (a) and (b) of the README's "On a fresh machine" bash block."""
    section = README[README.index("## On a fresh machine"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [c.strip() for c in re.split(r"^# \([ab]\)[^\n]*\n", block, flags=re.M) if c.strip()]
    assert len(commands) == 2, commands
    return commands[0], commands[1]


def test_exactly_two_commands_and_ci_runs_command_b():
    a, b = fresh_machine_commands()
    assert a.startswith("pip install -e . && hispec generate")
    assert b.startswith("pip install -e '.[test]' && python -m pytest")
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert ci[-1] == b, "the last line of .ci/run must be the README's test command (b)"


def test_command_a_generates_with_the_default_model():
    a, _ = fresh_machine_commands()
    generate = a.removeprefix("pip install -e . && ")
    argv = shlex.split(generate)
    assert argv[0] == "hispec"
    script = Path(sys.executable).parent / "hispec"
    proc = subprocess.run([str(script), *argv[1:]], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(argv[-1])  # the prompt, then its continuation
    assert len(proc.stdout) > len(argv[-1]) + 20
    # no --method: the shipped model's recommended HiSpec plan, as README says
    plan = json.loads((REPO / "hispec_jax" / "default_model" / "recommended_plan.json").read_text())
    exits = ",".join(map(str, plan["methods"]["hispec"]["exits"]))
    assert re.search(rf"^\[hispec\] default_model \(24 layers, exits {exits}; the model's "
                     r"recommended plan\): 48 tokens, ",
                     proc.stderr, re.M), proc.stderr
    assert "PyTorch was not found" not in proc.stderr


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny chat GGUF file standing in for `hispec pull smollm2-135m-instruct`."""
    import gguf_files

    return gguf_files.tiny_chat_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_python_examples_run_as_written(tiny_gguf, tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert len(blocks) >= 3
    script = tmp_path / "readme_examples.py"
    script.write_text("\n\n".join(f"# ---- README python block {i + 1}\n{b}"
                                  for i, b in enumerate(blocks)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=900, cwd=REPO,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "M": str(tiny_gguf)})
    assert proc.returncode == 0, proc.stderr[-4000:]


MACHINE_LOCAL = re.compile(r"(?<![\w.$~-])/(tmp|work|root|home|mnt)/")


def test_docs_and_configs_name_no_machine_local_paths():
    """Issue 27: a reader's machine has no /tmp/smol_exp or /work/shared: paths in the docs,
    configs and notebooks are project-relative, `~/.cache/...` or `$(hispec pull ...)`."""
    files = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").rglob("*.md")),
             *sorted((REPO / "configs").glob("*.py")), *sorted((REPO / "notebooks").glob("*.ipynb"))]
    found = [f"{f.relative_to(REPO)}:{n}: {line.strip()[:80]}"
             for f in files for n, line in enumerate(f.read_text().splitlines(), 1)
             if MACHINE_LOCAL.search(line)]
    assert not found, "\n".join(found)


DOCS = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITED_PATH = re.compile(r"`((?:benchmarks|docs/results)/[^`\s]*)`")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {github_anchor(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc):
    """Every relative link of README.md, BENCHMARKS.md and docs/*.md names a file that exists,
    and its #anchor, if any, a heading of that file."""
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no such heading")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_cited_result_files_exist(doc):
    """A `benchmarks/...` or `docs/results/...` path a page cites is in the repository (files
    kept only in git history are cited, in the same paragraph, as `git show COMMIT:PATH` or
    "in git at commit ...")."""
    missing = []
    for paragraph in re.split(r"\n\s*\n", doc.read_text()):
        if "in git at commit" in paragraph or "git show" in paragraph:
            continue
        for path in CITED_PATH.findall(paragraph):
            if not any(marker in path for marker in ("NAME", "*", "RUN", "OUT")) \
                    and not (REPO / path.rstrip("/")).exists():
                missing.append(path)
    assert not missing, missing


def test_readme_commands_use_existing_flags():
    """Every `hispec COMMAND --flag` the README shows is a flag of that command."""
    script = Path(sys.executable).parent / "hispec"
    shown: dict[str, set[str]] = {}
    for block in re.findall(r"```bash\n(.*?)```", README, re.S) + re.findall(r"`(hispec [^`]+)`", README):
        for command in re.findall(r"hispec ([a-z-]+)((?:[^\n&|#]|\\\n)*)", block):
            name, rest = command
            shown.setdefault(name, set()).update(re.findall(r"(?<![\w.])(--[a-z][a-z-]*)(?![\w.])", rest))
    assert {"generate", "chat", "serve", "train-heads", "pull"} <= set(shown), shown
    for name, flags in shown.items():
        proc = subprocess.run([str(script), name, "--help"], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        assert proc.returncode == 0, (name, proc.stderr)
        unknown = {f for f in flags if f not in proc.stdout}
        assert not unknown, (name, unknown)
