"""What a pass over a block of T positions costs against one position, on SmolLM2-135M.

    python benchmarks/results_claims/block_cost.py > benchmarks/results_claims/block_cost.txt

Prompt lookup verifies k drafted tokens in one pass over a block of positions; its wall-clock
gain trails its work saving by how much more such a pass costs than the AR step. This
times the pass the engine runs for a block (every layer over T positions with their
in-place KV writes, `transformer.run_layers_cached`, then the LM head at every position)
on SmolLM2-135M-Instruct (the pulled Q4_1 GGUF, dequantized to float32), batch 1, a
cache of capacity 1024 holding a 400-token context, for T = 1, 2, 4, 8: each T compiled
in this process, then 7 interleaved rounds of 5 passes; the median per pass and its ratio
to T = 1. Load average is printed at start and end: under load the ratios grow.
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
from hispec_jax.models.transformer import embed, run_layers_cached

path = subprocess.run(["hispec", "pull", "smollm2-135m-instruct"], capture_output=True,
                      text=True, check=True).stdout.strip()
model = load_model(path)
cfg, L = model.cfg, model.cfg.num_layers
CAPACITY, CONTEXT, ROUNDS, PASSES = 1024, 400, 7, 5
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(f"# {device_description()}; commit {commit}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
      f"load {tuple(round(x, 2) for x in os.getloadavg())}")
print(f"# {os.path.basename(path)}: {L} layers, D {cfg.hidden_size}, V {cfg.vocab_size}; "
      f"capacity {CAPACITY}, context {CONTEXT}, batch 1")


def block_pass(params, tokens_BxT, positions_BxT, cache):
    h, cache = run_layers_cached(params, cfg, embed(params, tokens_BxT), positions_BxT, cache, 0, L)
    return jnp.argmax(exit_logits(params, {}, cfg, h, L), -1).astype(jnp.int32), cache


per_layer = isinstance(model.params["layers"], (tuple, list))
passes = {}
for T in (1, 2, 4, 8):
    tokens = jnp.ones((1, T), jnp.int32)
    positions = CONTEXT + jnp.arange(T, dtype=jnp.int32)[None]
    cache = KVCache.zeros(cfg, 1, CAPACITY, per_layer=per_layer)
    fn = jax.jit(block_pass, donate_argnums=3).lower(model.params, tokens, positions, cache).compile()
    passes[T] = [fn, tokens, positions, cache]

times = {T: [] for T in passes}
for r in range(ROUNDS + 1):  # round 0 warms up
    for T, p in passes.items():
        fn, tokens, positions, cache = p
        t0 = time.perf_counter()
        for _ in range(PASSES):
            out, cache = fn(model.params, tokens, positions, cache)  # same slots rewritten
        out.block_until_ready()
        p[3] = cache
        if r:
            times[T].append((time.perf_counter() - t0) / PASSES * 1e3)

one = statistics.median(times[1])
print("\nT | ms per pass (median) | x one position")
for T, ts in times.items():
    print(f"{T} | {statistics.median(ts):.1f} | {statistics.median(ts) / one:.2f}")
print(f"\n# load at end {tuple(round(x, 2) for x in os.getloadavg())}")
