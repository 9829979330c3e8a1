"""Extract, batch 1, --chat, stop at EOS: AR, the default plan (gated lookup) and the
prompts' prefill alone (AR with one new token), one interleaved round: the end-to-end ratio
against the loop's alone (`suite.loop_ratio`, prefill subtracted).

    python benchmarks/results_lookup/prefill_share.py "$(hispec pull smollm2-135m-instruct)"
"""
import sys
from hispec_jax.cli.common import use_compilation_cache
use_compilation_cache()
from hispec_jax.bench import suite, tasks
from hispec_jax.models.model import load_model
M = sys.argv[1]
model = load_model(M)
prompts = tasks.task_prompts(model, "extract", 8, 512, True)
specs = [suite.MethodSpec.of("ar", "ar"), suite.MethodSpec.of("lookup", "lookup")]
runners, cap = suite.loop_time_runners(model, prompts, specs, 256, stop_at_eos=True, chat=True)
runners.append(suite.prefill_runner(model, prompts, cap))
res = suite.compare(runners, 1)
for r in res:
    print(r.name, r.seconds, r.new_tokens, r.tokens_per_second, flush=True)
ar, lk, pf = res
print("end-to-end", ar.tokens_per_second and lk.tokens_per_second/ar.tokens_per_second, "loop", suite.loop_ratio(ar, lk, pf))
