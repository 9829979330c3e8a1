"""Batch-1 generate over a task's prompts, the store growing (or none): the work-model
speed (tokens per unit of pass cost, C(1, T) of the CPU default F=15.75, J=4.25 over the
rounds' blocks: noise-free), wall tokens/s, per-source acceptance. One variant per process
(HISPEC_STORE_RULE / HISPEC_STORE_PRIOR_REJ at trace time); prints one line."""
import sys, json, os
import hispec_jax
from hispec_jax.bench import tasks
from hispec_jax.decoding import suffix_store
M = "/root/.cache/hispec/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
task, n, variant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model = hispec_jax.load_model(M)
prompts = tasks.task_prompts(model, task, n, 400, chat=True)
store = suffix_store.SuffixStore() if variant != "nostore" else False
F, J = 15.75, 4.25
C = lambda T: (F + T + J * (T > 1)) / (F + 1)
r = hispec_jax.generate(model, prompts, max_new_tokens=128, max_cache_len=640, batch_size=1,
                        cross_request=store)
cost = sum(cnt * C(int(T)) for T, cnt in r.stats["passes_per_block"][1].items())
lk = r.stats["lookup"]; fe = lk["from_earlier_requests"]
out = dict(task=task, variant=variant, rule=os.environ.get("HISPEC_STORE_RULE", "value"),
           prior_rej=os.environ.get("HISPEC_STORE_PRIOR_REJ", "0"),
           tokens=r.stats["new_tokens"], rounds=r.stats["rounds"], cost=cost,
           tokens_per_cost=r.stats["new_tokens"] / cost, tok_s=r.stats["tokens_per_second"],
           own=[lk["proposed"] - fe["proposed"], lk["accepted"] - fe["accepted"], lk["matches"] - fe["matches"]],
           store=[fe["proposed"], fe["accepted"], fe["matches"]],
           digest=hash(tuple(map(tuple, r.token_ids))))
print(json.dumps(out), flush=True)
