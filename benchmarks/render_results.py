"""Render the results tables of README.md and BENCHMARKS.md from the records in
benchmarks/results/, so that a published figure has one source.

A record is one measured figure: what ran (command, commit, date, hardware, versions, load,
model, task, method), what was read (metric, value) and where its output is kept (output).
Each file benchmarks/results/RUN.json holds one run: the fields its records share, and the
list `records` of what differs between them; `load_records` merges the two.

A table is declared in benchmarks/results/tables.json: columns (a header, and a metric to
show, or a record field) and rows (which records, by their fields). A cell may also be a
template over several records, e.g. the range of a metric over four tasks. A document marks
where a table goes with `<!-- table: NAME -->` ... `<!-- /table -->`; everything between
the two markers is rewritten by this script.

    python benchmarks/render_results.py           # rewrite README.md and BENCHMARKS.md
    python benchmarks/render_results.py --check   # exit 1 if a committed table differs
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOCUMENTS = ("README.md", "BENCHMARKS.md")
REQUIRED = ("command", "commit", "date", "hardware", "versions", "load", "model", "task",
            "method", "metric", "value", "output")
# a column's keys that say how to show a cell; its other keys select the cell's record
CELL_KEYS = ("field", "fmt", "bold", "template", "values", "where")
BLOCK = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.S)


def load_records(results: Path = RESULTS) -> list[dict]:
    """Every record of every run file, its run's shared fields merged in, `run` its file."""
    records = []
    for path in sorted(results.glob("*.json")):
        if path.name == "tables.json":
            continue
        run = json.loads(path.read_text())
        shared = {k: v for k, v in run.items() if k != "records"}
        for record in run["records"]:
            records.append({**shared, **record, "run": path.stem})
    return records


def select(records: list[dict], where: dict) -> list[dict]:
    """The records whose fields equal every item of `where`."""
    return [r for r in records if all(r.get(k) == v for k, v in where.items())]


def one(records: list[dict], where: dict) -> dict:
    found = select(records, where)
    if len(found) != 1:
        raise LookupError(f"{len(found)} records match {where} (want exactly 1)")
    return found[0]


def fmt_value(value, fmt: str | None) -> str:
    if isinstance(value, str):
        return value
    return (fmt or "{}").format(value)


def render_cell(spec, row_where: dict, records: list[dict]) -> str:
    """A cell: literal text, or a template whose {names} are records' values (one record,
    or the min / max of a metric over several), or a record's field."""
    if isinstance(spec, str):
        return spec
    where = {**row_where, **spec.get("where", {})}
    if "template" in spec:
        values = {}
        for name, sub in spec["values"].items():
            sub_where = {**where, **sub.get("where", {})}
            agg = sub.get("agg", "one")
            if agg == "one":
                value = one(records, sub_where)["value"]
            else:
                found = select(records, sub_where)
                if not found:
                    raise LookupError(f"no record matches {sub_where}")
                value = (min if agg == "min" else max)(r["value"] for r in found)
            values[name] = fmt_value(value, sub.get("fmt", spec.get("fmt")))
        return spec["template"].format(**values)
    record = one(records, where)
    text = str(record[spec["field"]]) if "field" in spec else fmt_value(record["value"], spec.get("fmt"))
    return f"**{text}**" if spec.get("bold") else text


def render_table(name: str, tables: dict, records: list[dict]) -> str:
    """The Markdown of table `name`: a header row, then one line per declared row."""
    table = tables[name]
    columns = table["columns"]
    lines = ["| " + " | ".join(c["header"] for c in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in table["rows"]:
        where = {**table.get("where", {}), **row.get("where", {})}
        cells = []
        for column in columns:
            spec = row.get("cells", {}).get(column["header"])
            if spec is None:
                spec = {k: v for k, v in column.items() if k in CELL_KEYS}
                spec["where"] = {**column.get("where", {}),
                                 **{k: v for k, v in column.items()
                                    if k not in CELL_KEYS and k != "header"}}
                if row.get("bold") and column["header"] in row["bold"]:
                    spec["bold"] = True
            cells.append(render_cell(spec, where, records))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_document(text: str, tables: dict, records: list[dict]) -> str:
    """`text` with every marked table rewritten from the records."""
    return BLOCK.sub(lambda m: m.group(1) + render_table(m.group(2), tables, records) + m.group(4),
                     text)


def load_tables(results: Path = RESULTS) -> dict:
    return json.loads((results / "tables.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a document's tables differ from the records")
    args = parser.parse_args(argv)
    records, tables = load_records(), load_tables()
    stale = []
    for name in DOCUMENTS:
        path = REPO / name
        text = path.read_text()
        rendered = render_document(text, tables, records)
        if rendered != text:
            stale.append(name)
            if not args.check:
                path.write_text(rendered)
    if args.check and stale:
        print("tables differ from benchmarks/results/ in: " + ", ".join(stale)
              + " (run python benchmarks/render_results.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
