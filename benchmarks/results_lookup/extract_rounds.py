"""Is extract's lookup loop (SmolLM2, --chat, 8 prompts, 64 new tokens) all passes, or is
there a per-round overhead to remove?

    python benchmarks/results_lookup/extract_rounds.py

Per prompt, a 1-token and a 64-token generate (their difference: the loop) for AR and for
lookup; the lookup's verification passes (`verified_length_histogram`) are priced at the
pass costs of `pass_costs.txt` (in AR steps, at the compiled power-of-two block) and
compared with its loop time. Two repetitions after a compiling one.
"""

import numpy as np

from hispec_jax import load_model
from hispec_jax.api import generate
from hispec_jax.bench import tasks
from hispec_jax.models.pull import pull

# a pass over T positions in AR steps, at the compiled power-of-two block (pass_costs.txt)
COST = {1: 1.0, 2: 1.18, 4: 1.24, 8: 1.45, 16: 1.92}


def block(n: int) -> int:
    return min(b for b in COST if b >= n)


def run(model, prompts, method: str):
    """Per prompt: (1-token seconds, 64-token seconds, the 64-token run's stats)."""
    out = []
    for p in prompts:
        first = generate(model, [p], method=method, max_new_tokens=1, ignore_eos=True)
        whole = generate(model, [p], method=method, max_new_tokens=64, ignore_eos=True)
        out.append((first.stats["decode_seconds"], whole.stats["decode_seconds"], whole.stats))
    return out


def main():
    model = load_model(str(pull("smollm2-135m-instruct")))
    prompts = tasks.task_prompts(model, "extract", 8, 512, True)
    run(model, prompts, "ar")  # compiles
    run(model, prompts, "lookup")
    for _ in range(2):
        ar, lk = run(model, prompts, "ar"), run(model, prompts, "lookup")
        ar_loop = sum(b - a for a, b, _ in ar)
        lk_loop = sum(b - a for a, b, _ in lk)
        steps = sum(s["rounds"] for _, _, s in ar)
        step = ar_loop / steps
        hist = np.sum([np.asarray(s["verified_length_histogram"]) for _, _, s in lk], axis=0)
        rounds = sum(s["rounds"] for _, _, s in lk)
        passes = sum(c * COST[block(n)] for n, c in enumerate(hist) if n and c)
        print(f"AR loop {ar_loop:.2f}s {steps} steps {1e3 * step:.1f} ms/step | lookup loop "
              f"{lk_loop:.2f}s rounds {rounds} ({1e3 * lk_loop / rounds:.1f} ms = "
              f"{lk_loop / rounds / step:.2f} AR steps) | passes at pass_costs {passes:.0f} AR "
              f"steps = {passes * step:.2f}s -> unexplained {lk_loop - passes * step:.2f}s; "
              f"hist {hist.tolist()}", flush=True)


if __name__ == "__main__":
    main()
