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

`default_plan(model)` is what `hispec serve` and `hispec chat` run when no method is given:
the model's recommended HiSpec plan (else its LayerSkip plan), or for a model without one
prompt lookup (`FALLBACK_METHOD`), which needs no exit heads; with the reason, for the
startup line and `/health`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

RECOMMENDED_FILE = "recommended_plan.json"
FORMAT_VERSION = 1
METHODS = ("layerskip", "hispec")
PREFERRED = ("hispec", "layerskip")  # the default plan: the first of these the model has
FALLBACK_METHOD = "lookup"  # the default plan of a model without a recommended plan


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
            opts["verify_window"] = (self.windows[1] if len(self.windows) == 2
                                     else tuple(self.windows[1:]))
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


def default_plan(model) -> tuple[str, dict[str, Any], str]:
    """(method, method options, reason): what to run on `model` (a loaded `Model`) when no
    method is given. See `default_plan_for`."""
    return default_plan_for(model.path, model.cfg.num_layers)


def default_plan_for(model_path, num_layers: int | None) -> tuple[str, dict[str, Any], str]:
    """The default plan of the model at `model_path` (None: a model without a directory):
    its recommended "hispec" plan, else its "layerskip" plan, else `FALLBACK_METHOD`. The
    options are `make_method`'s; they are empty for a recommended plan, whose exits and
    windows `make_method` takes from the same file. A malformed plan file is an error
    naming the file (`load`). `num_layers` None (the count is not known before the weights
    are read): the plan's layer check is left to `make_method`."""
    path = path_for(model_path)
    if path is not None and path.is_file():
        for method in PREFERRED:
            rec = (load(model_path, method, num_layers) if num_layers is not None
                   else _load_unchecked(path, method))
            if rec is not None:
                return method, {}, (
                    f"the model's recommended plan ({path.name}): {method} exits "
                    f"{','.join(map(str, rec.exits))}, windows {','.join(map(str, rec.windows))}")
    return FALLBACK_METHOD, {}, (f"the model has no recommended plan ({RECOMMENDED_FILE}): "
                                 f"{FALLBACK_METHOD}, n-gram drafts from the prompt that need "
                                 "no exit heads")


def _load_unchecked(path: Path, method: str) -> Recommended | None:
    """`load` for a model whose layer count is not known yet: the plan's own last exit
    stands in for L."""
    try:
        exits = json.loads(path.read_text())["methods"][method]["exits"]
        num_layers = int(exits[-1])
    except (KeyError, TypeError, ValueError, IndexError):
        num_layers = 0  # `load` names what is wrong with the file, or finds no entry
    return load(path.parent, method, num_layers)
