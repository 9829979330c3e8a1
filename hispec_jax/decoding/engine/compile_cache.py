"""The process-wide cache of compiled decoding loops, keyed by `Engine` (a frozen, hashable
description: two equal engines share one executable).

Least recently used loops are dropped beyond `MAX_COMPILED`, and before each compilation
while the process holds more than `MAP_BUDGET` of its memory-mapping limit: XLA:CPU's JIT
maps every compiled kernel's code and data sections separately, one decoding loop holds
1,000-3,000 mappings (a lookup loop, with a `lax.switch` branch per block, the most), and
Linux refuses a process more than `vm.max_map_count` (65,530 by default), which LLVM reports
as "Unable to allocate section memory". A dropped loop compiles again when next used.

A loop this process has not compiled yet comes through the cross-process program cache
(`decoding/program_cache.py`, directory `PROGRAM_CACHE`): a later process loads the compiled
loop instead of tracing, lowering and compiling it again (docs/startup.md).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

import jax

from hispec_jax.decoding import program_cache, xla_options

# Engine -> (compiled executable, seconds it took), least recently used first.
_COMPILED: collections.OrderedDict[Any, tuple[Any, float]] = collections.OrderedDict()
# Engine -> how its executable is made (`program_cache.Program.source`), for `_COMPILED`'s keys.
_SOURCES: dict[Any, str] = {}
MAX_COMPILED = 32
MAP_BUDGET = 0.5  # the share of the memory-mapping limit compiled loops may keep held
compilations = 0  # loops compiled by this process (tests check that bad input compiles none)
# Where compiled loops are kept across processes (`program_cache.compile_cached`'s
# `directory`): True for `$HISPEC_CACHE/programs` (off with HISPEC_COMPILATION_CACHE=0),
# None for off. An entry is keyed by the engine and this library's source files, not by
# code replaced at run time: a process that patches a function the loop traces (a test's
# mutant) sets it to None.
PROGRAM_CACHE: Any = True

# XLA options every decoding loop is compiled with, by platform (`jax.default_backend()`),
# as `jax.stages.Lowered.compile(compiler_options=...)` takes them (XLA's `DebugOptions`
# field names; values as the `XLA_FLAGS` parser reads them). Per-compile options rather
# than `XLA_FLAGS`, so a library import changes nothing else in the process, and a probe
# can compile the same loop under several. Compiled loops are not keyed by the options:
# `clear_compiled()` after a change. The serving slots' programs take them too. On CPU:
# XLA's YNNPACK fusions off (`xla_options`, where the measurement is).
COMPILER_OPTIONS: dict[str, dict[str, Any]] = {
    platform: dict(options) for platform, options in xla_options.PLATFORM_OPTIONS.items()}


def compiler_options() -> dict[str, Any]:
    """`COMPILER_OPTIONS` for the platform this process computes on."""
    return dict(COMPILER_OPTIONS.get(jax.default_backend(), {}))


def compiled(engine) -> tuple[Any, float]:
    """(`engine`'s compiled `run`, seconds spent compiling: 0 when this process already
    compiled an equal engine)."""
    global compilations
    if engine in _COMPILED:
        _COMPILED.move_to_end(engine)
        return _COMPILED[engine][0], 0.0
    make_room()
    t0 = time.perf_counter()
    shardings, args = engine.shardings, engine.abstract_arguments()
    if shardings is not None:  # the structs carry the loop's input shardings
        args = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            args, shardings.in_shardings())
    program = program_cache.compile_cached(
        engine.jitted(), args, key=engine.program_key(),
        compiler_options=compiler_options() or None,
        mesh=None if shardings is None else shardings.mesh, directory=PROGRAM_CACHE)
    seconds = time.perf_counter() - t0
    compilations += 1
    _COMPILED[engine] = (program.executable, seconds)
    _SOURCES[engine] = program.source
    while len(_COMPILED) > MAX_COMPILED:
        _drop_oldest()
    return program.executable, seconds


def compile_seconds(engine) -> float | None:
    """Seconds this process spent compiling `engine`'s loop (None: not compiled, or
    dropped)."""
    entry = _COMPILED.get(engine)
    return None if entry is None else entry[1]


def program_source(engine) -> str | None:
    """How `engine`'s loop is made: "cache" (read from the program cache), "stored"
    (traced, compiled and written to it) or "jit" (traced and compiled, the program cache
    off or unwritable, or the loop not serializable); None: not compiled, or dropped."""
    return _SOURCES.get(engine) if engine in _COMPILED else None


def covering(engine):
    """An already compiled engine equal to `engine` except for larger window bounds (its
    loop runs these windows without a new compilation), else `engine`."""
    for other in reversed(_COMPILED):
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
    """Drops least recently used compiled loops while this process holds more than
    `MAP_BUDGET` of its memory-mapping limit (`map_counts`); returns how many it dropped."""
    dropped = 0
    while _COMPILED:
        counts = map_counts()
        if counts is None or counts[0] <= MAP_BUDGET * counts[1]:
            break
        _drop_oldest()
        dropped += 1
    return dropped


def clear_compiled() -> None:
    """Drops every compiled loop of this process."""
    _COMPILED.clear()
    _SOURCES.clear()


def _drop_oldest() -> None:
    engine, _ = _COMPILED.popitem(last=False)
    _SOURCES.pop(engine, None)
