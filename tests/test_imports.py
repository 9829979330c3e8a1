"""Imports run one way: models, datasets -> decoding, train_heads -> planner -> api -> serving
-> bench -> cli, inference code never imports the training code, and no package's modules import
each other in a cycle. The contracts are import-linter's, in pyproject.toml; function-level
imports count."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(no_cache=True, no_logo=True))")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` with root's pyproject.toml over root's hispec_jax."""
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, capture_output=True,
                          text=True, env={"PYTHONPATH": str(root), "PATH": ""}, timeout=120)


def test_the_package_keeps_its_import_contracts():
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 kept, 0 broken" in run.stdout, run.stdout


@pytest.fixture
def copy(tmp_path):
    """The package's sources and pyproject.toml in tmp_path, to plant bad imports in."""
    shutil.copytree(ROOT / "hispec_jax", tmp_path / "hispec_jax",
                    ignore=shutil.ignore_patterns("default_model", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def plant(root: Path, module: str, statement: str) -> None:
    """Appends `statement` inside a function of `module` (a function-level import)."""
    path = root / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    {statement}\n")


@pytest.mark.parametrize("module, statement, broken", [
    # decoding resolving method="auto" itself (the planner is above it)
    ("hispec_jax.decoding.generate", "from hispec_jax.planner import tune",
     "Layers: models"),
    # the planner reaching a model helper through the training code
    ("hispec_jax.planner.calibrate", "from hispec_jax.train_heads import pretrain",
     "Inference code never imports the training code"),
    # two modules of one package importing each other
    ("hispec_jax.models.kv_cache", "from hispec_jax.models import transformer",
     "No import cycles"),
])
def test_a_planted_bad_import_breaks_a_contract(copy, module, statement, broken):
    plant(copy, module, statement)
    run = lint_imports(copy)
    assert run.returncode == 1, run.stdout + run.stderr
    text = " ".join(run.stdout.split())  # contract names wrap
    verdict = re.search(re.escape(broken) + r".*? (KEPT|BROKEN)\b", text)
    assert verdict and verdict.group(1) == "BROKEN", run.stdout
