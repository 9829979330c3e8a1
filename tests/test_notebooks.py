"""The colab notebooks in notebooks/ run top to bottom (with small settings injected after
their `parameters` cell, papermill-style) and are committed without outputs."""

import os
import re
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

# Small settings per notebook: a 4-layer random model ("{tiny}") and a few tokens, so the
# three run in a few minutes on a 2-core CPU (compiling the decoding loops is most of it).
# The quickstart's own model, SmolLM2 with prompt lookup, is run by test_gguf.py (README's
# transcript) and the shipped model by test_readme.py (README's command (a), its examples).
SMALL = {
    "01_quickstart.ipynb": {"MODEL": "{tiny}", "CHAT": False, "MAX_NEW_TOKENS": 8, "ROUNDS": 1,
                            "PROMPTS": ["Repeat: the cat sat on the mat. the cat sat on the"]},
    "02_train_exit_heads.ipynb": {"MODEL": "{tiny}", "HEAD_LAYERS": "1,2", "HEAD_RANK": 8,
                                  "STEPS": 3, "SEQ_LEN": 32, "BATCH_SIZE": 2, "EVAL_ROWS": 2,
                                  "AGREEMENT_PROMPTS": 2, "TRAIN_DOCS": 20},
    "03_benchmark_and_tune.ipynb": {"MODEL": "{tiny}", "PROMPTS": 1, "MAX_NEW_TOKENS": 4,
                                    "ROUNDS": 1, "DRAFT_EXITS": (), "GRID": False,
                                    "TUNED": None,  # AR and HiSpec default / adaptive
                                    "TUNE_QUICK": True},
}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A 4-layer random model with the tiny preset's byte-level tokenizer."""
    from hispec_jax import cli

    path = tmp_path_factory.mktemp("tiny_model")
    assert cli.main(["init-model", str(path), "--config.num_layers=4", "--config.hidden_size=64",
                     "--config.intermediate_size=128", "--config.head_dim=16"]) == 0
    return str(path)


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_committed_clean(name):
    """Outputs stripped, a colab badge, a `parameters` cell holding every overridden name."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, \
                f"{name}: outputs are committed (clear them, e.g. nbstripout)"
    assert f"colab.research.google.com/github/" in nb.cells[0].source
    assert f"notebooks/{name}" in nb.cells[0].source
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    for key in SMALL[name]:
        assert f"\n{key} =" in "\n" + params[0].source, f"{name}: no parameter {key}"


@pytest.mark.parametrize("name", sorted(SMALL))
def test_installs_from_its_own_repository(name):
    """The install cell clones only the repository that pyproject.toml names (on colab, where
    the notebook runs outside a checkout) and the badge opens; in a checkout it installs that."""
    import tomllib

    repository = tomllib.loads((NOTEBOOKS.parent / "pyproject.toml").read_text())[
        "project"]["urls"]["Repository"]
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert re.findall(r"https?://[^\s\"']+", code) == [repository]
    assert "pyproject.toml" in code and '"-e"' in code
    owner_repo = repository.removeprefix("https://github.com/")
    assert f"colab.research.google.com/github/{owner_repo}/blob/main/notebooks/{name}" \
        in nb.cells[0].source


@pytest.mark.parametrize("name", sorted(SMALL))
def test_figures_come_from_the_run(name):
    """A notebook's text states no measured figure: its tables and plots are its own run's."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert not re.findall(r"\d+(?:\.\d+)?\s*(?:x\b|tok(?:ens)?/s|%)", text), name


@pytest.mark.parametrize("name", sorted(SMALL))
def test_runs_top_to_bottom(name, tmp_path, tiny_model_dir):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    settings = {k: tiny_model_dir if v == "{tiny}" else v for k, v in SMALL[name].items()}
    overrides = "\n".join(f"{k} = {v!r}" for k, v in settings.items())
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell("# injected by the tests\n" + overrides))
    env_before = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"  # the kernel inherits it: plots render without a display
    try:
        t0 = time.perf_counter()
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        if env_before is None:
            os.environ.pop("MPLBACKEND")
        else:
            os.environ["MPLBACKEND"] = env_before
    seconds = time.perf_counter() - t0
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    print(f"{name}: {seconds:.0f} s")
