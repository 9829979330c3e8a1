"""Where a decoding pass's time goes on XLA:CPU, per compiled op (SmolLM2-135M).

    XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true \
      python benchmarks/results_lookup/block_profile.py > benchmarks/results_lookup/block_profile.txt

Profiles (jax.profiler, Perfetto trace) the AR step (one position, `run_layers_cached`) and
the verify pass of a lookup / LayerSkip round over T = 2 and 8 positions (`run_layers(...,
split_context=True)`, the block's keys/values written after, head, argmax) on the pulled
SmolLM2-135M-Instruct, batch 1, capacity 640 with 330 cached positions, in the library's
CPU default layout (unrolled, out-major projections). For each pass: its median wall time,
then the trace's thunk time per op kind, named by the op's source (the einsum or the jnp
call that made it, from the compiled HLO's metadata) and result shape. Thunk times of the
two threads add up, so the column sums exceed the wall time; read them as shares.
Without `--xla_cpu_enable_xprof_traceme=true` the trace holds no per-op events. `TOP=45`
lists 45 op kinds per pass instead of 12 (block_profile_2026-11-26c.txt: the per-layer
attention-span conditionals, whose thunk time holds their branch's ops).
"""

import collections
import glob
import gzip
import json
import os
import re
import statistics
import tempfile
import time

import jax
from passes import ar_step, compiled_call, header, load, verify_pass

from hispec_jax import load_model
from hispec_jax.models.pull import pull

CAPACITY, CONTEXT, CALLS = 640, 330, 5
TOP = int(os.environ.get("TOP", 12))  # op kinds listed per pass
_RUNTIME = ("$", "Thunk", "Pjit", "Common", "Slinky", "end:", "Handle", "ParseArguments")


def op_sources(hlo_text: str) -> dict[str, str]:
    """Op name -> "source shape" from the compiled HLO's metadata."""
    sources = {}
    for m in re.finditer(r"%([\w.-]+) = (\S+) ([^\n]*)", hlo_text):
        shape, rest = m.group(2).split("{")[0], m.group(3)
        name = re.search(r"op_name=\"([^\"]*)\"", rest)
        if name is None:  # no metadata (e.g. attention dots): the fused computation's shape
            sources.setdefault(m.group(1), f"(no source) {shape}")
            continue
        parts = name.group(1).split("/")
        sources[m.group(1)] = f"{parts[-2] if len(parts) > 2 else name.group(1)} {shape}"
    return sources


def main():
    model = load_model(str(pull("smollm2-135m-instruct")))
    cfg, params = model.cfg, model.params
    print(f"{header()}; XLA_FLAGS={os.environ.get('XLA_FLAGS')}")
    print(f"# SmolLM2-135M-Instruct, batch 1, capacity {CAPACITY}, context {CONTEXT}\n")
    for name, f, T in (("AR step", ar_step(cfg), 1), ("verify pass", verify_pass(cfg), 2),
                       ("verify pass", verify_pass(cfg), 8)):
        call, compiled = compiled_call(f, cfg, params, T, CONTEXT, CAPACITY)
        sources = op_sources(compiled.as_text())
        call()
        walls = []
        for _ in range(15):
            t0 = time.perf_counter()
            call()
            walls.append(time.perf_counter() - t0)
        with tempfile.TemporaryDirectory() as trace_dir:
            with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
                for _ in range(CALLS):
                    call()
            trace, = glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True)
            events = json.load(gzip.open(trace))["traceEvents"]
        per_kind, count = collections.Counter(), collections.Counter()
        for e in events:
            if e.get("ph") != "X" or e["name"].startswith(_RUNTIME):
                continue
            kind = re.sub(r"\.\d+$", "", e["name"])
            key = f"{kind} | {sources.get(e['name'], '?')}"
            per_kind[key] += e["dur"] / CALLS / 1e3
            count[key] += 1
        print(f"## {name}, T = {T}: {statistics.median(walls) * 1e3:.1f} ms (median wall)\n")
        print("| op kind \\| source and shape | thunk ms per pass | ops per pass |")
        print("|---|---|---|")
        for key, ms in per_kind.most_common(TOP):
            print(f"| {key} | {ms:.2f} | {count[key] // CALLS} |")
        rest = sum(per_kind.values()) - sum(ms for _, ms in per_kind.most_common(TOP))
        print(f"| (everything else) | {rest:.2f} | |\n")
    print(f"# load at end {load()}")


if __name__ == "__main__":
    main()
