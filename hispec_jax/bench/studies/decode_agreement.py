"""Per-exit agreement IN DECODING: LayerSkip's acceptance rate at each exit on held-out prompts.

    python -m hispec_jax.bench decode-agreement --model DIR [--exits 3,6] [--prompts 16]
        [--max-new-tokens 64] [--draft-len 1] [--out result.json]

Teacher-forced agreement (`exit-agreement`, `train-heads`' evaluation) scores an exit on
human text; a drafter sees the model's own text. This runs `generate(method="layerskip",
draft_exit=e, draft_len=Nd)` greedy over the first `--prompts` ShareGPT evaluation prompts
(never trained on; at most 128 tokens each) and reports, per exit, the final verifier's
acceptance rate (`final_acceptance_rate`: accepted / proposed draft tokens; with Nd = 1
exactly the per-token agreement of exit e with the final layer along the model's own greedy
path), tokens per full-model pass, the head's kind and its cost in layer equivalents
(`models.heads.head_cost_layers`), and checks every output against AR's.

It also reports `own_text_agreement`: exit e's greedy token against the final layer's at
every position of AR's continuations, teacher-forced (the per-token agreement on the model's
own text). The two differ because drafts do not sample positions evenly: where exit and
final layer agree for a stretch, a draft length of 1 proposes every other token (each
accepted draft brings the verifier's bonus token), where they disagree every token, so the
acceptance rate weighs the hard stretches more than the per-token agreement does.

And `ar_seq_rep_4`, how repetitive AR's continuations are: seq-rep-4 (Welleck et al. 2019,
"Neural text generation with unlikelihood training"), per continuation 1 - distinct 4-grams
/ 4-grams, averaged. A model that loops ("interview interview interview ...") drafts
easily; compare acceptance between models only beside this.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hispec_jax.bench import args as args_lib

PROG = "python -m hispec_jax.bench decode-agreement"
MAX_PROMPT_TOKENS = 128


def main(argv=None) -> int:
    ap = args_lib.Parser(prog=PROG, description=__doc__.split("\n")[0],
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", required=True, help="a HF model directory or .gguf file")
    ap.add_argument("--exits", default="", help="comma-separated exits (default: the exits "
                    "with trained heads, else L/8, L/4)")
    ap.add_argument("--prompts", type=int, default=16, help="held-out ShareGPT prompts")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--draft-len", type=int, default=1, help="LayerSkip's draft length Nd")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default=None, help="also write the result as JSON here")
    args = ap.parse_args(argv)
    for name in ("prompts", "max_new_tokens", "draft_len", "batch_size"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        exits = [int(e) for e in args.exits.split(",") if e.strip()]
    except ValueError:
        ap.error(f"--exits must be comma-separated integers, got {args.exits!r}")

    import hispec_jax
    from hispec_jax import datasets
    from hispec_jax.models.heads import head_cost_layers, head_kind

    model = hispec_jax.load_model(args.model)
    L = model.cfg.num_layers
    if not exits:
        exits = sorted(int(e) for e in model.heads) or [max(1, L // 8), max(1, L // 4)]
    bad = [e for e in exits if not 1 <= e < L]
    if bad:
        ap.error(f"--exits {bad} outside [1, {L - 1}]")
    prompts = datasets.load_prompts("sharegpt", model.tokenizer, args.prompts, MAX_PROMPT_TOKENS)
    common = dict(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    t0 = time.perf_counter()
    ar = hispec_jax.generate(model, prompts, method="ar", **common)
    result = {"model": args.model, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "draft_len": args.draft_len, "ar_new_tokens": ar.stats["new_tokens"],
              "ar_seq_rep_4": seq_rep(ar.token_ids, 4), "exits": {}}
    own_text = own_text_agreement(model, exits, ar.prompt_token_ids, ar.token_ids)
    for e in exits:
        out = hispec_jax.generate(model, prompts, method="layerskip", draft_exit=e,
                                  draft_len=args.draft_len, **common)
        s = out.stats
        result["exits"][e] = {
            "head_kind": head_kind(model.cfg, model.heads, e),
            "head_cost_layers": round(head_cost_layers(model.cfg, model.heads, e), 4),
            "acceptance_rate": s["final_acceptance_rate"],
            "own_text_agreement": own_text[e],
            "tokens_per_full_pass": s.get("tokens_per_full_pass"),
            "identical_to_ar": out.token_ids == ar.token_ids}
        print(f"exit {e}: {result['exits'][e]}", file=sys.stderr)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def seq_rep(continuations, n: int = 4) -> float | None:
    """Mean over continuations (those with at least n tokens) of 1 - distinct n-grams /
    n-grams: 0 for text that never repeats an n-gram, near 1 for a loop."""
    reps = []
    for ids in continuations:
        grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
        if grams:
            reps.append(1 - len(set(grams)) / len(grams))
    return round(sum(reps) / len(reps), 4) if reps else None


def own_text_agreement(model, exits, prompts, continuations) -> dict[int, float]:
    """Per exit, the fraction of continuation tokens where exit e's greedy token (teacher-
    forced on prompt + continuation) equals the final layer's."""
    import jax.numpy as jnp
    import numpy as np

    from hispec_jax.models.heads import exit_logits
    from hispec_jax.models.params import with_layer_layout
    from hispec_jax.models.transformer import scan_exits

    params, cfg, L = with_layer_layout(model.params, "scan"), model.cfg, model.cfg.num_layers
    agree, total = {e: 0 for e in exits}, 0
    for prompt, new in zip(prompts, continuations):
        if not new:
            continue
        _, h_LxBxTxD = scan_exits(params, cfg, jnp.asarray(list(prompt) + list(new))[None],
                                  lambda h, i: h)
        # the tokens predicted for the continuation's positions
        span = slice(len(prompt) - 1, len(prompt) + len(new) - 1)
        final_T = np.asarray(jnp.argmax(exit_logits(params, model.heads, cfg, h_LxBxTxD[L - 1], L),
                                        -1))[0, span]
        for e in exits:
            draft_T = np.asarray(jnp.argmax(exit_logits(params, model.heads, cfg,
                                                        h_LxBxTxD[e - 1], e), -1))[0, span]
            agree[e] += int((draft_T == final_T).sum())
        total += len(new)
    return {e: agree[e] / total if total else None for e in exits}


if __name__ == "__main__":
    sys.exit(main())
