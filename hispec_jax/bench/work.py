"""Work per token of every method at its defaults: the hardware-free measure of drafts.

    hispec bench-tool work [--model PATH] [--dataset sharegpt|humaneval] [--prompts 8]
                           [--max-new-tokens 64] [--chat] [--out work.json]

One greedy `generate` call per method on the same prompts (batch 1 by default; EOS ignored, so every method
emits the same tokens; each is checked to equal AR's), no timing: the counters give
`work_per_token` = (layer passes + every exit-head evaluation at its multiply-add cost in
layer equivalents) per emitted token (`decoding/methods.work_stats`), `work_speedup` =
AR's / the method's. It tells how much faster drafts this good can make decoding on any
hardware where a block of a few tokens costs about one token; wall time (`hispec bench`)
stays the final word. Methods: AR, LayerSkip and HiSpec as `--method` gives them (the
model's recommended plan when it has one), HiSpec at the paper's exits, SV (when the model
has a profile), SpecBound, prompt lookup alone and under LayerSkip.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hispec_jax.bench import args as args_lib

PROG = "hispec bench-tool work"


def parse_args(argv):
    p = args_lib.Parser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model directory or .gguf (default: shipped)")
    p.add_argument("--dataset", default="sharegpt", choices=("sharegpt", "humaneval"),
                   help="held-out prompts: ShareGPT evaluation split or HumanEval")
    p.add_argument("--prompts", type=int, default=8, help="prompts (default 8)")
    p.add_argument("--max-prompt-tokens", type=int, default=256,
                   help="longer prompts are skipped, never cut")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt")
    p.add_argument("--batch-size", type=int, default=1,
                   help="prompts decoded together (default 1: a pass counts once for the "
                        "whole batch, so at batch > 1 every sequence pays for the others' "
                        "passes)")
    p.add_argument("--chat", action="store_true", help="render with the chat template")
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    args = p.parse_args(argv)
    for name in ("prompts", "max_prompt_tokens", "max_new_tokens", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def method_options(model) -> list[tuple[str, str, dict]]:
    """(row name, method, options) of every method at its defaults."""
    from hispec_jax.decoding import methods, sv

    d, v = methods.default_exits(model)
    rows = [("ar", "ar", {}), ("layerskip", "layerskip", {}), ("hispec", "hispec", {})]
    if v is not None:
        rows.append(("hispec paper exits", "hispec", {"draft_exit": d, "verify_exits": (v,)}))
        try:
            sv.find_table(model.path)
            rows.append(("sv", "sv", {}))
        except FileNotFoundError:
            pass  # no profile: `hispec profile-sv` makes one
    rows += [("specbound", "specbound", {}), ("lookup", "lookup", {}),
             ("layerskip + lookup", "layerskip", {"lookup": 8})]
    return rows


def measure(model, prompts: list[list[int]], max_new_tokens: int,
            batch_size: int = 1, plans: list[tuple[str, str, dict]] | None = None
            ) -> list[dict]:
    """One row per method: its work stats, whether its tokens equal AR's. `plans`: (row
    name, method, options), the first one AR (default: `method_options`, every method at
    its defaults)."""
    from hispec_jax import generate

    rows, ar_tokens = [], None
    for name, method, options in plans or method_options(model):
        r = generate(model, prompts, method=method, max_new_tokens=max_new_tokens,
                     ignore_eos=True, batch_size=batch_size, **options)
        s = r.stats
        if ar_tokens is None:
            ar_tokens = r.token_ids
        rows.append({"name": name, "method": method, "exits": s["exits"],
                     "hierarchy_source": s.get("hierarchy_source"),
                     "identical_to_ar": r.token_ids == ar_tokens,
                     **{k: s.get(k) for k in (
                         "work_per_token", "work_speedup", "layer_passes_per_token",
                         "head_work_per_token", "ar_work_per_token", "tokens_per_round",
                         "final_acceptance_rate")}})
    return rows


def table(rows: list[dict]) -> str:
    f = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"
    lines = ["| method | exits | work / token | work speedup | layer passes / token | "
             "heads / token | tokens / round | final acceptance | identical to AR |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {','.join(map(str, r['exits']))} | "
                     f"{f(r['work_per_token'], 1)} | {f(r['work_speedup'])}x | "
                     f"{f(r['layer_passes_per_token'], 1)} | {f(r['head_work_per_token'])} | "
                     f"{f(r['tokens_per_round'])} | {f(r['final_acceptance_rate'])} | "
                     f"{r['identical_to_ar']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from hispec_jax import DEFAULT_MODEL_DIR, datasets, load_model
    from hispec_jax.decoding import chat as chat_lib

    model = load_model(args.model or DEFAULT_MODEL_DIR)
    texts = datasets.dataset_texts(args.dataset)
    if args.chat:  # the user's message itself, without the plain-text "User: ...\nAssistant:"
        ids = (chat_lib.chat_prompt_ids(model, [t.removeprefix("User: ").removesuffix(
            "\nAssistant:")])[0] for t in texts)
    else:
        ids = (model.tokenizer(t)["input_ids"] for t in texts)
    prompts = datasets.first_prompts(ids, args.prompts, args.max_prompt_tokens,
                                     source=f"{args.dataset} has")
    rows = measure(model, prompts, args.max_new_tokens, args.batch_size)
    print(f"# {Path(model.path or 'model').name}, {args.dataset}, {len(prompts)} prompts x "
          f"{args.max_new_tokens} tokens, greedy, batch {args.batch_size}")
    print(table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 0 if all(r["identical_to_ar"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
