"""Checkpoint weights read only where they are indexed: each process of a multi-host run
reads the slices of the safetensors files its own devices hold, never the whole model.

`hf_io.load_checkpoint(..., lazy=True)` returns these in place of NumPy arrays; placing them
on a mesh (`sharding.shard_arrays`, `jax.make_array_from_callback`) asks each one for the
index of every local device's shard, and only those bytes are read (safetensors'
`get_slice`, which seeks into the file):

    HF tensor [out, in] on disk ---get_slice[o0:o1, i0:i1]---> [o1-o0, i1-i0]
        --.T, reshape--> our slice [in..., out...] of the shard          (`LazyTensor`)
    per-layer tensors, stacked [L, ...]: one read per layer in the index  (`LazyStack`)

An index our layout cannot map to one rectangle of the HF tensor (a slice inside a split
axis other than its first, e.g. half of `head_dim`) reads the whole tensor and cuts it: the
rule table never shards so. `bytes_read` counts what this process read (the multi-host test
checks that each of two processes reads about half).
"""

from __future__ import annotations

import math
import threading

import numpy as np
from safetensors import safe_open

bytes_read = 0  # bytes this process read through these arrays (tests read it)
_lock = threading.Lock()


def _count(array: np.ndarray) -> np.ndarray:
    global bytes_read
    with _lock:
        bytes_read += array.nbytes
    return array


def _slices(index, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """`index` (what NumPy and `make_array_from_callback` pass: a tuple of slices, maybe
    shorter than `shape`, or an int per axis) as one step-1 slice per axis; ints become
    one-long slices (`_squeeze` drops those axes again)."""
    index = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis for i in index):
        raise IndexError("a lazy checkpoint weight takes no Ellipsis")
    out = []
    for i, n in zip(index + (slice(None),) * (len(shape) - len(index)), shape):
        if isinstance(i, (int, np.integer)):
            i = int(i) + n if i < 0 else int(i)
            if not 0 <= i < n:
                raise IndexError(f"index {i} is out of bounds for an axis of {n}")
            out.append(slice(i, i + 1))
            continue
        start, stop, step = i.indices(n)
        if step != 1:
            raise IndexError("a lazy checkpoint weight takes step-1 slices only")
        out.append(slice(start, max(start, stop)))
    return tuple(out)


def _squeeze(array: np.ndarray, index) -> np.ndarray:
    index = index if isinstance(index, tuple) else (index,)
    axes = tuple(a for a, i in enumerate(index) if isinstance(i, (int, np.integer)))
    return array.squeeze(axes) if axes else array


def _span(slices: tuple[slice, ...], dims: tuple[int, ...]) -> tuple[int, int] | None:
    """The range of the flattened axis (C order over `dims`) that `slices` covers, when it
    is one range: every axis after the first sliced one whole."""
    if not dims:
        return 0, 1
    if any(s != slice(0, n) for s, n in zip(slices[1:], dims[1:])):
        return None
    inner = math.prod(dims[1:])
    return slices[0].start * inner, slices[0].stop * inner


class LazyTensor:
    """One checkpoint tensor in our layout (`shape`, `dtype`), read where indexed.

    `n_in` is how many leading axes of `shape` are the HF tensor's input axis (0: stored as
    it is, e.g. norms and embeddings; else the HF [out, in] matrix is transposed and its
    axes split: `hf_io._to_ours`)."""

    def __init__(self, file, name: str, shape: tuple[int, ...], n_in: int, dtype):
        self.file, self.name, self.n_in = str(file), name, n_in
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def _read(self, hf_index: tuple[slice, ...] | None) -> np.ndarray:
        with safe_open(self.file, framework="np") as f:
            part = f.get_slice(self.name)
            return _count(part[hf_index] if hf_index is not None else part[:])

    def __getitem__(self, index) -> np.ndarray:
        slices = _slices(index, self.shape)
        want = tuple(s.stop - s.start for s in slices)
        if self.n_in == 0:
            value = self._read(slices)
        else:
            ins, outs = self.shape[:self.n_in], self.shape[self.n_in:]
            i_span, o_span = _span(slices[:self.n_in], ins), _span(slices[self.n_in:], outs)
            if i_span is None or o_span is None:  # not one rectangle: read it all, then cut
                whole = self._read(None).T.reshape(self.shape)
                return _squeeze(whole[slices].astype(self.dtype), index)
            block = self._read((slice(*o_span), slice(*i_span)))  # HF [out, in]
            value = block.T.reshape(want)
        return _squeeze(np.asarray(value).reshape(want).astype(self.dtype, copy=False), index)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        value = self[()]
        return value if dtype is None else value.astype(dtype)

    def __repr__(self) -> str:
        return f"LazyTensor({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class LazyStack:
    """Per-layer `LazyTensor`s stacked on a leading [L] axis (our scan layout's arrays);
    `stack[i]` is layer i's tensor, still unread."""

    def __init__(self, layers: list[LazyTensor]):
        self.layers = layers
        self.shape = (len(layers),) + layers[0].shape
        self.dtype = self.layers[0].dtype

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index):
        first = index[0] if isinstance(index, tuple) and index else index
        rest = index[1:] if isinstance(index, tuple) else ()
        if isinstance(first, (int, np.integer)) and not rest:
            return self.layers[int(first)]  # one layer, unread (`with_layer_layout`)
        layers = _slices((first,), self.shape[:1])[0]
        value = np.stack([self.layers[i][rest] for i in range(layers.start, layers.stop)])
        return value[0] if isinstance(first, (int, np.integer)) else value

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        value = self[:]
        return value if dtype is None else value.astype(dtype)

    def __repr__(self) -> str:
        return f"LazyStack({len(self.layers)} x {self.layers[0]!r})"


def is_lazy(x) -> bool:
    return isinstance(x, (LazyTensor, LazyStack))
