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

from ngram_replay import NEW_TOKENS, PROMPTS, continuations, print_rule_table

from hispec_jax.decoding.lookup import PromptLookup


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
    records = continuations()
    print(f"# SmolLM2-135M-Instruct, greedy continuations of {PROMPTS} chat prompts per task "
          f"({NEW_TOKENS} new tokens); tokens per AR step of cost, in brackets / the default\n")
    print_rule_table(RULES, records)


if __name__ == "__main__":
    main()
