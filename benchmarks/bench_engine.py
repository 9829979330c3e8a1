"""AR vs LayerSkip (draft-exit sweep) vs HiSpec, side by side in one process.

Every method decodes the same prompts greedily; outputs are checked token-identical to AR.
Methods are warmed up (compiled) first, then timed in interleaved rounds so machine noise
hits every method alike; the median tokens/s is reported with the acceptance statistics,
the layer-pass counters and XLA's memory analysis of each compiled loop.

    python benchmarks/bench_engine.py --model PATH            # a real early-exit model
    python benchmarks/bench_engine.py --synthetic agree:0.05  # exits nearly agree
    python benchmarks/bench_engine.py --synthetic random      # exits disagree (worst case)

Synthetic models are random Llama-style models whose layers' residual contributions are
scaled by the given factor (`agree:s`): small factors make every exit's argmax (nearly)
equal to the final layer's, the regime an early-exit-trained model is in. They measure the
engine, not a model's quality.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys

import jax
import numpy as np

from hispec_jax import Model, ModelConfig, generate, load_model
from hispec_jax.bench import prompts as bench_prompts, suite
from hispec_jax.decoding import methods
from hispec_jax.models.params import default_layer_layout, init_params, with_layer_layout


def synthetic_model(kind: str, layers: int, hidden: int, vocab: int, seed: int) -> Model:
    scale = 1.0 if kind == "random" else float(kind.split(":")[1])
    cfg = ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=hidden,
                      intermediate_size=hidden * 8 // 3 // 64 * 64, num_layers=layers,
                      num_heads=hidden // 64, num_kv_heads=max(1, hidden // 256), head_dim=64,
                      max_position_embeddings=4096)
    params = init_params(cfg, jax.random.PRNGKey(seed), init_std=0.3 / np.sqrt(hidden / 64))
    params["layers"]["wo"] = params["layers"]["wo"] * scale
    params["layers"]["w_down"] = params["layers"]["w_down"] * scale
    return Model(cfg=cfg, params=params, generation_config={})


def memory_bytes(model: Model, decoder, prompts, max_new: int, capacity: int) -> int:
    """XLA memory analysis of the compiled loop (arguments, outputs, temporaries)."""
    return suite.compile_loop(model, decoder, prompts, len(prompts), max_new, capacity)[1]


def load_prompts(model: Model, args) -> list[list[int]]:
    """Token-id prompts: random ids of `--prompt-len`, or dataset prompts of at most that."""
    if args.dataset == "random":
        rng = np.random.RandomState(args.seed)
        return [rng.randint(0, model.cfg.vocab_size, args.prompt_len).tolist()
                for _ in range(args.prompts)]
    return bench_prompts.load_prompts(args.dataset, model.tokenizer, args.prompts, args.prompt_len)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="HF model directory (default: synthetic)")
    ap.add_argument("--synthetic", default="agree:0.05", help="random | agree:SCALE")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--prompts", type=int, default=4, help="number of prompts (batch 1 each)")
    ap.add_argument("--dataset", default="random", choices=["random", "sharegpt", "humaneval"],
                    help="prompt source: random token ids, the ShareGPT evaluation split (first "
                         "user turn, 'User: ...\nAssistant:'), or HumanEval (needs --model)")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=48,
                    help="random prompts: this many ids; dataset prompts: longer ones are skipped")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--draft-exits", default="", help="LayerSkip sweep, e.g. 1,2,4 (default: L/8, L/4)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layer-layout", default=None, choices=["scan", "unrolled"],
                    help="layer weights layout of --model (default: load_model's, unrolled on CPU)")
    ap.add_argument("--out", default=None, help="write results as JSON here")
    ap.add_argument("--temperatures", default="",
                    help="sampling mode instead: e.g. 0.6,1.0 runs AR and HiSpec (token-wise and "
                         "blockwise verification) at each temperature")
    args = ap.parse_args(argv)

    if args.model:
        model = load_model(args.model, layer_layout=args.layer_layout)
    else:
        model = synthetic_model(args.synthetic, args.layers, args.hidden, args.vocab, args.seed)
        layout = args.layer_layout or default_layer_layout()
        model = dataclasses.replace(model, params=with_layer_layout(model.params, layout))
    L = model.cfg.num_layers
    prompts = load_prompts(model, args)
    if args.temperatures:
        return sampling_benchmark(model, prompts, args)
    d_default, v_default = methods.default_exits(model)
    sweep = ([int(x) for x in args.draft_exits.split(",")] if args.draft_exits
             else sorted({d_default, v_default or d_default}))
    configs = [("ar", {})]
    configs += [(f"layerskip d={d}", {"method": "layerskip", "draft_exit": d}) for d in sweep]
    configs += [("hispec (defaults)", {"method": "hispec"}),
                ("hispec adaptive", {"method": "hispec", "adaptive": True})]
    # One fixed cache capacity for every method, so memory is compared like for like
    # (speculative methods need `lookahead` extra positions; that is part of their cost).
    lookahead = max(methods.make_method(model, o.get("method", "ar"), **{
        k: v for k, v in o.items() if k != "method"}).lookahead() for _, o in configs)
    longest = max(len(p) for p in prompts)
    capacity = -(-(longest + args.max_new_tokens + lookahead) // 64) * 64
    common = dict(max_new_tokens=args.max_new_tokens, ignore_eos=True, batch_size=args.batch_size,
                  max_cache_len=capacity)

    results, reference = {}, None
    for name, opts in configs:  # warm-up: compile, and check losslessness
        r = generate(model, prompts, **common, **opts)
        if reference is None:
            reference = r.token_ids
        identical = r.token_ids == reference
        decoder = methods.make_method(model, opts.get("method", "ar"),
                                      **{k: v for k, v in opts.items() if k != "method"})
        batch = prompts[:args.batch_size]
        results[name] = {"options": opts, "identical_to_ar": identical, "tps": [],
                         "compile_seconds": r.stats["compile_seconds"],
                         "memory": memory_bytes(model, decoder, batch, args.max_new_tokens,
                                                capacity),
                         "stats": {k: r.stats.get(k) for k in (
                             "exits", "acceptance_rate_per_level", "final_acceptance_rate",
                             "true_reject_rate", "false_accept_rate", "tokens_per_full_pass",
                             "layer_passes_per_token", "layer_token_evals", "layer_passes",
                             "rounds", "actions_per_level", "new_tokens")}}
    for _ in range(args.rounds):  # interleaved timing
        for name, opts in configs:
            r = generate(model, prompts, **common, **opts)
            results[name]["tps"].append(r.stats["tokens_per_second"])

    ar_tps = statistics.median(results["ar"]["tps"])
    ar_mem = results["ar"]["memory"]
    print(f"# {platform.processor() or platform.machine()}, {jax.devices()[0].platform}, "
          f"jax {jax.__version__}, prompts: {args.dataset}, model: {args.model or args.synthetic} L={L} "
          f"D={model.cfg.hidden_size} V={model.cfg.vocab_size}, {len(prompts)} prompts, "
          f"batch {args.batch_size}, {args.max_new_tokens} new tokens")
    print("| method | exits | tokens/s | speedup | identical | accept/level | final acc | "
          "true rej | tok/full pass | layer passes/tok | loop trips/tok | ms/layer pass "
          "| time/tok vs passes x AR's ms/pass | extra mem vs AR |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ar_lp = results["ar"]["stats"]["layer_passes_per_token"] or L
    ar_ms_per_pass = 1e3 / (ar_tps * ar_lp) * args.batch_size
    for name, res in results.items():
        tps = statistics.median(res["tps"])
        s = res["stats"]
        fmt = lambda x: "-" if x is None else f"{x:.2f}"
        accept = "/".join(fmt(a) for a in (s["acceptance_rate_per_level"] or [None])[1:]) or "-"
        extra = (res["memory"] - ar_mem) / ar_mem * 100
        res["speedup"] = tps / ar_tps
        # Loop trips (the old engine ran one action per trip; v2 one round per trip) and
        # wall time per sequential layer pass, per sequence of the batch.
        trips = s.get("rounds") or sum(s["actions_per_level"] or [0])
        per_seq_tokens = s["new_tokens"] / len(prompts)
        batches = -(-len(prompts) // args.batch_size)
        trips_per_tok = trips / batches / per_seq_tokens
        ms_per_pass = 1e3 / (tps * s["layer_passes_per_token"]) * args.batch_size
        res.update(trips_per_token=trips_per_tok, ms_per_layer_pass=ms_per_pass,
                   time_vs_prediction=ms_per_pass / ar_ms_per_pass)
        print(f"| {name} | {s['exits']} | {tps:.1f} | {tps / ar_tps:.2f}x | {res['identical_to_ar']} "
              f"| {accept} | {fmt(s['final_acceptance_rate'])} | {fmt(s['true_reject_rate'])} "
              f"| {fmt(s['tokens_per_full_pass'])} | {fmt(s['layer_passes_per_token'])} "
              f"| {trips_per_tok:.2f} | {ms_per_pass:.3f} | {ms_per_pass / ar_ms_per_pass:.2f} "
              f"| {extra:+.2f}% |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1, default=str)
    if not all(r["identical_to_ar"] for r in results.values()):
        print("ERROR: some method's output differs from AR", file=sys.stderr)
        return 1
    return 0


def sampling_benchmark(model: Model, prompts, args) -> int:
    """Sampling-mode tokens/s (AR vs HiSpec) and block efficiency, token-wise vs blockwise."""
    temps = [float(t) for t in args.temperatures.split(",")]
    configs = [("ar", {})] + [(f"hispec {a}", {"method": "hispec", "acceptance": a})
                              for a in ("tokenwise", "blockwise")]
    common = dict(max_new_tokens=args.max_new_tokens, ignore_eos=True, batch_size=args.batch_size)
    rows = {}
    for t in temps:
        for name, opts in configs:  # warm-up / compile
            generate(model, prompts, temperature=t, seed=args.seed, **common, **opts)
        for name, opts in configs:
            rows[(t, name)] = {"tps": [], "tokens_per_full_pass": [], "accept": []}
        for r in range(args.rounds):
            for name, opts in configs:
                res = generate(model, prompts, temperature=t, seed=args.seed + r, **common, **opts)
                row = rows[(t, name)]
                row["tps"].append(res.stats["tokens_per_second"])
                row["tokens_per_full_pass"].append(res.stats["tokens_per_full_pass"] or 1.0)
                row["accept"].append(res.stats["acceptance_rate_per_level"])
    print(f"# sampling mode, model: {args.model or args.synthetic}, {len(prompts)} prompts, "
          f"batch {args.batch_size}, {args.max_new_tokens} new tokens, {args.rounds} rounds")
    print("| temperature | method | tokens/s (median) | speedup vs AR | tokens per full pass "
          "(block efficiency) | acceptance per level (last round) |")
    print("|---|---|---|---|---|---|")
    for t in temps:
        ar = statistics.median(rows[(t, "ar")]["tps"])
        for name, _ in configs:
            row = rows[(t, name)]
            tps = statistics.median(row["tps"])
            acc = "/".join("-" if a is None else f"{a:.2f}" for a in (row["accept"][-1] or [])[1:])
            print(f"| {t} | {name} | {tps:.1f} | {tps / ar:.2f}x | "
                  f"{statistics.mean(row['tokens_per_full_pass']):.2f} | {acc or '-'} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": {f"{t} {n}": v for (t, n), v in rows.items()}},
                      f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
