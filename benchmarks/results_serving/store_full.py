"""The store's work model once it already holds W earlier answers of the task (a server in
steady state; W = 0: the store growing from empty), against the same prompts without it.

    PYTHONPATH=. python benchmarks/results_serving/store_full.py TASK W M

Runs the task's first W prompts into a store (batch 1, 128 new tokens, gated prompt
lookup), then its next M prompts with and without that store (the store growing as they
finish) and prints tokens per unit of pass cost for each: the rounds' level-1 blocks priced
by the gate's CPU default C(1, T) = (F + T + J [T > 1]) / (F + 1), F = 15.75, J = 4.25
(noise-free; the outputs are the same either way)."""
import sys

import hispec_jax
from hispec_jax.bench import tasks
from hispec_jax.decoding import suffix_store

MODEL = "/root/.cache/hispec/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
F, J = 15.75, 4.25


def pass_cost(T: int) -> float:
    return (F + T + J * (T > 1)) / (F + 1)


def main(task: str, W: int, M: int) -> None:
    model = hispec_jax.load_model(MODEL)
    prompts = tasks.task_prompts(model, task, W + M, 400, chat=True)
    store = suffix_store.SuffixStore()
    options = dict(max_new_tokens=128, max_cache_len=640, batch_size=1)
    if W:
        hispec_jax.generate(model, prompts[:W], cross_request=store, **options)
    speed = {}
    for variant in ("off", "on"):
        r = hispec_jax.generate(model, prompts[W:], cross_request=store if variant == "on"
                                else False, **options)
        cost = sum(n * pass_cost(int(T)) for T, n in r.stats["passes_per_block"][1].items())
        earlier = r.stats["lookup"]["from_earlier_requests"]
        speed[variant] = r.stats["new_tokens"] / cost
        print(f"{task} W={W} store {variant}: tokens/cost {speed[variant]:.3f}, store tokens "
              f"kept/proposed {earlier['accepted']}/{earlier['proposed']}", flush=True)
    print(f"{task} W={W}: store on x off {speed['on'] / speed['off']:.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
