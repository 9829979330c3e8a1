"""Decoding: methods (`make_method`), the one engine that runs them (`Engine`), `generate`.

Start with `policies.py`: the engine's seams (drafter, window, draft exit, acceptance,
companion) as typed contracts, with a diagram of where each acts in a round and which
module implements which method. Then `methods.py` (each method as a hierarchy of policies),
`generate.py` (the host side, in named steps) and the `engine/` package (the compiled loop;
docs/engine.md).
`costs.py` holds the measured stage costs and device keys that decoding policies (SV) read;
the planner, above this package, produces them.

Names are imported on first use, so `hispec_jax.decoding.options` (argument checks without
JAX) can be imported alone.
"""

import importlib as _importlib

_LAZY = {
    "Engine": "hispec_jax.decoding.engine",
    "Hierarchy": "hispec_jax.decoding.engine",
    "Shapes": "hispec_jax.decoding.engine",
    "Decoder": "hispec_jax.decoding.methods",
    "make_method": "hispec_jax.decoding.methods",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'hispec_jax.decoding' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
