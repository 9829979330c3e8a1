"""AR decoding speed of the default model after a short and a long prompt: a step's cost grows
with its context (docs/planner.md §1, why calibration times its loops over every prompt).

    python benchmarks/results_planner/context_cost.py > benchmarks/results_planner/context_cost.txt

Random prompts of 34 and 129 tokens (the shortest and longest of the v4 chat calibration in
BENCHMARKS.md, "Default model v4 chat, 6 prompts"), 64 new tokens, capacity 320, loop time
(`decode_seconds`), best of 4 calls, each length twice.
"""

import numpy as np

import hispec_jax
from hispec_jax.decoding import generate as generate_lib

model = hispec_jax.load_model(hispec_jax.DEFAULT_MODEL_DIR)
rng = np.random.RandomState(0)
for n in (34, 129, 34, 129):
    prompt = [rng.randint(3, 2000, n).tolist()]
    best = min(generate_lib.generate(model, prompt, method="ar", max_new_tokens=64, ignore_eos=True,
                                     max_cache_len=320).stats["decode_seconds"]
               for _ in range(4))
    print(n, f"{63 / best:.1f} tok/s (decode_seconds, best of 4)")
