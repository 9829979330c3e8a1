"""Greedy AR decoding, hispec_jax vs transformers, on one random Llama model (CPU, batched).

    python -m hispec_jax.bench ar                          # defaults below
    python -m hispec_jax.bench ar --layers 4 --rounds 1    # quicker
    python -m hispec_jax.bench ar --rounds 5 --out /tmp/bench_ar.json

Builds a random Llama model with transformers (`--layers`, `--hidden`, ... ; float32), saves
it in HF layout and loads the same weights with `hispec_jax.load_model`. At each batch size
B (`--batch-sizes`), B prompts of random token ids with lengths drawn from
[`--min-prompt`, `--max-prompt`] decode exactly N = `--new-tokens` new tokens each:

    hispec_jax     `generate(model, prompts, method="ar", ignore_eos=True)`, the ragged
                   batch in one call (compilation happens in the warm-up, reported apart)
    transformers   `model.generate(do_sample=False)`, the batch left-padded with an
                   attention mask, default (dynamic) KV cache (`hf_baselines.hf_generate_batch`)

Per batch size one `suite.compare`: both warmed up, then `--rounds` interleaved rounds;
tokens/s = B x N / wall time of one call, median over rounds, and the best round (on a
shared machine, the least disturbed one). Both run in this process on the same CPU cores:
the process is pinned to `--threads` cores before JAX and PyTorch start their thread pools
(XLA's pool follows the affinity mask) and `torch.set_num_threads` gets the same number.
Greedy tokens must match transformers' at batch 1 (exit status 1 if not). Needs PyTorch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

from hispec_jax.bench import args as args_lib

PROG = "hispec bench-tool ar"


def parse_args(argv=None) -> argparse.Namespace:
    """The flags, checked (threads against this process's cores) before anything is imported."""
    p = args_lib.Parser(prog=PROG, description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--layers", type=int, default=8, help="decoder layers")
    p.add_argument("--hidden", type=int, default=512, help="hidden size")
    p.add_argument("--heads", type=int, default=8, help="attention heads")
    p.add_argument("--kv-heads", type=int, default=4, help="key/value heads")
    p.add_argument("--intermediate", type=int, default=1408, help="MLP size")
    p.add_argument("--vocab", type=int, default=8192, help="vocabulary size")
    p.add_argument("--init-std", type=float, default=0.02, help="HF initializer_range")
    p.add_argument("--new-tokens", type=int, default=128, help="N new tokens per sequence")
    p.add_argument("--batch-sizes", type=args_lib.positive_int_list, default=(1, 8), help="comma-separated")
    p.add_argument("--min-prompt", type=int, default=32, help="shortest prompt (tokens)")
    p.add_argument("--max-prompt", type=int, default=64, help="longest prompt (tokens)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per batch size")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="CPU threads for both (default: every core this process may use)")
    p.add_argument("--seed", type=int, default=0, help="weights and prompts")
    p.add_argument("--out", default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    if not 1 <= args.threads <= cores:
        p.error(f"--threads must be in [1, {cores}], got {args.threads}")
    for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "new_tokens",
                 "rounds", "min_prompt"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_prompt < args.min_prompt:
        p.error(f"--max-prompt ({args.max_prompt}) is below --min-prompt ({args.min_prompt})")
    if args.vocab <= 3:
        p.error(f"--vocab must be > 3 (prompt ids are drawn from [3, vocab)), got {args.vocab}")
    return args


def cpu_model() -> str:
    """The CPU's name as /proc/cpuinfo gives it (else `platform.processor()`)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def transformers_runner(hf_model, prompts: list[list[int]], new_tokens: int):
    """transformers' batched greedy `generate` as a `suite.Runner`."""
    from hispec_jax.bench import hf_baselines, suite

    def warmup() -> suite.Result:
        tokens, _ = hf_baselines.hf_generate_batch(hf_model, prompts, new_tokens)
        return suite.Result(name="transformers", token_ids=tokens,
                            new_tokens=len(prompts) * new_tokens,
                            options={"method": "transformers"})

    return suite.Runner("transformers", warmup,
                        lambda: hf_baselines.hf_generate_batch(hf_model, prompts, new_tokens)[1])


def markdown(rows: list[dict], rounds: int) -> str:
    """The results table (one row per batch size)."""
    lines = ["| batch | prompt lengths | new tokens / seq | hispec_jax tok/s | transformers tok/s "
             "| speedup | best round: hispec_jax / transformers tok/s | hispec_jax compile (s) "
             "| greedy tokens == transformers |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        lens = row["prompt_lengths"]
        lines.append(
            f"| {row['batch']} | {min(lens)}–{max(lens)} | {row['new_tokens']} "
            f"| {row['hispec_jax_tokens_per_s']:.1f} | {row['transformers_tokens_per_s']:.1f} "
            f"| {row['speedup']:.2f}× | {row['hispec_jax_best_tokens_per_s']:.1f} / "
            f"{row['transformers_best_tokens_per_s']:.1f} "
            f"| {row['hispec_jax_compile_seconds']:.1f} "
            f"| {row['rows_matching_transformers']}/{row['batch']} rows |")
    lines.append(f"\ntok/s and speedup: median of {rounds} interleaved rounds; tokens/s = "
                 "batch × new tokens / wall time of one generate call")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    # Before JAX / PyTorch start their thread pools, so both see the same cores.
    os.sched_setaffinity(0, cores[:args.threads])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import tempfile

    import jax
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig

    import hispec_jax
    from hispec_jax.bench import suite

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    N = args.new_tokens
    machine = {
        "cpu": cpu_model(), "cores_available": len(cores), "threads": args.threads,
        "loadavg_at_start": os.getloadavg(), "platform": platform.platform(),
        "python": platform.python_version(), "jax": jax.__version__,
        "jax_backend": jax.default_backend(), "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    print(f"machine: {machine['cpu']}, {len(cores)} cores available, {args.threads} threads "
          f"used, load average {os.getloadavg()[0]:.2f}")
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
    print(f"model: Llama, {args.layers} layers, hidden {args.hidden}, {args.heads} heads / "
          f"{args.kv_heads} kv heads, MLP {args.intermediate}, vocab {args.vocab}, "
          f"{model.cfg.dtype}, {num_params / 1e6:.1f}M parameters; {N} new tokens per sequence")

    rng = np.random.RandomState(args.seed)
    prompts = {}
    for B in args.batch_sizes:
        lens = rng.randint(args.min_prompt, args.max_prompt + 1, size=B)
        prompts[B] = [rng.randint(3, args.vocab, size=n).tolist() for n in lens]

    ar = suite.MethodSpec.of("hispec_jax", "ar")
    rows = []
    for B in args.batch_sizes:
        capacity = suite.common_cache_len(model, prompts[B], [ar], N)
        ours = suite.hispec_runner(model, prompts[B], ar, max_new_tokens=N, batch_size=B,
                                   max_cache_len=capacity)
        theirs = transformers_runner(hf_model, prompts[B], N)
        mine, hf = suite.compare([ours, theirs], args.rounds,
                                 lambda name: print(f"[ar] batch {B}: {name}", file=sys.stderr))
        rows.append({
            "batch": B, "prompt_lengths": [len(p) for p in prompts[B]], "new_tokens": N,
            "hispec_jax_tokens_per_s": mine.tokens_per_second,
            "transformers_tokens_per_s": hf.tokens_per_second,
            "speedup": mine.tokens_per_second / hf.tokens_per_second,
            "hispec_jax_best_tokens_per_s": B * N / min(mine.seconds),
            "transformers_best_tokens_per_s": B * N / min(hf.seconds),
            "hispec_jax_seconds": mine.seconds, "transformers_seconds": hf.seconds,
            "hispec_jax_compile_seconds": mine.compile_seconds,
            "rows_matching_transformers": sum(d is None for d in hf.departures_from_ar),
            "first_departure_from_transformers": hf.departures_from_ar,
        })

    print()
    print(markdown(rows, args.rounds) + f"; load average at end {os.getloadavg()[0]:.2f}")
    batch1 = next((row for row in rows if row["batch"] == 1), None)
    ok = batch1 is None or batch1["rows_matching_transformers"] == 1
    if not ok:
        print("MISMATCH at batch 1: first differing new token at index "
              f"{batch1['first_departure_from_transformers'][0]}")
    if args.out:
        machine["loadavg_at_end"] = os.getloadavg()
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "args": vars(args), "num_params": num_params,
                       "results": rows, "batch1_tokens_match": ok}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
