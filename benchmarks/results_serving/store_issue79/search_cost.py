"""The per-round cost of the lookups alone: PromptLookup.propose over S=640 and
suffix_store.propose over R tokens, jitted, at B = 1 and 8 (interleaved, the fastest of repeats)."""
import time, sys
import jax, jax.numpy as jnp, numpy as np
from hispec_jax.decoding.lookup import PromptLookup
from hispec_jax.decoding import suffix_store
lk = PromptLookup(16, 8)
rng = np.random.default_rng(0)
S = 640
fns = {}
for B in (1, 8):
    toks = jnp.asarray(rng.integers(0, 2000, (B, S)), jnp.int32)
    newest = jnp.full((B,), 400, jnp.int32); lim = jnp.full((B,), 16, jnp.int32)
    fns[(B, "own")] = (jax.jit(lambda t, n, l: tuple(vars(lk.propose(t, n, l)).values())), (toks, newest, lim))
    for R in [int(r) for r in sys.argv[1:]] or (64, 16384):
        st = suffix_store.StoreArrays(tokens_R=jnp.asarray(rng.integers(0, 2000, R), jnp.int32),
                                      scope_R=jnp.zeros((R,), jnp.int32), scope_B=jnp.zeros((B,), jnp.int32))
        fns[(B, f"store R={R}")] = (jax.jit(lambda s, t, n, l: tuple(vars(suffix_store.propose(lk, s, t, n, l)).values())), (st, toks, newest, lim))
best = {k: 1e9 for k in fns}
for k, (f, a) in fns.items():
    jax.block_until_ready(f(*a))
for _ in range(7):
    for k, (f, a) in fns.items():
        t0 = time.perf_counter()
        for _ in range(20):
            out = f(*a)
        jax.block_until_ready(out)
        best[k] = min(best[k], (time.perf_counter() - t0) / 20)
for k, v in best.items():
    print(f"B={k[0]} {k[1]}: {v * 1e3:.3f} ms")
