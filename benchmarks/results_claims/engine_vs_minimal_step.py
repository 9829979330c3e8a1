"""The engine's AR round against the minimal AR step (BENCHMARKS.md, "The engine's AR round
against a minimal AR step").

    python benchmarks/results_claims/engine_vs_minimal_step.py > benchmarks/results_claims/engine_vs_minimal_step.txt

1. Operations of the compiled step (`roofline.step_ops`: fusions, dots, copies), the engine's
   AR round (`roofline.engine_ar_step`) and the minimal step (`roofline.minimal_ar_step`),
   capacity 256, unrolled: the shipped model at batch 1 and 4, the 4-layer model of
   `tests/test_roofline.py` at batch 1.
2. Time per token of a 64-token AR loop of the shipped model (batch 1, capacity 128): the
   engine's `generate` loop (`stats["decode_seconds"]`, 63 loop steps after prefill's token)
   against a jitted `lax.fori_loop` of 63 minimal steps; median of 5 interleaved rounds.
3. AR through `hispec bench-tool oracle --model hispec_jax/default_model --rounds 5` with AR
   alone: measured tokens/s against the stage model's AR prediction (one layer and one head
   timed as differences of standalone programs).
Machine, commit and load average at start and end are printed.
"""

import os
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax import DEFAULT_MODEL_DIR, Model, ModelConfig, generate, load_model
from hispec_jax.bench import oracle, roofline
from hispec_jax.bench.suite import MethodSpec, device_description
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import init_params, with_layer_layout
from hispec_jax.models.transformer import embed, run_layers_cached

load = lambda: tuple(round(x, 2) for x in os.getloadavg())
try:  # (a lent GPU machine's copy of the tree may have no git)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
except OSError:
    commit = "unknown"
print(f"# {device_description()}; commit {commit}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
      f"load at start {load()}")

shipped = load_model(DEFAULT_MODEL_DIR)
test_cfg = ModelConfig(model_type="llama", vocab_size=2048, hidden_size=128, intermediate_size=384,
                       num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                       max_position_embeddings=2048)
test_model = Model(cfg=test_cfg, params=with_layer_layout(init_params(test_cfg, jax.random.PRNGKey(0)),
                                                          "unrolled"))


def ops_line(name, model, batch):
    engine = roofline.step_ops(roofline.engine_ar_step(model, batch, 256))
    minimal = roofline.step_ops(roofline.minimal_ar_step(model, batch, 256))
    part = lambda o: (f"{o.total} ({o.counts['fusion']} fusions + {o.counts['dot']} dots + "
                      f"{o.counts['copy']} copies)")
    print(f"| {name} | {batch} | {part(engine)} | {part(minimal)} | {engine.total - minimal.total:+d} "
          f"| {max(engine.copy_bytes, default=0)} |")


print("\n| model | batch | engine: ops | minimal step: ops | difference | largest copy (bytes) |")
print("|---|---|---|---|---|---|")
ops_line(f"shipped (L = {shipped.cfg.num_layers}, D = {shipped.cfg.hidden_size})", shipped, 1)
ops_line("shipped", shipped, 4)
ops_line("test model (L = 4, D = 128)", test_model, 1)

# 2. A 64-token AR loop: the engine's against a fori_loop of the minimal step.
cfg, L, NEW, CAP = shipped.cfg, shipped.cfg.num_layers, 64, 128
prompt = np.random.RandomState(0).randint(3, cfg.vocab_size, 32).tolist()
per_layer = isinstance(shipped.params["layers"], (tuple, list))


@jax.jit
def minimal_loop(params, token_B, position_B, cache):
    def body(_, carry):
        token_B, position_B, cache = carry
        h, cache = run_layers_cached(params, cfg, embed(params, token_B[:, None]),
                                     position_B[:, None], cache, 0, L)
        token_B = jnp.argmax(exit_logits(params, {}, cfg, h, L)[:, 0], -1).astype(jnp.int32)
        return token_B, position_B + 1, cache
    return jax.lax.fori_loop(0, NEW - 1, body, (token_B, position_B, cache))[0]


def engine_seconds():
    r = generate(shipped, [prompt], method="ar", max_new_tokens=NEW, ignore_eos=True,
                 max_cache_len=CAP)
    return r.stats["decode_seconds"] / (NEW - 1)


def minimal_seconds():
    cache = KVCache.zeros(cfg, 1, CAP, per_layer=per_layer)
    args = (shipped.params, jnp.asarray([5], jnp.int32), jnp.asarray([len(prompt)], jnp.int32), cache)
    t0 = time.perf_counter()
    jax.block_until_ready(minimal_loop(*args))
    return (time.perf_counter() - t0) / (NEW - 1)


engine_seconds(), minimal_seconds()  # compile
engine_t, minimal_t = [], []
for _ in range(5):
    engine_t.append(engine_seconds())
    minimal_t.append(minimal_seconds())
e, m = statistics.median(engine_t), statistics.median(minimal_t)
print(f"\n64-token AR loop, batch 1, capacity {CAP}, median of 5: engine {e * 1e3:.2f} ms per token, "
      f"minimal fori_loop {m * 1e3:.2f} ms per token (engine / minimal {e / m:.2f})")

# 3. AR alone through the oracle tool: measured against the stage model's prediction.
report = oracle.run(shipped, [MethodSpec.of("ar", "ar")], prompts=2, prompt_len=32,
                    max_new_tokens=64, batch_size=1, rounds=5)
ar = report["rows"][0]
print(f"\noracle (always-agree shipped model, AR alone, 5 rounds): measured {ar['tokens_per_second']:.1f} "
      f"tokens/s, stage model {ar['stage_model_tokens_per_second']:.1f} tokens/s "
      f"(predicted / measured {ar['stage_model_tokens_per_second'] / ar['tokens_per_second']:.2f})")
print(f"# load at end {load()}")
