"""The per-round cost of the lookups alone, jitted: `PromptLookup.propose` over a sequence of
S = 640 and `suffix_store.propose` (the search and the most frequent continuation's walk) over
a store of R tokens, at B = 1 and 8; the fastest of 7 interleaved repeats of 20 calls.

    PYTHONPATH=. python benchmarks/results_serving/search_cost.py 64 16384
"""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.decoding import suffix_store
from hispec_jax.decoding.lookup import PromptLookup

LOOKUP = PromptLookup(16, 8)
S, VOCAB = 640, 2000


def main(sizes: list[int]) -> None:
    rng = np.random.default_rng(0)
    calls = {}
    for B in (1, 8):
        tokens = jnp.asarray(rng.integers(0, VOCAB, (B, S)), jnp.int32)
        newest, limit = jnp.full((B,), 400, jnp.int32), jnp.full((B,), 16, jnp.int32)
        own = jax.jit(lambda t, n, l: tuple(vars(LOOKUP.propose(t, n, l)).values()))
        calls[f"B={B} own S={S}"] = (own, (tokens, newest, limit))
        for R in sizes:
            store = suffix_store.StoreArrays(
                tokens_R=jnp.asarray(rng.integers(0, VOCAB, R), jnp.int32),
                scope_R=jnp.zeros((R,), jnp.int32), scope_B=jnp.zeros((B,), jnp.int32))
            search = jax.jit(lambda s, t, n, l: tuple(
                vars(suffix_store.propose(LOOKUP, s, t, n, l)).values()))
            calls[f"B={B} store R={R}"] = (search, (store, tokens, newest, limit))
    for f, args in calls.values():
        jax.block_until_ready(f(*args))
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(7):
        for name, (f, args) in calls.items():
            start = time.perf_counter()
            for _ in range(20):
                out = f(*args)
            jax.block_until_ready(out)
            best[name] = min(best[name], (time.perf_counter() - start) / 20)
    for name, seconds in best.items():
        print(f"{name}: {seconds * 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    main([int(r) for r in sys.argv[1:]] or [64, 16384])
