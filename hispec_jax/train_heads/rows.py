"""Token rows for head training and the order batches visit them.

Head training reads a fixed set of packed rows (int32 [N, seq_len]) for every epoch, so the
frozen base's features of each row can be cached once (`features.FeatureCache`) and both
the cached and the uncached pipeline see exactly the same batches:

- "sharegpt": the ShareGPT training split (`datasets.split_sharegpt`), tokenized with the
  model's tokenizer, packed once by `data.PackedBatches` (its epoch-0 packing, inputs
  `row[:-1]`); held-out rows come from the evaluation split, packed without shuffling.
- "random": uniformly random token ids (tests, smoke runs, throughput measurements).

`RowOrder`: batch `step` takes rows `perm_e[i·B : (i+1)·B]` where `e, i = divmod(step,
batches_per_epoch)` and `perm_e` is a permutation seeded by (seed, e): a pure function of
the step, so a resumed run continues with exactly the batches it would have seen.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hispec_jax import datasets
from hispec_jax.models.model import Model


@dataclasses.dataclass
class TokenRows:
    """Training and held-out rows, int32 [N, T] and [M, T]; `source` describes them."""

    train: np.ndarray
    eval: np.ndarray
    source: str


@dataclasses.dataclass(frozen=True)
class RowOrder:
    """Which training rows batch `step` holds (module docstring)."""

    num_rows: int
    batch_size: int
    seed: int

    @property
    def batches_per_epoch(self) -> int:
        return self.num_rows // self.batch_size

    def rows(self, step: int) -> np.ndarray:
        epoch, index = divmod(step, self.batches_per_epoch)
        perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
        return perm[index * self.batch_size:(index + 1) * self.batch_size]


def random_rows(vocab_size: int, seq_len: int, num_train: int, num_eval: int,
                seed: int) -> TokenRows:
    """Uniformly random token rows (separate streams for training and held-out rows)."""
    train = np.random.default_rng([seed, 0]).integers(0, vocab_size, (num_train, seq_len))
    held_out = np.random.default_rng([seed, 1]).integers(0, vocab_size, (num_eval, seq_len))
    return TokenRows(train=train.astype(np.int32), eval=held_out.astype(np.int32),
                     source=f"random tokens ({num_train} training rows)")


def _packed_rows(docs, seq_len: int, seed: int, eos_id: int, shuffle: bool) -> np.ndarray:
    from hispec_jax.train_heads.data import PackedBatches

    packed = PackedBatches(docs, seq_len=seq_len, batch_size=1, seed=seed, eos_id=eos_id,
                           shuffle=shuffle)
    rows = [packed.batch(i)[0, :seq_len] for i in range(packed.rows_per_epoch)]
    return np.stack(rows).astype(np.int32)


def sharegpt_rows(model: Model, seq_len: int, max_train_docs: int, num_eval: int,
                  seed: int) -> TokenRows:
    """Packed ShareGPT rows tokenized with `model.tokenizer` (module docstring)."""
    from hispec_jax.train_heads import data

    if model.tokenizer is None:
        raise ValueError("data_source='sharegpt' needs the model's tokenizer, and the model "
                         "directory has none")
    records = datasets.load_sharegpt().records
    train_records, eval_records = datasets.split_sharegpt(records)
    if max_train_docs:
        train_records = train_records[:max_train_docs]
    token_dir = data.DEFAULT_CACHE_DIR / "tokens"
    eos_id = (model.eos_token_ids or (model.tokenizer.eos_token_id,))[0]
    train_docs = data.tokenize_docs(model.tokenizer, [datasets.conversation_text(r) for r in train_records],
                                    cache_dir=token_dir)
    eval_docs = data.tokenize_docs(model.tokenizer, [datasets.conversation_text(r) for r in eval_records],
                                   cache_dir=token_dir)
    train = _packed_rows(train_docs, seq_len, seed, eos_id, shuffle=True)
    held_out = _packed_rows(eval_docs, seq_len, seed, eos_id, shuffle=False)[:num_eval]
    return TokenRows(train=train, eval=held_out,
                     source=f"ShareGPT ({len(train_records)} training conversations, "
                            f"{len(train)} rows of {seq_len} tokens)")


def load_rows(config, model: Model) -> TokenRows:
    """The run's rows from `config.data_source`."""
    if config.data_source == "random":
        return random_rows(model.cfg.vocab_size, config.seq_len, config.random_train_rows,
                           config.eval_rows, config.seed)
    return sharegpt_rows(model, config.seq_len, config.max_train_docs, config.eval_rows,
                         config.seed)
