"""What a product over T = 1-16 rows costs on XLA:CPU, per formulation (no model: MLP-sized
random weights).

    python benchmarks/results_lookup/small_block_products.py > benchmarks/results_lookup/small_block_products.txt

30 layers of x <- x + down(silu(up(x))) with SmolLM2-135M's MLP shapes (576 -> 1536 -> 576,
float32, 212 MB of weights: memory-bound at T = 1), for a block of T rows, in five forms:

    io dot      weights [I, O], x @ w                     (the canonical layout)
    oi einsum   weights [O, I], einsum("ti,oi->to")
    oi lib      weights [O, I], `transformer.weight_left_matmul` (w @ x^T, the library's
                CPU default for T > 1: out-major projections)
    io rows     T matrix-vector products x[t] @ w
    oi rows     T matrix-vector products w @ x[t]

Interleaved rounds (two calls per round), median ms per call.
"""

import os
import statistics
import time

import jax
import jax.numpy as jnp

from hispec_jax.models.transformer import weight_left_matmul

L, D, F = 30, 576, 1536
ROUNDS = 7
TS = (1, 2, 4, 8, 16)


def weights(out_major: bool):
    def w(i, shape):
        return jax.random.normal(jax.random.PRNGKey(i), shape) * 0.02
    return [(w(i, (F, D) if out_major else (D, F)), w(100 + i, (D, F) if out_major else (F, D)))
            for i in range(L)]


def mlp_stack(product):
    def f(x, ws):
        for up, down in ws:
            x = x + product(jax.nn.silu(product(x, up)), down)
        return x
    return jax.jit(f)


FORMS = {
    "io dot": (lambda x, w: x @ w, False),
    "oi einsum": (lambda x, w: jnp.einsum("ti,oi->to", x, w), True),
    "oi lib": (lambda x, w: weight_left_matmul(w, x[None], None)[0], True),
    "io rows": (lambda x, w: jnp.stack([x[t] @ w for t in range(x.shape[0])]), False),
    "oi rows": (lambda x, w: jnp.stack([w @ x[t] for t in range(x.shape[0])]), True),
}


def main():
    ws = {False: weights(False), True: weights(True)}
    calls = {}
    for name, (product, out_major) in FORMS.items():
        f = mlp_stack(product)
        for T in TS:
            x = jnp.full((T, D), 0.01)
            f(x, ws[out_major]).block_until_ready()
            calls[name, T] = lambda f=f, x=x, w=ws[out_major]: f(x, w).block_until_ready()
    start = os.getloadavg()
    times = {key: [] for key in calls}
    for _ in range(ROUNDS):
        for key, call in calls.items():
            t0 = time.perf_counter()
            call()
            call()
            times[key].append((time.perf_counter() - t0) / 2)
    print(f"# XLA:CPU, jax {jax.__version__}, {os.cpu_count()} cores; load at start "
          f"{tuple(round(v, 2) for v in start)}, at end {tuple(round(v, 2) for v in os.getloadavg())}")
    print(f"# 30 MLP layers 576 -> 1536 -> 576, float32; median of {ROUNDS} interleaved rounds, ms\n")
    print("| form | " + " | ".join(f"T = {T}" for T in TS) + " |")
    print("|---|" + "---|" * len(TS))
    for name in FORMS:
        print(f"| {name} | " + " | ".join(f"{statistics.median(times[name, T]) * 1e3:.1f}"
                                           for T in TS) + " |")


if __name__ == "__main__":
    main()
