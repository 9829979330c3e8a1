"""The tied LM head as `E @ x^T` for blocks against `x @ E^T`, side by side in one process.

`heads._tied_head` computes a block of 2..`EMBED_LHS_MAX_ROWS` rows as `E @ x^T` on CPU
(benchmarks/results_lookup/head_block_cost.py); before, every block ran `x @ E^T`. This
times AR and prompt lookup on the task prompts of `hispec bench --tasks` both ways (the
"before" variant sets `EMBED_LHS_MAX_ROWS = 1`, which is exactly the earlier head; each
variant's loops are compiled once and kept), and transformers' prompt-lookup decoding on
the same prompts and weights, interleaved round by round; tokens/s of the compiled
program's runs, prefill included (as transformers' `generate` time includes its prefill).

    python benchmarks/results_lookup/head_ab.py [--tasks summarize,extract,chat,code]
        [--prompts 2] [--max-new-tokens 64] [--rounds 2] [--no-transformers] > head_ab.txt
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics

import jax

import hispec_jax
from hispec_jax.bench import tasks as tasks_lib
from hispec_jax.decoding import engine as engine_lib
from hispec_jax.models import heads as heads_lib

SMOLLM2 = os.path.expanduser(
    "~/.cache/hispec/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
VARIANTS = {"head x @ E^T (before)": 1, "head E @ x^T for blocks (after)": heads_lib.EMBED_LHS_MAX_ROWS}
HF_LOOKUP = 10


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=SMOLLM2)
    ap.add_argument("--tasks", default="summarize,extract,chat,code")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-transformers", action="store_true")
    args = ap.parse_args()
    model = hispec_jax.load_model(args.model)
    hf_model = None if args.no_transformers else tasks_lib._hf_model(args.model)
    compiled = {name: collections.OrderedDict() for name in VARIANTS}  # each variant's loops
    print(f"load average at start: {os.getloadavg()}")

    def run(method, variant, prompts):
        heads_lib.EMBED_LHS_MAX_ROWS = VARIANTS[variant]
        if engine_lib._COMPILED is not compiled[variant]:
            engine_lib._COMPILED = compiled[variant]
            jax.clear_caches()  # no trace of the other variant's head is reused
        r = hispec_jax.generate(model, prompts, method=method, batch_size=1,
                                max_new_tokens=args.max_new_tokens, ignore_eos=True,
                                max_cache_len=1024)
        return r.stats["decode_seconds"], r.token_ids

    for task in args.tasks.split(","):
        prompts = tasks_lib.task_prompts(model, task, args.prompts, 512, True)
        print(f"\n{task}: prompt lengths {[len(p) for p in prompts]}, "
              f"{args.max_new_tokens} new tokens each, batch 1, --chat")
        warmups = {(m, v): (lambda m=m, v=v: run(m, v, prompts)[1])
                   for m in ("ar", "lookup") for v in VARIANTS}
        timed = {(m, v): (lambda m=m, v=v: run(m, v, prompts)[0])
                 for m in ("ar", "lookup") for v in VARIANTS}
        if hf_model is not None:
            name = f"transformers prompt-lookup k={HF_LOOKUP}"
            runner = tasks_lib.hf_runner(hf_model, prompts, args.max_new_tokens, name, HF_LOOKUP)
            warmups[name, ""] = lambda: runner.warmup().token_ids
            timed[name, ""] = runner.timed_round
        outputs = {key: fn() for key, fn in warmups.items()}  # warm-up: compiles
        seconds = {key: [] for key in timed}
        for _ in range(args.rounds):
            for key, fn in timed.items():
                seconds[key].append(fn())
        reference = outputs["ar", "head x @ E^T (before)"]
        new_tokens = args.max_new_tokens * len(prompts)
        tps = {key: new_tokens / statistics.median(s) for key, s in seconds.items()}
        print("| method | head | tokens/s (median) | x AR (same head) | x AR before "
              "| same tokens as AR before |")
        print("|---|---|---|---|---|---|")
        for (method, variant), t in tps.items():
            same_ar = tps.get(("ar", variant), tps["ar", "head x @ E^T (before)"])
            print(f"| {method} | {variant} | {t:.1f} | {t / same_ar:.2f} | "
                  f"{t / tps['ar', 'head x @ E^T (before)']:.2f} | "
                  f"{'yes' if outputs[method, variant] == reference else 'NO'} |")
        if hf_model is not None:
            hf = tps[f"transformers prompt-lookup k={HF_LOOKUP}", ""]
            for variant in VARIANTS:
                print(f"lookup ({variant}) / transformers prompt-lookup: "
                      f"{tps['lookup', variant] / hf:.2f}")
    print(f"\nload average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
