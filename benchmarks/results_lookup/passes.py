"""The compiled decoding passes the results_lookup scripts time, on the pulled SmolLM2-135M.

Shared by `out_major.py`, `capacity_cost.py`, `block_profile.py`, `span_cost.py`,
`prefill_tail.py`, `compile_cost.py` and `head_block_cost.py` (each imports this file from
its own directory: `python benchmarks/results_lookup/SCRIPT.py`).

- `ar_step`: one position (or a prefill chunk) through all layers with the in-place cache
  write (`run_layers_cached`), the head and the argmax: the engine's AR loop body.
- `compiled_prefill`: the whole prefill of one prompt (`prefill.prefill`) in chunks of T.
- `verify_pass`: all layers over a block from a read-only cache (`run_layers(...,
  split_context=True)`), the block's keys/values written after a barrier (as the engine
  does after its switch), the head and the argmax: a lookup / LayerSkip round's top pass.
"""

import os
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp

from hispec_jax.bench.suite import device_description
from hispec_jax.decoding import prefill as prefill_lib
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.transformer import embed, run_layers, run_layers_cached


def ar_step(cfg):
    L = cfg.num_layers

    def f(params, tokens, positions, cache):
        h, cache = run_layers_cached(params, cfg, embed(params, tokens), positions, cache, 0, L)
        return jnp.argmax(exit_logits(params, {}, cfg, h, L), -1).astype(jnp.int32), cache
    return f


def verify_pass(cfg):
    L = cfg.num_layers

    def f(params, tokens, positions, cache):
        h, kv = run_layers(params, cfg, embed(params, tokens), positions, cache, 0, L,
                           split_context=True)
        positions, kv = jax.lax.optimization_barrier((positions, kv))
        cache = cache.write_block(0, positions, kv)
        return jnp.argmax(exit_logits(params, {}, cfg, h, L), -1).astype(jnp.int32), cache
    return f


def compiled_call(f, cfg, params, T: int, start: int, capacity: int, per_layer: bool = True):
    """(a call of pass `f` over T positions from `start`, batch 1, in a cache of `capacity`
    slots that is donated and carried: the same slots are rewritten every call; the compiled
    executable). `per_layer`: the cache layout of the unrolled layer layout (False: scan)."""
    tokens = jnp.ones((1, T), jnp.int32)
    positions = start + jnp.arange(T, dtype=jnp.int32)[None]
    cache = [KVCache.zeros(cfg, 1, capacity, per_layer=per_layer)]
    compiled = jax.jit(f, donate_argnums=3).lower(params, tokens, positions, cache[0]).compile()

    def call():
        out, cache[0] = compiled(params, tokens, positions, cache[0])
        out.block_until_ready()
    return call, compiled


def compiled_prefill(cfg, params, length: int, chunk: int, capacity: int):
    """A call of the whole prefill (all layers, batch 1) of a `length`-token prompt in chunks
    of `chunk` positions, into a donated, carried cache of `capacity` slots."""
    tokens = jnp.ones((1, capacity), jnp.int32)
    lengths = jnp.asarray([length], jnp.int32)
    cache = [KVCache.zeros(cfg, 1, capacity, per_layer=True)]
    run = jax.jit(lambda p, t, n, c: prefill_lib.prefill(p, cfg, t, n, c, cfg.num_layers, chunk),
                  donate_argnums=3)
    compiled = run.lower(params, tokens, lengths, cache[0]).compile()

    def call():
        h, cache[0] = compiled(params, tokens, lengths, cache[0])
        h.block_until_ready()
    return call


def interleaved_ms(calls: dict, rounds: int, repeats) -> tuple[dict, tuple]:
    """Median ms per call of every `calls[key]()` over `rounds` interleaved rounds, each call
    repeated `repeats(key)` times per round (warmed up first); and the load when timing began."""
    for call in calls.values():
        call()
    start_load = load()
    times = {key: [] for key in calls}
    for _ in range(rounds):
        for key, call in calls.items():
            n = repeats(key)
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            times[key].append((time.perf_counter() - t0) / n)
    return {key: statistics.median(v) * 1e3 for key, v in times.items()}, start_load


def header() -> str:
    """The machine / commit / time / load line every output starts with."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return (f"# {device_description()}; commit {commit}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {load()}")


def load():
    return tuple(round(x, 2) for x in os.getloadavg())
