"""Markdown rendering of a `hispec bench` report (the dict written to report.json)."""

from __future__ import annotations

from typing import Any


def _f(x, digits: int = 2, suffix: str = "") -> str:
    return "-" if x is None else f"{x:.{digits}f}{suffix}"


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


METHOD_HEADER = ("| method | tokens/s | speedup vs AR | identical to AR | final acceptance | "
                 "true reject | false accept | tokens / full pass | tokens / round | "
                 "layer passes / token | work / token | work speedup | ms / layer pass | "
                 "compile s | loop memory MiB |\n" + "|---" * 15 + "|\n")


def identical_cell(row: dict[str, Any]) -> str:
    """"True", or where the output departs from AR: "False (2/8 prompts, first at 83)"."""
    if row["identical_to_ar"] or not row.get("departures_from_ar"):
        return str(row["identical_to_ar"])
    departed = [d for d in row["departures_from_ar"] if d is not None]
    return (f"False ({len(departed)}/{len(row['departures_from_ar'])} prompts, "
            f"first at {min(departed)})")


def method_table(rows: list[dict[str, Any]]) -> str:
    """One row per method: speed, losslessness, Table 9 statistics, costs."""
    lines = [METHOD_HEADER]
    for r in rows:
        s = r.get("stats", {})
        lines.append(
            f"| {r['name']} | {r['tokens_per_second']:.1f} | {_f(r.get('speedup_vs_ar'), 2, 'x')} "
            f"| {identical_cell(r)} | {_f(s.get('final_acceptance_rate'))} "
            f"| {_f(s.get('true_reject_rate'))} | {_f(s.get('false_accept_rate'))} "
            f"| {_f(s.get('tokens_per_full_pass'))} | {_f(s.get('tokens_per_round'))} "
            f"| {_f(s.get('layer_passes_per_token'), 1)} | {_f(s.get('work_per_token'), 1)} "
            f"| {_f(s.get('work_speedup'), 2, 'x')} | {_f(r.get('ms_per_layer_pass'), 3)} | {_f(r.get('compile_seconds'), 1)} | {_mib(r.get('memory_bytes'))} |\n")
    return "".join(lines)


def best_row(rows, method: str):
    """The fastest result row of `method` ("layerskip", "hispec", "transformers"), or None."""
    candidates = [r for r in rows if r["options"].get("method") == method]
    return max(candidates, key=lambda r: r["tokens_per_second"]) if candidates else None


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The headline ratios the targets are about."""
    out = []
    for dataset, rows in report["methods"].items():
        ls, hs = best_row(rows, "layerskip"), best_row(rows, "hispec")
        if hs and ls:
            out.append(f"- {dataset}: best HiSpec ({hs['name']}) {hs['speedup_vs_ar']:.2f}x AR, "
                       f"{hs['tokens_per_second'] / ls['tokens_per_second']:.2f}x the best "
                       f"LayerSkip ({ls['name']}, {ls['speedup_vs_ar']:.2f}x AR)")
        seeds = [r for r in (best_row(rows, "sv"), best_row(rows, "specbound")) if r]
        if seeds:
            out.append(f"- {dataset}: " + ", ".join(
                f"{r['name']} {r['speedup_vs_ar']:.2f}x AR" for r in seeds))
    for dataset, rows in report["peers"].items():
        ours = best_row(rows, "hispec")
        theirs = best_row(rows, "transformers")
        if ours and theirs:
            out.append(f"- {dataset}: our best HiSpec is {ours['tokens_per_second'] / theirs['tokens_per_second']:.2f}x "
                       f"the best transformers method ({theirs['name']}, "
                       f"{theirs['tokens_per_second']:.1f} tokens/s)")
    if report.get("batch"):
        b = report["batch"]
        for size in b["batch_sizes"]:
            ar, *others = b["rows"][str(size)]
            out.append(f"- batch {size} ({b['dataset']}, AR {ar['tokens_per_second']:.1f} "
                       "tokens/s): " + ", ".join(f"{r['name']} {r['speedup_vs_ar']:.2f}x"
                                                 for r in others))
    identical = all(r["identical_to_ar"] for section in ("methods", "peers")
                    for rows in report[section].values() for r in rows)
    if report.get("batch"):
        identical &= all(r["identical_to_ar"] for rows in report["batch"]["rows"].values()
                         for r in rows)
    if report.get("grid"):
        identical &= all(r["identical_to_ar"] for r in report["grid"]["rows"])
    out.append(f"- every method's greedy output identical to AR: **{identical}**")
    return out


def markdown(report: dict[str, Any]) -> str:
    m, c = report["model"], report["config"]
    parts = [f"# hispec bench — {report['date']}\n\n",
             f"Device: {report['device']}. Model: `{m['dir']}` (L={m['layers']}, D={m['hidden']}, "
             f"V={m['vocab']}, default exits Ld, Li = {m['default_exits']}). "
             f"{c['num_prompts']} prompts per dataset (at most {c['max_prompt_tokens']} tokens), "
             f"{c['max_new_tokens']} new tokens each (EOS ignored), greedy, batch {c['batch_size']}, "
             f"{c['rounds']} interleaved rounds (median). Total {report.get('seconds', '?')} s.\n\n",
             "## Summary\n\n", "\n".join(summary_lines(report)), "\n\n"]
    for dataset, rows in report["methods"].items():
        parts += [f"## Methods: {dataset}\n\n", method_table(rows), "\n"]
    for dataset, rows in report["peers"].items():
        parts += [f"## Against transformers (PyTorch), same weights: {dataset}\n\n",
                  "| method | tokens/s | vs our AR | identical to our AR |\n|---|---|---|---|\n"]
        parts += [f"| {r['name']} | {r['tokens_per_second']:.1f} | {r['speedup_vs_ar']:.2f}x "
                  f"| {r['identical_to_ar']} |\n" for r in rows]
        parts.append("\n")
    if report.get("grid"):
        g = report["grid"]
        d0 = m["default_exits"][0]
        parts += [f"## Exit grid ({g['dataset']}, 1 round): HiSpec speedup over AR, row Ld, column Li\n\n",
                  "| Ld \\ Li | " + " | ".join(map(str, g["exits"])) + " |\n",
                  "|---" * (len(g["exits"]) + 1) + "|\n"]
        for d, row in zip(g["exits"], g["heatmap"]):
            parts.append(f"| {d} | " + " | ".join("" if v != v else f"{v:.2f}" for v in row) + " |\n")
        table9 = [r for r in g["rows"] if r["options"].get("draft_exit") == d0]
        parts += [f"\n### Intermediate-exit sweep at Ld = {d0} (paper Table 9)\n\n",
                  method_table(table9), "\n### Window sweep for the best pair\n\n",
                  method_table(g["window_rows"]), "\n"]
    if report.get("batch"):
        b = report["batch"]
        names = [r["name"] for r in b["rows"][str(b["batch_sizes"][0])]]
        parts += [f"## Batch sizes ({b['dataset']}, {b['num_prompts']} prompts): tokens/s "
                  "(speedup vs AR)\n\n",
                  "| batch | " + " | ".join(names) + " | all identical to AR |\n",
                  "|---" * (len(names) + 2) + "|\n"]
        for size in b["batch_sizes"]:
            rows = b["rows"][str(size)]
            cells = [f"{r['tokens_per_second']:.1f} ({r['speedup_vs_ar']:.2f}x)" for r in rows]
            identical = all(r["identical_to_ar"] for r in rows)
            parts.append(f"| {size} | " + " | ".join(cells) + f" | {identical} |\n")
        for size in b["batch_sizes"]:
            parts += [f"\n### Batch {size}\n\n", method_table(b["rows"][str(size)])]
        parts.append("\n")
    if report.get("agreement"):
        parts.append("## Per-exit top-1 agreement with the final layer (teacher-forced)\n\n")
        for dataset, a in report["agreement"].items():
            parts += [f"{dataset} ({a['tokens']} tokens):\n\n",
                      "| exit | " + " | ".join(map(str, a["exits"])) + " |\n",
                      "|---" * (len(a["exits"]) + 1) + "|\n",
                      "| agreement | " + " | ".join(f"{x:.3f}" for x in a["agreement"]) + " |\n\n"]
    if report.get("plots"):
        parts += ["## Plots\n\n"] + [f"![{p}]({p})\n" for p in report["plots"]]
    return "".join(parts)
