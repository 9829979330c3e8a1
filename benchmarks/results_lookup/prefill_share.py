"""How much of a task prompt's time is its prefill, for AR and prompt lookup (SmolLM2, CPU).

    python benchmarks/results_lookup/prefill_share.py > benchmarks/results_lookup/prefill_share.txt

`hispec bench --tasks` reports tokens/s of the whole compiled program, prefill included (as
transformers' `generate` time includes its prefill). This times `generate` on the first two
prompts of summarize and extract (`--chat` rendering, SmolLM2-135M-Instruct) with 1 and with
64 new tokens, best of 3 after a warm-up each: the 1-token call is (almost all) prefill, the
difference is the decoding of 63 tokens. Ratios of AR to lookup, whole and decode-only.
"""

import os
import subprocess
import time

import hispec_jax
from hispec_jax.bench import tasks
from hispec_jax.bench.suite import device_description
from hispec_jax.models.pull import pull

NEW, REPEATS = 64, 3
METHODS = {"ar": dict(method="ar"), "lookup": dict(method="lookup", lookup=8)}


def best_seconds(model, prompt, new_tokens, options):
    hispec_jax.generate(model, [prompt], max_new_tokens=new_tokens, **options)  # compile
    return min(hispec_jax.generate(model, [prompt], max_new_tokens=new_tokens, **options)
               .stats["decode_seconds"] for _ in range(REPEATS))


def main():
    model = hispec_jax.load_model(str(pull("smollm2-135m-instruct")))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# {device_description()}; commit {commit}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load "
          f"{tuple(round(x, 2) for x in os.getloadavg())}")
    print(f"# SmolLM2-135M-Instruct, batch 1, greedy; seconds are the best of {REPEATS}\n")
    print("| task | prompt tokens | method | 1 token s | 64 tokens s | prefill share | "
          "decode ms/token |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for task in ("summarize", "extract"):
        for prompt in tasks.task_prompts(model, task, 2, 512, True):
            s = {(m, n): best_seconds(model, prompt, n, o) for m, o in METHODS.items()
                 for n in (1, NEW)}
            for m in METHODS:
                one, full = s[m, 1], s[m, NEW]
                print(f"| {task} | {len(prompt)} | {m} | {one:.3f} | {full:.3f} | "
                      f"{one / full:.0%} | {(full - one) / (NEW - 1) * 1e3:.1f} |", flush=True)
            whole = s["ar", NEW] / s["lookup", NEW]
            decode = (s["ar", NEW] - s["ar", 1]) / (s["lookup", NEW] - s["lookup", 1])
            ratios.append((task, len(prompt), whole, decode))
    print("\n| task | prompt tokens | lookup x AR, whole | lookup x AR, decode only |")
    print("|---|---|---|---|")
    for task, n, whole, decode in ratios:
        print(f"| {task} | {n} | {whole:.2f} | {decode:.2f} |")
    print(f"\n# load at end {tuple(round(x, 2) for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
