"""Greedy autoregressive decoding: hispec_jax `generate(method="ar")` vs transformers (CPU).

Builds a random Llama model with transformers, saves it in HF layout, loads the same
weights with `hispec_jax.load_model`, and measures new tokens per second of

  * ours: `hispec_jax.generate(model, prompts, method="ar", ignore_eos=True)`, ragged
    prompts in one batch (compilation happens in the warm-up and is reported separately);
  * transformers: `model.generate(do_sample=False, min_new_tokens=N, max_new_tokens=N)`,
    the batch left-padded with an attention mask, default (dynamic) KV cache;

at each batch size, both warmed up first, rounds interleaved (ours, theirs, ours, ...), the
median reported, and the best round (on a shared machine, the least disturbed one). Both
run in this process on the same CPU threads: the process is pinned to `--threads` cores
(XLA's pool follows the affinity mask) and `torch.set_num_threads` is set to the same number.
Greedy tokens must match transformers' at batch 1 (checked; the exit status is 1 if not).

    python benchmarks/bench_ar.py                         # defaults below
    python benchmarks/bench_ar.py --layers 4 --rounds 1   # quicker
    python benchmarks/bench_ar.py --out /tmp/bench_ar.json

Not part of the test suite.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1408)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--init-std", type=float, default=0.02, help="HF initializer_range")
    p.add_argument("--new-tokens", type=int, default=128, help="N new tokens per sequence")
    p.add_argument("--batch-sizes", default="1,8", help="comma-separated")
    p.add_argument("--min-prompt", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per batch size")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="CPU threads for both (default: every core this process may use)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="also write the results as JSON here")
    return p.parse_args(argv)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    args = parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    if not 1 <= args.threads <= len(cores):
        raise SystemExit(f"--threads must be in [1, {len(cores)}]")
    # Before jax / torch start their thread pools, so both see the same cores.
    os.sched_setaffinity(0, cores[:args.threads])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig

    import hispec_jax

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    N = args.new_tokens

    machine = {
        "cpu": cpu_model(), "cores_available": len(cores), "threads": args.threads,
        "loadavg_at_start": os.getloadavg(), "platform": platform.platform(),
        "python": platform.python_version(), "jax": jax.__version__,
        "jax_backend": jax.default_backend(), "torch": torch.__version__,
        "transformers": transformers.__version__, "hispec_jax": hispec_jax.__version__
        if hasattr(hispec_jax, "__version__") else "dev",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    print(f"machine: {machine['cpu']}, {len(cores)} cores available, {args.threads} threads used, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"versions: python {machine['python']}, jax {machine['jax']} ({machine['jax_backend']}), "
          f"torch {machine['torch']}, transformers {machine['transformers']}")

    # ---- one random model, two implementations ----
    torch.manual_seed(args.seed)
    hf_config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=2048,
        initializer_range=args.init_std, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=None, pad_token_id=0)
    hf_model = AutoModelForCausalLM.from_config(hf_config).float().eval()
    num_params = sum(p.numel() for p in hf_model.parameters())
    with tempfile.TemporaryDirectory(prefix="bench_ar_") as workdir:
        hf_model.save_pretrained(workdir, safe_serialization=True)
        model = hispec_jax.load_model(workdir)
    assert model.cfg.dtype == "float32"
    print(f"model: Llama, {args.layers} layers, hidden {args.hidden}, {args.heads} heads / "
          f"{args.kv_heads} kv heads, MLP {args.intermediate}, vocab {args.vocab}, float32, "
          f"{num_params / 1e6:.1f}M parameters; {N} new tokens per sequence")

    rng = np.random.RandomState(args.seed)
    prompts = {}
    for B in batch_sizes:
        lens = rng.randint(args.min_prompt, args.max_prompt + 1, size=B)
        prompts[B] = [rng.randint(3, args.vocab, size=n).tolist() for n in lens]

    def hf_inputs(batch):
        P = max(len(p) for p in batch)
        ids = torch.zeros((len(batch), P), dtype=torch.long)
        mask = torch.zeros((len(batch), P), dtype=torch.long)
        for b, p in enumerate(batch):  # left padding
            ids[b, P - len(p):] = torch.tensor(p)
            mask[b, P - len(p):] = 1
        return ids, mask

    def run_ours(B):
        t0 = time.perf_counter()
        result = hispec_jax.generate(model, prompts[B], method="ar", max_new_tokens=N,
                                     ignore_eos=True)
        return time.perf_counter() - t0, result

    def run_hf(B):
        ids, mask = hf_inputs(prompts[B])
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf_model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                    min_new_tokens=N, max_new_tokens=N, pad_token_id=0)
        return time.perf_counter() - t0, out[:, ids.shape[1]:].tolist()

    # ---- warm up both (our compilation happens here) ----
    compile_seconds, first_call_seconds, tokens = {}, {}, {}
    for B in batch_sizes:
        seconds, result = run_ours(B)
        compile_seconds[B] = result.stats["compile_seconds"]
        first_call_seconds[B] = seconds
        _, hf_tokens = run_hf(B)
        tokens[B] = (result.token_ids, hf_tokens)

    # ---- timed rounds, interleaved ----
    times = {B: {"hispec_jax": [], "transformers": []} for B in batch_sizes}
    for r in range(args.rounds):
        for B in batch_sizes:
            times[B]["hispec_jax"].append(run_ours(B)[0])
            times[B]["transformers"].append(run_hf(B)[0])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    rows = []
    for B in batch_sizes:
        ours_tokens, hf_tokens = tokens[B]
        same_rows = sum(o == h for o, h in zip(ours_tokens, hf_tokens))
        ours_s = statistics.median(times[B]["hispec_jax"])
        hf_s = statistics.median(times[B]["transformers"])
        rows.append({
            "batch": B, "prompt_lengths": [len(p) for p in prompts[B]], "new_tokens": N,
            "hispec_jax_tokens_per_s": B * N / ours_s, "transformers_tokens_per_s": B * N / hf_s,
            "speedup": hf_s / ours_s,
            "hispec_jax_best_tokens_per_s": B * N / min(times[B]["hispec_jax"]),
            "transformers_best_tokens_per_s": B * N / min(times[B]["transformers"]),
            "hispec_jax_seconds": times[B]["hispec_jax"],
            "transformers_seconds": times[B]["transformers"],
            "hispec_jax_compile_seconds": compile_seconds[B],
            "hispec_jax_first_call_seconds": first_call_seconds[B],
            "rows_matching_transformers": same_rows,
        })

    print()
    print("| batch | prompt lengths | new tokens / seq | hispec_jax tok/s | transformers tok/s "
          "| speedup | best round: hispec_jax / transformers tok/s | hispec_jax compile (s) "
          "| greedy tokens == transformers |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        lens = row["prompt_lengths"]
        print(f"| {row['batch']} | {min(lens)}–{max(lens)} | {N} "
              f"| {row['hispec_jax_tokens_per_s']:.1f} | {row['transformers_tokens_per_s']:.1f} "
              f"| {row['speedup']:.2f}× | {row['hispec_jax_best_tokens_per_s']:.1f} / "
              f"{row['transformers_best_tokens_per_s']:.1f} "
              f"| {row['hispec_jax_compile_seconds']:.1f} "
              f"| {row['rows_matching_transformers']}/{row['batch']} rows |")
    print(f"\ntok/s and speedup: median of {args.rounds} interleaved rounds; tokens/s = "
          f"batch × new tokens / wall time of one generate call; load average at end "
          f"{os.getloadavg()[0]:.2f}")

    batch1 = next((row for row in rows if row["batch"] == 1), None)
    ok = batch1 is None or batch1["rows_matching_transformers"] == 1
    if not ok:
        ours_tokens, hf_tokens = tokens[1]
        first = next(i for i, (a, b) in enumerate(zip(ours_tokens[0], hf_tokens[0])) if a != b)
        print(f"MISMATCH at batch 1: first differing new token at index {first}")
    if args.out:
        machine["loadavg_at_end"] = os.getloadavg()
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "args": vars(args), "num_params": num_params,
                       "results": rows, "batch1_tokens_match": ok}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
