"""Compile time of one engine loop vs depth, scanned and unrolled layer layouts (the
"Compile time vs depth" table of docs/layer_layouts.md).

    python benchmarks/results_claims/compile_depth.py > benchmarks/results_claims/compile_depth.txt

A random-architecture model (D = 128, 4 heads, 2 KV heads, V = 2048; abstract weights, so
nothing is allocated) at 8, 16 and 32 layers; AR and HiSpec (draft exit L/8, verifier
L/4, windows 2 / 4) loops at batch 1, capacity 256, prompt block 16, greedy;
`Engine.lower().compile()` timed once each in a fresh process-level cache (wall and this
process's CPU seconds: CPU time is the less load-sensitive of the two). XLA flags as the
environment gives them (the library's defaults, not the test suite's fast-compile flags).
"""

import os
import time

import jax

from hispec_jax.decoding import engine as engine_lib
from hispec_jax.decoding import methods
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.model import Model
from hispec_jax.models.params import init_params, with_layer_layout

print(os.popen("uptime").read().strip())
print(f"{jax.devices()[0].platform}: {os.cpu_count()} cores, jax {jax.__version__}, "
      f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
print("| layers | layout | method | compile wall s | compile CPU s |")
print("|---|---|---|---|---|")
for L in (8, 16, 32):
    cfg = ModelConfig(model_type="llama", vocab_size=2048, hidden_size=128,
                      intermediate_size=352, num_layers=L, num_heads=4, num_kv_heads=2,
                      head_dim=32, max_position_embeddings=512)
    for layout in ("scan", "unrolled"):
        params = jax.eval_shape(lambda: with_layer_layout(init_params(cfg, jax.random.key(0)),
                                                          layout))
        model = Model(cfg=cfg, params=params)
        for name, options in (("AR", {}), ("HiSpec", dict(draft_exit=L // 8,
                                                          verify_exits=(L // 4,)))):
            method = "ar" if name == "AR" else "hispec"
            decoder = methods.make_method(model, method, **options)
            engine = engine_lib.Engine.for_model(
                model, decoder.hierarchy, engine_lib.Shapes(batch=1, capacity=256,
                                                            prompt_block=16))
            jax.clear_caches()
            w0, c0 = time.perf_counter(), time.process_time()
            engine.lower().compile()
            print(f"| {L} | {layout} | {name} | {time.perf_counter() - w0:.1f} | "
                  f"{time.process_time() - c0:.1f} |", flush=True)
print(os.popen("uptime").read().strip())
