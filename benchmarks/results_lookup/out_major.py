"""What out-major layer projections save on SmolLM2-135M (CPU): the passes of a decoding loop,
canonical (`x @ w`, w [in, out]) against out-major (`w_T @ x^T`, w_T [out, in]) weights.

    python benchmarks/results_lookup/out_major.py > benchmarks/results_lookup/out_major.txt

XLA:CPU serves every dot of more than one row with YNNPACK's GEMM, which packs its right
operand on each call: as `x @ w` that is the whole weight matrix, every layer, every pass.
With the weight stored transposed and used as the left operand (`transformer.project`) it
is read as stored. This times, on SmolLM2-135M-Instruct (the pulled Q4_1 GGUF dequantized
to float32), batch 1, a cache of capacity 640 holding a 330-token context (a task prompt
with its reply under way), both weight orders in one process:

- the AR step: one position through all 30 layers with the in-place cache write, the head
  and the argmax (`run_layers_cached`, as the engine's AR loop);
- the verify pass of a lookup or LayerSkip round over T = 2, 4, 8 positions: all layers over
  the block from a read-only cache (`run_layers(split_context=True)`), the block's keys and
  values written after, the head and the argmax;
- a prefill chunk of 128 positions (`run_layers_cached`, as `decoding/prefill.py`).

Each variant is compiled first, then timed in interleaved rounds (median per call). Load
average at start and end: under load every ratio moves.
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
from hispec_jax.models.params import with_layer_layout
from hispec_jax.models.pull import pull
from hispec_jax.models.transformer import embed, run_layers, run_layers_cached

CAPACITY, CONTEXT, CHUNK = 640, 330, 128
BLOCK_TS = (2, 4, 8)
ROUNDS, CALLS = 9, 3


def main():
    path = str(pull("smollm2-135m-instruct"))
    model = load_model(path, out_major=True)
    cfg, L = model.cfg, model.cfg.num_layers
    orders = {"canonical": with_layer_layout(model.params, "unrolled", out_major=False),
              "out-major": model.params}

    def verify(params, tokens, positions, cache):
        h, kv = run_layers(params, cfg, embed(params, tokens), positions, cache, 0, L,
                           split_context=True)
        positions, kv = jax.lax.optimization_barrier((positions, kv))  # as the engine
        cache = cache.write_block(0, positions, kv)
        return jnp.argmax(exit_logits(params, {}, cfg, h, L), -1).astype(jnp.int32), cache

    def cached(params, tokens, positions, cache):
        h, cache = run_layers_cached(params, cfg, embed(params, tokens), positions, cache, 0, L)
        return jnp.argmax(exit_logits(params, {}, cfg, h, L), -1).astype(jnp.int32), cache

    def stepper(f, T, params, start):
        tokens = jnp.ones((1, T), jnp.int32)
        positions = start + jnp.arange(T, dtype=jnp.int32)[None]
        cache = [KVCache.zeros(cfg, 1, CAPACITY, per_layer=True)]
        fn = jax.jit(f, donate_argnums=3).lower(params, tokens, positions, cache[0]).compile()

        def call():
            out, cache[0] = fn(params, tokens, positions, cache[0])
            out.block_until_ready()
        return call

    passes = [("AR step (1 position)", cached, 1, CONTEXT)]
    passes += [(f"verify pass, T = {T}", verify, T, CONTEXT) for T in BLOCK_TS]
    passes += [(f"prefill chunk, T = {CHUNK}", cached, CHUNK, CHUNK)]
    calls = {(name, order): stepper(f, T, params, start)
             for name, f, T, start in passes for order, params in orders.items()}
    for call in calls.values():
        call()
    start_load = tuple(round(x, 2) for x in os.getloadavg())
    times = {key: [] for key in calls}
    for _ in range(ROUNDS):
        for key, call in calls.items():
            n = 1 if "prefill" in key[0] else CALLS
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            times[key].append((time.perf_counter() - t0) / n)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# {device_description()}; commit {commit}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {start_load}")
    print(f"# {os.path.basename(path)}: {L} layers, D {cfg.hidden_size}, F "
          f"{cfg.intermediate_size}; batch 1; capacity {CAPACITY}, context {CONTEXT}; median of "
          f"{ROUNDS} interleaved rounds ({CALLS} calls per round, prefill 1)\n")
    ar = {o: statistics.median(times[passes[0][0], o]) * 1e3 for o in orders}
    print("| pass | canonical ms | out-major ms | out-major / canonical | canonical x AR step "
          "| out-major x AR step |")
    print("|---|---|---|---|---|---|")
    for name, *_ in passes:
        a, b = (statistics.median(times[name, o]) * 1e3 for o in orders)
        print(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.2f} | {a / ar['canonical']:.2f} "
              f"| {b / ar['out-major']:.2f} |")
    print(f"\n# load at end {tuple(round(x, 2) for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
