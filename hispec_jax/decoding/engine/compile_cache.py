"""The process-wide cache of compiled programs: every program an engine runs (the batch's
insert, the prefill chunks, finish, the rounds loops, cancel: `decoding/slots.py`), for
offline `generate`, streaming, chat and serving alike, compiled once per process and keyed
by (function, static arguments, argument shapes, dtypes and shardings).

Least recently used programs are dropped beyond `MAX_PROGRAMS`, and before each
compilation while the process holds more than `MAP_BUDGET` of its memory-mapping limit:
XLA:CPU's JIT maps every compiled kernel's code and data sections separately, one rounds
loop holds 1,000-3,000 mappings (a lookup loop, with a `lax.switch` branch per block, the
most), and Linux refuses a process more than `vm.max_map_count` (65,530 by default), which
LLVM reports as "Unable to allocate section memory". A dropped program compiles again when
next used; an engine that already holds it keeps it.

A program this process has not compiled yet comes through the cross-process program cache
(`decoding/program_cache.py`, directory `PROGRAM_CACHE`): a later process loads it instead
of tracing, lowering and compiling it again (docs/startup.md).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from hispec_jax.decoding import program_cache, xla_options
from hispec_jax.models import sharding, transformer


@dataclasses.dataclass
class _Entry:
    program: program_cache.Program
    seconds: float  # spent making it (tracing, lowering and compiling, or loading)
    engine: Any = None  # the engine whose rounds it runs (`covering`), else None


# Program key -> entry, least recently used first.
_PROGRAMS: collections.OrderedDict[Any, _Entry] = collections.OrderedDict()
_LOCK = threading.Lock()
MAX_PROGRAMS = 96
MAP_BUDGET = 0.5  # the share of the memory-mapping limit compiled programs may keep held
compilations = 0  # programs this process made (tests check that bad input makes none)
# Where compiled programs are kept across processes (`program_cache.compile_cached`'s
# `directory`): True for `$HISPEC_CACHE/programs` (off with HISPEC_COMPILATION_CACHE=0),
# None for off. An entry is keyed by the program and this library's source files, not by
# code replaced at run time: a process that patches a function a program traces (a test's
# mutant) sets it to None.
PROGRAM_CACHE: Any = True

# XLA options every program is compiled with, by platform (`jax.default_backend()`), as
# `jax.stages.Lowered.compile(compiler_options=...)` takes them (XLA's `DebugOptions` field
# names; values as the `XLA_FLAGS` parser reads them). Per-compile options rather than
# `XLA_FLAGS`, so a library import changes nothing else in the process, and a probe can
# compile the same loop under several. Programs are not keyed by the options in this
# process: `clear_compiled()` after a change. On CPU: XLA's YNNPACK fusions off, but for the
# reductions in the decoding steps of a cache read in one attention span
# (`ONE_SPAN_OPTIONS`; `xla_options`, where the measurement is).
COMPILER_OPTIONS: dict[str, dict[str, Any]] = {
    platform: dict(options) for platform, options in xla_options.PLATFORM_OPTIONS.items()}
ONE_SPAN_OPTIONS: dict[str, dict[str, Any]] = {
    platform: dict(options) for platform, options in xla_options.ONE_SPAN_OPTIONS.items()}


def compiler_options(capacity: int | None = None) -> dict[str, Any]:
    """`COMPILER_OPTIONS` for the platform this process computes on; for a program of
    decoding steps over a cache of `capacity` slots that one attention span reads whole
    (`transformer.attention_spans`), with `ONE_SPAN_OPTIONS` too."""
    platform = jax.default_backend()
    options = dict(COMPILER_OPTIONS.get(platform, {}))
    if capacity is not None and len(transformer.attention_spans(capacity)) == 1:
        options.update(ONE_SPAN_OPTIONS.get(platform, {}))
    return options


def rounds_options(engine) -> dict[str, Any]:
    """The XLA options of `engine`'s rounds program: `compiler_options(capacity)` where its
    drafts are single-position steps (AR, exit drafters), the platform's only where they
    reach level 1 as blocks (`Drafter.block_passes`: prompt lookup, whose one-span loops
    YNNPACK's reductions made no faster and, at four times the fusions of an AR loop,
    slower to load)."""
    blocks = engine.hierarchy.drafter.block_passes
    return compiler_options(None if blocks else engine.shapes.capacity)


def structs(args, mesh=None, batch: int = 0):
    """`args` as `jax.ShapeDtypeStruct`s. On a mesh, with their shardings: an array already
    placed on it (the model's weights, an earlier program's results) keeps its own; the
    rest (host arrays, the request's settings) are placed by their names and shapes
    (`sharding.map_state`: per-sequence arrays over "data", caches over "data" and "model",
    the rest replicated)."""
    if mesh is None:
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)

    def one(x, axes):
        placed = getattr(x, "sharding", None)
        if not (isinstance(placed, NamedSharding) and placed.mesh == mesh):
            placed = sharding.named_sharding(axes, x.shape, mesh)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed)

    return sharding.map_state(one, args, batch)


def program(fn: Callable, static: tuple, donate: tuple[int, ...], args, mesh=None,
            batch: int = 0) -> program_cache.Program:
    """`fn(*static, *args)` compiled for the shapes and dtypes of `args` (arrays or
    `jax.ShapeDtypeStruct`s), donating `args[i]` for i in `donate`: once per process (until
    dropped), with the decoding loops' XLA options (`rounds_options` where `static` holds
    an engine), and through the cross-process program cache. Any thread may call it.

    On a device `mesh` (`batch`: the engine's B), the program takes the model's weights as
    they are placed and every other argument as `structs` places it, and returns its
    results placed the same way (`sharding.constrain_state`), so that one program's
    results are the next one's arguments without a copy."""
    global compilations
    args = structs(args, mesh, batch)
    leaves, treedef = jax.tree.flatten(args)
    key = (fn.__name__, static, mesh, treedef,
           tuple((tuple(x.shape), jnp.dtype(x.dtype).name, x.sharding) for x in leaves))
    with _LOCK:
        entry = _PROGRAMS.get(key)
        if entry is not None:
            _PROGRAMS.move_to_end(key)
            return entry.program
    make_room()
    run = inner = functools.partial(fn, *static)
    if mesh is not None:  # results placed as the next program takes them
        run = functools.wraps(fn)(lambda *a: sharding.constrain_state(inner(*a), batch))
    t0 = time.perf_counter()
    made = program_cache.compile_cached(jax.jit(run, donate_argnums=donate), args, mesh=mesh,
                                        **_cache_entry(fn, static))
    engine = _engine_of(static)
    with _LOCK:
        if key not in _PROGRAMS:
            compilations += 1
            _PROGRAMS[key] = _Entry(made, time.perf_counter() - t0,
                                    engine if fn.__name__ == ROUNDS_PROGRAMS[0] else None)
        while len(_PROGRAMS) > MAX_PROGRAMS:
            _PROGRAMS.popitem(last=False)
        return _PROGRAMS[key].program


def _engine_of(static: tuple):
    from hispec_jax.decoding.engine.engine import Engine

    return next((s for s in static if isinstance(s, Engine)), None)


# The programs that run decoding rounds (`decoding/slots.py`), compiled with
# `rounds_options`; the others (prefill, insert, finish, cancel) with the platform's.
ROUNDS_PROGRAMS = ("_rounds_rows", "_round_with_chunk")


def _cache_entry(fn, static: tuple) -> dict:
    """The program cache's key, XLA options and directory for `fn(*static, ...)`."""
    from hispec_jax.decoding.engine.engine import Engine

    described = ", ".join(s.program_key() if isinstance(s, Engine) else repr(s)
                          for s in static)
    engine = _engine_of(static)
    options = (rounds_options(engine) if fn.__name__ in ROUNDS_PROGRAMS and engine is not None
               else compiler_options())
    return {"key": f"slots.{fn.__name__}({described})",
            "compiler_options": options or None, "directory": PROGRAM_CACHE}


def is_stored(fn: Callable, static: tuple, args, mesh=None, batch: int = 0) -> bool:
    """Whether `program(fn, static, ..., args)` is held by this process or stored in the
    program cache (making it is then a load of about a second, not a compile)."""
    args = structs(args, mesh, batch)
    return program_cache.is_stored(args=args, **_cache_entry(fn, static))


def seconds_of(made: program_cache.Program) -> float:
    """Seconds this process spent making `made` (0 for one it no longer holds)."""
    with _LOCK:
        return next((e.seconds for e in _PROGRAMS.values() if e.program is made), 0.0)


def covering(engine):
    """An engine whose rounds this process has compiled, equal to `engine` except for larger
    window bounds (its rounds run these windows without a new compilation), else
    `engine`."""
    with _LOCK:
        engines = [e.engine for e in reversed(_PROGRAMS.values()) if e.engine is not None]
    for other in engines:
        if (dataclasses.replace(other, hierarchy=engine.hierarchy) == engine
                and other.hierarchy.covers(engine.hierarchy)):
            return other
    return engine


def map_counts() -> tuple[int, int] | None:
    """(memory mappings this process holds, the most it may hold), or None where the
    system does not say (not Linux)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            held = sum(1 for _ in f)
        with open("/proc/sys/vm/max_map_count") as f:
            return held, int(f.read())
    except (OSError, ValueError):
        return None


def make_room() -> int:
    """Drops least recently used programs while this process holds more than `MAP_BUDGET`
    of its memory-mapping limit (`map_counts`); returns how many it dropped."""
    dropped = 0
    while _PROGRAMS:
        counts = map_counts()
        if counts is None or counts[0] <= MAP_BUDGET * counts[1]:
            break
        with _LOCK:
            if _PROGRAMS:
                _PROGRAMS.popitem(last=False)
        dropped += 1
    return dropped


def clear_compiled() -> None:
    """Drops every compiled program this process holds (engines built before keep the
    programs they already hold)."""
    with _LOCK:
        _PROGRAMS.clear()
