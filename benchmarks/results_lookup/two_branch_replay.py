"""Would a second lookup candidate, verified in the same pass, pay? A replay over SmolLM2's
own continuations.

    python benchmarks/results_lookup/two_branch_replay.py > benchmarks/results_lookup/two_branch_replay.txt

The engine's lookup proposes one chain: the tokens after the most recent earlier occurrence
of the longest matching suffix (`decoding/lookup.py`). When that chain is wrong, an older
occurrence may continue differently and be right. A tree verification (both chains in one
block, each attending to its own prefix) would keep the longer agreeing chain, at the price
of the whole block's positions. This replay prices that idea before anyone builds it, on the
continuations and pass costs of `ngram_replay.py` (16 chat prompts per task, 128 new tokens,
a pass over T positions charged `ngram_replay.COST` at the next power of two):

    one chain       the engine's rule (the default `PromptLookup`)
    two chains      + the most recent occurrence (any suffix length, longest first) whose
                    next token differs from the first chain's, as many tokens as its
                    n-gram allows within a 16-position block
    two halves      both chains cut to 8 positions (a 16-position block)
    best match      an oracle: the best single chain among all occurrences, charged as
                    the engine's one chain (what any way of picking one chain could reach)

Printed: emitted tokens per AR step of cost (decode only), and the ratio to one chain.
"""

from __future__ import annotations

import numpy as np

from hispec_jax.decoding.lookup import PromptLookup

import ngram_replay

DRAFTER = PromptLookup(16, 8, schedule="ngram")  # the engine's default rule
BLOCK = 16  # the largest compiled verification block of the default drafter


def occurrences(context: list[int], max_ngram: int) -> list[tuple[int, int]]:
    """[(n, j)]: every earlier occurrence of the context's last n tokens (ending at j < c),
    longest n first, most recent first within an n (the first is the engine's match)."""
    c = len(context) - 1
    arr = np.asarray(context)
    found = []
    for n in range(min(max_ngram, c), 0, -1):
        rows = np.lib.stride_tricks.sliding_window_view(arr[:c], n)
        hits = np.flatnonzero((rows == arr[c - n + 1:]).all(axis=1))
        found += [(n, int(h) + n - 1) for h in hits[::-1]]
    return found


def agreeing(chain: list[int], out: list[int], i: int) -> int:
    """How many of `chain`'s tokens equal the continuation from position i."""
    kept = 0
    while kept < len(chain) and i + kept < len(out) and chain[kept] == out[i + kept]:
        kept += 1
    return kept


def chains(context, limit: int, mode: str) -> tuple[list[list[int]], int]:
    """(the chains verified this round, positions of the block); no chain: an AR step."""
    c = len(context) - 1
    found = occurrences(context, DRAFTER.max_ngram)
    if not found:
        return [], 1

    def chain(n, j, most):
        return context[j + 1:j + 1 + max(1, min(c - j, limit, DRAFTER.ngram_tokens(n), most))]

    first = chain(*found[0], BLOCK // 2 if mode == "two halves" else BLOCK)
    if mode == "best match":
        return [chain(n, j, BLOCK) for n, j in found], len(first)
    if mode == "one chain":
        return [first], len(first)
    room = BLOCK // 2 if mode == "two halves" else BLOCK - len(first)
    second = next((chain(n, j, room) for n, j in found[1:] if context[j + 1] != first[0]), None)
    if second is None or room < 1:
        return [first], len(first)
    return [first, second], len(first) + len(second)


def replay(records, mode: str) -> float:
    """Emitted tokens per AR step of cost over `records` [(prompt, continuation)]."""
    cost = emitted = 0.0
    for prompt, out in records:
        context, i = list(prompt) + out[:1], 1  # the first token comes from the prefill
        while i < len(out):
            proposed, positions = chains(context, len(out) - i, mode)
            kept, longest = max(((agreeing(ch, out, i), len(ch)) for ch in proposed),
                                default=(0, 1))
            n = kept if kept == longest else kept + 1  # + the verifier's own token
            cost += ngram_replay.COST[1 << (positions - 1).bit_length()]
            context += out[i:i + n]
            i += n
            emitted += n
    return emitted / cost


def main() -> None:
    records = ngram_replay.continuations()
    modes = ("one chain", "two chains", "two halves", "best match")
    print(f"# SmolLM2-135M-Instruct, greedy continuations of {ngram_replay.PROMPTS} chat "
          f"prompts per task ({ngram_replay.NEW_TOKENS} new tokens); pass costs "
          f"{ngram_replay.COST} AR steps\n")
    print("| task | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    for task in ngram_replay.TASKS:
        speed = [replay(records[task], m) for m in modes]
        print(f"| {task} | " + " | ".join(f"{s:.2f} ({s / speed[0]:.3f})" for s in speed)
              + " |", flush=True)
    print("\n(emitted tokens per AR step of cost, decode only; in brackets / one chain)")


if __name__ == "__main__":
    main()
