"""One tree's AR (or LayerSkip d=4) on SmolLM2's extract prompts (4, chat-templated, batch 1)
with canonical weights, timed at 32 and 128 new tokens: the per-token step is the slope, the
prompt's prefill and the call's fixed costs the intercept. Run under each tree with the same
XLA options (`same_options_ab.sh`), so the two trees' code is compared, not their defaults.

    PYTHONPATH=TREE XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= \
        python same_options_ab.py SMOLLM2 [ar|layerskip]
"""
import json
import statistics
import sys

import hispec_jax
import hispec_jax.decoding.generate as G
from hispec_jax import load_model
from hispec_jax.bench.tasks import task_prompts

M = sys.argv[1]
METHOD = sys.argv[2] if len(sys.argv) > 2 else "ar"
KW = {"draft_exit": 4} if METHOD == "layerskip" else {}
m = load_model(M, out_major=False)
prompts = task_prompts(m, "extract", 4, 256, chat=True)


def run(n):  # seconds per prompt, prefill included
    t = 0.0
    for p in prompts:
        r = G.generate(m, [p], method=METHOD, max_new_tokens=n, ignore_eos=True, **KW)
        t += r.stats["decode_seconds"]
    return t / len(prompts)


for n in (32, 128):  # compile
    run(n)
res = {32: [], 128: []}
for _ in range(3):
    for n in (32, 128):
        res[n].append(run(n))
a, b = statistics.median(res[32]), statistics.median(res[128])
slope = (b - a) / 96
print(json.dumps({"method": METHOD, "tree": hispec_jax.__file__, "t32": round(a, 4),
                  "t128": round(b, 4), "step_ms": round(1000 * slope, 2),
                  "intercept_ms": round(1000 * (a - 32 * slope), 1)}))
