"""Benchmark prompts: the ShareGPT evaluation split and HumanEval, as token ids.

ShareGPT prompts are the first user turn of each held-out conversation (the last 5 % of the
recovered records, never trained on), rendered in the default model's conversation format
`"User: {turn}\nAssistant:"`. HumanEval prompts are the problems' code prompts (function
signature + docstring), for code completion. Prompts are taken in dataset order; those
longer than `max_prompt_tokens` (after tokenization, BOS included) are skipped, never cut,
so every prompt reads as the dataset wrote it.
"""

from __future__ import annotations

import functools

DATASETS = ("sharegpt", "humaneval")


@functools.lru_cache(maxsize=None)
def dataset_texts(dataset: str) -> tuple[str, ...]:
    """Prompt texts of `dataset` ("sharegpt" or "humaneval"), in dataset order (parsed once
    per process)."""
    from hispec_jax.train_heads import data

    if dataset == "sharegpt":
        _, evaluation = data.split_sharegpt(data.load_sharegpt().records)
        texts = []
        for record in evaluation:
            turns = [t.get("value") or "" for t in record.get("conversations", [])
                     if str(t.get("from", "")).lower() in ("human", "user")]
            if turns and turns[0].strip():
                texts.append(f"User: {turns[0].strip()}\nAssistant:")
        return tuple(texts)
    if dataset == "humaneval":
        return tuple(data.load_humaneval_prompts())
    raise ValueError(f"dataset={dataset!r} is not one of {DATASETS}")


def load_prompts(dataset: str, tokenizer, num_prompts: int,
                 max_prompt_tokens: int) -> list[list[int]]:
    """The first `num_prompts` prompts of `dataset` with at most `max_prompt_tokens` tokens.

    Raises ValueError when the dataset has fewer such prompts.
    """
    if tokenizer is None:
        raise ValueError("benchmark prompts need a model with a tokenizer")
    prompts = []
    for text in dataset_texts(dataset):
        ids = tokenizer(text)["input_ids"]
        if len(ids) <= max_prompt_tokens:
            prompts.append(ids)
            if len(prompts) == num_prompts:
                return prompts
    raise ValueError(f"{dataset} has only {len(prompts)} prompts of at most "
                     f"{max_prompt_tokens} tokens; {num_prompts} were asked for")
