"""`hispec bench-tool oracle` on the random 16-layer models of BENCHMARKS.md, "The oracle tool".

    python benchmarks/results_claims/oracle_random.py [256|1024 ...] > benchmarks/results_claims/oracle_random.txt

The always-agree variant of a random Llama model (L = 16, V = 4096, unrolled, float32):
D = 256 (F = 640, 4 heads / 1 KV head; 5 rounds) and the memory-bound D = 1024 (F = 2816,
16 heads / 4 KV heads; 3 rounds). Two random prompts of 32 tokens, 64 new tokens, batch 1,
the default methods (`oracle.default_specs`), interleaved rounds, decoding-loop time. The
JSON reports go next to this file (`oracle_random_d{D}.json`); the machine, commit and load
average at start and end are printed.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax

from hispec_jax import Model, ModelConfig
from hispec_jax.bench import oracle
from hispec_jax.models.params import init_params, with_layer_layout

SHAPES = {256: dict(hidden_size=256, intermediate_size=640, num_heads=4, num_kv_heads=1, rounds=5),
          1024: dict(hidden_size=1024, intermediate_size=2816, num_heads=16, num_kv_heads=4, rounds=3)}


def main(widths):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    for D in widths:
        shape = dict(SHAPES[D])
        rounds = shape.pop("rounds")
        cfg = ModelConfig(model_type="llama", vocab_size=4096, num_layers=16, head_dim=64,
                          max_position_embeddings=4096, **shape)
        model = Model(cfg=cfg, params=with_layer_layout(init_params(cfg, jax.random.PRNGKey(0)),
                                                        "unrolled"))
        load = tuple(round(x, 2) for x in os.getloadavg())
        print(f"## D = {D}: commit {commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
              f"load at start {load}\n", flush=True)
        report = oracle.run(model, oracle.default_specs(model), prompts=2, prompt_len=32,
                            max_new_tokens=64, batch_size=1, rounds=rounds,
                            progress=lambda name: print(f"[oracle] {name}", file=sys.stderr))
        print(oracle.markdown(report))
        print(f"load at end {tuple(round(x, 2) for x in os.getloadavg())}\n", flush=True)
        Path(__file__).with_name(f"oracle_random_d{D}.json").write_text(
            json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main([int(w) for w in sys.argv[1:]] or [256, 1024])
