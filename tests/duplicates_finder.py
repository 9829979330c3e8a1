"""Copy-paste finder: blocks of code that appear in more than one place of the package.

    python tests/duplicates_finder.py [--min-lines 6] [--fail] [PATH ...]   (default: hispec_jax/)

Each file's code lines are normalized (comments, docstrings, blank lines and imports
dropped; whitespace stripped), every run of `--min-lines` consecutive normalized lines is
hashed, and runs that occur at two or more places are merged into the longest blocks and
printed with their places, longest first; the last line is the total. `--fail` exits 1 when
there is any (for CI). A repeated block is a helper waiting to be written once.

pylint's similarity checker does the same by building astroid trees, which takes minutes on
this package; this uses only `tokenize`. `tests/test_duplicates.py` runs it on the package.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import io
import sys
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hispec_jax"
SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
        tokenize.ENCODING, tokenize.ENDMARKER}


def code_lines(source: str) -> list[tuple[int, str]]:
    """(line number, normalized text) of each line holding code: tokens joined by single
    spaces; comments, docstrings (a string statement), blank lines and imports dropped."""
    lines: dict[int, list[str]] = collections.defaultdict(list)
    previous = tokenize.NEWLINE  # a string right after NEWLINE/INDENT/DEDENT is a docstring
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT,
                                                         tokenize.DEDENT, tokenize.NL):
            previous = tok.type
            continue
        if tok.type not in SKIP:
            lines[tok.start[0]].append(tok.string)
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
    out = []
    for number in sorted(lines):
        text = " ".join(lines[number])
        if not text.startswith(("import ", "from ")):
            out.append((number, text))
    return out


def find(files: dict[str, str], min_lines: int) -> list[tuple[int, list[tuple[str, int, int]]]]:
    """Repeated blocks of at least `min_lines` normalized lines across `files` ({name:
    source}): [(lines, [(file, first line, last line), ...]), ...], longest first."""
    code = {name: code_lines(source) for name, source in files.items()}
    places = collections.defaultdict(list)  # window hash -> [(file, index)]
    for name, lines in code.items():
        for i in range(len(lines) - min_lines + 1):
            window = "\n".join(text for _, text in lines[i:i + min_lines])
            places[hashlib.sha1(window.encode()).hexdigest()].append((name, i))
    repeated = {key: where for key, where in places.items() if len(where) > 1}
    # Merge runs of consecutive repeated windows starting at the same places (shifted).
    blocks, seen = [], set()
    for where in sorted(repeated.values()):
        if where[0] in seen:
            continue
        length = min_lines
        while True:
            nxt = [(f, i + length - min_lines + 1) for f, i in where]
            key = [k for k, w in repeated.items() if w == nxt]
            if not key:
                break
            seen.update(nxt)
            length += 1
        spans = [(f, code[f][i][0], code[f][i + length - 1][0]) for f, i in where]
        blocks.append((length, spans))
    return sorted(blocks, key=lambda b: (-b[0], b[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="duplicates_finder.py", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="*", metavar="PATH",
                    help="files or directories (default: the hispec_jax package)")
    ap.add_argument("--min-lines", type=int, default=6,
                    help="shortest block reported, in code lines (default: 6)")
    ap.add_argument("--fail", action="store_true", help="exit 1 when any block is found")
    args = ap.parse_args(argv)
    if args.min_lines < 2:
        ap.error(f"--min-lines must be >= 2, got {args.min_lines}")
    roots = [Path(p) for p in args.paths] or [PACKAGE]
    for root in roots:
        if not root.exists():
            ap.error(f"{root}: no such file or directory")
    files = {str(f): f.read_text(encoding="utf-8") for root in roots
             for f in ([root] if root.is_file() else sorted(root.rglob("*.py")))}
    blocks = find(files, args.min_lines)
    for length, spans in blocks:
        print(f"{length} code lines at {len(spans)} places:")
        for name, first, last in spans:
            print(f"  {name}:{first}-{last}")
    print(f"{len(blocks)} repeated blocks of >= {args.min_lines} code lines in {len(files)} files")
    return 1 if blocks and args.fail else 0


if __name__ == "__main__":
    sys.exit(main())
