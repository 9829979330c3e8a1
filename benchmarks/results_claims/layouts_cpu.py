"""AR on the shipped model with the scanned and the unrolled layer layout, side by side.

    python benchmarks/results_claims/layouts_cpu.py > benchmarks/results_claims/layouts_cpu.txt

4 held-out ShareGPT prompts x 64 new tokens, batch 1, 3 interleaved timed rounds after a
warm-up (`suite.compare`, end-to-end `generate` wall time); the scan runner's tokens are
checked against the unrolled one's.
"""

import statistics

from hispec_jax import DEFAULT_MODEL_DIR, load_model
from hispec_jax import datasets as prompts_lib
from hispec_jax.bench import suite

models = {layout: load_model(DEFAULT_MODEL_DIR, layer_layout=layout) for layout in ("unrolled", "scan")}
prompts = prompts_lib.load_prompts("sharegpt", models["unrolled"].tokenizer, 4, 64)
ar = suite.MethodSpec.of("ar", "ar")
cache_len = suite.common_cache_len(models["unrolled"], prompts, [ar], 64)
runners = []
for layout, model in models.items():
    runner = suite.hispec_runner(model, prompts, suite.MethodSpec.of(f"ar {layout}", "ar"),
                                 max_new_tokens=64, batch_size=1, max_cache_len=cache_len)
    runners.append(runner)
results = suite.compare(runners, rounds=3)
print(suite.device_description())
for r in results:
    print(f"{r.name}: {r.tokens_per_second:.1f} tokens/s (rounds: "
          f"{', '.join(f'{s:.2f}' for s in r.seconds)} s), identical to unrolled: {r.identical_to_ar}")
unrolled, scan = results
paired = statistics.median(s / u for u, s in zip(unrolled.seconds, scan.seconds))
print(f"unrolled / scan tokens/s: {unrolled.tokens_per_second / scan.tokens_per_second:.2f}x "
      f"(median of paired per-round ratios {paired:.2f}x)")
