"""What the engine's pieces cost on this device: `Costs` (measured stage costs),
`device_key()` (the device a measurement belongs to) and `host_key()` (the same, with a
CPU's vector units).

Decoding policies that weigh speed (SV's verification lengths, `sv.py`) read them here; the
planner (`planner/calibrate.py` measures them, `planner/latency.py` predicts whole
hierarchies from them) builds on them. Plain data and numpy: no engine, no planner.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Costs:
    """Measured costs of the engine's pieces on one device at one batch size (seconds).

    Attributes:
      batch: B, the batch size they were measured at.
      num_layers: L.
      block_sizes: the block lengths T the per-pass costs were measured at (ascending).
      layer_s: seconds of one decoder layer over a block of T tokens (per entry of
        `block_sizes`; linear interpolation between, linear extrapolation beyond).
      head_s: seconds of one evaluation of the shared head (final norm + LM head, argmax)
        on a block of T tokens.
      pass_s: fixed seconds of one pass (draft step or verification) beyond its layers and
        head: gathers, acceptance, rollback, counters, the `lax.cond` around it.
      round_s: fixed seconds of one loop trip (speculation round).
      prefill_s: seconds of one `generate` call outside the loop (prefill, first token,
        request building, transfers), per batch.
      head_scale: ((exit, cost of its head / the shared head's), ...) for the exits whose
        trained head costs otherwise (`calibrate.head_cost_scales`); others cost 1.
    """

    batch: int
    num_layers: int
    block_sizes: tuple[int, ...]
    layer_s: tuple[float, ...]
    head_s: tuple[float, ...]
    pass_s: float = 0.0
    round_s: float = 0.0
    prefill_s: float = 0.0
    head_scale: tuple[tuple[int, float], ...] = ()

    def _interp(self, values, T: float) -> float:
        x, y = np.asarray(self.block_sizes, float), np.asarray(values, float)
        if len(x) == 1:
            return float(y[0] * T / x[0])
        if T > x[-1]:  # extrapolate with the last segment's slope
            return float(y[-1] + (T - x[-1]) * (y[-1] - y[-2]) / (x[-1] - x[-2]))
        return float(np.interp(T, x, y))

    def layer(self, T: int) -> float:
        return self._interp(self.layer_s, T)

    def head(self, T: int) -> float:
        return self._interp(self.head_s, T)

    def head_at(self, exit_layer: int, T: int) -> float:
        """Exit `exit_layer`'s head over a block of T tokens."""
        return dict(self.head_scale).get(exit_layer, 1.0) * self.head(T)

    def stage(self, lo: int, hi: int, T: int) -> float:
        """One pass of layers [lo, hi) plus exit hi's head over a block of T tokens."""
        return (hi - lo) * self.layer(T) + self.head_at(hi, T) + self.pass_s

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Costs":
        d = dict(d)
        for key in ("block_sizes", "layer_s", "head_s"):
            d[key] = tuple(d[key])
        d["head_scale"] = tuple((int(e), float(x)) for e, x in d.get("head_scale", ()))
        return cls(**d)



def device_key() -> str:
    """e.g. 'cpu-2cores' or 'gpu-nvidia-h100-80gb-hbm3'."""
    d = jax.devices()[0]
    if d.platform == "cpu":
        what = f"{len(os.sched_getaffinity(0))}cores"
    else:
        what = d.device_kind
    return re.sub(r"[^a-z0-9]+", "-", f"{d.platform}-{what}".lower()).strip("-")


# A CPU's vector extensions, widest first: what a block pass's compute runs at.
CPU_EXTENSIONS = ("avx512f", "avx2", "avx", "asimd", "neon", "sse4_2")


@functools.lru_cache(maxsize=None)
def host_key() -> str:
    """`device_key()`, and on a CPU its widest vector extension and a hash of its model name
    (e.g. 'cpu-2cores-avx2-1a2b3c'): two hosts with the same cores but other vector units
    can price a block of positions differently (the lookup gate's pass costs,
    `device_costs.py`)."""
    key = device_key()
    if jax.devices()[0].platform != "cpu":
        return key
    name, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                field, _, value = line.partition(":")
                field = field.strip().lower()
                if field in ("model name", "cpu model") and not name:
                    name = value.strip()
                elif field in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:  # not Linux: the platform's own name
        import platform
        name = platform.processor() or platform.machine()
    isa = next((x for x in CPU_EXTENSIONS if x in flags), "")
    digest = hashlib.sha1(name.encode()).hexdigest()[:6]
    return "-".join(part for part in (key, isa, digest) if part)
