"""A draft model that always / never agrees: tokens per round and speed against AR and the cost model.

`hispec bench-tool draft-model`.

No pair of real models sharing a vocabulary need be at hand: the pairs are built from one
random Llama target of L layers.

    always agrees   the target's layers [n, L) have their attention-output and MLP-down
                    weights zeroed (they add nothing to the residual stream), and the draft
                    is the target's first n layers with its embedding, final norm and head:
                    the draft's hidden state is the target's, so its greedy token is the
                    target's and every draft is kept (a round emits k + 1 tokens)
    never agrees    a random draft of the same shape and vocabulary (another seed): its
                    greedy token is the target's about once in V

Every row decodes the same random prompts greedily (EOS ignored), timed in interleaved
rounds (`suite.compare`, decoding loop time) beside AR, and is checked token-identical to
AR. What a round costs by the gate's cost model (`gate.exit_round_cost` with the bonus),
in units of the target's AR step:

    cost(w)  = w f_0 + C(1, T) + u c      f_0: a draft step's share of a target pass
    speedup  = tokens per round / cost(w)        (w: draft steps per round, as run)

with C(1, T) the target's pass over T positions over its AR step as timed here
(`gate.time_passes`, the pass-cost tool's timing) at the block the loop compiles (T = k + 1
ungated; gated, the power of two >= w + 1, `DraftModelDrafter.level_blocks`), and f_0
twice: by multiply-adds, as the gate prices it (`DraftModelDrafter.pass_fractions`), and as
timed here (the draft model's AR step over the target's); u the draft model's catch-up
passes per round (over the prompt, and after rounds the gate ran at w = 0: `catch_up_passes`)
and c such a pass over `chunk` positions as timed here, over the target's AR step (passes,
not the engine's work). Efficiency is measured over predicted speedup. The last columns put
the same in milliseconds: a round's wall time in the loop against its passes timed alone;
the difference is the engine's own work.

    hispec bench-tool draft-model                       # 24 x 512 target, 6-layer drafts
    hispec bench-tool draft-model --layers 8 --hidden 64 --draft-layers 2 --rounds 1

`--save-pair DIR` instead writes three models that agree (as Hugging Face directories):
DIR/target, DIR/draft (its first n layers) and DIR/smaller (its first m < n layers; the
target's layers [m, L) add nothing), for `hispec tune --model DIR/target --draft-model
DIR/draft --smaller-draft-model DIR/smaller --verify`: every plan of a draft model priced
and timed on one machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import types
from typing import Any

import jax
import numpy as np

from hispec_jax.bench import args as args_lib
from hispec_jax.bench import oracle, suite
from hispec_jax.bench.oracle import in_layout
from hispec_jax.bench.suite import MethodSpec
from hispec_jax.decoding.engine.draft_model import DraftModelDrafter
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.model import Model
from hispec_jax.models.params import default_layer_layout, init_params, with_layer_layout


def random_llama(layers: int, hidden: int, vocab: int, seed: int,
                 dtype: str = "float32") -> Model:
    """A random-weight Llama of `layers` x `hidden` (MLP 2.75 D, head_dim 64, half as many
    KV heads as query heads), of `dtype`, scanned layout."""
    heads = max(1, hidden // 64)
    cfg = ModelConfig(model_type="llama", vocab_size=vocab, hidden_size=hidden,
                      intermediate_size=int(2.75 * hidden) // 8 * 8, num_layers=layers,
                      num_heads=heads, num_kv_heads=max(1, heads // 2), head_dim=min(64, hidden),
                      max_position_embeddings=4096, dtype=dtype)
    params = with_layer_layout(init_params(cfg, jax.random.key(seed)), "scan")
    return Model(cfg=cfg, params=params, generation_config={})


def agreeing_pair(target: Model, draft_layers: int) -> tuple[Model, Model]:
    """(the target with layers [n, L) adding nothing to the residual stream, its first n
    layers with its embedding, final norm and head as the draft), both scanned."""
    n = draft_layers
    layers = dict(with_layer_layout(target.params, "scan")["layers"])
    for name in ("wo", "w_down"):
        layers[name] = layers[name].at[n:].set(0)
    params = {**target.params, "layers": layers}
    draft_params = {**params, "layers": jax.tree.map(lambda x: x[:n], layers)}
    draft = Model(cfg=target.cfg.replace(num_layers=n), params=draft_params,
                  generation_config={})
    return dataclasses.replace(target, params=params), draft


def save_pair(directory: str, target: Model, n: int, m: int) -> int:
    """Writes `target` with its layers [m, L) adding nothing, its first n layers (the draft)
    and its first m (the smaller draft): three models whose greedy tokens agree."""
    from pathlib import Path

    from hispec_jax import save_model

    target, smaller = agreeing_pair(target, m)
    layers = with_layer_layout(target.params, "scan")["layers"]
    draft = Model(cfg=target.cfg.replace(num_layers=n), generation_config={},
                  params={**target.params, "layers": jax.tree.map(lambda x: x[:n], layers)})
    for name, model in (("target", target), ("draft", draft), ("smaller", smaller)):
        save_model(model, Path(directory) / name)
        print(f"{name}: {describe(model)} -> {Path(directory) / name}")
    return 0


def draft_fraction_by_macs(target: Model, draft: Model, k: int) -> float:
    """f_0 as the gate prices it (`DraftModelDrafter.pass_fractions`, the final layer
    verifying)."""
    from hispec_jax.decoding.engine.draft_model import DraftModelDrafter

    rnd = types.SimpleNamespace(cfg=target.cfg, heads={},
                                h=types.SimpleNamespace(exits=(0, target.cfg.num_layers)))
    return DraftModelDrafter(cfg=draft.cfg, k=k).pass_fractions(rnd)[0]


def draft_spec(name: str, k: int, gate: bool) -> MethodSpec:
    return MethodSpec.of(name, "draft", draft_k=k, **({} if gate else {"draft_gate": False}))


def run(target: Model, agree: Model, disagree: Model, *, k: int, prompts: int, prompt_len: int,
        max_new_tokens: int, rounds: int, seed: int = 0, repeats: int = 5,
        progress=None) -> dict[str, Any]:
    """Times AR, the agreeing draft (ungated and gated) and the disagreeing one (gated and
    ungated) on `target` side by side, and prices each row by the cost model."""
    tick = progress or (lambda msg: None)
    load_start = os.getloadavg()[0]
    rng = np.random.RandomState(seed)
    token_prompts = [rng.randint(3, target.cfg.vocab_size, prompt_len).tolist()
                     for _ in range(prompts)]
    rows_spec = [("ar", target, MethodSpec.of("ar", "ar")),
                 ("always agrees", target.with_draft(agree), draft_spec(f"draft k={k} ungated", k, False)),
                 ("always agrees", target.with_draft(agree), draft_spec(f"draft k={k} gated", k, True)),
                 ("never agrees", target.with_draft(disagree), draft_spec(f"draft k={k} gated", k, True)),
                 ("never agrees", target.with_draft(disagree), draft_spec(f"draft k={k} ungated", k, False))]
    capacity = max(suite.common_cache_len(m, token_prompts, [s], max_new_tokens)
                   for _, m, s in rows_spec)
    runners = [suite.hispec_runner(m, token_prompts, s, max_new_tokens=max_new_tokens,
                                   batch_size=1, max_cache_len=capacity, loop_time_only=True)
               for _, m, s in rows_spec]
    runners = [dataclasses.replace(r, name=f"{d}: {r.name}") for r, (d, _, _) in zip(runners, rows_spec)]
    results = suite.compare(runners, rounds, tick)

    # the pass costs of the cost model, timed here at the middle of the decoding
    tick("pass costs")
    context = prompt_len + max_new_tokens // 2
    pass_capacity = -(-(context + 2 * k + 2) // 64) * 64
    top = max(k + 1, power_of_two(k + 1))  # the gated loop's blocks are powers of two
    target_s = suite_time_passes(target, [(1, T) for T in range(1, top + 1)], context,
                                 pass_capacity, repeats)
    draft_s = suite_time_passes(agree, [(1, 1)], context, pass_capacity, repeats)
    random_s = suite_time_passes(disagree, [(1, 1)], context, pass_capacity, repeats)
    C = {T: target_s[1, T] / target_s[1, 1] for T in range(1, top + 1)}
    # a catch-up pass of each draft model (`chunk` positions), over the target's AR step
    chunk = DraftModelDrafter.chunk  # its default
    chunk_capacity = -(-(context + chunk) // 64) * 64
    c_chunk = {drafts: suite_time_passes(m, [(1, chunk)], context, chunk_capacity,
                                         repeats)[1, chunk] / target_s[1, 1]
               for drafts, m in (("always agrees", agree), ("never agrees", disagree))}
    f_macs = draft_fraction_by_macs(target, agree, k)
    f_timed = {"always agrees": draft_s[1, 1] / target_s[1, 1],
               "never agrees": random_s[1, 1] / target_s[1, 1]}

    ar_tps = results[0].tokens_per_second
    rows = []
    for (drafts, _, spec), result in zip(rows_spec, results):
        stats = result.stats
        dm = (stats.get("draft_model") or {}) if spec.method == "draft" else {}
        row = {"drafts": drafts, "name": spec.name, "k": k if spec.method == "draft" else 0,
               "tokens_per_second": result.tokens_per_second,
               "x_ar": result.tokens_per_second / ar_tps,
               "paired_x_ar": suite.paired_ratio(results[0], result),
               "identical_to_ar": result.identical_to_ar,
               "tokens_per_round": stats["tokens_per_round"], "rounds": stats["rounds"],
               "new_tokens": stats["new_tokens"],
               "acceptance_rate": dm.get("acceptance_rate"),
               "draft_steps": dm.get("draft_steps"), "proposed": dm.get("proposed")}
        # wall time per round (rounds of every prompt; the prompts run one after another)
        row["ms_per_round"] = 1e3 * float(np.median(result.seconds)) / stats["rounds"]
        if spec.method == "draft":
            steps_per_round = dm["draft_steps"] / stats["rounds"]
            # level 1's pass, and the draft model's catch-up passes spread over the rounds
            c_block = (block_cost(C, steps_per_round, k, gated=dict(spec.options).get(
                "draft_gate", True)) + dm["catch_up_passes"] / stats["rounds"] * c_chunk[drafts])
            for tag, f in (("macs", f_macs), ("timed", f_timed[drafts])):
                cost = steps_per_round * f + c_block
                row[f"predicted_x_ar_{tag}"] = stats["tokens_per_round"] / cost
                row[f"efficiency_{tag}"] = row["x_ar"] / row[f"predicted_x_ar_{tag}"]
            row["draft_steps_per_round"] = steps_per_round
            # the round's passes as timed alone: the rest is the engine's own
            row["predicted_ms_per_round"] = 1e3 * (steps_per_round * f_timed[drafts]
                                                   + c_block) * target_s[1, 1]
        else:
            row["predicted_ms_per_round"] = 1e3 * target_s[1, 1]
        rows.append(row)
    return {"device": suite.device_description(),
            "load_average": [round(load_start, 2), round(os.getloadavg()[0], 2)],
            "target": describe(target),
            "draft": describe(agree), "k": k, "prompts": prompts, "prompt_len": prompt_len,
            "max_new_tokens": max_new_tokens, "rounds": rounds, "capacity": capacity,
            "pass_context": context, "target_pass_seconds": {T: target_s[1, T] for T in C},
            "C": C, "draft_step_seconds": draft_s[1, 1], "random_draft_step_seconds": random_s[1, 1],
            "f_draft_macs": f_macs, "f_draft_timed": f_timed["always agrees"],
            "f_random_draft_timed": f_timed["never agrees"], "chunk": chunk,
            "c_catch_up_pass": c_chunk, "rows": rows}


def power_of_two(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def block_cost(C: dict[int, float], steps_per_round: float, k: int, gated: bool) -> float:
    """C(1, T) of the block level 1 runs at a mean of `steps_per_round` drafts: k + 1
    ungated (its one compiled block); gated, the power-of-two block of w + 1 positions
    (`DraftModelDrafter.level_blocks`), interpolated between the blocks of the two windows
    around the mean."""
    if not gated:
        return C[k + 1]
    lo_w = int(np.floor(steps_per_round))
    hi_w = min(lo_w + 1, k)
    lo, hi = C[power_of_two(lo_w + 1)], C[power_of_two(hi_w + 1)]
    return lo + (steps_per_round - lo_w) * (hi - lo)


def suite_time_passes(model: Model, shapes, context: int, capacity: int, repeats: int):
    from hispec_jax.decoding import gate

    return gate.time_passes(model, shapes, context=context, capacity=capacity, repeats=repeats)


def describe(model: Model) -> str:
    c = model.cfg
    return (f"random llama L={c.num_layers}, D={c.hidden_size}, F={c.intermediate_size}, "
            f"heads {c.num_heads}/{c.num_kv_heads}, V={c.vocab_size}, {c.dtype}")


def markdown(report: dict[str, Any]) -> str:
    f = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    k = report["k"]
    lines = [f"Device: {report['device']}. Target: {report['target']}. Draft: {report['draft']} "
             f"(always agrees: the target's own first layers; never agrees: random weights). "
             f"k = {k}; {report['prompts']} random prompts of {report['prompt_len']} tokens, "
             f"{report['max_new_tokens']} new tokens, batch 1, greedy, "
             f"{report['rounds']} interleaved rounds (median, decoding loop time). Load "
             f"average {report['load_average'][0]:.2f} at the start, "
             f"{report['load_average'][1]:.2f} at the end.", "",
             "| drafts | method | tokens/s | x AR | paired x AR | tokens / round | draft steps / round "
             "| acceptance | predicted x AR (f_0 by MACs) | efficiency | predicted x AR (f_0 timed) "
             "| efficiency | ms / round | its passes alone, ms | identical to AR |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(
            f"| {r['drafts']} | {r['name']} | {r['tokens_per_second']:.1f} | {r['x_ar']:.3f} "
            f"| {r['paired_x_ar']:.3f} | {f(r['tokens_per_round'])} "
            f"| {f(r.get('draft_steps_per_round'))} | {f(r['acceptance_rate'], 3)} "
            f"| {f(r.get('predicted_x_ar_macs'), 3)} | {f(r.get('efficiency_macs'), 3)} "
            f"| {f(r.get('predicted_x_ar_timed'), 3)} | {f(r.get('efficiency_timed'), 3)} "
            f"| {r['ms_per_round']:.1f} | {r['predicted_ms_per_round']:.1f} "
            f"| {r['identical_to_ar']} |")
    C = ", ".join(f"T={T}: {c:.2f}" for T, c in report["C"].items())
    lines += ["", f"Target pass over T positions / its AR step (context {report['pass_context']}): "
                  f"{C}; AR step {1e3 * report['target_pass_seconds'][1]:.2f} ms. Draft step "
                  f"{1e3 * report['draft_step_seconds']:.2f} ms (random draft "
                  f"{1e3 * report['random_draft_step_seconds']:.2f} ms): f_0 timed "
                  f"{report['f_draft_timed']:.3f}, by multiply-adds {report['f_draft_macs']:.3f}. "
                  f"A catch-up pass ({report['chunk']} positions) / the target's AR step: "
                  + ", ".join(f"{d} {c:.2f}" for d, c in report["c_catch_up_pass"].items())
                  + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = args_lib.Parser(prog="hispec bench-tool draft-model", description=__doc__.split("\n")[0],
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--layers", type=int, default=24, help="the target's layers L")
    ap.add_argument("--hidden", type=int, default=512, help="the target's width D")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--draft-layers", type=int, default=None,
                    help="the draft's layers n (default L/4)")
    ap.add_argument("--k", type=int, default=5, help="most drafts a round")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="repeats of each timed pass")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the models' dtype (bfloat16 on accelerators; XLA:CPU runs it slowly)")
    ap.add_argument("--layer-layout", choices=["scan", "unrolled"], default=None,
                    help="default: the backend's")
    ap.add_argument("--out", default=None, help="write the report as JSON here")
    ap.add_argument("--save-pair", default=None, metavar="DIR",
                    help="write DIR/target, DIR/draft and DIR/smaller (module docstring) and "
                         "stop")
    ap.add_argument("--smaller-layers", type=int, default=None,
                    help="--save-pair: the smaller draft model's layers m (default n/3)")
    args = ap.parse_args(argv)
    n = args.draft_layers if args.draft_layers is not None else max(1, args.layers // 4)
    for name in ("layers", "hidden", "vocab", "k", "prompts", "prompt_len", "max_new_tokens",
                 "rounds", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 1 <= n < args.layers:
        ap.error(f"--draft-layers must be in 1..{args.layers - 1}, got {n}")
    from hispec_jax.decoding.options import MAX_DRAFT_K
    if args.k > MAX_DRAFT_K:
        ap.error(f"--k must be <= {MAX_DRAFT_K}, got {args.k}")
    if args.save_pair:
        m = args.smaller_layers if args.smaller_layers is not None else max(1, n // 3)
        if not 1 <= m < n:
            ap.error(f"--smaller-layers must be in 1..{n - 1}, got {m}")
        return save_pair(args.save_pair, random_llama(args.layers, args.hidden, args.vocab,
                                                       args.seed, args.dtype), n, m)
    layout = args.layer_layout or default_layer_layout()
    target, agree = agreeing_pair(random_llama(args.layers, args.hidden, args.vocab, args.seed,
                                               args.dtype), n)
    disagree = random_llama(n, args.hidden, args.vocab, args.seed + 1, args.dtype)
    target, agree, disagree = (in_layout(m, layout) for m in (target, agree, disagree))
    report = run(target, agree, disagree, k=args.k, prompts=args.prompts,
                 prompt_len=args.prompt_len, max_new_tokens=args.max_new_tokens,
                 rounds=args.rounds, seed=args.seed, repeats=args.repeats,
                 progress=lambda msg: print(f"[draft-model] {msg}", file=sys.stderr, flush=True))
    return oracle.finish(report, markdown(report), args.out)


if __name__ == "__main__":
    sys.exit(main())
