"""Chunked prefill against one power-of-two block, side by side in one process.

`generate` prefills a prompt in chunks of at most `generate.PREFILL_CHUNK` positions
(`decoding/prefill.py`); before, one block of the prompt's power-of-two bucket (a 300-token
prompt ran 512 positions). This times AR and prompt lookup on the task prompts of
`hispec bench --tasks` both ways, interleaved round by round (the "bucket" variant sets the
chunk above every bucket, which is exactly the earlier one-block prefill), prefill and
decoding together (`stats["decode_seconds"]`: the compiled program's runs).

    python benchmarks/results_lookup/prefill_chunk.py [--tasks summarize,extract]
        [--prompts 2] [--max-new-tokens 64] [--rounds 3] [--chunks 128,64] > prefill_chunk.txt
"""

from __future__ import annotations

import argparse
import os
import statistics

import hispec_jax
from hispec_jax.bench import tasks as tasks_lib
from hispec_jax.decoding import generate as generate_lib

SMOLLM2 = os.path.expanduser(
    "~/.cache/hispec/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--tasks", default="summarize,extract")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunks", type=lambda t: [int(c) for c in t.split(",")],
                    default=[generate_lib.PREFILL_CHUNK], help="chunk lengths to compare")
    args = ap.parse_args()
    model = hispec_jax.load_model(args.model)
    chunked = generate_lib.PREFILL_CHUNK
    variants = {f"chunks of {c}": c for c in args.chunks}
    variants["one bucket block"] = 1 << 20
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    for task in args.tasks.split(","):
        prompts = tasks_lib.task_prompts(model, task, args.prompts, 512, True)
        print(f"\n{task}: prompt lengths {[len(p) for p in prompts]}, "
              f"{args.max_new_tokens} new tokens each, batch 1")
        seconds, outputs = {}, {}

        def run(method, chunk):
            generate_lib.PREFILL_CHUNK = chunk
            r = hispec_jax.generate(model, prompts, method=method, batch_size=1,
                                    max_new_tokens=args.max_new_tokens, ignore_eos=True,
                                    max_cache_len=1024)
            return r.stats["decode_seconds"], r.token_ids

        for method in ("ar", "lookup"):
            for name, chunk in variants.items():
                _, outputs[method, name] = run(method, chunk)  # warm-up: compiles
                seconds[method, name] = []
        for _ in range(args.rounds):
            for method in ("ar", "lookup"):
                for name, chunk in variants.items():
                    s, _ = run(method, chunk)
                    seconds[method, name].append(s)
        generate_lib.PREFILL_CHUNK = chunked
        same = len({tuple(map(tuple, t)) for t in outputs.values()}) == 1
        print(f"every output identical: {same}")
        print("| method | prefill | tokens/s (median) | x AR with one bucket block |")
        print("|---|---|---|---|")
        new_tokens = args.max_new_tokens * len(prompts)
        base = new_tokens / statistics.median(seconds["ar", "one bucket block"])
        for (method, name), s in seconds.items():
            tps = new_tokens / statistics.median(s)
            print(f"| {method} | {name} | {tps:.1f} | {tps / base:.2f} |")
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
