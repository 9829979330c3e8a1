"""A plan (the hierarchy `tune` chose) and the plan file.

Plan files live in `$HISPEC_CACHE/plans/` (default `~/.cache/hispec/plans/`), one per
(model, device, batch size): `<model key>-<device key>-b<B>.json`. `hispec tune --out`
writes one anywhere else (e.g. next to the model); `load_plan` also looks in the model's
directory for `plans/<device key>-b<B>.json`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np

from hispec_jax.decoding import method_spec, methods
from hispec_jax.decoding.costs import device_key
from hispec_jax.models.model import Model
from hispec_jax.models.pull import default_cache_dir

FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Plan:
    """One hierarchy with its predicted speed.

    Attributes:
      exits: (e_0, ..., e_{K-1} = L); K = 1 is AR.
      windows: (draft_len Nd, verify_window Ni, ...), K - 1 entries (initial windows when
        adaptive).
      adaptive: App. J adaptive windows.
      predicted_tokens_per_second: steady-state decoding speed at the plan's batch size.
      predicted_speedup: over AR's predicted speed.
      tokens_per_round: expected tokens per sequence per loop trip.
      predicted_work_per_token: expected layer passes + heads (in layer equivalents) per
        emitted token (`latency.work_costs`; None when the search had no model).
      predicted_work_speedup: AR's work per token over the plan's.
      lookup: k of the prompt-lookup drafter, 0: none. With exits (L,) `method="lookup"`;
        below exits (d, L) or (d, i, ..., L) the drafter is level 0 under LayerSkip /
        HiSpec (`lookup=k`): exit d verifies its drafts, and the windows are the levels
        above it (`Nd`: L, or i, verifies once Nd + 1 tokens are pending). With
        `draft_k`, a lookup below the draft model.
      draft_k: k of a draft model drafting for the target's levels, 0: none. With exits
        (L,) the final layer verifies it (method "draft"); with (d, L) or (d, i, L) it is
        level 0 under LayerSkip / HiSpec (`draft=`), the windows those of the levels
        above exit d, as for a lookup. Such a plan runs only on the model with the same
        draft model (`Model.with_draft`, `--draft-model`): its plan file is keyed by both.
      draft_gate: with `draft_k`, whether the acceptance gate picks each round's window.
      inner_k: with `draft_k`, k' of the draft model's own draft model below it (HSD's two
        draft models: `draft_k=(k', k)`), 0: none.
    """

    exits: tuple[int, ...]
    windows: tuple[int, ...] = ()
    adaptive: bool = False
    predicted_tokens_per_second: float = 0.0
    predicted_speedup: float = 1.0
    tokens_per_round: float = 1.0
    predicted_work_per_token: float | None = None
    predicted_work_speedup: float | None = None
    lookup: int = 0
    draft_k: int = 0
    draft_gate: bool = True
    inner_k: int = 0

    def __post_init__(self):
        if self.lookup and self.adaptive:
            raise ValueError("a lookup plan has fixed windows (the lookup adapts its own k)")
        if self.inner_k and (not self.draft_k or self.lookup):
            raise ValueError("inner_k is a second draft model's: it needs draft_k and no lookup")

    @property
    def method(self) -> str:
        if self.draft_k and len(self.exits) == 1:
            return "draft"
        if self.lookup and len(self.exits) == 1:
            return "lookup"
        return {1: "ar", 2: "layerskip"}.get(len(self.exits), "hispec")

    @property
    def kind(self) -> str:
        """The plan's family in the search's table: ar, layerskip, hispec, lookup,
        layerskip+lookup, hispec+lookup, draft, draft+lookup, draft+draft (two draft
        models), layerskip+draft, hispec+draft."""
        if self.draft_k:
            return ("draft" if len(self.exits) == 1 else self.method + "+draft") + (
                "+lookup" if self.lookup else "+draft" if self.inner_k else "")
        return self.method + ("+lookup" if self.lookup and len(self.exits) > 1 else "")

    def method_options(self) -> dict[str, Any]:
        """Options of `make_method(model, self.method, **options)`."""
        if self.draft_k:
            exits = dataclasses.replace(self, draft_k=0, lookup=0, inner_k=0)
            return {**exits.method_options(),
                    "draft_k": (self.inner_k, self.draft_k) if self.inner_k else self.draft_k,
                    **({} if self.draft_gate else {"draft_gate": False}),
                    **({"lookup": self.lookup} if self.lookup else {})}
        if self.lookup and len(self.exits) == 1:
            return {"lookup": self.lookup}
        if len(self.exits) == 1:
            return {}
        opts: dict[str, Any] = {"draft_exit": self.exits[0], "draft_len": self.windows[0]}
        if len(self.exits) > 2:
            opts["verify_exits"] = tuple(self.exits[1:-1])
            opts["verify_window"] = (self.windows[1] if len(self.exits) == 3
                                     else tuple(self.windows[1:]))
        if self.adaptive:
            opts["adaptive"] = True
        if self.lookup:
            opts["lookup"] = self.lookup
        return opts

    @classmethod
    def of_decoder(cls, decoder: methods.Decoder) -> "Plan":
        """The plan (unscored) of the hierarchy `decoder` runs: the inverse of `decoder`
        for AR, LayerSkip, HiSpec and the lookup alone or under them (a lookup level's own
        window is its k)."""
        h = decoder.hierarchy
        options = h.drafter.plan_options()
        k = options.get("lookup", 0)
        exits = tuple(e for e in h.exits if e)
        if options.get("draft_k"):  # a draft model below the target's levels
            ks = options["draft_k"]
            inner_k, draft_k = ks if isinstance(ks, tuple) else (0, ks)
            return cls(exits=exits, windows=tuple(decoder.windows[1:]), draft_k=draft_k,
                       draft_gate=options.get("draft_gate", True), lookup=k, inner_k=inner_k)
        return cls(exits=exits, windows=tuple(decoder.windows[1 if k else 0:]),
                   adaptive=h.adaptive, lookup=k)

    def spec(self) -> method_spec.MethodSpec:
        """The plan's method spec (what `hispec_jax.generate(method=...)` takes)."""
        return method_spec.of(self.method, **self.method_options())

    def decoder(self, model: Model, greedy: bool = True) -> methods.Decoder:
        """The plan as a `Decoder`."""
        if self.draft_k and model.draft is None:
            raise ValueError(f"the plan '{self.name()}' drafts with a draft model: give the "
                             "model the draft model it was tuned with (--draft-model)")
        if self.inner_k and "draft" not in model.draft.params:
            raise ValueError(f"the plan '{self.name()}' drafts with two draft models: give "
                             "the smaller one too (--smaller-draft-model)")
        return methods.make_method(model, self.spec(), greedy=greedy)

    def name(self) -> str:
        if self.draft_k:
            drafts = (f"draft model k={self.draft_k}" + ("" if self.draft_gate else " ungated")
                      + (f" + lookup k={self.lookup}" if self.lookup else "")
                      + (f" + smaller draft model k={self.inner_k}" if self.inner_k else ""))
            if len(self.exits) == 1:
                return drafts
            return dataclasses.replace(self, draft_k=0, lookup=0, inner_k=0).name() + " + " + drafts
        if self.lookup and len(self.exits) == 1:
            return f"lookup k={self.lookup}"
        if self.lookup:
            return dataclasses.replace(self, lookup=0).name() + f" + lookup k={self.lookup}"
        if len(self.exits) == 1:
            return "ar"
        if len(self.exits) == 2:
            return f"layerskip d={self.exits[0]} nd={self.windows[0]}" + (" adaptive" if self.adaptive else "")
        mids = ",".join(map(str, self.exits[1:-1]))
        wins = ",".join(map(str, self.windows[1:]))
        return (f"hispec d={self.exits[0]} i={mids} nd={self.windows[0]} ni={wins}"
                + (" adaptive" if self.adaptive else ""))

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["method"], d["kind"], d["name"] = self.method, self.kind, self.name()
        d["spec"] = self.spec().to_json()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Plan":
        fields = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in fields}
        d["exits"], d["windows"] = tuple(d["exits"]), tuple(d.get("windows", ()))
        return cls(**d)


def model_key(model: Model) -> str:
    """A short name + hash of the model's identity: its config, exit heads and a few of its
    weights (a retrained or different checkpoint gets a different key)."""
    h = hashlib.sha1(repr(model.cfg).encode())
    h.update(repr(sorted(model.heads)).encode())
    embed = np.asarray(model.params["embed"])
    h.update(np.ascontiguousarray(embed[:4]).tobytes())
    h.update(np.float64(np.asarray(embed, np.float64).sum()).tobytes())
    draft = model.draft
    while draft is not None:  # a draft model's plans are the pair's (or the three models')
        h.update(repr(draft.cfg).encode())
        leaves = jax.tree.leaves(draft.params["layers"])
        h.update(np.float64(np.asarray(leaves[0], np.float64).sum()).tobytes())
        draft = draft.params.get("draft") if isinstance(draft.params, dict) else None
    name = Path(model.path).name if model.path else "model"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name)[:40] or "model"
    return f"{name}-{h.hexdigest()[:12]}"


def cache_dir() -> Path:
    """`$HISPEC_CACHE/plans` (`pull.default_cache_dir`: the one cache root, beside the pulled
    models, the compiled programs and the pass costs)."""
    return default_cache_dir() / "plans"


def plan_path(model: Model, batch_size: int) -> Path:
    return cache_dir() / f"{model_key(model)}-{device_key()}-b{batch_size}.json"


def save_plan_file(path: Path, payload: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)
    return path


def plan_payload(model: Model, batch_size: int, plans: list[Plan], calibration=None,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan file's contents: the chosen plan first, then the runners-up."""
    return {"version": FORMAT_VERSION, "model": model_key(model), "device": device_key(),
            "batch_size": batch_size, "plans": [p.to_json() for p in plans],
            "calibration": calibration.to_json() if calibration is not None else None,
            **(extra or {})}


def load_plan(model: Model, batch_size: int, path: str | Path | None = None) -> Plan | None:
    """The saved plan for (model, this device, batch size), or None. Looks at `path` if
    given, else the model directory's `plans/`, else the cache. A file made for another
    model, device or batch size is ignored."""
    candidates = [Path(path)] if path else []
    if not path and model.path and Path(model.path).is_dir():
        candidates.append(Path(model.path) / "plans" / f"{device_key()}-b{batch_size}.json")
    if not path:
        candidates.append(plan_path(model, batch_size))
    for p in candidates:
        if not p.is_file():
            continue
        d = json.loads(p.read_text())
        if (d.get("version") != FORMAT_VERSION or d.get("model") != model_key(model)
                or d.get("device") != device_key() or d.get("batch_size") != batch_size):
            continue
        if d.get("plans"):
            return Plan.from_json(d["plans"][0])
    return None
