"""The library speaks in the present tense: its sources carry no dates, no issue numbers and no
paths into benchmarks/ (history belongs to git; a measured reason links its docs page)."""

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hispec_jax"

RULES = {
    "a date": re.compile(r"20\d\d-\d\d-\d\d"),
    "an issue number": re.compile(r"issue \d+", re.IGNORECASE),
    "a path into benchmarks/": re.compile(r"benchmarks/"),
}


def hits(pattern: re.Pattern, root: Path = PACKAGE) -> list[str]:
    """`file:line: text` for every line of root's .py files that pattern matches."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(root.parent)}:{number}: {line.strip()}")
    return found


@pytest.mark.parametrize("what", RULES)
def test_the_library_names_no(what):
    found = hits(RULES[what])
    if found:
        pytest.fail(f"{len(found)} lines name {what}:\n" + "\n".join(found), pytrace=False)


def test_hits_name_file_and_line(tmp_path):
    package = tmp_path / "hispec_jax"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "m.py").write_text(
        "x = 1\n# see Issue 12\n# measured 2026-11-25 in benchmarks/x.py\n")
    assert hits(RULES["an issue number"], package) == ["hispec_jax/sub/m.py:2: # see Issue 12"]
    assert hits(RULES["a date"], package) == hits(RULES["a path into benchmarks/"], package) == [
        "hispec_jax/sub/m.py:3: # measured 2026-11-25 in benchmarks/x.py"]
