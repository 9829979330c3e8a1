"""Per-exit top-1 agreement with the final layer on held-out ShareGPT rows (every exit).

    python -m hispec_jax.bench exit-agreement --model DIR_OR_GGUF [--rows 16] [--seq-len 256]
        [--batch-size 4] [--out result.json]

For every exit e = 1..L: how often the shared final norm + LM head applied to the residual
stream after layer e predicts the same next token as the full model (the greedy acceptance
rate of a drafter at e; `train_heads.pretrain.evaluate`), the final layer's perplexity, and,
when the model directory has trained exit heads (`exit_heads.safetensors`), the same
agreement for those heads (`train_heads.train.evaluate`). Rows: the first `--rows` packed
rows of `--seq-len` + 1 tokens of the ShareGPT evaluation split (held out from `hispec
train-heads` and `hispec pretrain`), tokenized with the model's tokenizer, teacher-forced.
Prints the result as JSON. (`hispec bench`'s agreement phase is the per-conversation variant
at the exits the model has heads for: `sweeps.exit_agreement`.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hispec_jax.bench import args as args_lib

PROG = "hispec bench-tool exit-agreement"


def main(argv=None) -> int:
    ap = args_lib.Parser(prog=PROG, description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", required=True, help="a HF model directory or .gguf file")
    ap.add_argument("--rows", type=int, default=16, help="held-out rows")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per row (targets)")
    ap.add_argument("--batch-size", type=int, default=4, help="rows per evaluation batch")
    ap.add_argument("--out", default=None, help="also write the result as JSON here")
    args = ap.parse_args(argv)
    for name in ("rows", "seq_len", "batch_size"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")

    import hispec_jax
    from hispec_jax.models.heads import draft_vocab_size
    from hispec_jax.train_heads import pretrain, steps
    from hispec_jax.train_heads.rows import sharegpt_rows
    from hispec_jax.train_heads.train import evaluate

    model = hispec_jax.load_model(args.model, layer_layout="scan")
    rows = sharegpt_rows(model, args.seq_len + 1, max_train_docs=1, num_eval=args.rows,
                         seed=0).eval
    t0 = time.perf_counter()
    batches = [rows[i:i + args.batch_size] for i in range(0, len(rows), args.batch_size)]
    shared = pretrain.evaluate(model.params, model.cfg, batches)
    result = {"model": args.model, "tokens": shared["tokens"],
              "shared_head_agreement": dict(zip(range(1, model.cfg.num_layers + 1),
                                                shared["agreement_exits"])),
              "final_layer_perplexity": shared["perplexity"]}
    if model.heads:
        layers = tuple(sorted(int(e) for e in model.heads))
        settings = steps.StepSettings(cfg=model.cfg, head_layers=layers, temperature=2.0, top_k=0)
        trained = evaluate(model.heads, model, rows[:, :args.seq_len], args.batch_size, settings)
        result["trained_head_agreement"] = {int(e): round(m["top1_agreement"], 4)
                                            for e, m in trained.items()}
        result["head_kinds"] = {e: k for e, k in model.exit_head_kinds().items() if k != "shared"}
        result["draft_vocab_sizes"] = {int(e): draft_vocab_size(model.cfg, model.heads, int(e))
                                       for e, h in model.heads.items() if "vocab" in h}
    result["seconds"] = time.perf_counter() - t0
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
