"""`hispec doctor`: what this installation runs on, for a bug report or a first check on a
new machine (a TPU VM, a GPU box): the JAX backend and its devices, the versions of the
packages that decide the numbers (jax, jaxlib and its plugins, flax, transformers,
huggingface_hub, hispec-jax) and where hispec keeps its caches."""

from __future__ import annotations

import json
import os
import sys

from hispec_jax.cli import common

# Distributions whose versions a report needs; jax's accelerator plugins where installed.
PACKAGES = ("hispec-jax", "jax", "jaxlib", "libtpu", "jax-cuda12-plugin", "jax-cuda13-plugin",
            "flax", "transformers", "huggingface_hub")
OPTIONAL = ("libtpu", "jax-cuda12-plugin", "jax-cuda13-plugin")


def add_parsers(subparsers) -> None:
    doctor = common.add_command(
        subparsers, "doctor", run_doctor,
        help="the backend, devices, package versions and cache directories of this install",
        description="Prints the JAX backend and its devices, the versions of hispec-jax, "
                    "jax, jaxlib (and a TPU / CUDA plugin where installed), flax, "
                    "transformers and huggingface_hub, and the cache directories (hispec's: "
                    "pulled models and compiled programs; Hugging Face's: --model org/name). "
                    "Exit status 1 when JAX finds no device.")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")


def versions() -> dict[str, str | None]:
    """{distribution: version, or None where it is not installed (optional plugins left
    out then)}."""
    from importlib import metadata

    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            if name not in OPTIONAL:
                out[name] = None
    return out


def report() -> dict:
    """The doctor's findings as a dict; a backend that fails to start is reported, not
    raised (`error`)."""
    from hispec_jax.models.pull import default_cache_dir

    info: dict = {"versions": versions(), "python": sys.version.split()[0],
                  "hispec_cache": str(default_cache_dir()),
                  "compilation_cache": os.environ.get("JAX_COMPILATION_CACHE_DIR"),
                  "huggingface_cache": None, "backend": None, "devices": [], "error": None}
    try:
        from huggingface_hub import constants

        info["huggingface_cache"] = constants.HF_HUB_CACHE
    except ImportError:
        pass
    try:
        import jax

        info["backend"] = jax.default_backend()
        info["devices"] = [{"id": d.id, "platform": d.platform, "kind": d.device_kind,
                            "process": d.process_index} for d in jax.devices()]
        info["process_count"] = jax.process_count()
    except RuntimeError as e:  # no backend starts (a plugin without its device, ...)
        info["error"] = str(e).strip().splitlines()[0]
    return info


def lines(info: dict) -> list[str]:
    """The report as text."""
    v = info["versions"]
    out = [" ".join(f"{name} {version or 'not installed'}" for name, version in v.items())
           + f" python {info['python']}"]
    if info["error"]:
        out.append(f"backend: none ({info['error']})")
    else:
        kinds = sorted({d["kind"] for d in info["devices"]})
        out.append(f"backend {info['backend']}: {len(info['devices'])} device(s) "
                   f"({', '.join(kinds)}) in {info['process_count']} process(es)")
    out.append(f"hispec cache: {info['hispec_cache']} (pulled models; compiled programs in "
               f"{info['compilation_cache'] or 'none: HISPEC_COMPILATION_CACHE=0'})")
    out.append(f"Hugging Face cache: {info['huggingface_cache'] or 'huggingface_hub not installed'}"
               " (--model org/name)")
    return out


def run_doctor(args) -> int:
    info = report()
    print(json.dumps(info) if args.json else "\n".join(lines(info)))
    return 1 if info["error"] else 0
