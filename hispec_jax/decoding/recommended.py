"""A model's recommended hierarchy: `recommended_plan.json` in its directory (beside a
.gguf file), the plan that works best for it, per method.

`method="layerskip"` or `"hispec"` with no exits given uses the model's recommended plan
for that method (its exits; its windows where none are given) and says so in the stats
(`hierarchy_source`); without one, the paper's exits L/8 (draft) and L/4 (intermediate
verifier) remain the defaults. Exits given explicitly always win.

    {"format_version": 1,
     "source": "hispec tune --verify (cpu-2cores)",               # how it was chosen
     "methods": {"hispec":    {"exits": [3, 6, 24], "windows": [4, 12], "adaptive": false},
                 "layerskip": {"exits": [8, 24], "windows": [3], "adaptive": false}},
     "measured": {...}}                                            # optional evidence

`hispec tune --recommend` writes it from the tune's best plan of each kind
(`planner.plan.save_recommended`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

RECOMMENDED_FILE = "recommended_plan.json"
FORMAT_VERSION = 1
METHODS = ("layerskip", "hispec")


@dataclasses.dataclass(frozen=True)
class Recommended:
    """One method's recommended hierarchy.

    Attributes:
      method: "layerskip" or "hispec".
      exits: (draft exit, intermediate verifiers..., L).
      windows: (draft_len, verify_window, ...), one per verifying level.
      adaptive: App. J adaptive windows (the windows are then the initial ones).
      source: how it was chosen, and the file it came from.
    """

    method: str
    exits: tuple[int, ...]
    windows: tuple[int, ...]
    adaptive: bool
    source: str

    def options(self) -> dict[str, Any]:
        """`make_method` options of this plan."""
        opts: dict[str, Any] = {"draft_exit": self.exits[0], "draft_len": self.windows[0]}
        if self.method == "hispec":
            opts["verify_exits"] = tuple(self.exits[1:-1])
            opts["verify_window"] = self.windows[1]
        if self.adaptive:
            opts["adaptive"] = True
        return opts


def path_for(model_path) -> Path | None:
    """Where a model's recommended plan lives: its directory, or beside its .gguf file."""
    if model_path is None:
        return None
    directory = Path(model_path)
    return (directory.parent if directory.is_file() else directory) / RECOMMENDED_FILE


def load(model_path, method: str, num_layers: int) -> Recommended | None:
    """The model's recommended plan for `method`, or None (no file, or no entry for it).
    A file that is there but malformed is an error naming the file, never ignored."""
    path = path_for(model_path)
    if method not in METHODS or path is None or not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text())
        if payload.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {payload.get('format_version')!r} is not "
                             f"{FORMAT_VERSION}")
        entry = payload.get("methods", {}).get(method)
        if entry is None:
            return None
        exits, windows = tuple(int(e) for e in entry["exits"]), tuple(
            int(w) for w in entry["windows"])
        levels = 2 if method == "layerskip" else None
        if (len(exits) < 2 or exits[-1] != num_layers or len(windows) != len(exits) - 1
                or (levels is not None and len(exits) != levels) or (
                    method == "hispec" and len(exits) < 3)):
            raise ValueError(f"exits {list(exits)} / windows {list(windows)} do not fit a "
                             f"{method} hierarchy of a {num_layers}-layer model")
    except (KeyError, TypeError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not a valid recommended plan ({err})") from None
    source = f"{payload.get('source', 'unknown')} ({path.name})"
    return Recommended(method, exits, windows, bool(entry.get("adaptive", False)), source)


def save(model_path, plans: dict[str, dict[str, Any]], source: str,
         measured: dict[str, Any] | None = None) -> Path:
    """Writes `plans` ({method: {"exits", "windows", "adaptive"}}) as the model's
    recommended plan; returns the file."""
    unknown = set(plans) - set(METHODS)
    if unknown:
        raise ValueError(f"recommended plans are for {METHODS}, got {sorted(unknown)}")
    path = path_for(model_path)
    if path is None:
        raise ValueError("the model has no directory to hold a recommended plan")
    payload = {"format_version": FORMAT_VERSION, "source": source,
               "methods": {m: {"exits": list(p["exits"]), "windows": list(p["windows"]),
                               "adaptive": bool(p.get("adaptive", False))}
                           for m, p in plans.items()}}
    if measured:
        payload["measured"] = measured
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path
