"""Extra memory of the speculative loops over autoregressive decoding, from XLA's memory
analysis of the compiled loops at real model shapes (nothing is allocated: parameters and
caches are abstract `ShapeDtypeStruct`s).

    python benchmarks/memory_analysis.py --preset llama3_8b --batch 1 --capacity 4096

Reports argument (parameters, cache, request), output and temporary bytes of each loop and
HiSpec's extra total over AR. All methods get the same cache capacity.
"""

from __future__ import annotations

import argparse
import sys

import jax

from hispec_jax import Model
from hispec_jax.decoding import methods
from hispec_jax.decoding.engine import Engine, Shapes
from hispec_jax.models import presets
from hispec_jax.models.params import shape_structs


def analyze(cfg, method: str, batch: int, capacity: int, prompt_block: int, greedy: bool, **opts):
    model = Model(cfg=cfg, params=shape_structs(cfg))
    decoder = methods.make_method(model, method, greedy=greedy, **opts)
    shapes = Shapes(batch=batch, capacity=capacity, prompt_block=prompt_block)
    compiled = Engine.for_model(model, decoder.hierarchy, shapes, greedy).lower().compile()
    m = compiled.memory_analysis()
    return {"argument": m.argument_size_in_bytes, "output": m.output_size_in_bytes,
            "temp": m.temp_size_in_bytes,
            # the donated cache is both an argument and an output: count it once
            "total": m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="llama3_8b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--prompt-block", type=int, default=512)
    ap.add_argument("--dtype", default="float32",
                    help="float32 by default: XLA:CPU has no bf16 matmul and converts whole "
                         "bf16 weight stacks to f32 temporaries, which says nothing about GPU/TPU")
    args = ap.parse_args(argv)
    cfg = presets.load_preset(args.preset).replace(dtype=args.dtype)
    rows = [("ar", {}, True), ("layerskip", {}, True), ("hispec", {}, True),
            ("hispec", {"adaptive": True}, True), ("ar", {}, False), ("hispec", {}, False)]
    gib = 2**30
    print(f"# {args.preset}: L={cfg.num_layers} D={cfg.hidden_size} V={cfg.vocab_size} "
          f"{cfg.dtype}, batch {args.batch}, cache capacity {args.capacity}, jax {jax.__version__}")
    print("| method | mode | arguments GiB | outputs GiB | temporaries GiB | total GiB | extra vs AR |")
    print("|---|---|---|---|---|---|---|")
    base = {}
    for method, opts, greedy in rows:
        mode = "greedy" if greedy else "sampling"
        r = analyze(cfg, method, args.batch, args.capacity, args.prompt_block, greedy, **opts)
        if method == "ar":
            base[mode] = r["total"]
        extra = (r["total"] - base[mode]) / base[mode] * 100
        name = method + (" adaptive" if opts.get("adaptive") else "")
        print(f"| {name} | {mode} | {r['argument'] / gib:.3f} | {r['output'] / gib:.3f} | "
              f"{r['temp'] / gib:.4f} | {r['total'] / gib:.3f} | {extra:+.3f}% |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
