"""The lookup gate's pass costs measured on this machine, kept per host and model.

The gate weighs a proposal's expected tokens against what its verification pass costs
(`gate.PassCost`). The backend's default is one device's fit, and devices differ: on a CPU
without AVX-512 a pass over 2 positions of one sequence costs about 1.8 AR steps, not the
default's 1.3, and a batch's blocks less than it says; an accelerator's default is a guess
at a memory-bound pass. `gate.measure_pass_cost` times the model's passes on this device
(every pass shape compiles once: minutes on a CPU); this module keeps the result in
`$HISPEC_CACHE/pass_costs/<model>-<host>.json` (or the folder `$HISPEC_PASS_COSTS` names;
`HISPEC_PASS_COSTS=0`: none kept or read, the test suite's setting), so every later
`generate`, `chat` and `serve` of that model on that host weighs its proposals by it
(`for_model`).

    who measures   `hispec bench-tool pass-cost`; `hispec serve --measure-pass-cost` in the
                   background after its warm-up, once the server is quiet, where its plan
                   has a lookup gate and nothing is kept yet (`server.warm_up`); nothing
                   measures unasked (minutes of a first start's CPU)
    host           `costs.host_key()`: the device, and a CPU's vector extension and model
    model          what a pass's cost depends on (`shape_key`): the config, the weights'
                   dtype, layer layout and form (int8, fused), not their values
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path

import numpy as np

from hispec_jax.decoding import gate as gate_lib
from hispec_jax.decoding.costs import host_key
from hispec_jax.models import params as params_lib
from hispec_jax.models.pull import default_cache_dir

log = logging.getLogger("hispec.costs")

FORMAT_VERSION = 1
MEASURED = "measured on this host"
DEFAULT = "the backend's default"


def shape_key(model) -> str:
    """The model file's name (for the reader) + a hash of what a pass's cost depends on:
    the model's config, its weights' dtype, layer layout and form, not their values (a
    fine-tuned checkpoint of the same shapes and name reads the same measurement)."""
    params = model.params
    first = params_lib._first_layer(params)
    dtypes = sorted({str(np.dtype(x.dtype)) for x in first.values() if hasattr(x, "dtype")})
    parts = (repr(model.cfg), params_lib.layer_layout(params), params_lib.is_quantized(params),
             params_lib.is_fused(params), params_lib.is_out_major(params), dtypes,
             str(np.dtype(params["embed"].dtype)))
    digest = hashlib.sha1(repr(parts).encode()).hexdigest()[:12]
    name = Path(model.path).name if getattr(model, "path", None) else "model"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)[:40] or "model"
    return f"{name}-{digest}"


def store_dir() -> Path | None:
    """The folder measurements are kept in: `$HISPEC_PASS_COSTS`, else
    `$HISPEC_CACHE/pass_costs`; None with HISPEC_PASS_COSTS=0 (none kept or read)."""
    where = os.environ.get("HISPEC_PASS_COSTS")
    if where == "0":
        return None
    return Path(where).expanduser() if where else default_cache_dir() / "pass_costs"


def path_for(model) -> Path | None:
    """Where this host's measurement of `model`'s passes is kept (None: nowhere)."""
    folder = store_dir()
    return None if folder is None else folder / f"{shape_key(model)}-{host_key()}.json"


def load(model) -> gate_lib.PassCost | None:
    """The stored measurement of `model`'s passes on this host, or None (none, none kept,
    or a file this version cannot read)."""
    path = path_for(model)
    if path is None:
        return None
    try:
        d = json.loads(path.read_text())
        if d.get("version") != FORMAT_VERSION or d.get("host") != host_key():
            return None
        measured = {(int(b), int(T)): float(c) for b, T, c in d["measured"]}
        return gate_lib.PassCost.of(float(d["fixed"]), float(d["jump"]), measured)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(model, cost: gate_lib.PassCost,
          seconds: dict[tuple[int, int], float] | None = None) -> Path | None:
    """Writes `cost` (and the passes' `seconds`, for the reader) as this host's measurement
    of `model`; returns the file (None where none is kept)."""
    path = path_for(model)
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"version": FORMAT_VERSION, "host": host_key(), "model": shape_key(model),
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "fixed": float(cost.fixed), "jump": float(cost.jump),
               "measured": [[b, T, round(c, 4)] for (b, T), c in sorted(cost.measured().items())],
               "seconds": [[b, T, s] for (b, T), s in sorted((seconds or {}).items())]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)
    return path


def for_model(model) -> tuple[gate_lib.PassCost, str]:
    """(the pass costs the gate weighs for `model` on this host, where they come from):
    the stored measurement (`MEASURED`), else the backend's default (`DEFAULT`)."""
    cost = load(model)
    return (cost, MEASURED) if cost is not None else (gate_lib.default_pass_cost(), DEFAULT)


def measure_and_store(model, shapes=gate_lib.MEASURED_PASSES, **timing
                      ) -> tuple[gate_lib.PassCost, dict[tuple[int, int], float]]:
    """Times `model`'s passes on this device (`gate.time_passes` over `shapes`, `timing`:
    its context, capacity, repeats, calls), fits them and stores the result; returns it
    and the passes' seconds."""
    t0 = time.perf_counter()
    seconds = gate_lib.time_passes(model, shapes, **timing)
    cost = gate_lib.measured_pass_cost(seconds)
    path = store(model, cost, seconds)
    log.info("measured the lookup gate's pass costs in %.0f s: %s", time.perf_counter() - t0,
             path)
    return cost, seconds


def describe(cost: gate_lib.PassCost) -> str:
    """The costs in one line: 'F 15.0, J 5.0; C(1, 2) 1.83, C(1, 16) 2.53, ...'."""
    table = ", ".join(f"C({b}, {T}) {c:.2f}" for (b, T), c in sorted(cost.measured().items())
                      if T > 1)
    return f"F {float(cost.fixed):.2f}, J {float(cost.jump):.2f}" + (f"; {table}" if table else "")
