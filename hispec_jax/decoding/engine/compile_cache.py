"""The process-wide cache of compiled decoding loops, keyed by `Engine` (a frozen, hashable
description: two equal engines share one loop). A loop is two programs
(`Engine.programs`, run in turn by `CompiledLoop`): the prefill, shared by engines that
differ only in their method, and the rounds.

Least recently used loops are dropped beyond `MAX_COMPILED`, and before each compilation
while the process holds more than `MAP_BUDGET` of its memory-mapping limit: XLA:CPU's JIT
maps every compiled kernel's code and data sections separately, one decoding loop holds
1,000-3,000 mappings (a lookup loop, with a `lax.switch` branch per block, the most), and
Linux refuses a process more than `vm.max_map_count` (65,530 by default), which LLVM reports
as "Unable to allocate section memory". A dropped loop compiles again when next used.

A loop this process has not compiled yet comes through the cross-process program cache
(`decoding/program_cache.py`, directory `PROGRAM_CACHE`): a later process loads its two
programs, side by side, instead of tracing, lowering and compiling them again
(docs/startup.md).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
import types
from typing import Any

import jax

from hispec_jax.decoding import program_cache, xla_options
from hispec_jax.models import transformer

# Engine -> (compiled executable, seconds it took), least recently used first.
_COMPILED: collections.OrderedDict[Any, tuple[Any, float]] = collections.OrderedDict()
# Engine -> how its executable is made (`program_cache.Program.source`), for `_COMPILED`'s keys.
_SOURCES: dict[Any, str] = {}
# Program key (`engine.Program.key`) -> `program_cache.Program`: the programs of
# `_COMPILED`'s loops, found by key, so engines share a prefill program.
_PROGRAMS: dict[str, Any] = {}
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
# XLA's YNNPACK fusions off, but for the reductions in the decoding steps of a cache read
# in one attention span (`ONE_SPAN_OPTIONS`; `xla_options`, where the measurement is).
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


@dataclasses.dataclass(frozen=True)
class CompiledLoop:
    """An engine's `run` as its two compiled programs (`Engine.programs`), called as `run`
    is: `loop(params, heads, request, cache, windows)` -> (output, counters, cache)."""

    prefill: Any  # (params, request, cache) -> (h [B, D], cache)
    rounds: Any  # (params, heads, request, h, cache, windows) -> (output, counters, cache)

    def __call__(self, params, heads, req, cache, windows_K1):
        h_BxD, cache = self.prefill(params, req, cache)
        return self.rounds(params, heads, req, h_BxD, cache, windows_K1)

    def memory_analysis(self) -> types.SimpleNamespace:
        """Per field of XLA's memory analysis, the larger of the two programs' (the weights
        and the cache are arguments of both): the loop's peak."""
        a, b = self.prefill.memory_analysis(), self.rounds.memory_analysis()
        return types.SimpleNamespace(**{f: max(getattr(a, f), getattr(b, f)) for f in (
            "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes", "generated_code_size_in_bytes")})

    def as_text(self) -> str:
        return "\n".join(p.as_text() or "" for p in (self.prefill, self.rounds))


def compiled(engine) -> tuple[CompiledLoop, float]:
    """(`engine`'s compiled `run`, seconds spent compiling: 0 when this process already
    compiled an equal engine). Both programs come through the program cache; where both
    are stored they load side by side."""
    global compilations
    if engine in _COMPILED:
        _COMPILED.move_to_end(engine)
        return _COMPILED[engine][0], 0.0
    make_room()
    t0 = time.perf_counter()
    mesh = None if engine.shardings is None else engine.shardings.mesh

    def get(program) -> program_cache.Program:
        if program.key in _PROGRAMS:  # another engine's (a prefill other methods share)
            return _PROGRAMS[program.key]
        return program_cache.compile_cached(program.jitted, program.args, key=program.key,
                                            compiler_options=program.options, mesh=mesh,
                                            directory=PROGRAM_CACHE)

    programs = engine.programs()
    if all(p.key in _PROGRAMS or program_cache.is_stored(p.key, p.args, p.options, PROGRAM_CACHE)
           for p in programs):
        with concurrent.futures.ThreadPoolExecutor(len(programs)) as pool:
            loaded = list(pool.map(get, programs))
    else:  # compiles (tracing holds the GIL; a storing compile takes its turn anyway)
        loaded = [get(p) for p in programs]
    seconds = time.perf_counter() - t0
    compilations += 1
    for p, program in zip(programs, loaded):
        _PROGRAMS[p.key] = program
    loop = CompiledLoop(*(p.executable for p in loaded))
    _COMPILED[engine] = (loop, seconds)
    sources = {p.source for p in loaded}
    _SOURCES[engine] = next(s for s in ("jit", "stored", "cache") if s in sources)
    while len(_COMPILED) > MAX_COMPILED:
        _drop_oldest()
    return loop, seconds


def compile_seconds(engine) -> float | None:
    """Seconds this process spent compiling `engine`'s loop (None: not compiled, or
    dropped)."""
    entry = _COMPILED.get(engine)
    return None if entry is None else entry[1]


def program_source(engine) -> str | None:
    """How `engine`'s loop is made: "cache" (both programs read from the program cache),
    "stored" (at least one traced, compiled and written to it) or "jit" (at least one traced
    and compiled without it: the program cache off or unwritable, or a program not
    serializable); None: not compiled, or dropped."""
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
    _PROGRAMS.clear()


def _drop_oldest() -> None:
    engine, _ = _COMPILED.popitem(last=False)
    _SOURCES.pop(engine, None)
    held = {id(x) for loop, _ in _COMPILED.values() for x in (loop.prefill, loop.rounds)}
    for key in [k for k, p in _PROGRAMS.items() if id(p.executable) not in held]:
        del _PROGRAMS[key]  # no loop left runs it
