"""AR vs LayerSkip (draft-exit sweep) vs HiSpec on one model, greedy or sampling, one table.

    python -m hispec_jax.bench engine --model PATH            # a real early-exit model
    python -m hispec_jax.bench engine --synthetic agree:0.05  # exits nearly agree
    python -m hispec_jax.bench engine --synthetic random      # exits disagree (worst case)
    python -m hispec_jax.bench engine --model PATH --dataset sharegpt --layer-layout scan
    python -m hispec_jax.bench engine --model PATH --temperatures 0.6,1.0   # sampling mode

Greedy mode (one `suite.compare`): AR, LayerSkip at each `--draft-exits` exit (default: the
model's default exits), HiSpec defaults and adaptive decode the same prompts with one cache
capacity; warmed up (compiled, checked token-identical to AR), then timed in interleaved
rounds. tokens/s: median over rounds of `generate`'s own `tokens_per_second` (the compiled
loop's time; request building and host copies excluded). Per method: tokens/s, speedup,
acceptance per level, final acceptance, true reject rate, tokens per full pass, layer
passes per token, loop trips per token, wall ms per sequential layer pass, that time over
AR's ms per pass, and the extra memory of its compiled loop over AR's (XLA's memory
analysis).

Sampling mode (`--temperatures`): at each temperature AR and HiSpec with token-wise and
blockwise verification, warmed up, then interleaved rounds (round r samples with seed
`--seed` + r; tokens/s as in greedy mode): tokens/s, speedup, block efficiency (tokens per
full-model pass, mean over rounds) and acceptance per level (last round).

Synthetic models (`--synthetic`) are random Llama-style models whose layers' residual
contributions are scaled (`agree:S`, `oracle.scaled_residuals`): small S makes every exit's
argmax (nearly) the final layer's, the regime an early-exit-trained model is in; S = 0 is
the always-agree model of `hispec bench-tool oracle`. They measure the engine, not a model.
Prompts: random token ids of `--prompt-len`, or held-out ShareGPT / HumanEval prompts of at
most that many tokens (`hispec_jax/datasets.py`; needs --model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from hispec_jax.bench import args as args_lib

PROG = "hispec bench-tool engine"


def residual_scale(kind: str) -> float:
    """`--synthetic` text -> the factor on every layer's residual contribution:
    "random" -> 1.0, "agree:S" -> S (S >= 0)."""
    if kind == "random":
        return 1.0
    name, _, value = kind.partition(":")
    try:
        scale = float(value)
    except ValueError:
        scale = -1.0
    if name != "agree" or scale < 0:
        raise argparse.ArgumentTypeError(
            f"expected 'random' or 'agree:S' with S >= 0, got {kind!r}")
    return scale


def parse_args(argv=None) -> argparse.Namespace:
    ap = args_lib.Parser(prog=PROG, description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model directory (default: synthetic)")
    ap.add_argument("--synthetic", default="agree:0.05", help="random | agree:SCALE")
    ap.add_argument("--layers", type=int, default=16, help="synthetic: layers")
    ap.add_argument("--hidden", type=int, default=512, help="synthetic: hidden size (x 64)")
    ap.add_argument("--vocab", type=int, default=4096, help="synthetic: vocabulary size")
    ap.add_argument("--prompts", type=int, default=4, help="number of prompts")
    ap.add_argument("--dataset", default="random", choices=["random", "sharegpt", "humaneval"],
                    help="prompt source: random token ids, the ShareGPT evaluation split (first "
                         "user turn, 'User: ...\\nAssistant:'), or HumanEval (needs --model)")
    ap.add_argument("--batch-size", type=int, default=1, help="prompts decoded together")
    ap.add_argument("--prompt-len", type=int, default=48,
                    help="random prompts: this many ids; dataset prompts: longer ones are skipped")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="new tokens per prompt")
    ap.add_argument("--draft-exits", type=args_lib.int_list, default=(),
                    help="LayerSkip sweep, e.g. 1,2,4 (default: the model's default exits)")
    ap.add_argument("--rounds", type=int, default=3, help="timed interleaved rounds (median)")
    ap.add_argument("--seed", type=int, default=0, help="synthetic weights, prompts, sampling")
    ap.add_argument("--layer-layout", default=None, choices=["scan", "unrolled"],
                    help="layer weights layout (default: the backend's, unrolled on CPU)")
    ap.add_argument("--out", default=None, help="write results as JSON here")
    ap.add_argument("--temperatures", type=args_lib.float_list, default=(),
                    help="sampling mode instead: e.g. 0.6,1.0 runs AR and HiSpec (token-wise and "
                         "blockwise verification) at each temperature")
    args = ap.parse_args(argv)
    try:
        residual_scale(args.synthetic)
    except argparse.ArgumentTypeError as e:
        ap.error(f"--synthetic: {e}")
    for name in ("layers", "hidden", "vocab", "prompts", "batch_size", "prompt_len",
                 "max_new_tokens", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.model and args.hidden % 64:
        ap.error(f"--hidden must be a multiple of 64 (head dim), got {args.hidden}")
    if args.dataset != "random" and not args.model:
        ap.error(f"--dataset {args.dataset} needs --model (a model with a tokenizer)")
    if any(t <= 0 for t in args.temperatures):
        ap.error("--temperatures must be > 0 (greedy is the default mode)")
    return args


def synthetic_model(scale: float, layers: int, hidden: int, vocab: int, seed: int):
    """A random Llama-style model (head dim 64, one KV head per 4 heads) whose layers'
    residual contributions are scaled by `scale`."""
    import jax
    import numpy as np

    from hispec_jax import Model, ModelConfig
    from hispec_jax.bench import oracle
    from hispec_jax.models.params import init_params

    cfg = ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=hidden,
                      intermediate_size=hidden * 8 // 3 // 64 * 64, num_layers=layers,
                      num_heads=hidden // 64, num_kv_heads=max(1, hidden // 256), head_dim=64,
                      max_position_embeddings=4096)
    params = init_params(cfg, jax.random.PRNGKey(seed), init_std=0.3 / np.sqrt(hidden / 64))
    return oracle.scaled_residuals(Model(cfg=cfg, params=params, generation_config={}), scale)


def load(args):
    """(model in `--layer-layout`, token-id prompts)."""
    import dataclasses

    import numpy as np

    from hispec_jax import load_model
    from hispec_jax import datasets as prompts_lib
    from hispec_jax.models.params import default_layer_layout, with_layer_layout

    if args.model:
        model = load_model(args.model, layer_layout=args.layer_layout)
    else:
        model = synthetic_model(residual_scale(args.synthetic), args.layers, args.hidden,
                                args.vocab, args.seed)
        layout = args.layer_layout or default_layer_layout()
        model = dataclasses.replace(model, params=with_layer_layout(model.params, layout))
    if args.dataset == "random":
        rng = np.random.RandomState(args.seed)
        prompts = [rng.randint(0, model.cfg.vocab_size, args.prompt_len).tolist()
                   for _ in range(args.prompts)]
    else:
        prompts = prompts_lib.load_prompts(args.dataset, model.tokenizer, args.prompts,
                                           args.prompt_len)
    return model, prompts


def greedy_specs(model, draft_exits: list[int]):
    from hispec_jax.bench.suite import MethodSpec
    from hispec_jax.decoding import methods

    d, v = methods.default_exits(model)
    sweep = draft_exits or sorted({d, v or d})
    return ([MethodSpec.of("ar", "ar")]
            + [MethodSpec.of(f"layerskip d={e}", "layerskip", draft_exit=e) for e in sweep]
            + [MethodSpec.of("hispec (defaults)", "hispec"),
               MethodSpec.of("hispec adaptive", "hispec", adaptive=True)])


def cost_columns(stats: dict[str, Any], tokens_per_second: float, num_prompts: int,
                 batch_size: int) -> dict[str, float]:
    """Loop trips per generated token and wall ms per sequential layer pass, per sequence of
    the batch (a trip: one round of the v2 engine, one action of v1)."""
    trips = stats.get("rounds") or sum(stats.get("actions_per_level") or [0])
    per_sequence_tokens = stats["new_tokens"] / num_prompts
    batches = -(-num_prompts // batch_size)
    return {"trips_per_token": trips / batches / per_sequence_tokens,
            "ms_per_layer_pass": 1e3 / (tokens_per_second * stats["layer_passes_per_token"])
            * batch_size}


def greedy(model, prompts, args) -> int:
    """The greedy table; exit status 1 when a method's output differs from AR's."""
    from hispec_jax.bench import suite

    specs = greedy_specs(model, args.draft_exits)
    capacity = suite.common_cache_len(model, prompts, specs, args.max_new_tokens)
    runners = [suite.hispec_runner(model, prompts, s, max_new_tokens=args.max_new_tokens,
                                   batch_size=args.batch_size, max_cache_len=capacity,
                                   loop_time_only=True)
               for s in specs]
    results = suite.compare(runners, args.rounds,
                            lambda name: print(f"[engine] {name}", file=sys.stderr))
    ar = results[0]
    L = model.cfg.num_layers
    print(f"# {suite.device_description()}, prompts: {args.dataset}, model: "
          f"{args.model or args.synthetic} L={L} D={model.cfg.hidden_size} "
          f"V={model.cfg.vocab_size}, {len(prompts)} prompts, batch {args.batch_size}, "
          f"{args.max_new_tokens} new tokens")
    print("| method | exits | tokens/s | speedup | identical | accept/level | final acc | "
          "true rej | tok/full pass | layer passes/tok | work/tok | work speedup | "
          "loop trips/tok | ms/layer pass | time/tok vs passes x AR's ms/pass | extra mem vs AR |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ar_cost = cost_columns(ar.stats, ar.tokens_per_second, len(prompts), args.batch_size)
    fmt = lambda x: "-" if x is None else f"{x:.2f}"
    rows = {}
    for r in results:
        s = r.stats
        cost = cost_columns(s, r.tokens_per_second, len(prompts), args.batch_size)
        relative = cost["ms_per_layer_pass"] / ar_cost["ms_per_layer_pass"]
        extra = (r.memory_bytes - ar.memory_bytes) / ar.memory_bytes * 100
        accept = "/".join(fmt(a) for a in (s["acceptance_rate_per_level"] or [None])[1:]) or "-"
        rows[r.name] = {**r.to_json(ar), **cost, "time_vs_prediction": relative,
                        "extra_memory_percent": extra}
        print(f"| {r.name} | {s['exits']} | {r.tokens_per_second:.1f} "
              f"| {r.tokens_per_second / ar.tokens_per_second:.2f}x | {r.identical_to_ar} "
              f"| {accept} | {fmt(s['final_acceptance_rate'])} | {fmt(s['true_reject_rate'])} "
              f"| {fmt(s['tokens_per_full_pass'])} | {fmt(s['layer_passes_per_token'])} "
              f"| {fmt(s.get('work_per_token'))} | {fmt(s.get('work_speedup'))} "
              f"| {cost['trips_per_token']:.2f} | {cost['ms_per_layer_pass']:.3f} "
              f"| {relative:.2f} | {extra:+.2f}% |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": rows}, f, indent=1, default=str)
    if not all(r.identical_to_ar for r in results):
        print("ERROR: some method's output differs from AR", file=sys.stderr)
        return 1
    return 0


def sampling_runner(model, prompts, name: str, options: dict, temperature: float, seed: int,
                    common: dict):
    """A sampling-mode `suite.Runner` (warm-up samples with `seed`, timed round r with
    `seed` + r) and the list its timed rounds append their `generate` stats to."""
    from hispec_jax import generate
    from hispec_jax.bench import suite

    round_stats: list[dict] = []

    def run(s: int):
        return generate(model, prompts, temperature=temperature, seed=s, **common, **options)

    def warmup() -> suite.Result:
        r = run(seed)
        return suite.Result(name=name, token_ids=r.token_ids, new_tokens=r.stats["new_tokens"],
                            compile_seconds=r.stats["compile_seconds"],
                            stats={k: r.stats.get(k) for k in suite.STAT_KEYS}, options=options)

    def timed_round() -> float:  # the compiled loop's time, as `suite.hispec_runner`'s
        r = run(seed + len(round_stats))
        round_stats.append(r.stats)
        return r.stats["decode_seconds"]

    return suite.Runner(name, warmup, timed_round), round_stats


def sampling(model, prompts, args) -> int:
    """Sampling-mode tokens/s (AR vs HiSpec) and block efficiency, token-wise vs blockwise."""
    from hispec_jax.bench import suite

    configs = [("ar", {"method": "ar"})] + [(f"hispec {a}", {"method": "hispec", "acceptance": a})
                                            for a in ("tokenwise", "blockwise")]
    common = dict(max_new_tokens=args.max_new_tokens, ignore_eos=True, batch_size=args.batch_size)
    print(f"# sampling mode, {suite.device_description()}, model: {args.model or args.synthetic}, "
          f"{len(prompts)} prompts, batch {args.batch_size}, {args.max_new_tokens} new tokens, "
          f"{args.rounds} rounds")
    print("| temperature | method | tokens/s (median) | speedup vs AR | tokens per full pass "
          "(block efficiency) | acceptance per level (last round) |")
    print("|---|---|---|---|---|---|")
    table = {}
    for t in args.temperatures:
        runners, per_round = [], []
        for name, options in configs:
            runner, stats = sampling_runner(model, prompts, name, options, t, args.seed, common)
            runners.append(runner)
            per_round.append(stats)
        results = suite.compare(runners, args.rounds,
                                lambda name: print(f"[engine] T={t} {name}", file=sys.stderr))
        ar = results[0].tokens_per_second
        for r, stats in zip(results, per_round):
            efficiency = statistics.mean(s["tokens_per_full_pass"] or 1.0 for s in stats)
            last = stats[-1]["acceptance_rate_per_level"] or []
            accept = "/".join("-" if a is None else f"{a:.2f}" for a in last[1:]) or "-"
            table[f"{t} {r.name}"] = {"tokens_per_second": r.tokens_per_second,
                                      "seconds": r.seconds, "tokens_per_full_pass": efficiency,
                                      "acceptance_last_round": last}
            print(f"| {t} | {r.name} | {r.tokens_per_second:.1f} | {r.tokens_per_second / ar:.2f}x "
                  f"| {efficiency:.2f} | {accept} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": table}, f, indent=1, default=str)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    model, prompts = load(args)
    return sampling(model, prompts, args) if args.temperatures else greedy(model, prompts, args)


if __name__ == "__main__":
    sys.exit(main())
