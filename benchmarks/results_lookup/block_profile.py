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
Without `--xla_cpu_enable_xprof_traceme=true` the trace holds no per-op events.
"""

import collections
import glob
import gzip
import json
import os
import re
import statistics
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp

from hispec_jax import load_model
from hispec_jax.bench.suite import device_description
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.pull import pull
from hispec_jax.models.transformer import embed, run_layers, run_layers_cached

CAPACITY, CONTEXT, CALLS, TOP = 640, 330, 5, 12
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
    cfg, params, L = model.cfg, model.params, model.cfg.num_layers

    def verify(params, tokens, positions, cache):
        h, kv = run_layers(params, cfg, embed(params, tokens), positions, cache, 0, L,
                           split_context=True)
        positions, kv = jax.lax.optimization_barrier((positions, kv))  # as the engine
        cache = cache.write_block(0, positions, kv)
        return jnp.argmax(exit_logits(params, {}, cfg, h, L), -1).astype(jnp.int32), cache

    def ar(params, tokens, positions, cache):
        h, cache = run_layers_cached(params, cfg, embed(params, tokens), positions, cache, 0, L)
        return jnp.argmax(exit_logits(params, {}, cfg, h, L), -1).astype(jnp.int32), cache

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# {device_description()}; commit {commit}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load "
          f"{tuple(round(x, 2) for x in os.getloadavg())}; XLA_FLAGS={os.environ.get('XLA_FLAGS')}")
    print(f"# SmolLM2-135M-Instruct, batch 1, capacity {CAPACITY}, context {CONTEXT}\n")
    for name, f, T in (("AR step", ar, 1), ("verify pass", verify, 2), ("verify pass", verify, 8)):
        tokens = jnp.ones((1, T), jnp.int32)
        positions = CONTEXT + jnp.arange(T, dtype=jnp.int32)[None]
        cache = [KVCache.zeros(cfg, 1, CAPACITY, per_layer=True)]
        compiled = jax.jit(f, donate_argnums=3).lower(params, tokens, positions, cache[0]).compile()
        sources = op_sources(compiled.as_text())

        def call():
            out, cache[0] = compiled(params, tokens, positions, cache[0])
            out.block_until_ready()

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
    print(f"# load at end {tuple(round(x, 2) for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
