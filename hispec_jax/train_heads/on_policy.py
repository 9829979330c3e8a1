"""On-policy head-training data: the model's own continuations of ShareGPT training prompts.

Off-policy training (`data_source="sharegpt"`) teaches the exits on human-written text; in
decoding they draft on the model's own text, whose statistics differ (the model repeats
itself, stays on its favourite tokens). `data_source="on_policy"` trains on what decoding
will see:

    prompts  the first `on_policy_prompts` ShareGPT *training* conversations' first user
             turns, `"User: {turn}\\nAssistant:"`, of at most MAX_PROMPT_TOKENS tokens
    docs     prompt ids + the model's continuation: `hispec_jax.generate(method="ar")`,
             greedy (`on_policy_sampling="greedy"`) or sampled at `on_policy_temperature`
             with the run's seed ("sampled"), `on_policy_new_tokens` new tokens at most (up
             to EOS), `on_policy_batch` prompts per batch
    rows     packed like ShareGPT text (`rows._packed_rows`, epoch-0 packing, seed)

The teacher is still the final layer on those rows (KL or CE, the run's `loss`); held-out
rows stay the ShareGPT evaluation split, so teacher-forced agreement is comparable between
data sources. Generation is cached on disk (`<cache_dir>/on_policy/<key>.tokens.npy` +
`.offsets.npy`, key = hash of the model's fingerprint, the prompts and the generation
settings), so a rerun or a second run on the same data skips it.

Both trainers read this data through `config_docs`: `train-heads` (`data_source`, the
`on_policy_*` keys at the top of its config; `rows.on_policy_rows`) and `hispec pretrain`
(`data.source`, the same `on_policy_*` keys in `config.data`; `pretrain.prepare_data`, the
continuations of the `init_from` model, generated once before training).

Shapes: docs are int32 [prompt + continuation] (lengths vary); rows int32 [N, seq_len].
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Sequence

import jax
import numpy as np

from hispec_jax.models.model import Model
from hispec_jax.models.params import with_layer_layout

SAMPLINGS = ("greedy", "sampled")
MAX_PROMPT_TOKENS = 128  # prompts longer than this are skipped (the rows stay mostly model text)


@dataclasses.dataclass(frozen=True)
class Generation:
    """How the continuations are made (all of it goes into the cache key)."""

    new_tokens: int
    sampling: str = "greedy"   # "greedy" | "sampled"
    temperature: float = 1.0   # "sampled" only
    seed: int = 0
    batch_size: int = 16

    def __post_init__(self):
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"on_policy_sampling={self.sampling!r} must be 'greedy' or "
                             "'sampled'")
        for key, value in (("on_policy_new_tokens", self.new_tokens),
                           ("on_policy_batch", self.batch_size)):
            if value < 1:
                raise ValueError(f"{key}={value} must be >= 1")
        if self.sampling == "sampled" and self.temperature <= 0:
            raise ValueError(f"on_policy_temperature={self.temperature} must be > 0 for "
                             "sampled continuations")


def model_fingerprint(model: Model) -> str:
    """What identifies the model's weights: its config and weight files' contents (a model
    with a directory: a fresh checkout or a copy keeps the key), else a hash of every
    parameter's bytes."""
    h = hashlib.sha1(json.dumps(model.cfg.to_hf_dict(), sort_keys=True).encode())
    files = sorted(Path(model.path).glob("*.safetensors")) if model.path else []
    files = [f for f in files if f.name != "exit_heads.safetensors"]
    if files:
        for f in files:
            h.update(f.name.encode() + b":")
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 24), b""):
                    h.update(chunk)
    else:
        for leaf in jax.tree.leaves(model.params):
            h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()


def _cache_key(model: Model, prompts: Sequence[Sequence[int]], gen: Generation) -> str:
    h = hashlib.sha1(model_fingerprint(model).encode())
    h.update(json.dumps(dataclasses.asdict(gen), sort_keys=True).encode())
    for p in prompts:
        h.update(np.asarray(p, np.int32).tobytes() + b"|")
    return h.hexdigest()[:20]


def continuation_docs(model: Model, prompts: Sequence[Sequence[int]], gen: Generation,
                      cache_dir: str | Path | None = None,
                      log: Callable[[str], None] = print) -> list[np.ndarray]:
    """Per prompt, int32 `prompt ids + the model's continuation` (module docstring), read from
    `cache_dir` when this model, these prompts and `gen` were generated before."""
    from hispec_jax import generate

    files = None
    if cache_dir is not None:
        key = Path(cache_dir).expanduser() / "on_policy" / _cache_key(model, prompts, gen)
        files = Path(f"{key}.tokens.npy"), Path(f"{key}.offsets.npy")
        if all(f.exists() for f in files):
            flat, offsets = np.load(files[0]), np.load(files[1])
            log(f"on-policy data: {len(offsets) - 1} continuations from {key}")
            return [flat[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
    # decoding runs fastest on the backend's layout (CPU: unrolled); the math is the same
    decoding_model = dataclasses.replace(model, params=with_layer_layout(model.params,
                                                                         "unrolled"))
    result = generate(decoding_model, [list(p) for p in prompts], method="ar",
                      max_new_tokens=gen.new_tokens, batch_size=gen.batch_size,
                      temperature=0.0 if gen.sampling == "greedy" else gen.temperature,
                      seed=gen.seed)
    docs = [np.asarray(list(p) + list(c), np.int32)
            for p, c in zip(result.prompt_token_ids, result.token_ids)]
    log(f"on-policy data: generated {sum(map(len, result.token_ids))} tokens "
        f"({gen.sampling}) for {len(docs)} prompts at "
        f"{result.stats['tokens_per_second']:.0f} tokens/s")
    if files is not None:
        files[0].parent.mkdir(parents=True, exist_ok=True)
        offsets = np.cumsum([0] + [len(d) for d in docs]).astype(np.int64)
        for arr, final in ((np.concatenate(docs), files[0]), (offsets, files[1])):
            tmp = final.with_name(final.name + ".tmp.npy")  # rename: never half-written
            np.save(tmp, arr)
            os.replace(tmp, final)
    return docs


def generation_from_config(keys, seed: int) -> Generation:
    """The `Generation` a config's `on_policy_new_tokens`, `_sampling`, `_temperature` and
    `_batch` keys describe (`keys`: train-heads' config or pretrain's `config.data`);
    ValueError naming the key with a bad value."""
    if keys.on_policy_prompts < 1:
        raise ValueError(f"on_policy_prompts={keys.on_policy_prompts} must be >= 1")
    return Generation(new_tokens=keys.on_policy_new_tokens, sampling=keys.on_policy_sampling,
                      temperature=keys.on_policy_temperature, seed=seed,
                      batch_size=keys.on_policy_batch)


def config_docs(model: Model, keys, seed: int, cache_dir: str | Path | None,
                log: Callable[[str], None] = print) -> tuple[Generation, list[np.ndarray]]:
    """(generation settings, docs): `model`'s continuations of the first
    `keys.on_policy_prompts` ShareGPT training prompts as `keys` asks (`generation_from_config`),
    cached under `cache_dir`."""
    gen = generation_from_config(keys, seed)
    prompts = training_prompts(model, keys.on_policy_prompts)
    return gen, continuation_docs(model, prompts, gen, cache_dir=cache_dir, log=log)


def training_prompts(model: Model, num_prompts: int,
                     max_prompt_tokens: int = MAX_PROMPT_TOKENS) -> list[list[int]]:
    """Token ids of the first `num_prompts` ShareGPT training conversations' first user
    turns with at most `max_prompt_tokens` tokens (never the evaluation split)."""
    from hispec_jax import datasets

    if model.tokenizer is None:
        raise ValueError("data_source='on_policy' needs the model's tokenizer (for the "
                         "ShareGPT prompts), and the model directory has none")
    train_records, _ = datasets.split_sharegpt(datasets.load_sharegpt().records)
    texts = (p for p in map(datasets.first_user_prompt, train_records) if p is not None)
    token_ids = (model.tokenizer(text)["input_ids"] for text in texts)
    return datasets.first_prompts(token_ids, num_prompts, max_prompt_tokens,
                                  source="the ShareGPT training split has")
