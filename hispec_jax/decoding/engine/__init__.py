"""The hierarchical speculative decoding engine: one compiled state machine for every exit
hierarchy (docs/engine.md). One concept per module:

    hierarchy.py      `Hierarchy`: the static description of the levels, validated, and the
                      block lengths every pass is compiled at
    state.py          `EngineState`, `Counters`: the loop state, and its ring buffers
    drafters.py       level 0 (`ExitDrafter`, `LookupDrafter`): what a round drafts
    draft_model.py    level 0 as a draft model (`DraftModelDrafter`; `InnerDraftModel` below it)
    round.py          `Round`: one speculation round (draft, verify, accept, rollback)
    engine.py         `Engine`, `Shapes`: the frozen compile key and the loop's functions
    compile_cache.py  the process-wide cache of compiled programs and its memory budget

The programs that run are the slot engine's (`decoding/slots.py`: a batch's insert, the
prefill chunks, finish, the rounds loops), for offline `generate`, streaming and serving
alike. The names below are this package's interface. The compile cache's counter and
limits (`compilations`, `MAX_PROGRAMS`, `MAP_BUDGET`) read through to `compile_cache`,
where they are kept (and set).
"""

from hispec_jax.decoding.engine import compile_cache
from hispec_jax.decoding.engine.compile_cache import (COMPILER_OPTIONS, clear_compiled,
                                                      compiler_options, make_room, map_counts)
from hispec_jax.decoding.engine.draft_model import DraftModelDrafter, InnerDraftModel
from hispec_jax.decoding.engine.drafters import ExitDrafter, LookupDrafter
from hispec_jax.decoding.engine.engine import Engine, Shapes
from hispec_jax.decoding.engine.hierarchy import Hierarchy
from hispec_jax.decoding.engine.round import Forward, Round
from hispec_jax.decoding.engine.state import Counters, EngineState

__all__ = ["COMPILER_OPTIONS", "Counters", "DraftModelDrafter", "Engine", "EngineState",
           "ExitDrafter", "Forward", "Hierarchy", "InnerDraftModel", "LookupDrafter", "Round", "Shapes",
           "clear_compiled", "compile_cache", "compiler_options", "make_room", "map_counts"]


def __getattr__(name):
    if name in ("compilations", "MAX_PROGRAMS", "MAP_BUDGET"):
        return getattr(compile_cache, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
