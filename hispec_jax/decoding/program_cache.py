"""Compiled programs kept across processes: a start skips tracing, lowering and XLA's
compile.

JAX's persistent compilation cache (`cli.common.use_compilation_cache`) keeps XLA's
executables, but every process still traces the Python loop into a jaxpr and lowers it to
StableHLO before it can look the executable up: seconds per decoding loop on a CPU
(docs/startup.md). This cache keeps the compiled executable itself, serialized with
`jax.experimental.serialize_executable`, so a later process only reads it and loads it: no
Python tracing, no StableHLO, no cache-key hashing of a module.

    program = program_cache.compile_cached(jax.jit(fn, donate_argnums=(3,)), abstract_args,
                                           key=engine.program_key())
    outputs = program(*args)            # the pytrees `fn` takes and returns
    program.source                      # "cache" (read), "stored" (compiled and written) or "jit"

An entry is keyed by a digest of the caller's key (what the program computes: the model
architecture, parameter layout, method and shapes; never the weights' values, which are
arguments), the arguments' shapes, dtypes and shardings, the compiler options and
`XLA_FLAGS`, the JAX settings that change a trace (x64, default matmul precision), the
backend and its devices, and the versions of jax, jaxlib and this library's own source (a
digest of its files, so an edited checkout never runs a stale program). A corrupted entry, one written under other
versions, or a key collision is ignored with one warning line and the program is compiled
and stored again; a directory that cannot be written gives one warning and a normal start.
`HISPEC_COMPILATION_CACHE=0` turns it off, whatever the directory (as it turns off XLA's
cache).

What the executable carries: donation (XLA's input/output aliasing is part of it, so the
donated buffers are consumed as in the process that compiled it), shardings (on a mesh it
runs on the mesh's devices, whose number is part of the key) and custom pytrees in and out
(their tree definitions are pickled with it). Programs with host callbacks or ordered
effects do not serialize: such a program compiles the normal way (`source` "jit"), with a
warning.

Entries are pickles: they are read only by the jax and jaxlib that wrote them (part of the
key), each file carries a SHA-256 of its contents, and, like XLA's own cache, the directory
is trusted (loading an executable runs its code).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import pickle
import tempfile
import threading
from pathlib import Path
from typing import Any

import jax
import jaxlib
from jax.experimental import serialize_executable
from jax.experimental.compilation_cache import compilation_cache as xla_cache

log = logging.getLogger("hispec.program_cache")

MAGIC = b"hispec-executable-1\n"
SUFFIX = ".program"
MAX_BYTES = 2 * 2**30  # a process that finds the directory above this ...
KEEP_BYTES = 3 * 2**29  # ... drops its least recently used entries down to this


def default_directory() -> Path | None:
    """`$HISPEC_CACHE/programs` (next to XLA's cache and the pulled models), or None when
    HISPEC_COMPILATION_CACHE=0."""
    if os.environ.get("HISPEC_COMPILATION_CACHE") == "0":
        return None
    from hispec_jax.models.pull import default_cache_dir

    return default_cache_dir() / "programs"


@functools.cache
def library_fingerprint() -> str:
    """A digest of this package's Python source: a program is only reused by the code that
    traced it."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _describe(x) -> str:
    sharding = getattr(x, "sharding", None)
    return f"{tuple(x.shape)}:{jax.numpy.dtype(x.dtype).name}:{sharding}"


def entry_key(key: str, args, compiler_options: dict | None = None) -> str:
    """The full text an entry is keyed by (its file name is the digest of this)."""
    leaves, treedef = jax.tree.flatten(args)
    devices = jax.devices()
    return "\n".join([
        f"key={key}",
        f"args={treedef}",
        *(f"arg={_describe(x)}" for x in leaves),
        f"compiler_options={sorted((compiler_options or {}).items())}",
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}",
        f"x64={jax.config.jax_enable_x64} "
        f"matmul_precision={jax.config.jax_default_matmul_precision}",
        f"backend={jax.default_backend()}:{devices[0].device_kind}:{len(devices)}",
        f"jax={jax.__version__} jaxlib={jaxlib.__version__}",
        f"hispec_jax={library_fingerprint()}",
    ])


@dataclasses.dataclass
class Program:
    """A compiled program that takes and returns `fn`'s pytrees.

    Attributes:
      executable: the `jax.stages.Compiled`.
      source: "cache" (read from the directory), "stored" (compiled now and written) or
        "jit" (compiled the normal way: the cache is off, or the program does not
        serialize).
    """

    executable: Any
    source: str

    def __call__(self, *args):
        return self.executable(*args)

    @property
    def out_info(self):
        """The outputs as `jax.ShapeDtypeStruct`s (a next program's arguments, untraced)."""
        return self.executable.out_info

    @functools.cached_property
    def memory_analysis(self):
        """XLA's memory analysis of the executable (asked once: tens of milliseconds)."""
        return self.executable.memory_analysis()


def compile_cached(jitted, args, *, key: str, compiler_options=None, mesh=None,
                   directory: str | Path | None | bool = True) -> Program:
    """`jitted` (a `jax.jit`-wrapped function, with its donation) compiled for `args`
    (arrays or `jax.ShapeDtypeStruct`s), through the program cache.

    Args:
      key: what the program computes, as text that is equal across processes exactly when
        the program is (e.g. the repr of a frozen dataclass of static settings). A key that
        holds an object address (" at 0x") is not cached.
      compiler_options: XLA options, as `jax.stages.Lowered.compile` takes them.
      mesh: a `jax.sharding.Mesh` to lower under (`jax.set_mesh`), or None. On a mesh,
        pass `args` as structs with their shardings: the program takes them in every process.
      directory: where entries live; True: `default_directory()`; None or False: off.
        HISPEC_COMPILATION_CACHE=0 turns it off whatever the directory.
    """
    located = entry_path(key, args, compiler_options, directory)
    if located is None:
        return Program(_compile(jitted, args, compiler_options, mesh), "jit")
    path, text = located
    entry = _read(path, text)
    if entry is not None:
        try:
            return Program(_load(entry, mesh), "cache")
        except Exception as e:  # read whole, yet not an executable this jaxlib loads: stale
            log.warning("program cache: %s is stale (%s); compiling again", path,
                        type(e).__name__)
    with _STORE_LOCK, _xla_cache_off():
        before = _compile_events()
        executable = _compile(jitted, args, compiler_options, mesh)
        compiles, hits = (a - b for a, b in zip(_compile_events(), before))
    if compiles == 0 or hits > 0:  # this process's copy or XLA's cache's: perhaps loaded
        log.info("program cache: %s was not compiled afresh; not stored",
                 getattr(jitted, "__name__", "the program"))
        return Program(executable, "jit")
    try:
        payload, in_tree, out_tree = serialize_executable.serialize(executable)
    except Exception as e:  # host callbacks, ordered effects, constants: not serializable
        log.warning("program cache: %s does not serialize (%s: %s); it compiles again in "
                    "the next process", getattr(jitted, "__name__", "the program"),
                    type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return Program(executable, "jit")
    stored = _write(path, text, {"executable": payload, "in_tree": in_tree,
                                 "out_tree": out_tree})
    return Program(executable, "stored" if stored else "jit")


def entry_path(key: str, args, compiler_options=None,
               directory: str | Path | None | bool = True) -> tuple[Path, str] | None:
    """(the file, the full key text) of the entry `compile_cached` reads and writes for
    these arguments; None where the cache is off for it (no directory,
    HISPEC_COMPILATION_CACHE=0, a key holding an object address, a run over several
    processes)."""
    if os.environ.get("HISPEC_COMPILATION_CACHE") == "0" or jax.process_count() > 1:
        # several processes: off (an executable over several processes' devices, written
        # and read back, makes XLA abort on its sharding at load)
        directory = None
    elif directory is True:
        directory = default_directory()
    if not directory or " at 0x" in key:
        return None
    text = entry_key(key, args, compiler_options)
    return Path(directory) / (hashlib.sha256(text.encode()).hexdigest()[:40] + SUFFIX), text


def is_stored(key: str, args, compiler_options=None,
              directory: str | Path | None | bool = True) -> bool:
    """Whether `compile_cached` with these arguments would find an entry to load (a file
    is there; whether it loads is known only by loading it)."""
    located = entry_path(key, args, compiler_options, directory)
    return located is not None and located[0].is_file()


def _compile(jitted, args, compiler_options, mesh):
    if mesh is None:
        return jitted.lower(*args).compile(compiler_options=compiler_options)
    with jax.set_mesh(mesh):
        return jitted.lower(*args).compile(compiler_options=compiler_options)


_STORE_LOCK = threading.Lock()  # one storing compile at a time (`_xla_cache_off` is global)
_events = threading.local()


def _count_compile(event: str, duration: float, **kwargs) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _events.compiles = getattr(_events, "compiles", 0) + 1


def _count_hit(event: str, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _events.hits = getattr(_events, "hits", 0) + 1


@functools.cache
def _listen() -> None:
    jax.monitoring.register_event_duration_secs_listener(_count_compile)
    jax.monitoring.register_event_listener(_count_hit)


def _compile_events() -> tuple[int, int]:
    """(XLA compiles, of them answered by JAX's persistent cache) this thread has run:
    `jax.monitoring` reports each in the thread that runs it, and a program JAX finds in its
    in-memory cache reports neither."""
    _listen()
    return getattr(_events, "compiles", 0), getattr(_events, "hits", 0)


@contextlib.contextmanager
def _xla_cache_off():
    """JAX's persistent compilation cache off for one compile. XLA:CPU cannot serialize again
    an executable it loaded from that cache (the loaded one keeps no object code: running a
    copy fails with "Function ... not found"), so a program this cache stores is compiled
    anew, once per key; one found in JAX's in-memory cache (compiled earlier in this
    process, perhaps loaded) or, should another thread have turned the cache back on, in
    the persistent cache, is not stored (`_compile_events`)."""
    if not jax.config.jax_enable_compilation_cache:
        yield
        return
    jax.config.update("jax_enable_compilation_cache", False)
    xla_cache.reset_cache()  # JAX decides once per process whether its cache is used
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
        xla_cache.reset_cache()


def _load(entry: dict, mesh):
    """The `jax.stages.Compiled` an entry holds, loaded onto the devices it was compiled
    for: the mesh's, on a mesh; else the one default device an unsharded program runs on
    (JAX would otherwise load it onto every device of the process, and a process with
    several runs it expecting one shard per device)."""
    devices = [_default_device()] if mesh is None else list(mesh.devices.flat)
    return serialize_executable.deserialize_and_load(
        entry["executable"], entry["in_tree"], entry["out_tree"], execution_devices=devices)


def _default_device():
    """The device `jax.jit` places an unsharded program on."""
    device = jax.config.jax_default_device
    return device if isinstance(device, jax.Device) else jax.devices()[0]


def _read(path: Path, text: str) -> dict | None:
    """The entry stored at `path` for `text`, or None (absent, or ignored with one warning
    line: unreadable, corrupted, another key)."""
    try:
        blob = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # absent (a bad directory: `_write` says)
        return None
    except OSError as e:
        log.warning("program cache: cannot read %s (%s); compiling again", path, e.strerror)
        return None
    body = blob[len(MAGIC) + 32:]
    if not blob.startswith(MAGIC) or blob[len(MAGIC):len(MAGIC) + 32] != hashlib.sha256(body).digest():
        log.warning("program cache: %s is corrupted; ignoring it and compiling again", path)
        return None
    try:
        stored_text, entry = pickle.loads(body)
        if stored_text != text:
            log.warning("program cache: %s holds another program (a digest collision); "
                        "compiling again", path)
            return None
        if set(entry) != {"executable", "in_tree", "out_tree"}:
            raise ValueError("unknown fields")
    except Exception as e:  # written by other library versions: stale
        log.warning("program cache: %s is stale (%s); compiling again", path, type(e).__name__)
        return None
    try:
        os.utime(path)  # recently used: pruned last
    except OSError:
        pass
    return entry


_unwritable: set[str] = set()  # directories already warned about (one warning each)


def _write(path: Path, text: str, entry: dict) -> bool:
    """Writes an entry atomically (a temporary file renamed into place); whether it was
    written. A directory that cannot be written is warned about once and left alone."""
    try:
        body = pickle.dumps((text, entry), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # a tree definition that does not pickle
        log.warning("program cache: cannot store the program (%s); it compiles again in the "
                    "next process", type(e).__name__)
        return False
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _prune_once(str(directory))
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + hashlib.sha256(body).digest() + body)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        if str(directory) not in _unwritable:
            _unwritable.add(str(directory))
            log.warning("program cache: cannot write to %s (%s); programs compile again in "
                        "the next process", directory, e.strerror or e)
        return False
    return True


@functools.cache
def _prune_once(directory: str) -> None:
    """Bounds the directory once per process (`pull.prune_cache_dir`)."""
    from hispec_jax.models.pull import prune_cache_dir

    prune_cache_dir(directory, MAX_BYTES, KEEP_BYTES)
