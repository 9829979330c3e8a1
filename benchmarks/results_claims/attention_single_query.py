"""Attention of one query per sequence on XLA:CPU: two dots vs products + reductions.

    python benchmarks/results_claims/attention_single_query.py \
        > benchmarks/results_claims/attention_single_query.txt

`transformer._attend` computes a decoding step's attention (one query per sequence, on
CPU) as elementwise products with reductions (`_attend_single_query`); every other case
uses two einsum dots. This script rebuilds the "dots" variant by making
`transformer._single_query_on_cpu` answer False while a step is traced, on a random
8-layer model (D = 256, V = 4096, unrolled layout, float32), and prints for both variants:

* XLA's bytes accessed of one compiled engine AR round over the analytic bytes (weights +
  KV read; `roofline.compiled_step_bytes`), batch 1, capacity 256 and 2048;
* the time of `roofline.minimal_ar_step` (embed, every layer with its in-place KV write,
  LM head, argmax) at capacity 2048, batch 1 / 2 / 4: both variants compiled in this
  process, then 5 interleaved rounds of 10 steps each; the median per step.
"""

import os
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp

from hispec_jax import Model, ModelConfig
from hispec_jax.bench import roofline
from hispec_jax.bench.suite import device_description
from hispec_jax.models import transformer
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import init_params, with_layer_layout

single_query = transformer._single_query_on_cpu
VARIANTS = {"dots": lambda q: False, "products + reductions": single_query}


def traced_with(variant, build):
    """`build()` with `_attend`'s single-query test replaced while it traces."""
    transformer._single_query_on_cpu = VARIANTS[variant]
    try:
        return build()
    finally:
        transformer._single_query_on_cpu = single_query


cfg = ModelConfig(model_type="llama", vocab_size=4096, hidden_size=256, intermediate_size=704,
                  num_layers=8, num_heads=4, num_kv_heads=2, head_dim=64,
                  max_position_embeddings=4096)
model = Model(cfg=cfg, params=with_layer_layout(init_params(cfg, jax.random.PRNGKey(0)), "unrolled"))
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(f"# {device_description()}; commit {commit}; "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {os.getloadavg()}")
print(f"# model: {cfg.num_layers} layers, D {cfg.hidden_size}, V {cfg.vocab_size}, random, unrolled")

print("\nbytes accessed / analytic, AR round, batch 1")
print("capacity | " + " | ".join(VARIANTS))
for capacity in (256, 2048):
    ratios = [traced_with(v, lambda: roofline.compiled_step_bytes(model, 1, capacity)) for v in VARIANTS]
    print(f"{capacity} | " + " | ".join(f"{s.compiled / s.analytic:.2f}x" for s in ratios))

print("\nms per AR step (minimal step), capacity 2048, median of 5 interleaved rounds of 10 steps")
print("batch | " + " | ".join(VARIANTS))
capacity, rounds, steps = 2048, 5, 10
for batch in (1, 2, 4):
    compiled = {v: traced_with(v, lambda: roofline.minimal_ar_step(model, batch, capacity)) for v in VARIANTS}
    tokens = jnp.zeros((batch,), jnp.int32)
    caches = {v: KVCache.zeros(cfg, batch, capacity, per_layer=True) for v in VARIANTS}
    per_step = {v: [] for v in VARIANTS}
    for r in range(rounds + 1):  # round 0 warms up
        for v, step in compiled.items():
            cache = caches[v]
            t0 = time.perf_counter()
            for i in range(steps):
                tokens_out, cache = step(model.params, tokens, jnp.full((batch,), 1000 + i, jnp.int32), cache)
            tokens_out.block_until_ready()
            caches[v] = cache
            if r:
                per_step[v].append((time.perf_counter() - t0) / steps * 1e3)
    print(f"{batch} | " + " | ".join(f"{statistics.median(per_step[v]):.1f} ms" for v in VARIANTS))
print(f"\n# load at end {os.getloadavg()}")
