"""Decoding: methods (`make_method`), the one engine that runs them (`Engine`), `generate`."""

from hispec_jax.decoding.engine import Engine, Hierarchy, Shapes
from hispec_jax.decoding.methods import Decoder, make_method

__all__ = ["Decoder", "Engine", "Hierarchy", "Shapes", "make_method"]
