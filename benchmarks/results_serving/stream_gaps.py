"""The gaps between a stream's deliveries, read from a server's step log (`hispec serve
--step-log`), against the clients' inter-token latencies.

Each engine step hands every decoding stream its new tokens (AR: one, prompt lookup: one or
more), so a stream's gap between two deliveries is the time between two step starts. Per
delivery: those gaps, one per stream decoding in both steps; per token: each gap divided by
the tokens per stream of the later step (how vLLM's server-side inter-token latency
counts a several-token delivery). Only steps with at least --busy streams decoding count
(the load phase of `hispec bench-tool serve`).

The server sends a chunk per delivery, its text "" while held back (the first bytes of a
multi-byte character: `serving.detok`), and `hispec bench-tool serve` stamps each, so the
clients' inter-token latencies and these gaps count the same deliveries; `held_back` counts
the tokens whose text is held back in offline AR answers (before the server sent empty
chunks, each of those merged two deliveries into one client gap).

Usage: python benchmarks/results_serving/stream_gaps.py STEPS.jsonl[.gz] [...]
           [--busy 6] [--held-back SMOLLM2.gguf --task chat --requests 16]
"""

import argparse
import gzip
import json

import numpy as np


def gaps(path: str, busy: int) -> tuple[np.ndarray, np.ndarray]:
    """(per-delivery gaps, per-token gaps) in seconds, one entry per stream and step."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    delivery, token = [], []
    for before, after in zip(records, records[1:]):
        if before["engine"] != after["engine"]:
            continue
        streams = min(before["decoding"], after["decoding"])
        if streams < busy:
            continue
        gap = after["time"] - before["time"]
        per_stream = after["tokens"] / after["decoding"] if after["decoding"] else 1
        delivery += [gap] * streams
        token += [gap / max(per_stream, 1.0)] * streams
    return np.asarray(delivery), np.asarray(token)


def held_back(model_path: str, task: str, requests: int) -> str:
    import hispec_jax
    from hispec_jax.bench import tasks
    from hispec_jax.serving.detok import TextDeltas

    model = hispec_jax.load_model(model_path)
    prompts = tasks.task_prompts(model, task, requests, 500, True)
    out = hispec_jax.generate(model, prompts, method="ar", max_new_tokens=128)
    empty = total = 0
    for ids in out.token_ids:
        deltas = TextDeltas(model.tokenizer)
        for t in ids:
            total += 1
            empty += deltas.push([t]) == ""
    return f"held back: {empty} of {total} tokens ({100 * empty / total:.1f} %) hand out no text"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--busy", type=int, default=6)
    ap.add_argument("--held-back", metavar="MODEL")
    ap.add_argument("--task", default="chat")
    ap.add_argument("--requests", type=int, default=16)
    args = ap.parse_args()
    for path in args.logs:
        delivery, token = gaps(path, args.busy)
        if not len(delivery):
            print(f"{path}: no two steps in a row with {args.busy} or more streams decoding")
            continue
        p = lambda x: np.percentile(x, [50, 99]) * 1e3
        (d50, d99), (t50, t99) = p(delivery), p(token)
        print(f"{path}: {len(delivery)} stream gaps; per delivery p50/p99 {d50:.0f}/{d99:.0f} ms "
              f"({d99 / d50:.2f}x); per token {t50:.0f}/{t99:.0f} ms ({t99 / t50:.2f}x)")
    if args.held_back:
        print(held_back(args.held_back, args.task, args.requests))


if __name__ == "__main__":
    main()
