"""`tests/duplicates_finder.py`: finds a block pasted into two files (comments, docstrings
and whitespace aside), merges it into one block, and the package itself has none of 8 or
more code lines."""

import pytest

import duplicates_finder as duplicates

BLOCK = '''
def f(x):
    """Docstring."""
    a = x + 1  # a comment
    b = a * 2
    c = b - 3
    d = c * c
    return d
'''


def test_a_pasted_block_is_found_once_with_both_places(tmp_path, capsys):
    (tmp_path / "a.py").write_text("import os\n" + BLOCK)
    (tmp_path / "b.py").write_text("y = 0\n\n" + BLOCK.replace("# a comment", "")
                                   .replace("    b =", "    b  ="))
    (tmp_path / "c.py").write_text(BLOCK.replace("c * c", "c + c"))  # differs in one line
    assert duplicates.main([str(tmp_path), "--min-lines", "5",
                     "--fail"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "6 code lines at 2 places:"
    assert out[1].endswith("a.py:3-9") and out[2].endswith("b.py:4-10")
    assert out[-1] == "1 repeated blocks of >= 5 code lines in 3 files"
    blocks = duplicates.find({"a": BLOCK, "c": BLOCK.replace("c * c", "c + c")}, 4)
    assert [(n, [s[0] for s in spans]) for n, spans in blocks] == [(4, ["a", "c"])]


def test_the_package_has_no_copy_paste_of_8_lines(capsys):
    assert duplicates.main(["--min-lines", "8", "--fail"]) == 0, \
        capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--min-lines", "1"], "--min-lines must be >= 2"),
    (["/nonexistent"], "/nonexistent: no such file or directory"),
])
def test_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        duplicates.main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err
