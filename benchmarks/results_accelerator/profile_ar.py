"""Where an AR token's time goes on a GPU: a profiler trace of the engine's AR loop, summed
per kernel.

    python benchmarks/results_accelerator/profile_ar.py --out-dir DIR [--shapes llama3-8b]

Random weights of a preset's shapes (unrolled layout, bf16 by default), one prompt of 32
tokens, 64 new tokens: one `generate` to compile, then one under `jax.profiler.trace` with a
Perfetto trace (`DIR/trace/.../perfetto_trace.json.gz`), and the loop's optimised HLO
(`DIR/jit_run.hlo.txt.gz`). The summary (`DIR/kernels.txt`, and printed) groups the device's
kernel events by name: count, total and mean microseconds, share of the traced device time,
the time per generated token, and each kernel's HLO instruction (its output shape and the
JAX operation it came from); the device's busy time against the loop's wall time tells
kernel time from gaps between kernels. Read with BENCHMARKS.md, "On an accelerator".

    python benchmarks/results_accelerator/profile_ar.py --summarize TRACE_DIR --hlo HLO.txt[.gz]

summarises a trace made earlier (64 new tokens assumed; `--new-tokens` otherwise).
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import time

import jax
import numpy as np

from hispec_jax import generate
from hispec_jax.bench import oracle
from hispec_jax.bench.oracle import in_layout
from hispec_jax.bench.suite import device_description
from hispec_jax.decoding.engine import _COMPILED


def find_trace(trace_dir: str) -> str:
    return glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)[0]


def kernel_events(trace_path: str) -> list[dict]:
    """The trace's complete events ("ph": "X") on device (GPU) threads; on a CPU, XLA's ops."""
    with gzip.open(trace_path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    pids = {e["pid"]: e["args"].get("name", "") for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name"}
    device = {pid for pid, name in pids.items() if "/device:" in name and "CPU" not in name}
    pick = (lambda e: e.get("pid") in device) if device else (lambda e: True)
    return [e for e in events if e.get("ph") == "X" and "dur" in e and pick(e)]


def hlo_instructions(hlo_text: str) -> dict[str, str]:
    """Instruction name -> "output shape <- JAX op" for every fusion and custom call of an
    HLO module's text (kernel names in a trace write its last "." as "_")."""
    out = {}
    pattern = r"(?m)^\s*(?:ROOT )?%([\w.-]+) = (\(?[^=]*?\)?) (?:fusion|custom-call)\(.*?op_name=\"([^\"]*)\""
    for m in re.finditer(pattern, hlo_text):
        out[re.sub(r"\.(\d+)$", r"_\1", m.group(1))] = f"{m.group(2)} <- {m.group(3)}"
    return out


def summary(events: list[dict], tokens: int, wall_s: float | None,
            hlo: dict[str, str] | None = None) -> str:
    by_name = collections.defaultdict(list)
    for e in events:
        by_name[e["name"]].append(float(e["dur"]))
    busy = sum(sum(d) for d in by_name.values())
    span = (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) if events else 0
    wall = "" if wall_s is None else f", decoding wall {wall_s * 1e3:.1f} ms"
    lines = [f"{len(events)} events, {len(by_name)} names; device busy {busy / 1e3:.1f} ms, "
             f"span {span / 1e3:.1f} ms{wall}; {tokens} tokens: "
             f"busy {busy / tokens:.0f} us / token, span {span / tokens:.0f} us / token", "",
             "| kernel | count | total ms | mean us | share of busy | HLO: output <- op |",
             "|---|---|---|---|---|---|"]
    for name, d in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:40]:
        what = (hlo or {}).get(name, "")
        lines.append(f"| {name[:90]} | {len(d)} | {sum(d) / 1e3:.2f} | {np.mean(d):.1f} | "
                     f"{sum(d) / busy:.1%} | {what[:160]} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="llama3-8b")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--out-dir")
    p.add_argument("--summarize", metavar="TRACE_DIR", help="summarise this earlier trace")
    p.add_argument("--hlo", help="with --summarize: the traced loop's HLO text (.txt or .gz)")
    args = p.parse_args()
    if args.summarize:
        opener = gzip.open if args.hlo and args.hlo.endswith(".gz") else open
        hlo = hlo_instructions(opener(args.hlo, "rt").read()) if args.hlo else None
        print(summary(kernel_events(find_trace(args.summarize)), args.new_tokens, None, hlo))
        return 0
    if not args.out_dir:
        p.error("--out-dir is required (or --summarize)")
    t0 = time.perf_counter()
    say = lambda m: print(f"[{time.perf_counter() - t0:6.1f}s] {m}", flush=True)
    say(f"{device_description()}; jax {jax.__version__}; XLA_FLAGS="
        f"{os.environ.get('XLA_FLAGS', '')!r}")
    model = in_layout(oracle.preset_model(args.shapes, args.dtype), "unrolled")
    prompt = np.random.RandomState(0).randint(0, model.cfg.vocab_size, 32).tolist()
    run = lambda: generate(model, [prompt], method="ar", max_new_tokens=args.new_tokens,
                           ignore_eos=True)
    out = run()
    say(f"compiled and ran once: {out.stats['decode_seconds'] * 1e3:.1f} ms decoding")
    trace_dir = os.path.join(args.out_dir, "trace")
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        out = run()
    wall = out.stats["decode_seconds"]
    tokens = args.new_tokens
    say(f"traced: {tokens / wall:.1f} tok/s ({wall * 1e3:.1f} ms decoding)")
    hlo_text = "\n".join(executable.as_text() or "" for executable, _ in _COMPILED.values())
    with gzip.open(os.path.join(args.out_dir, "jit_run.hlo.txt.gz"), "wt") as f:
        f.write(hlo_text)
    text = summary(kernel_events(find_trace(trace_dir)), tokens, wall, hlo_instructions(hlo_text))
    print(text, flush=True)
    with open(os.path.join(args.out_dir, "kernels.txt"), "w") as f:
        f.write(f"# {device_description()}; jax {jax.__version__}; {args.shapes} {args.dtype}, "
                f"unrolled, AR, {tokens} new tokens\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
