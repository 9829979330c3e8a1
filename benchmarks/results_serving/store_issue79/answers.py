"""Greedy answers (AR-identical lookup) of a task's chat prompts -> json."""
import json, sys
import hispec_jax
from hispec_jax.bench import tasks
M = "/root/.cache/hispec/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
task, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model = hispec_jax.load_model(M)
prompts = tasks.task_prompts(model, task, n, 400, chat=True)
r = hispec_jax.generate(model, prompts, max_new_tokens=128, max_cache_len=640, batch_size=len(prompts))
json.dump([{"prompt": p, "output": o} for p, o in zip(prompts, r.token_ids)], open(out, "w"))
print(r.stats["tokens_per_second"], r.stats["new_tokens"])
