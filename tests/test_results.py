"""Published figures have one source: the records in benchmarks/results/.

README.md's and BENCHMARKS.md's tables are rendered from the records
(benchmarks/render_results.py) and must be committed as rendered; every speedup ("1.85x") and
throughput ("64.2 tok/s") that README.md, BENCHMARKS.md or a notebook states is the value of
a record, and so is every one a docs/ page states (a study that was not adopted is a sentence
naming the commit that holds it, without its figures), and a docs section names the kept
output of the record it quotes or links BENCHMARKS.md; every record names what ran and
where its output is kept, and that output exists and holds the value."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOADER = importlib.util.spec_from_file_location("render_results", REPO / "benchmarks" / "render_results.py")
render_results = importlib.util.module_from_spec(LOADER)
LOADER.loader.exec_module(render_results)

RECORDS = render_results.load_records()
TABLES = render_results.load_tables()
NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w.])({NUMBER})(?:\s*-\s*({NUMBER}))?(?:x\b|\s*(?:tok/s|tokens/s)\b)")


def test_records_name_what_ran_and_their_output():
    assert len(RECORDS) > 50
    for record in RECORDS:
        missing = [k for k in render_results.REQUIRED if record.get(k) in (None, "")]
        assert not missing, (record["run"], record.get("metric"), missing)
        assert re.fullmatch(r"[0-9a-f]{7,40}", record["commit"]), record
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", record["date"]), record
        assert (REPO / record["output"]).exists(), f"{record['run']}: no kept output {record['output']}"


def numbers_in(text: str) -> list[float]:
    # a minus right after a digit is a range's dash ("0.96-1.12": two numbers), not a sign
    return [float(n) for n in re.findall(r"(?:(?<![\d.])-)?\d+(?:\.\d+)?(?:[eE]-?\d+)?", text)]


def decimals(value: float) -> int:
    text = repr(value)
    return len(text.split(".")[1]) if "." in text and "e" not in text else 0


@pytest.mark.parametrize("run", sorted({r["run"] for r in RECORDS}))
def test_record_values_are_in_their_outputs(run):
    """A measured value (not one a record says it derived) is a number of its kept output,
    as printed or as rounded from a longer one."""
    texts: dict[str, list[float]] = {}
    wrong = []
    for record in render_results.select(RECORDS, {"run": run}):
        value = record["value"]
        if "derived" in record or not isinstance(value, (int, float)):
            continue
        path = REPO / record["output"]
        if path.is_dir():
            continue
        numbers = texts.setdefault(record["output"], numbers_in(path.read_text()))
        places = decimals(float(value))
        if not any(round(n, places) == round(float(value), places) for n in numbers):
            wrong.append(f"{record['task']} / {record['method']} / {record['metric']} = {value}")
    assert not wrong, f"not in the outputs of {run}: {wrong}"


def test_committed_tables_are_the_rendered_ones():
    for name in render_results.DOCUMENTS:
        text = (REPO / name).read_text()
        assert render_results.render_document(text, TABLES, RECORDS) == text, \
            f"{name}: a table differs from benchmarks/results/ (python benchmarks/render_results.py)"


def test_every_table_is_published_once():
    used = [m.group(2) for name in render_results.DOCUMENTS
            for m in render_results.BLOCK.finditer((REPO / name).read_text())]
    assert sorted(used) == sorted(TABLES)


def test_a_changed_record_changes_the_table():
    """The check above can fail: a record's new value shows in the rendered table."""
    changed = [dict(r) for r in RECORDS]
    target = next(r for r in changed if r["run"].startswith("cpu_smollm2_tasks") and r["metric"] == "x_ar")
    target["value"] = 9.99
    text = (REPO / "BENCHMARKS.md").read_text()
    assert "9.99" in render_results.render_document(text, TABLES, changed)
    assert render_results.render_document(text, TABLES, changed) != text


def recorded(figure: str) -> bool:
    value = float(figure.replace(",", ""))
    places = len(figure.split(".")[1]) if "." in figure else 0
    return any(isinstance(r["value"], (int, float)) and round(float(r["value"]), places) == value
               for r in RECORDS)


def prose(text: str) -> str:
    """`text` without code blocks and inline code: a command's example output shows a
    format, not a published figure."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


def unrecorded_figures(text: str) -> list[str]:
    return [m.group(0) for m in FIGURE.finditer(prose(text))
            if not all(recorded(g) for g in m.groups() if g is not None)]


def notebook_text(path: Path) -> str:
    return "\n".join(cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
                     for cell in json.loads(path.read_text())["cells"])


STRICT = [REPO / "README.md", REPO / "BENCHMARKS.md", REPO / "CONTRIBUTING.md",
          *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "notebooks").glob("*.ipynb"))]


def page_text(path: Path) -> str:
    return notebook_text(path) if path.suffix == ".ipynb" else path.read_text()


@pytest.mark.parametrize("path", STRICT, ids=lambda p: str(p.relative_to(REPO)))
def test_every_published_figure_is_a_record(path):
    """README, BENCHMARKS, CONTRIBUTING, every docs/ page and every notebook: a figure
    that is not a record's value fails, even beside a study's name (a docs page explains;
    the figure lives in a record, or the finding is told without it)."""
    assert not unrecorded_figures(page_text(path)), unrecorded_figures(page_text(path))


def test_docs_are_held_to_the_rule():
    """The check can fail on a docs page: every page is checked, and an unrecorded figure
    fails even in a section that names the study it came from."""
    assert {p for p in STRICT if p.parent == REPO / "docs"} == set((REPO / "docs").glob("*.md"))
    section = ("## A study\n\nlookup ran 7.77x AR (study in git at commit b5ad122:\n"
               "`benchmarks/results_lookup/level_blocks_ab.txt`).\n")
    assert unrecorded_figures(section) == ["7.77x"]


def records_of(figure: str) -> list[dict]:
    value = float(figure.replace(",", ""))
    places = len(figure.split(".")[1]) if "." in figure else 0
    return [r for r in RECORDS
            if isinstance(r["value"], (int, float)) and round(float(r["value"]), places) == value]


def uncited_figures(section: str) -> list[str]:
    """Figures of a docs section that are no record the section points to: a record counts
    when the section names its kept output's file or links BENCHMARKS.md (which shows it),
    so a figure cannot pass by matching an unrelated record's value."""
    def cited(record: dict) -> bool:
        return Path(record["output"]).name in section or "BENCHMARKS.md" in section
    return [m.group(0) for m in FIGURE.finditer(prose(section))
            if not all(any(cited(r) for r in records_of(g)) for g in m.groups() if g is not None)]


@pytest.mark.parametrize("path", sorted((REPO / "docs").glob("*.md")), ids=lambda p: p.name)
def test_docs_figures_point_to_their_record(path):
    bare = [f"{section.splitlines()[0][:60]}: {uncited_figures(section)}"
            for section in re.split(r"^#+ ", path.read_text(), flags=re.M)
            if uncited_figures(section)]
    assert not bare, "\n".join(bare)


def test_a_figure_matching_an_unrelated_record_fails():
    figure = next(r for r in RECORDS if r["metric"] == "x_ar" and isinstance(r["value"], float))
    text = f"## A study\n\nlookup ran {figure['value']}x AR on some other day.\n"
    assert not unrecorded_figures(text)
    assert uncited_figures(text) == [f"{figure['value']}x"]
    assert uncited_figures(text + f"(output: `{figure['output']}`)\n") == []


def test_the_figure_pattern_finds_figures():
    assert unrecorded_figures("ran 7.77x AR, then 123.4 tok/s and 5.55-6.66x") == [
        "7.77x", "123.4 tok/s", "5.55-6.66x"]
    assert unrecorded_figures("lookup 1.85x AR at 64.2 tokens/s; shape 4x4, file_8x16") == []
    assert unrecorded_figures("prints `12 tokens, 7.77 tokens/s`") == []
