"""Is the "ngram" proposal rule (`lookup.PromptLookup.ngram_tokens`) a local optimum? Its
neighbours replayed on the same continuations as `ngram_replay.py`.

    python benchmarks/results_lookup/ngram_neighbours.py > benchmarks/results_lookup/ngram_neighbours.txt

The default rule at k = 16, N = 8 proposes 4 tokens after a 1-gram match, 8 after a 2-4-gram
match and 16 from a 5-gram up. Each row changes one of these (or two); tokens per AR step of
cost (decode only) and the ratio to the default, per task, from `ngram_replay.replay` on
SmolLM2's greedy continuations of 16 chat prompts per task (128 new tokens).
"""

from __future__ import annotations

import dataclasses
import math

from ngram_replay import NEW_TOKENS, PROMPTS, TASKS, replay

from hispec_jax import load_model
from hispec_jax.api import generate
from hispec_jax.bench import tasks
from hispec_jax.decoding.lookup import PromptLookup
from hispec_jax.models.pull import pull


def rule(one: int, mid: int, full_at: int = 5) -> PromptLookup:
    """"ngram" with `one` tokens after a 1-gram, `mid` after a 2..full_at-1-gram, k after
    longer matches."""
    @dataclasses.dataclass(frozen=True)
    class Rule(PromptLookup):
        def ngram_tokens(self, ngram):
            if ngram >= min(full_at, self.max_ngram):
                return self.max_tokens
            return one if ngram < 2 else mid
    return Rule(16, 8, schedule="ngram")


RULES = {
    "default: 1-gram 4, 2-4-gram 8, 5-gram+ 16": PromptLookup(16, 8, schedule="ngram"),
    "1-gram 1": rule(1, 8),
    "1-gram 2": rule(2, 8),
    "1-gram 8": rule(8, 8),
    "2-4-gram 4": rule(4, 4),
    "2-4-gram 16": rule(4, 16),
    "all 16 from a 3-gram": rule(4, 8, full_at=3),
    "all 16 from an 8-gram": rule(4, 8, full_at=8),
    "1-gram 2, 2-4-gram 4": rule(2, 4),
}


def main() -> None:
    model = load_model(str(pull("smollm2-135m-instruct")))
    records = {}
    for task in TASKS:
        prompts = tasks.task_prompts(model, task, PROMPTS, 512, True)
        result = generate(model, prompts, max_new_tokens=NEW_TOKENS, batch_size=8)
        records[task] = list(zip(result.prompt_token_ids, result.token_ids))
    print(f"# SmolLM2-135M-Instruct, greedy continuations of {PROMPTS} chat prompts per task "
          f"({NEW_TOKENS} new tokens); tokens per AR step of cost, in brackets / the default\n")
    print("| rule | " + " | ".join(TASKS) + " | geometric mean |")
    print("|---|" + "---|" * (len(TASKS) + 1))
    base = None
    for name, drafter in RULES.items():
        speed = [replay(records[t], drafter) for t in TASKS]
        base = base or speed
        ratios = [s / b for s, b in zip(speed, base)]
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"| {name} | " + " | ".join(f"{s:.2f} ({r:.3f})" for s, r in zip(speed, ratios))
              + f" | {geo:.3f} |", flush=True)


if __name__ == "__main__":
    main()
