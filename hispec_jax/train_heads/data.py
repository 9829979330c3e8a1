"""Training data: masks of assistant replies, a byte-level BPE tokenizer, cached
tokenization and deterministic sequence packing. The data sets themselves (ShareGPT,
HumanEval, the train / evaluation split) are `hispec_jax/datasets.py`.

Packing (`PackedBatches`): each document is `<s> tokens </s>`; per epoch the documents are
shuffled with a seed derived from (seed, epoch), concatenated into one stream and cut into
rows of `seq_len + 1` tokens (stride `seq_len`, so inputs `row[:-1]` and targets `row[1:]`
cover every stream token once). Batch `step` is a pure function of (docs, seed, step), so a
run resumes exactly with `batches_from(step)`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from hispec_jax.datasets import conversation_text, reply_spans
from hispec_jax.models.pull import default_cache_dir

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
SPECIAL_TOKENS = (UNK, BOS, EOS)  # ids 0, 1, 2 (Llama's order)
DEFAULT_CACHE_DIR = default_cache_dir()  # $HISPEC_CACHE: the one cache root (`models.pull`)


# ----- assistant replies ---------------------------------------------------------------

def reply_token_masks(tokenizer, records: Sequence[dict[str, Any]]) -> list[np.ndarray]:
    """Per record with non-empty text, an int32 0/1 array aligned with its `tokenize_docs`
    ids: 1 for the tokens that start inside an assistant reply (`reply_spans`), 0 for the
    user turns, role markers and specials. Evaluation "on replies" scores those tokens."""
    backend = tokenizer.backend_tokenizer
    masks = []
    for record in records:
        text = conversation_text(record)
        if not text:
            continue
        enc = backend.encode(text, add_special_tokens=True)
        starts = np.asarray([o[0] for o in enc.offsets])
        special = np.asarray(enc.special_tokens_mask, bool)
        inside = np.zeros(len(starts), bool)
        for a, b in reply_spans(record):
            inside |= (starts >= a) & (starts < b)
        masks.append((inside & ~special).astype(np.int32))
    return masks


# ----- tokenizer -----------------------------------------------------------------------

def train_tokenizer(texts: Sequence[str], vocab_size: int, out_dir: str | Path | None = None,
                    model_max_length: int | None = None):
    """Trains a byte-level BPE tokenizer; returns a `transformers.PreTrainedTokenizerFast`.

    Specials `<unk>`=0, `<s>`=1, `</s>`=2; ByteLevel pre-tokenizer and decoder (every byte
    is in the base alphabet, so any text round-trips); a post-processor that prepends `<s>`
    as Llama's does. Saved with `save_pretrained(out_dir)` when `out_dir` is given, so
    `AutoTokenizer.from_pretrained(out_dir)` loads it.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)])
    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS,
                                   unk_token=UNK, **extra)
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast


def _tokenizer_fingerprint(tokenizer) -> str:
    return hashlib.sha1(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:16]


def tokenize_docs(tokenizer, texts: Sequence[str], cache_dir: str | Path | None = None,
                  batch_size: int = 1000) -> list[np.ndarray]:
    """Token ids of every text (`<s>` prepended, no `</s>`), as int32 arrays.

    With `cache_dir`, the ids are stored as `<key>.tokens.npy` + `<key>.offsets.npy`, keyed
    by a hash of the tokenizer and the texts, and read back on the next call.
    """
    key = None
    if cache_dir is not None:
        h = hashlib.sha1(_tokenizer_fingerprint(tokenizer).encode())
        for t in texts:
            h.update(t.encode("utf-8", "surrogatepass"))
            h.update(b"\0")
        key = Path(cache_dir) / f"docs-{h.hexdigest()[:20]}"
        tokens_file, offsets_file = Path(f"{key}.tokens.npy"), Path(f"{key}.offsets.npy")
        if tokens_file.exists() and offsets_file.exists():
            flat, offsets = np.load(tokens_file), np.load(offsets_file)
            return [flat[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
    backend = tokenizer.backend_tokenizer
    docs: list[np.ndarray] = []
    for start in range(0, len(texts), batch_size):
        for enc in backend.encode_batch(list(texts[start:start + batch_size]),
                                        add_special_tokens=True):
            docs.append(np.asarray(enc.ids, np.int32))
    if key is not None:
        key.parent.mkdir(parents=True, exist_ok=True)
        offsets = np.cumsum([0] + [len(d) for d in docs]).astype(np.int64)
        flat = np.concatenate(docs) if docs else np.zeros((0,), np.int32)
        # Write to temporary names, then rename: a crash never leaves a half-written cache.
        for arr, final in ((flat, tokens_file), (offsets, offsets_file)):
            tmp = final.with_name(final.name + ".tmp.npy")
            np.save(tmp, arr)
            os.replace(tmp, final)
    return docs


# ----- packing -------------------------------------------------------------------------

class PackedBatches:
    """Deterministic, resumable packing of documents into [batch, seq_len + 1] int32 rows.

    Each document is followed by `eos_id` (`</s>`), documents are shuffled per epoch by
    `seed`, concatenated and cut into rows with stride `seq_len` (the last token of a row
    is the first of the next). Every epoch has the same number of batches
    (`batches_per_epoch`); the tail of the stream that does not fill a batch is dropped.

        batches = PackedBatches(docs, seq_len=256, batch_size=16, seed=0, eos_id=2)
        batches.batch(step)              # one batch, pure function of step
        for step, batch in batches.batches_from(k): ...   # resume at step k
    """

    def __init__(self, token_ids_per_doc: Sequence[np.ndarray], seq_len: int, batch_size: int,
                 seed: int, eos_id: int = 2, shuffle: bool = True):
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len={seq_len} and batch_size={batch_size} must be >= 1")
        self.docs = [np.asarray(d, np.int32) for d in token_ids_per_doc]
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.eos_id, self.shuffle = eos_id, shuffle
        self.num_tokens = sum(len(d) + 1 for d in self.docs)
        self.rows_per_epoch = max(0, (self.num_tokens - 1) // seq_len)
        self.batches_per_epoch = self.rows_per_epoch // batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(f"{self.num_tokens} tokens do not fill one batch of "
                             f"{batch_size} x {seq_len + 1}")
        self._epoch, self._stream = -1, None

    def _epoch_stream(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            order = np.arange(len(self.docs))
            if self.shuffle:
                order = np.random.default_rng([self.seed, epoch]).permutation(len(self.docs))
            eos = np.array([self.eos_id], np.int32)
            pieces = []
            for i in order:
                pieces += [self.docs[i], eos]
            self._stream, self._epoch = np.concatenate(pieces), epoch
        return self._stream

    def batch(self, step: int) -> np.ndarray:
        """Batch number `step` (0-based, counting across epochs): int32 [batch, seq_len + 1]."""
        epoch, index = divmod(step, self.batches_per_epoch)
        stream = self._epoch_stream(epoch)
        first_row = index * self.batch_size
        starts = (first_row + np.arange(self.batch_size)) * self.seq_len
        return stream[starts[:, None] + np.arange(self.seq_len + 1)[None, :]]

    def batches_from(self, step: int = 0, num_steps: int | None = None
                     ) -> Iterator[tuple[int, np.ndarray]]:
        """Yields (step, batch) from `step` on (forever, or `num_steps` batches)."""
        end = None if num_steps is None else step + num_steps
        while end is None or step < end:
            yield step, self.batch(step)
            step += 1
