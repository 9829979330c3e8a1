"""Compiled programs kept across processes: a start skips tracing and lowering as well as
XLA's compile.

JAX's persistent compilation cache (`cli.common.use_compilation_cache`) keeps XLA's
executables, but every process still traces the Python loop into a jaxpr and lowers it to
StableHLO before it can look the executable up: seconds per decoding loop on a CPU
(docs/startup.md). This cache keeps the lowered program itself, a `jax.export.Exported`,
so a later process only unpickles it, wraps it in a one-primitive `jax.jit` and compiles
that, which XLA's persistent cache answers from disk.

    program = program_cache.compile_cached(jax.jit(fn, donate_argnums=(3,)), abstract_args,
                                           key=engine.program_key(), donate_argnums=(3,))
    outputs = program(*args)            # the pytrees `fn` takes and returns
    program.source                      # "cache" (read), "export" (written) or "jit"

An entry is keyed by a digest of the caller's key (what the program computes: the model
architecture, parameter layout, method and shapes; never the weights' values, which are
arguments), the arguments' shapes, dtypes and shardings, the compiler options, the JAX
settings that change a trace (x64, default matmul precision), the backend and its devices,
and the versions of jax, jaxlib and this library's own source (a digest of its files, so
an edited checkout never runs a stale program). A corrupted entry, one written under other
versions, or a key collision is ignored with one warning line and the program is exported
again; a directory that cannot be written gives one warning and a normal start.
`HISPEC_COMPILATION_CACHE=0` turns it off, whatever the directory (as it turns off XLA's
cache).

What the export carries: donation (the wrapping `jax.jit` donates the same arguments, and
XLA aliases them as before), shardings (the exported module keeps its HLO shardings, and on
a mesh the wrapper takes and returns them, so donated buffers still alias; it runs on as
many devices as it was exported for, part of the key) and unordered effects. Ordered effects (`io_callback(ordered=True)`) and host callbacks are not
exportable: such a program compiles the normal way (`source` "jit"), with a warning.

Entries are pickles of the `Exported` fields (`jax.export`'s own serialization needs the
optional flatbuffers package and a registration per custom pytree node): they are read only
by the jax and jaxlib that wrote them, and each file carries a SHA-256 of its contents.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import jax
import jaxlib

log = logging.getLogger("hispec.program_cache")

MAGIC = b"hispec-program-1\n"
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
      source: "cache" (read from the directory), "export" (exported now and written) or
        "jit" (compiled the normal way: the cache is off, or the program is not exportable).
    """

    executable: Any
    source: str

    def __call__(self, *args):
        return self.executable(*args)

    @property
    def out_info(self):
        """The outputs as `jax.ShapeDtypeStruct`s (a next program's arguments, untraced)."""
        return self.executable.out_info


def compile_cached(jitted, args, *, key: str, donate_argnums=(), compiler_options=None,
                   mesh=None, directory: str | Path | None | bool = True) -> Program:
    """`jitted` (a `jax.jit`-wrapped function) compiled for `args` (arrays or
    `jax.ShapeDtypeStruct`s), through the program cache.

    Args:
      key: what the program computes, as text that is equal across processes exactly when
        the program is (e.g. the repr of a frozen dataclass of static settings). A key that
        holds an object address (" at 0x") is not cached.
      donate_argnums: the arguments `jitted` donates (the cached program donates them too).
      compiler_options: XLA options, as `jax.stages.Lowered.compile` takes them.
      mesh: a `jax.sharding.Mesh` to lower under (`jax.set_mesh`), or None. On a mesh,
        pass `args` as structs with their shardings: the program takes them in every process.
      directory: where entries live; True: `default_directory()`; None or False: off.
        HISPEC_COMPILATION_CACHE=0 turns it off whatever the directory.
    """
    if os.environ.get("HISPEC_COMPILATION_CACHE") == "0":
        directory = None
    elif directory is True:
        directory = default_directory()
    if not directory or " at 0x" in key:
        return Program(_lower(jitted, args, mesh).compile(compiler_options=compiler_options),
                       "jit")
    text = entry_key(key, args, compiler_options)
    path = Path(directory) / (hashlib.sha256(text.encode()).hexdigest()[:40] + SUFFIX)
    exported = _read(path, text)
    if exported is not None:
        try:
            return Program(_compile_exported(exported, args, donate_argnums, compiler_options,
                                             mesh), "cache")
        except Exception as e:  # read whole, yet not a program this JAX can compile: stale
            log.warning("program cache: %s is stale (%s); compiling again", path,
                        type(e).__name__)
    try:
        exported = _export(jitted, args, mesh)
    except Exception as e:  # not exportable (ordered effects, host callbacks, ...)
        log.warning("program cache: %s is not exportable (%s: %s); compiling it the "
                    "normal way", getattr(jitted, "__name__", "the program"),
                    type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return Program(_lower(jitted, args, mesh).compile(compiler_options=compiler_options),
                       "jit")
    _write(path, text, exported)
    return Program(_compile_exported(exported, args, donate_argnums, compiler_options, mesh),
                   "export")


def _compile_exported(exported, args, donate_argnums, compiler_options, mesh):
    """`exported` wrapped in a `jax.jit` that donates `donate_argnums` and, on a mesh,
    takes and returns the exported shardings (so donated buffers alias their outputs).
    An argument's own sharding (a sharded `jax.ShapeDtypeStruct`) wins: the export keeps
    none for an argument the program does not read (a greedy loop's PRNG keys)."""
    if mesh is None:
        wrapper = jax.jit(exported.call, donate_argnums=donate_argnums)
    else:
        exported_in = jax.tree.unflatten(exported.in_tree, exported.in_shardings_jax(mesh))[0]
        in_shardings = jax.tree.map(lambda x, s: getattr(x, "sharding", None) or s,
                                    tuple(args), exported_in)
        out_shardings = jax.tree.unflatten(exported.out_tree, exported.out_shardings_jax(mesh))
        wrapper = jax.jit(exported.call, in_shardings=in_shardings, out_shardings=out_shardings,
                          donate_argnums=donate_argnums)
    return _lower(wrapper, args, mesh).compile(compiler_options=compiler_options)


def _lower(jitted, args, mesh):
    if mesh is None:
        return jitted.lower(*args)
    with jax.set_mesh(mesh):
        return jitted.lower(*args)


def _export(jitted, args, mesh):
    structs = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        args)
    if mesh is None:
        return jax.export.export(jitted)(*structs)
    with jax.set_mesh(mesh):
        return jax.export.export(jitted)(*structs)


def _read(path: Path, text: str):
    """The `Exported` stored at `path` for `text`, or None (absent, or ignored with one
    warning line: unreadable, corrupted, another key)."""
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
        stored_text, fields = pickle.loads(body)
        if stored_text != text:
            log.warning("program cache: %s holds another program (a digest collision); "
                        "compiling again", path)
            return None
        exported = jax.export.Exported(**fields, _get_vjp=None)
    except Exception as e:  # written by other library versions: stale
        log.warning("program cache: %s is stale (%s); compiling again", path, type(e).__name__)
        return None
    try:
        os.utime(path)  # recently used: pruned last
    except OSError:
        pass
    return exported


_unwritable: set[str] = set()  # directories already warned about (one warning each)


def _write(path: Path, text: str, exported) -> None:
    """Writes an entry atomically (a temporary file renamed into place); a directory that
    cannot be written is warned about once and left alone."""
    fields = {f.name: getattr(exported, f.name) for f in dataclasses.fields(exported)
              if f.name != "_get_vjp"}
    try:
        body = pickle.dumps((text, fields), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # something in the program that does not pickle
        log.warning("program cache: cannot store the program (%s); it compiles again in the "
                    "next process", type(e).__name__)
        return
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


@functools.cache
def _prune_once(directory: str) -> None:
    """Bounds the directory once per process (`pull.prune_cache_dir`)."""
    from hispec_jax.models.pull import prune_cache_dir

    prune_cache_dir(directory, MAX_BYTES, KEEP_BYTES)
