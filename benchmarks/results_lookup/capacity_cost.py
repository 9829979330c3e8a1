"""What the cache's unused slots cost a decoding pass on SmolLM2-135M (CPU).

    python benchmarks/results_lookup/capacity_cost.py > benchmarks/results_lookup/capacity_cost.txt

Every attention of the library reads the whole cache capacity S and masks the slots past the
sequence; `generate` plans S from the prompt's power-of-two bucket (a 272-337-token task
prompt gets S = 576-640 with 64 new tokens). This times the AR step and the verify pass over
8 positions (as `out_major.py`) with the same 330 cached positions at S = 384, 512, 640, 1024
and 2048, interleaved in one process (median per call): the cost of attending over slots
nobody can see, i.e. what attention over the used part of the cache only would save.
"""

import os
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp

from hispec_jax import load_model
from hispec_jax.bench.suite import device_description
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.pull import pull
from hispec_jax.models.transformer import embed, run_layers, run_layers_cached

CONTEXT, CAPACITIES = 330, (384, 512, 640, 1024, 2048)
ROUNDS, CALLS = 9, 3


def main():
    path = str(pull("smollm2-135m-instruct"))
    model = load_model(path)
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

    def stepper(f, T, capacity):
        tokens = jnp.ones((1, T), jnp.int32)
        positions = CONTEXT + jnp.arange(T, dtype=jnp.int32)[None]
        cache = [KVCache.zeros(cfg, 1, capacity, per_layer=True)]
        fn = jax.jit(f, donate_argnums=3).lower(params, tokens, positions, cache[0]).compile()

        def call():
            out, cache[0] = fn(params, tokens, positions, cache[0])
            out.block_until_ready()
        return call

    passes = (("AR step", ar, 1), ("verify pass, T = 8", verify, 8))
    calls = {(name, S): stepper(f, T, S) for name, f, T in passes for S in CAPACITIES}
    for call in calls.values():
        call()
    start_load = tuple(round(x, 2) for x in os.getloadavg())
    times = {key: [] for key in calls}
    for _ in range(ROUNDS):
        for key, call in calls.items():
            t0 = time.perf_counter()
            for _ in range(CALLS):
                call()
            times[key].append((time.perf_counter() - t0) / CALLS)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# {device_description()}; commit {commit}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {start_load}")
    print(f"# {os.path.basename(path)}, batch 1, {CONTEXT} cached positions; CPU default layout "
          f"(unrolled, out-major); median of {ROUNDS} interleaved rounds of {CALLS} calls\n")
    print("| pass | " + " | ".join(f"S = {S}" for S in CAPACITIES) + " |")
    print("|---|" + "---|" * len(CAPACITIES))
    for name, *_ in passes:
        ms = [statistics.median(times[name, S]) * 1e3 for S in CAPACITIES]
        print(f"| {name}, ms | " + " | ".join(f"{m:.1f}" for m in ms) + " |")
        print(f"| {name}, x S = {CAPACITIES[0]} | "
              + " | ".join(f"{m / ms[0]:.2f}" for m in ms) + " |")
    print(f"\n# load at end {tuple(round(x, 2) for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
