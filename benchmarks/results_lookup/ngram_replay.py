"""How many tokens should a lookup propose? A replay over SmolLM2's own continuations.

    python benchmarks/results_lookup/ngram_replay.py > benchmarks/results_lookup/ngram_replay.txt

Generates SmolLM2-135M-Instruct's greedy continuations (128 new tokens, EOS kept) of the
first 16 chat-rendered prompts of each `hispec bench --tasks` task, then replays lookup
decoding on them in plain Python under several proposal rules: each round the rule proposes
m tokens from the sequence so far, the continuation keeps its agreeing prefix (greedy
acceptance), and the pass over m positions is charged its cost in AR steps at the next
power of two (the engine's compiled blocks): COST below, SmolLM2 on this CPU
(`pass_costs.py` and `.txt`). A round without a match
is the one-position pass, the AR step. Printed: AR steps saved per emitted token
(tokens / charged cost: decode only, no prefill, no timing), and each rule's ratio to the
"fixed" k = 8 with 3-grams of 2026-11-26. It chose the "ngram" schedule
(`decoding/lookup.py`); wall time decides (`schedule_ab.py`, `ngram_ab_smollm2.txt`).
"""

from __future__ import annotations

import math

from hispec_jax import load_model
from hispec_jax.api import generate
from hispec_jax.bench import tasks
from hispec_jax.decoding.lookup import PromptLookup
from hispec_jax.models.pull import pull
from hispec_jax.planner import latency

TASKS = ("summarize", "extract", "code", "chat")
# a pass over T positions, in AR steps (`pass_costs.txt`; 32: extrapolated, not measured,
# only k = 32 uses it)
COST = {1: 1.0, 2: 1.18, 4: 1.24, 8: 1.45, 16: 1.92, 32: 2.9}
PROMPTS, NEW_TOKENS = 16, 128


RULES = {  # name: the drafter (`PromptLookup(k, max_ngram, schedule)`)
    "fixed k=8 N=3 (before)": PromptLookup(8, 3, schedule="fixed"),
    "fixed k=8 N=8": PromptLookup(8, 8, schedule="fixed"),
    "fixed k=16 N=3": PromptLookup(16, 3, schedule="fixed"),
    "fixed k=4 N=3": PromptLookup(4, 3, schedule="fixed"),
    "ngram k=8 N=8": PromptLookup(8, 8, schedule="ngram"),
    "ngram k=16 N=3": PromptLookup(16, 3, schedule="ngram"),
    "ngram k=16 N=5": PromptLookup(16, 5, schedule="ngram"),
    "ngram k=16 N=8 (default)": PromptLookup(16, 8, schedule="ngram"),
    "ngram k=32 N=8": PromptLookup(32, 8, schedule="ngram"),
}


def replay(records, drafter: PromptLookup) -> float:
    """Emitted tokens per AR step of cost over `records` (prompt, continuation); each
    proposal is the planner's replay of the engine's (`latency._lookup_proposal`)."""
    cost = emitted = 0.0
    for prompt, out in records:
        context, i = list(prompt) + out[:1], 1  # the first token comes from the prefill
        while i < len(out):
            drafts, matched = latency._lookup_proposal(context, drafter, len(out) - i)
            m = len(drafts)  # 1 without a match: the placeholder, the AR step
            kept = 0
            while matched and kept < m and drafts[kept] == out[i + kept]:
                kept += 1
            n = min(kept + 1, m)  # the verifier's own token after a rejection
            cost += COST[1 << (m - 1).bit_length()]
            context += out[i:i + n]
            i += n
            emitted += n
    return emitted / cost


def continuations() -> dict[str, list]:
    """{task: [(prompt ids, SmolLM2's greedy continuation ids)]} of the first `PROMPTS`
    chat-rendered prompts of every task."""
    model = load_model(str(pull("smollm2-135m-instruct")))
    records = {}
    for task in TASKS:
        prompts = tasks.task_prompts(model, task, PROMPTS, 512, True)
        result = generate(model, prompts, max_new_tokens=NEW_TOKENS, batch_size=8)
        records[task] = list(zip(result.prompt_token_ids, result.token_ids))
    return records


def print_rule_table(rules: dict[str, PromptLookup], records) -> None:
    """One markdown row per rule: tokens per AR step of cost per task and, in brackets, the
    ratio to the first rule's; their geometric mean."""
    print("| rule | " + " | ".join(TASKS) + " | geometric mean |")
    print("|---|" + "---|" * (len(TASKS) + 1))
    base = None
    for name, drafter in rules.items():
        speed = [replay(records[t], drafter) for t in TASKS]
        base = base or speed
        ratios = [s / b for s, b in zip(speed, base)]
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"| {name} | " + " | ".join(f"{s:.2f} ({r:.3f})" for s, r in zip(speed, ratios))
              + f" | {geo:.3f} |", flush=True)


def main() -> None:
    records = continuations()
    print(f"# SmolLM2-135M-Instruct, greedy continuations of {PROMPTS} chat prompts per task "
          f"({NEW_TOKENS} new tokens, EOS kept); pass costs {COST} AR steps\n")
    print_rule_table(RULES, records)
    print("\n(tokens per AR step of cost, decode only; in brackets the ratio to the first row)")


if __name__ == "__main__":
    main()
