"""What head training reads from the frozen base: exit-layer hidden states and final targets.

`compute_features` runs the frozen model once over a batch of token rows and returns the
hidden states at the head layers plus the final layer's softened targets (`losses.Targets`).
The base never changes, so these can be computed once and reused for every epoch
(SpecBound's "feature caching"): `FeatureCache` stores them in on-disk `.npy` shards and
hands back any set of rows, so training with the cache never runs the base model.

Cache layout (`<cache_dir>/<key>/`, key = hash of model, data rows and settings):

    meta.json                       settings, shapes, dtypes, rows per shard
    hidden-00000.npy                [R, E, T, D] hidden states at the E head layers
                                    (bfloat16 stored as its uint16 bits, or float32)
    log_probs-00000.npy             [R, T, K] float32 teacher log p of its top-k tokens
    ids-00000.npy                   [R, T, K] int32 their token ids
    tail_log_prob-00000.npy         [R, T]    float32 log of the teacher mass outside the top k
    ...                             (top_k = 0: log_probs is [R, T, V], no ids / tail)

Per token that is E·D·2 bytes (bf16) + 8K + 4 bytes: for Qwen3-8B with 8 heads and k = 64,
64 KiB + 516 B, against 8 · 4096 · 2 + 151936 · 4 ≈ 650 KiB with full-vocabulary targets.
A cache is built in `<key>.tmp-<pid>` and renamed when complete, so a run killed while
building leaves no half cache behind (the next run builds it again).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from hispec_jax.models.config import ModelConfig
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import Params
from hispec_jax.models.transformer import embed, run_layers
from hispec_jax.train_heads.losses import Targets, make_targets

SHARD_BYTES = 1 << 30  # target size of one shard's hidden-state file


@flax.struct.dataclass
class Features:
    """A batch of head-training inputs.

    Attributes:
      hidden: [B, E, T, D] hidden states after each of the E head layers (in `head_layers`
        order), in the model's or the cache's dtype.
      targets: the final layer's distributions at temperature T.
    """

    hidden: jax.Array
    targets: Targets


def base_hidden_states(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array,
                       head_layers: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """Runs the frozen model over full rows: (hidden [B, E, T, D] at head layers, final logits).

    Rows are independent sequences starting at position 0, so the KV cache is never read:
    a one-slot dummy cache satisfies `run_layers` (its context mask hides every slot).
    """
    B, T = tokens_BxT.shape
    positions_BxT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    no_context = KVCache.zeros(cfg, B, capacity=1)
    x = embed(params, tokens_BxT)
    hidden, start = [], 0
    for stop in (*head_layers, cfg.num_layers):
        x, _ = run_layers(params, cfg, x, positions_BxT, no_context, start, stop)
        hidden.append(x)
        start = stop
    final_logits = exit_logits(params, {}, cfg, hidden.pop(), cfg.num_layers)
    return jnp.stack(hidden, axis=1), final_logits


@functools.partial(jax.jit, static_argnames=("cfg", "head_layers", "temperature", "top_k",
                                             "hidden_dtype"))
def compute_features(params: Params, tokens_BxT: jax.Array, *, cfg: ModelConfig,
                     head_layers: tuple[int, ...], temperature: float, top_k: int,
                     hidden_dtype: str | None = None) -> Features:
    """`Features` of a batch of rows (jitted; everything but params and tokens is static).

    Args:
      params: frozen model parameters.
      tokens_BxT: int32 token rows.
      cfg, head_layers: the model and the exits with trained heads (sorted).
      temperature, top_k: target settings (`losses.make_targets`; top_k 0 = full vocab).
      hidden_dtype: dtype of the returned hidden states (None: the model's).
    """
    hidden, final_logits = base_hidden_states(params, cfg, tokens_BxT, head_layers)
    if hidden_dtype is not None:
        hidden = hidden.astype(hidden_dtype)
    return Features(hidden=hidden, targets=make_targets(final_logits, temperature, top_k))


# ----- on-disk cache ---------------------------------------------------------------------

_FIELDS = ("hidden", "log_probs", "ids", "tail_log_prob")


def cache_key(settings: dict[str, Any], rows: np.ndarray) -> str:
    """A 16-hex-digit key of the cache's settings and the exact token rows it holds."""
    h = hashlib.sha1(json.dumps(settings, sort_keys=True).encode())
    h.update(np.ascontiguousarray(rows, np.int32).tobytes())
    return h.hexdigest()[:16]


def bytes_per_row(cfg: ModelConfig, num_heads: int, seq_len: int, top_k: int,
                  hidden_dtype: str) -> int:
    """Cache bytes of one row of `seq_len` tokens."""
    hidden = num_heads * seq_len * cfg.hidden_size * np.dtype(_np_dtype(hidden_dtype)).itemsize
    targets = seq_len * (cfg.vocab_size * 4 if top_k == 0 else top_k * 8 + 4)
    return hidden + targets


def _np_dtype(name: str):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


@dataclasses.dataclass
class FeatureCache:
    """Read access to a complete on-disk feature cache (module docstring)."""

    directory: Path
    meta: dict[str, Any]
    built_now: bool = False  # built by this `open_or_build` call (vs. reused)

    @property
    def num_rows(self) -> int:
        return self.meta["num_rows"]

    @functools.cached_property
    def _shards(self) -> list[dict[str, np.ndarray]]:
        out = []
        for s in range(self.meta["num_shards"]):
            shard = {}
            for field in self.meta["fields"]:
                arr = np.load(self.directory / f"{field}-{s:05d}.npy", mmap_mode="r")
                if field == "hidden" and self.meta["hidden_dtype"] == "bfloat16":
                    arr = arr.view(ml_dtypes.bfloat16)
                shard[field] = arr
            out.append(shard)
        return out

    def gather(self, row_ids) -> Features:
        """`Features` (numpy arrays) of the given rows, in that order."""
        per_shard = self.meta["rows_per_shard"]
        picked = {f: [] for f in self.meta["fields"]}
        for r in np.asarray(row_ids):
            shard = self._shards[int(r) // per_shard]
            for f in picked:
                picked[f].append(shard[f][int(r) % per_shard])
        arrays = {f: np.stack(v) for f, v in picked.items()}
        return Features(hidden=arrays["hidden"],
                        targets=Targets(log_probs=arrays["log_probs"], ids=arrays.get("ids"),
                                        tail_log_prob=arrays.get("tail_log_prob")))

    @classmethod
    def open_or_build(cls, root, settings: dict[str, Any], rows: np.ndarray,
                      compute: Callable[[np.ndarray], Features], batch_size: int,
                      row_bytes: int, max_bytes: float | None = None,
                      progress: Callable[[int], None] | None = None,
                      log: Callable[[str], None] = print) -> "FeatureCache":
        """Opens the cache of (settings, rows) under `root`, building it first if absent.

        Args:
          root: the cache root directory; this cache lives in `root/<cache_key>`.
          settings: everything the features depend on besides the rows (model, layers,
            temperature, top_k, dtype), JSON-serializable.
          rows: int32 [N, T] token rows.
          compute: rows [batch_size, T] -> `Features` (device or numpy arrays).
          batch_size: rows per `compute` call (the last call is padded to it).
          row_bytes: cache bytes per row (`bytes_per_row`), for the size check and shards.
          max_bytes: refuse to build a cache larger than this (ValueError).
          progress: called with the number of rows written after each batch.
        """
        root = Path(root).expanduser()
        directory = root / cache_key(settings, rows)
        if (directory / "meta.json").exists():
            meta = json.loads((directory / "meta.json").read_text())
            log(f"feature cache: reusing {directory} ({meta['num_rows']} rows, "
                f"{meta['num_bytes'] / 2**30:.3f} GiB)")
            return cls(directory, meta)
        num_rows = len(rows)
        total = row_bytes * num_rows
        if max_bytes is not None and total > max_bytes:
            raise ValueError(f"feature cache would need {total / 2**30:.1f} GiB for {num_rows} "
                             f"rows (> cache_max_gb={max_bytes / 2**30:g}); train with "
                             "feature_cache=False, fewer rows, fewer head layers or a larger "
                             "cache_max_gb")
        log(f"feature cache: building {directory} ({num_rows} rows, {total / 2**30:.3f} GiB)")
        _remove_abandoned_builds(root, directory.name)
        tmp = root / f"{directory.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        start = time.perf_counter()
        try:
            meta = _build(tmp, settings, rows, compute, batch_size, row_bytes, progress)
            meta["build_seconds"] = time.perf_counter() - start
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
            os.replace(tmp, directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log(f"feature cache: built in {meta['build_seconds']:.1f} s")
        return cls(directory, meta, built_now=True)


def _remove_abandoned_builds(root: Path, key: str) -> None:
    """Deletes `<key>.tmp-<pid>` directories of builds whose process is gone (killed)."""
    for tmp in root.glob(f"{key}.tmp-*"):
        try:
            os.kill(int(tmp.name.rsplit("-", 1)[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, PermissionError):
            pass


def _build(tmp: Path, settings, rows, compute, batch_size, row_bytes, progress) -> dict:
    num_rows = len(rows)
    rows_per_shard = max(1, min(num_rows, SHARD_BYTES // max(row_bytes, 1)))
    num_shards = -(-num_rows // rows_per_shard)
    files: dict[str, np.ndarray] = {}
    fields, dtypes, shapes = None, {}, {}
    for first in range(0, num_rows, batch_size):
        chunk = rows[first:first + batch_size]
        n = len(chunk)
        if n < batch_size:  # pad to the compiled batch shape; padded rows are dropped
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - n, axis=0)])
        feats = compute(chunk)
        arrays = {"hidden": feats.hidden, "log_probs": feats.targets.log_probs,
                  "ids": feats.targets.ids, "tail_log_prob": feats.targets.tail_log_prob}
        arrays = {k: np.asarray(v)[:n] for k, v in arrays.items() if v is not None}
        if fields is None:
            fields = [f for f in _FIELDS if f in arrays]
            for f in fields:
                dtypes[f] = str(arrays[f].dtype)
                shapes[f] = list(arrays[f].shape[1:])
        for i in range(n):
            r = first + i
            s, o = divmod(r, rows_per_shard)
            for f in fields:
                key = f"{f}-{s:05d}"
                if key not in files:
                    for old in [k for k in files if k.startswith(f"{f}-")]:
                        files.pop(old).flush()
                    count = min(rows_per_shard, num_rows - s * rows_per_shard)
                    store = np.uint16 if dtypes[f] == "bfloat16" else np.dtype(dtypes[f])
                    files[key] = np.lib.format.open_memmap(tmp / f"{key}.npy", mode="w+",
                                                           dtype=store,
                                                           shape=(count, *shapes[f]))
                value = arrays[f][i]
                files[key][o] = value.view(np.uint16) if dtypes[f] == "bfloat16" else value
        if progress is not None:
            progress(first + n)
    for arr in files.values():
        arr.flush()
    num_bytes = sum(p.stat().st_size for p in tmp.glob("*.npy"))
    return {"settings": settings, "num_rows": num_rows, "rows_per_shard": rows_per_shard,
            "num_shards": num_shards, "fields": fields, "dtypes": dtypes, "shapes": shapes,
            "hidden_dtype": dtypes["hidden"], "num_bytes": num_bytes}
