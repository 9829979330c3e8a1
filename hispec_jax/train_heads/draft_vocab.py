"""Draft vocabularies: exit heads that can only propose the K most frequent tokens.

A drafter pays for a full-vocabulary head at every draft step. On small models with large
vocabularies that head is most of the step: SmolLM2-135M's tied LM head is 576 x 49,152
(28 M parameters), the size of 8 of its 30 transformer layers, so a draft at exit 8 costs
about as much as 16 layers. Restricting a draft head to the K tokens that make up most of
the text (the idea of frequency-ranked drafting, FR-Spec) cuts that to K/V of it:

    head at exit e                 cost per draft token     proposes
    shared / trained, full         D x V                    any token
    + draft vocabulary of K        D x K  (+ a V-wide fill) the K tokens, -inf elsewhere

Exactness is untouched: the final layer still verifies over all V tokens. A draft of a
token outside the vocabulary is simply never made (where the final layer wants one, that
round's draft is rejected and the verifier's token is emitted), and in sampling mode the
draft distribution q is zero there, which the acceptance rules already handle.

The vocabulary is counted from ShareGPT training conversations tokenized with the model's
tokenizer (`token_counts`), always keeps the model's end-of-sequence tokens, and is stored
with the head (`vocab` [K] int32, sorted; `models/heads.py`, `models/hf_io.py`).

    hispec draft-vocab --model DIR --size 8192 --exits 8,15,22 --out OUT_DIR
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from hispec_jax import datasets
from hispec_jax.models.heads import head_kind, lm_head_matrix, projection_kind
from hispec_jax.models.hf_io import check_draft_vocab
from hispec_jax.models.model import Model
from hispec_jax.models.params import ExitHeads


def token_counts(model: Model, max_docs: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """(train_counts [V], held_out_counts [V]) int64: how often each token occurs in the
    first `max_docs` ShareGPT training conversations and in the evaluation split, in the
    project's `User: ... / Assistant: ...` format, tokenized with the model's tokenizer."""
    from hispec_jax.train_heads import data

    if model.tokenizer is None:
        raise ValueError("a draft vocabulary is counted from text: the model has no tokenizer")
    if max_docs < 1:
        raise ValueError(f"max_docs must be >= 1, got {max_docs}")
    train, held_out = datasets.split_sharegpt(datasets.load_sharegpt().records)
    V = model.cfg.vocab_size

    def count(records) -> np.ndarray:
        docs = data.tokenize_docs(model.tokenizer, [datasets.conversation_text(r) for r in records],
                                  cache_dir=data.DEFAULT_CACHE_DIR / "tokens")
        ids = np.concatenate([np.asarray(d, np.int64) for d in docs]) if docs else np.zeros(0, int)
        return np.bincount(ids[(ids >= 0) & (ids < V)], minlength=V)

    return count(train[:max_docs]), count(held_out)


def choose_vocab(counts_V: np.ndarray, size: int, always: Sequence[int] = ()) -> np.ndarray:
    """The `size` most frequent token ids (ties: lower id first), `always` included, sorted,
    int32. Raises ValueError if `size` is outside [len(always), V]."""
    counts_V = np.asarray(counts_V)
    V = counts_V.shape[0]
    always = sorted({int(t) for t in always})
    if any(not 0 <= t < V for t in always):
        raise ValueError(f"token ids to keep {always} must be in [0, {V})")
    if not isinstance(size, (int, np.integer)) or not max(1, len(always)) <= size <= V:
        raise ValueError(f"draft vocabulary size must be an integer in [{max(1, len(always))}, "
                         f"{V}] (the vocabulary has {V} tokens), got {size!r}")
    order = np.lexsort((np.arange(V), -counts_V))  # most frequent first, then by id
    rest = order[~np.isin(order, always)][:size - len(always)]
    return np.sort(np.concatenate([always, rest])).astype(np.int32)


def coverage(counts_V: np.ndarray, vocab_K: np.ndarray) -> float:
    """Fraction of the counted tokens that lie inside the vocabulary."""
    total = int(np.sum(counts_V))
    return float(np.sum(np.asarray(counts_V)[vocab_K]) / total) if total else 0.0


def restrict_heads(model: Model, exits: Sequence[int], vocab_K: np.ndarray) -> ExitHeads:
    """The model's exit heads with those at `exits` restricted to `vocab_K`: a trained head
    keeps its norm and the vocabulary's columns of its projection (low rank: of `proj_up`);
    an exit without one gets the shared final norm and the LM head's columns. Heads at other
    exits are kept as they are. Each restricted head proposes, among the vocabulary's tokens,
    exactly what the unrestricted head would rank highest there."""
    cfg = model.cfg
    vocab = jnp.asarray(check_draft_vocab(vocab_K, cfg.vocab_size, "draft vocabulary"))
    heads = dict(model.heads)
    for e in exits:
        if not 1 <= int(e) < cfg.num_layers:
            raise ValueError(f"exit {e} is outside [1, {cfg.num_layers - 1}] (exit L is the "
                             "model itself and verifies over the whole vocabulary)")
        kind = head_kind(cfg, model.heads, int(e))
        if kind != "shared" and "vocab" in model.heads[str(e)]:
            raise ValueError(f"exit {e} already has a draft vocabulary")
        head = {} if kind == "shared" else dict(model.heads[str(e)])
        if projection_kind(cfg, model.heads, int(e)) == "shared":  # (an adapter's too)
            head.update(norm=model.params["final_norm"], proj=lm_head_matrix(model.params, cfg))
        columns = "proj" if "proj" in head else "proj_up"  # the [., V] projection
        head[columns] = jnp.take(head[columns], vocab, axis=1)
        heads[str(int(e))] = {**head, "vocab": vocab}
    return dict(sorted(heads.items(), key=lambda kv: int(kv[0])))
