"""One vocabulary for decoding methods: a typed, frozen spec per method.

    AR()                                  plain decoding
    Exit(layer=6)                         early-exit inference from one exit
    Lookup(k=16, max_ngram=8)             prompt-lookup drafts, the final layer verifies
    LayerSkip(draft_exit=4, draft_len=2)  a draft exit, the final layer verifies
    HiSpec(draft_exit=4, verify_exits=(12,), draft_len=2, verify_window=4)
    SV(draft_exit=4, verify_exits=(12,))  speculative verification (`sv.py`)
    SpecBound(tau=0.7, width=2)           dynamic draft exits (`draft.DynamicDraftExit`)
    DraftModel(k=5)                       a draft model's drafts (`Model.with_draft`)

A prompt-lookup drafter goes under exits or a draft model as `lookup=Lookup(...)`
(`LayerSkip(draft_exit=4, lookup=Lookup(k=8))`), a draft model under exits as
`draft=DraftModel(...)` (the model itself is attached with `generate(..., draft=)` or
`Model.with_draft`). A field left None takes the default `methods.make_method` gives it
(the model's recommended exits, the paper's windows, ...).

Each spec is checked when it is made, with the one-line errors of `options.py` (what needs
the model's weights, such as which exits have heads, is checked by `methods.make_method`).
The same spec is:
- the `method=` of `hispec_jax.generate`, `generate_stream` and `hispec serve`'s
  `build_app` (`resolve` turns a spec, a method name with options, "auto" or None into
  what runs);
- a JSON object, the method's name and its options as the command line names them
  (`to_json` / `from_json`: {"method": "hispec", "draft_exit": 4, "verify_exits": [12]}),
  stored in saved plans (`Plan.spec`), read from recommended ones (`of_recommended`) and
  printed in stats ("method_spec");
- the command line's flags (`--method hispec --draft-exit 4 ...`, `of`).

This module imports nothing but the standard library, `options.py` and `recommended.py`,
so the command line can build and check a spec before importing JAX.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, ClassVar, Union

from hispec_jax.decoding import options as options_lib
from hispec_jax.decoding import recommended
from hispec_jax.decoding.options import OptionError


def _tuple(value):
    """A list from JSON (or an int) as the tuple the spec keeps; None stays None."""
    if value is None:
        return None
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    """A decoding method and its settings; subclasses name one method each.

    `options()` gives the method's `make_method` options (only those given): the spelling
    the command line, the JSON form and `methods.make_method` share."""

    method: ClassVar[str] = ""

    def __post_init__(self):
        options = self.options()
        options_lib.check_method_options(self.method, draft=_drafts(self.method, options),
                                         **options)

    def options(self) -> dict[str, Any]:
        return {}

    def flat(self) -> tuple[str, dict[str, Any]]:
        """(method name, options): `methods.make_method(model, name, **options)`'s."""
        return self.method, self.options()

    def to_json(self) -> dict[str, Any]:
        """{"method": name, option: value, ...}: tuples as lists, a path as its text; an
        in-memory object (an SV profile given as one) is left out."""
        out: dict[str, Any] = {"method": self.method}
        for k, v in self.options().items():
            if isinstance(v, tuple):
                v = list(v)
            elif isinstance(v, os.PathLike):
                v = os.fspath(v)
            elif not isinstance(v, (bool, int, float, str, list)):
                continue
            out[k] = v
        return out

    def __str__(self) -> str:
        given = ", ".join(f"{f.name}={getattr(self, f.name)!s}" for f in dataclasses.fields(self)
                          if getattr(self, f.name) != f.default)
        return f"{type(self).__name__}({given})"


def _given(**options) -> dict[str, Any]:
    """The options given: None and False (a switch left off) dropped."""
    return {k: v for k, v in options.items() if v is not None and v is not False}


@dataclasses.dataclass(frozen=True)
class AR(MethodSpec):
    """Plain autoregressive decoding: the final layer, one token a step."""

    method: ClassVar[str] = "ar"


@dataclasses.dataclass(frozen=True)
class Exit(MethodSpec):
    """Early-exit inference: every token from exit `layer` (not the model's output)."""

    method: ClassVar[str] = "exit"
    layer: int | None = None

    def options(self) -> dict[str, Any]:
        return _given(exit_layer=self.layer)


@dataclasses.dataclass(frozen=True)
class Lookup(MethodSpec):
    """Prompt-lookup (n-gram) drafts of up to `k` tokens from suffixes of up to `max_ngram`
    tokens (`lookup.py`); `gate` False turns the acceptance gate off. Alone (method
    "lookup": the final layer verifies) or as the `lookup` of `LayerSkip` / `HiSpec` (its
    `acceptance` then left None: the outer method's)."""

    method: ClassVar[str] = "lookup"
    k: int = options_lib.DEFAULT_LOOKUP
    max_ngram: int = options_lib.DEFAULT_MAX_NGRAM
    gate: bool = True
    acceptance: str | None = None

    def options(self) -> dict[str, Any]:
        return {"lookup": self.k, "max_ngram": self.max_ngram,
                **({} if self.gate else {"lookup_gate": False}),
                **_given(acceptance=self.acceptance)}


@dataclasses.dataclass(frozen=True)
class DraftModel(MethodSpec):
    """A draft model's drafts (`engine/draft_model.py`): up to `k` a round (an int, or
    (k', k) with two draft models), `gate` False turns its acceptance gate off, `lookup`
    the k of a prompt lookup below it (`max_ngram` its suffixes). Alone (method "draft":
    the final layer verifies) or as the `draft` of `LayerSkip` / `HiSpec` (its
    `acceptance` then left None)."""

    method: ClassVar[str] = "draft"
    k: Union[int, tuple[int, int], None] = None
    gate: bool = True
    lookup: int | None = None
    max_ngram: int | None = None
    acceptance: str | None = None

    def __post_init__(self):
        if isinstance(self.k, list):
            object.__setattr__(self, "k", tuple(self.k))
        super().__post_init__()

    def options(self) -> dict[str, Any]:
        return {**_given(draft_k=self.k), **({} if self.gate else {"draft_gate": False}),
                **_given(lookup=self.lookup, max_ngram=self.max_ngram,
                         acceptance=self.acceptance)}


def _below(spec: Lookup | DraftModel | None, kind: type, name: str) -> dict[str, Any]:
    """The options of a drafter under exits (`name`: the field holding it)."""
    if spec is None:
        return {}
    if not isinstance(spec, kind):
        raise OptionError(name, spec, f"must be a {kind.__name__} spec",
                          f"{name}={spec!r} is not a {kind.__name__}(...) spec")
    if spec.acceptance is not None:
        raise OptionError("acceptance", spec.acceptance, "belongs to the outer method",
                          f"the {name} under exits takes the outer method's acceptance rule, "
                          "not its own")
    return spec.options()


@dataclasses.dataclass(frozen=True)
class LayerSkip(MethodSpec):
    """Self-speculation: exit `draft_exit` drafts `draft_len` tokens, the final layer
    verifies them; `adaptive` App. J windows; `exit_gate` the exit drafter's acceptance
    gate; `lookup` a prompt lookup below the draft exit, or `draft` a draft model."""

    method: ClassVar[str] = "layerskip"
    draft_exit: int | None = None
    draft_len: int | None = None
    adaptive: bool = False
    acceptance: str | None = None
    exit_gate: bool = False
    lookup: Lookup | None = None
    draft: DraftModel | None = None

    def options(self) -> dict[str, Any]:
        return {**_given(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                            if f.name not in ("lookup", "draft")}),
                **_below(self.lookup, Lookup, "lookup"), **_below(self.draft, DraftModel, "draft")}


@dataclasses.dataclass(frozen=True)
class HiSpec(LayerSkip):
    """Hierarchical speculation: exit `draft_exit` drafts, the intermediate `verify_exits`
    verify every `draft_len` drafts, the final layer once `verify_window` tokens are
    pending (an int, or one window per intermediate exit, each the window of the level
    above it); the rest as `LayerSkip`."""

    method: ClassVar[str] = "hispec"
    verify_exits: tuple[int, ...] | None = None
    verify_window: Union[int, tuple[int, ...], None] = None

    def __post_init__(self):
        object.__setattr__(self, "verify_exits", _tuple(self.verify_exits))
        if isinstance(self.verify_window, list):
            object.__setattr__(self, "verify_window", tuple(self.verify_window))
        super().__post_init__()


@dataclasses.dataclass(frozen=True)
class SV(MethodSpec):
    """Speculative verification (`sv.py`): the companion exit in `verify_exits` picks how
    many of the `draft_len` drafts the final layer verifies, from `sv_profile`."""

    method: ClassVar[str] = "sv"
    draft_exit: int | None = None
    verify_exits: tuple[int, ...] | None = None
    draft_len: int | None = None
    sv_profile: Any = None
    acceptance: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "verify_exits", _tuple(self.verify_exits))
        super().__post_init__()

    def options(self) -> dict[str, Any]:
        return _given(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


@dataclasses.dataclass(frozen=True)
class SpecBound(MethodSpec):
    """SpecBound's dynamic draft exits (`draft.DynamicDraftExit`): each draft exits at the
    first exit <= `depth_bound` whose annealed confidence clears `tau`, at most `width`
    drafts a round."""

    method: ClassVar[str] = "specbound"
    tau: float | None = None
    anneal: float | None = None
    depth_bound: int | None = None
    width: int | None = None
    acceptance: str | None = None

    def options(self) -> dict[str, Any]:
        return _given(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})


SPECS: dict[str, type[MethodSpec]] = {
    cls.method: cls for cls in (AR, Exit, Lookup, DraftModel, LayerSkip, HiSpec, SV, SpecBound)}


def _drafts(method: str, options: dict) -> bool | None:
    """True where the method runs a draft model (so `check_method_options` takes its
    settings; whether the model has one is `make_method`'s check), else None."""
    return True if (method == "draft" or "draft_k" in options or "draft_gate" in options) else None


# --------------------------------------------------------------------- the flat spelling
# switches whose False is a choice (off where on by default), not "not given"
_OFF_SWITCHES = ("lookup_gate", "draft_gate")


def _given_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options given: None, and False for a switch off by default, mean not given."""
    return {k: v for k, v in options.items()
            if v is not None and (v is not False or k in _OFF_SWITCHES)}


def of(method: str, *, has_draft: bool | None = None, num_layers: int | None = None,
       **options) -> MethodSpec:
    """The spec of a method name and its `make_method` options (the command line's and the
    JSON form's spelling); `OptionError` names a bad one, as `check_method_options` does.
    Options left None (or False, for the switches off by default) are not given.
    `has_draft`: whether the model has a draft model (None: not known here; draft settings
    then stand for one); `num_layers`: the model's L, where known (layer ranges checked
    against it)."""
    options = _given_options(options)
    draft = _drafts(method, options) if has_draft is None else (True if has_draft else None)
    options_lib.check_method_options(method, num_layers=num_layers, draft=draft, **options)
    if method not in SPECS:  # "auto": a saved plan, resolved by `resolve`
        raise OptionError("method", method, f"must be one of {', '.join(SPECS)}",
                          f"method {method!r} has no spec (it is resolved to one)")
    pop = options.pop
    if method == "exit":
        return Exit(layer=pop("exit_layer", None))
    if method == "lookup":
        return Lookup(k=pop("lookup", options_lib.DEFAULT_LOOKUP),
                      max_ngram=pop("max_ngram", options_lib.DEFAULT_MAX_NGRAM),
                      gate=pop("lookup_gate", True), **options)
    if method == "draft":
        return DraftModel(k=pop("draft_k", None), gate=pop("draft_gate", True), **options)
    if method in ("layerskip", "hispec"):
        lookup = draft = None
        if _drafts(method, options):
            draft = DraftModel(k=pop("draft_k", None), gate=pop("draft_gate", True),
                               lookup=pop("lookup", None), max_ngram=pop("max_ngram", None))
        elif "lookup" in options:
            lookup = Lookup(k=pop("lookup"),
                            max_ngram=pop("max_ngram", options_lib.DEFAULT_MAX_NGRAM),
                            gate=pop("lookup_gate", True))
        return SPECS[method](lookup=lookup, draft=draft, **options)
    return SPECS[method](**options)


def from_json(value: dict[str, Any] | str) -> MethodSpec:
    """The spec of its JSON form ({"method": name, option: value, ...}, or that object's
    text); `OptionError` on a bad one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise OptionError("method", value, "must be a method name or a JSON object",
                              f"method spec {value!r} is not valid JSON ({e})") from None
    if not isinstance(value, dict) or not isinstance(value.get("method"), str):
        raise OptionError("method", value, "must be a JSON object with a \"method\" name",
                          f"method spec {value!r} is not an object with a \"method\" name")
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()
               if k != "method"}
    return of(value["method"], **options)


def of_recommended(rec: recommended.Recommended) -> MethodSpec:
    """The spec of a model's recommended plan (`recommended.load`): LayerSkip or HiSpec."""
    return of(rec.method, **rec.options())


# ------------------------------------------------------------------------ the one resolver
GIVEN = "given"


def resolve(method, options: dict[str, Any] | None = None, *, model_path=None,
            num_layers: int | None = None, has_draft: bool = False
            ) -> tuple[MethodSpec | str, str]:
    """(spec, or "auto", and why it runs) for a `method` as every entry point takes it: a
    `MethodSpec` (no `options` then), a method name with its `options`, "auto" (a plan
    `hispec tune` saved: resolved to a spec where the weights are, `planner.tune`), or
    None: the model's default plan, the same for `hispec_jax.generate`, `generate_stream`,
    `hispec generate`, `chat` and `serve` (a draft model's classic plan where one is given,
    else the model's recommended plan, else gated prompt lookup: `recommended.default_plan_for`),
    with the `options` given on top. Reads no weights: `model_path` and `num_layers` (None
    before the weights are read) say where the recommended plan is."""
    options = dict(options or {})
    given = _given_options(options)
    if isinstance(method, MethodSpec):
        if given:
            raise OptionError(sorted(given)[0], given[sorted(given)[0]],
                              "is part of the method spec",
                              f"method options are part of the spec {method}; pass none "
                              f"with one (got {', '.join(sorted(given))})")
        return method, GIVEN
    if method == "auto":
        options_lib.check_method_options("auto", num_layers=num_layers,
                                         draft=True if has_draft else None, **options)
        return "auto", "the plan hispec tune saved for this model and device"
    if method is None:
        if has_draft:
            return (of("draft", has_draft=True, num_layers=num_layers, **options),
                    "a draft model was given")
        method, plan_options, reason = recommended.default_plan_for(model_path, num_layers)
        return of(method, has_draft=False, num_layers=num_layers,
                  **{**plan_options, **given}), reason
    if not isinstance(method, str):
        raise OptionError("method", method, "must be a method name, a MethodSpec, 'auto' or None",
                          f"method={method!r} is not a method name, a MethodSpec, 'auto' or None")
    return of(method, has_draft=has_draft, num_layers=num_layers, **options), GIVEN
