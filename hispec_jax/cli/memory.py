"""`hispec plan-memory`: one device's memory of a decoding loop on a mesh, compiled ahead of
time on abstract arrays (no weights needed)."""

from __future__ import annotations

import json
import os
import sys

from hispec_jax.cli import common, load_options
from hispec_jax.models import mesh_spec

PLAN_METHODS = ("ar", "layerskip", "hispec")


def add_parsers(subparsers) -> None:
    plan = common.add_command(
        subparsers, "plan-memory", run_plan_memory,
        help="one device's memory of a decoding loop on a mesh (compiled, no weights needed)",
        description="Lowers and compiles the decoding loop of a model config on a device mesh "
                    "with abstract arrays (nothing allocated) and prints one device's memory "
                    "from XLA's memory_analysis() beside the analytic weights + KV cache + "
                    "overhead. Compiles for the default backend when it has the mesh's "
                    "devices, else for that many CPU devices (whose temporaries overstate an "
                    "accelerator's for bfloat16: docs/memory_plans.md).")
    plan.add_argument("--config", required=True,
                      help="a configs/model_*.py file or preset name (e.g. llama3_8b)")
    common.add_mesh_flag(plan)
    plan.add_argument("--batch-size", type=int, default=1, help="sequences decoded together")
    plan.add_argument("--max-len", type=int, default=4096,
                      help="KV-cache capacity per sequence (prompt + new tokens)")
    plan.add_argument("--prompt-len", type=int, default=128, help="prompt length (prefill block)")
    plan.add_argument("--method", default=None, choices=list(PLAN_METHODS),
                      help="decoding method, exits chosen as generate chooses them (default: ar)")
    plan.add_argument("--sampling", action="store_true",
                      help="the sampling loop (keeps per-level distribution buffers)")
    load_options.add_load_flags(plan, dtype_help="override the config's dtype")
    plan.add_argument("--layer-layout", default="scan", choices=["scan", "unrolled"],
                      help="stacked weights scanned (as on TPU) or unrolled")
    plan.add_argument("--compare", action="store_true",
                      help="every loop instead (greedy AR, LayerSkip, HiSpec, HiSpec adaptive; "
                           "sampling AR and HiSpec) in one table, each with its extra memory "
                           "over AR's of the same mode")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")


def check_plan_memory_args(args) -> dict[str, int]:
    """Every check of `hispec plan-memory` that needs no JAX; returns the mesh shape."""
    shape = common.mesh_arg(args) or mesh_spec.parse_mesh("model=1")
    for flag, value in (("--batch-size", args.batch_size), ("--max-len", args.max_len),
                        ("--prompt-len", args.prompt_len)):
        if value < 1:
            raise ValueError(f"{flag} {value}: must be an integer >= 1")
    if args.compare and (args.method or args.sampling):
        raise ValueError("--compare plans every method, greedy and sampling: leave out "
                         + ("--method" if args.method else "--sampling"))
    if args.quantize is not None and args.layer_layout != "unrolled":
        raise ValueError(f"--quantize {args.quantize}: needs --layer-layout unrolled (int8 "
                         "weights live in the unrolled layout, as load_model holds them)")
    if args.prompt_len >= args.max_len:
        raise ValueError(f"--prompt-len {args.prompt_len}: must be below --max-len {args.max_len}")
    return shape


def run_plan_memory(args) -> int:
    shape = check_plan_memory_args(args)  # before JAX starts
    devices = mesh_spec.mesh_size(shape)
    if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in os.environ.get(
            "XLA_FLAGS", ""):  # enough CPU devices to compile for, if no accelerator has them
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform"
                                   f"_device_count={devices}").strip()
    from hispec_jax.decoding import memory_plan
    from hispec_jax.models.presets import load_preset

    cfg = load_preset(args.config)
    if args.dtype:
        cfg = cfg.replace(dtype=args.dtype)
    if args.matmul_precision:
        cfg = cfg.replace(matmul_precision=args.matmul_precision)
    shapes = dict(batch=args.batch_size, max_len=args.max_len, prompt_len=args.prompt_len,
                  layer_layout=args.layer_layout, quantize=args.quantize)
    if args.compare:
        plans = memory_plan.compare_loops(
            cfg, shape, lambda msg: print(f"[plan-memory] {msg}", file=sys.stderr, flush=True),
            **shapes)
        if args.json:
            print(json.dumps([{"name": name, **memory_plan.to_json(plan)}
                              for name, plan in plans]))
        else:
            print("\n".join(memory_plan.summary_lines(plans[0][1])[:2]
                            + memory_plan.comparison_lines(plans)))
        return 0
    plan = memory_plan.plan_memory(cfg, shape, method=args.method or "ar",
                                   greedy=not args.sampling, **shapes)
    if args.json:
        print(json.dumps(memory_plan.to_json(plan)))
    else:
        print("\n".join(memory_plan.summary_lines(plan)))
    return 0
