"""Bundles gpu_run.sh's variants into one results.json, picks one, and splits its weights.

    python benchmarks/results_default_model_v3/collect.py WORK_DIR OUT_DIR NAME [NAME ...]

The pick: among the variants whose held-out reply perplexity is at most MAX_PPL, the one
with the highest mean acceptance in decoding (LayerSkip, draft length 1) at exits 6 and 9,
the exits the shipped model's plans draft from (if decoding did not finish for every
variant: their teacher-forced agreement on the held-out replies at those exits). Its model.safetensors goes to OUT_DIR in
parts of at most PART_BYTES (the device tool returns files of at most 16 MB); join them with
`cat model.part* > model.safetensors` (choice.json gives the sha256).
"""

import hashlib
import json
import os
import sys
from pathlib import Path

MAX_PPL = float(os.environ.get("MAX_PPL", 11.5))  # the bound is 12
PICK_EXITS = ("6", "9")
PART_BYTES = 15_000_000


def variant(work: Path, name: str) -> dict:
    d = work / name
    out = {"name": name}
    summary = d / "model" / "training_summary.json"
    if summary.exists():
        out["summary"] = json.loads(summary.read_text())
    metrics = d / "metrics.jsonl"
    if metrics.exists():
        out["metrics"] = [json.loads(line) for line in metrics.read_text().splitlines()]
    decode = d / "decode.json"
    if decode.exists():
        out["decode"] = json.loads(decode.read_text())
    return out


def score(v: dict, by: str) -> float | None:
    if "summary" not in v or v["summary"]["eval"]["replies"]["perplexity"] > MAX_PPL:
        return None
    if by == "decoding":
        rates = [v["decode"]["exits"][e]["acceptance_rate"] for e in PICK_EXITS]
    else:
        agree = v["summary"]["eval"]["replies"]["agreement_exits"]
        rates = [agree[int(e) - 1] for e in PICK_EXITS]
    return sum(rates) / len(rates)


def main(work: str, out: str, *names: str) -> None:
    work, out = Path(work), Path(out)
    variants = [variant(work, n) for n in names]
    by = "decoding" if all("decode" in v for v in variants if "summary" in v) else "teacher-forced"
    for v in variants:
        v["score"] = score(v, by)
        s = v.get("summary")
        if s:
            r = s["eval"]["replies"]
            print(f"{v['name']:8s} steps {s['steps']} tokens {s['tokens_seen']} "
                  f"ppl {r['perplexity']:.2f} agree e3/e6/e12 "
                  + "/".join(f"{r['agreement_exits'][e - 1]:.3f}" for e in (3, 6, 12))
                  + f" score {v['score']}")
    (out / "results.json").write_text(json.dumps(variants, indent=1) + "\n")
    ranked = [v for v in variants if v["score"] is not None]
    if not ranked:
        print("no variant qualifies")
        return
    best = max(ranked, key=lambda v: v["score"])
    weights = (work / best["name"] / "model" / "model.safetensors").read_bytes()
    for i in range(0, len(weights), PART_BYTES):
        (out / f"model.part{i // PART_BYTES}").write_bytes(weights[i:i + PART_BYTES])
    choice = {"name": best["name"], "score": best["score"], "scored_by": by, "max_ppl": MAX_PPL,
              "pick_exits": PICK_EXITS, "bytes": len(weights),
              "sha256": hashlib.sha256(weights).hexdigest(),
              "config": json.loads((work / best["name"] / "model" / "config.json").read_text())}
    (out / "choice.json").write_text(json.dumps(choice, indent=1) + "\n")
    print("picked", best["name"], choice["sha256"])


if __name__ == "__main__":
    main(*sys.argv[1:])
