"""The model functions the decoding engine calls, as one object: `Backbone`.

The engine's loop (`engine/`: the round, the drafters, the first token) reaches the model
only through these five calls, so one field of the `Engine` says which model runs them
(the serving slots' prompt chunks, `slots._chunk`, and a draft model's own passes run the
transformer directly):

    embed               tokens -> layer-0 states
    run_layers          layers [a, b) over a block, reading the cache (keys/values returned)
    run_layers_cached   layers [a, b) over a block, writing the cache
    exit_logits         exit e's logits from layer-e states
    prefill             cache every prompt position, the top layer's state at the last

`TRANSFORMER` is the model (`models/transformer.py`, `models/heads.py`). The planner's
trace model (`planner/trace_model.py`) is the other: it answers every exit with the choice
a calibration recorded, so the planner predicts from the engine's own compiled round.
"""

from __future__ import annotations

import dataclasses

from hispec_jax.decoding import prefill as prefill_lib
from hispec_jax.models import heads as heads_lib
from hispec_jax.models import transformer


@dataclasses.dataclass(frozen=True)
class Backbone:
    """The transformer's functions, as the engine calls them (frozen and hashable: part of
    the `Engine`, the compile key). Each method has the signature of the function it calls;
    a stand-in model overrides them all."""

    def embed(self, params, tokens_BxT):
        return transformer.embed(params, tokens_BxT)

    def run_layers(self, params, cfg, x_BxTxD, positions_BxT, cache, start, stop, **kwargs):
        return transformer.run_layers(params, cfg, x_BxTxD, positions_BxT, cache, start, stop,
                                      **kwargs)

    def run_layers_cached(self, params, cfg, x_BxTxD, positions_BxT, cache, start, stop,
                          **kwargs):
        return transformer.run_layers_cached(params, cfg, x_BxTxD, positions_BxT, cache, start,
                                             stop, **kwargs)

    def exit_logits(self, params, heads, cfg, h_BxTxD, exit_layer: int):
        return heads_lib.exit_logits(params, heads, cfg, h_BxTxD, exit_layer)

    def prefill(self, params, cfg, tokens_BxS, lengths_B, cache, stop: int, chunk: int):
        return prefill_lib.prefill(params, cfg, tokens_BxS, lengths_B, cache, stop, chunk)


TRANSFORMER = Backbone()
