"""Extra memory of the speculative loops over AR at real model shapes (XLA memory analysis).

    python -m hispec_jax.bench memory --preset llama3_8b --batch 1 --capacity 4096

For each loop (AR, LayerSkip, HiSpec, HiSpec adaptive greedy; AR and HiSpec sampling) at a
model preset's shapes, `memory_plan.plan_memory` (what `hispec plan-memory` runs, here on one
device) lowers and compiles the loop on abstract arrays (nothing is allocated) with the same
cache capacity S = `--capacity` and prompt block `--prompt-block`, and reads XLA's
`compiled.memory_analysis()`: argument (parameters, cache, request), output and temporary
bytes, and their total with the donated cache counted once. The last column is each loop's
total over AR's of the same mode (greedy or sampling).
"""

from __future__ import annotations

import argparse
import sys

from hispec_jax.bench import args as args_lib

PROG = "hispec bench-tool memory"
GIB = 2**30

# (name, method, options, greedy): the loops compared, AR first in each mode.
LOOPS = (("ar", "ar", {}, True), ("layerskip", "layerskip", {}, True),
         ("hispec", "hispec", {}, True), ("hispec adaptive", "hispec", {"adaptive": True}, True),
         ("ar", "ar", {}, False), ("hispec", "hispec", {}, False))


def table_lines(rows: list[dict]) -> list[str]:
    """Markdown rows of `rows` ({name, greedy, arguments, outputs, temporaries, total} in
    bytes), the extra total relative to the first row of the same mode."""
    lines = ["| method | mode | arguments GiB | outputs GiB | temporaries GiB | total GiB "
             "| extra vs AR |", "|---|---|---|---|---|---|---|"]
    base: dict[bool, int] = {}
    for r in rows:
        base.setdefault(r["greedy"], r["total"])
        extra = (r["total"] - base[r["greedy"]]) / base[r["greedy"]] * 100
        lines.append(f"| {r['name']} | {'greedy' if r['greedy'] else 'sampling'} "
                     f"| {r['arguments'] / GIB:.3f} | {r['outputs'] / GIB:.3f} "
                     f"| {r['temporaries'] / GIB:.4f} | {r['total'] / GIB:.3f} | {extra:+.3f}% |")
    return lines


def main(argv=None) -> int:
    ap = args_lib.Parser(prog=PROG, description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--preset", default="llama3_8b", help="a configs/model_*.py preset")
    ap.add_argument("--batch", type=int, default=1, help="sequences B")
    ap.add_argument("--capacity", type=int, default=4096, help="KV-cache positions S")
    ap.add_argument("--prompt-block", type=int, default=512, help="prefill block (tokens)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="XLA:CPU has no bf16 matmul and converts whole bf16 weight stacks to "
                         "f32 temporaries, which says nothing about GPU/TPU")
    args = ap.parse_args(argv)
    for name in ("batch", "capacity", "prompt_block"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.prompt_block >= args.capacity:
        ap.error(f"--prompt-block ({args.prompt_block}) must be below --capacity "
                 f"({args.capacity})")

    import jax

    from hispec_jax.decoding import memory_plan
    from hispec_jax.models import presets

    try:
        cfg = presets.load_preset(args.preset).replace(dtype=args.dtype)
    except (FileNotFoundError, ValueError) as e:
        ap.error(f"--preset {args.preset}: {e}")
    print(f"# {args.preset}: L={cfg.num_layers} D={cfg.hidden_size} V={cfg.vocab_size} "
          f"{cfg.dtype}, batch {args.batch}, cache capacity {args.capacity}, "
          f"jax {jax.__version__} ({jax.default_backend()})")
    rows = []
    for name, method, options, greedy in LOOPS:
        plan = memory_plan.plan_memory(cfg, {"data": 1, "model": 1}, method=method,
                                       batch=args.batch, max_len=args.capacity,
                                       prompt_len=args.prompt_block, greedy=greedy, **options)
        rows.append({"name": name, "greedy": greedy, "arguments": plan.arguments,
                     "outputs": plan.outputs, "temporaries": plan.temporaries,
                     "total": plan.compiled_total})
        print(f"[memory] {name} ({'greedy' if greedy else 'sampling'}) compiled in "
              f"{plan.compile_seconds:.1f} s", file=sys.stderr, flush=True)
    print("\n".join(table_lines(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
