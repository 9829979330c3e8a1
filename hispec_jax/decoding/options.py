"""Decoding settings that can be checked without a model's weights and without JAX.

`generate` (through `methods.make_method` and `SamplingParams`) and the `hispec` command line
use the same rules, so the command line rejects a bad setting in milliseconds, before JAX
is imported or weights are read. Rules that need the model (which exits have trained
heads, the default exits) stay in `methods.py`.

Every error is an `OptionError`: a `ValueError` that also carries the setting's `name`, the
`value` given and `allowed` (what would be accepted), so the command line can name its flag.
This module imports nothing but the standard library.
"""

from __future__ import annotations

import math
import numbers

METHODS = ("ar", "exit", "layerskip", "hispec", "sv", "specbound", "lookup", "draft",
           "auto")  # auto: a saved plan
SPECULATIVE_METHODS = ("layerskip", "hispec", "sv", "specbound")
# Options only some methods take (the rest: SPECULATIVE_OPTIONS, exit_layer).
METHOD_OPTIONS = {"sv": ("sv_profile",), "specbound": ("tau", "anneal", "depth_bound", "width")}
# SpecBound defaults: the fastest setting of the sweep in docs/sv_specbound.md (shipped
# model, CPU). The depth bound's default is the deepest exit with a head at or below 2L/3.
SPECBOUND_DEFAULTS = {"tau": 0.7, "anneal": 0.0, "width": 2}
SPECBOUND_DEPTH_FRACTION = (2, 3)
SPECULATIVE_OPTIONS = ("draft_exit", "verify_exits", "draft_len", "verify_window", "adaptive",
                       "acceptance")
ACCEPTANCE_RULES = ("blockwise", "tokenwise")
# Prompt lookup (n-gram drafts, `lookup.py`): method "lookup" (drafts verified by the final
# layer), or `lookup=k` under the exits of these methods, or under a draft model (which
# checks the lookup's tokens in its own passes: `engine/draft_model.py`).
LOOKUP_METHODS = ("lookup", "layerskip", "hispec", "draft")
# The exit drafter's acceptance gate (`gate.py`): methods whose level 0 is a static draft exit.
EXIT_GATE_METHODS = ("layerskip", "hispec")
# A draft model (`engine/draft_model.py`): method "draft" (drafts verified by the final
# layer), or a draft model under the exits of these methods.
DRAFT_METHODS = ("draft", "layerskip", "hispec")
MAX_DRAFT_K = 32  # most tokens a draft model drafts a round
DEFAULT_DRAFT_K = 5
# With two draft models (HSD), the smaller drafts this many tokens per pass of the larger.
DEFAULT_INNER_DRAFT_K = 3
MAX_LOOKUP = 64  # most tokens one lookup proposes (every pass's block grows with it)
MAX_NGRAM = 16
MAX_STORE_TOKENS = 1 << 24  # R: store positions stay exact in float32 (`suffix_store.propose`)
# k = 16 and 8-grams with the "ngram" schedule (a 1-gram match proposes 4 tokens, a 2- to
# 4-gram one 8, a longer one 16): faster than k = 8 with 3-grams where answers quote the
# prompt, the same on chat (docs/lookup.md).
DEFAULT_LOOKUP = 16
DEFAULT_MAX_NGRAM = 8


def lookup_under_exits(k: int) -> int:
    """The other k worth trying for a lookup drafter under exits: half of `k`. Every level
    above the lookup verifies what it kept, so its passes grow with k; on the shipped model
    half of k runs within a few percent of k, faster on some tasks and slower on others, so
    the planner tries both (docs/lookup.md)."""
    return max(k // 2, 1)


class OptionError(ValueError):
    """A bad decoding setting: `name` (the keyword argument), `value`, `allowed` (text)."""

    def __init__(self, name: str, value, allowed: str, message: str | None = None):
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(message or f"{name}={value!r}: {allowed}")


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_positive_int(name: str, value) -> int:
    """An integer >= 1 (max_new_tokens, batch_size, draft_len, verify_window)."""
    if not _is_int(value) or value < 1:
        raise OptionError(name, value, "must be an integer >= 1",
                          f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_sampling(temperature, top_k, top_p, seed) -> None:
    """temperature >= 0 (0: greedy), top_k >= 0 (0: off), top_p in (0, 1], integer seed."""
    if not (_is_real(temperature) and math.isfinite(temperature) and temperature >= 0):
        raise OptionError("temperature", temperature, "must be a finite number >= 0 (0: greedy)",
                          f"temperature must be >= 0, got {temperature!r}")
    if not (_is_int(top_k) and top_k >= 0):
        raise OptionError("top_k", top_k, "must be an integer >= 0 (0: no limit)",
                          f"top_k must be an integer >= 0, got {top_k!r}")
    if not (_is_real(top_p) and 0 < top_p <= 1):
        raise OptionError("top_p", top_p, "must be in (0, 1] (1: no limit)",
                          f"top_p must be in (0, 1], got {top_p!r}")
    if not _is_int(seed):
        raise OptionError("seed", seed, "must be an integer", f"seed must be an integer, got {seed!r}")


def _check_layer(name: str, value, num_layers: int | None, below_top: bool) -> None:
    if not _is_int(value):
        raise OptionError(name, value, "must be an integer layer",
                          f"{name} must be an integer layer, got {value!r}")
    if num_layers is None:
        if value < 1:
            raise OptionError(name, value, "must be a layer >= 1",
                              f"{name}={value} is outside [1, L] (layers count from 1)")
        return
    top = num_layers - 1 if below_top else num_layers
    note = (f"the model has {num_layers} layers"
            + ("; the final layer is always the top verifier" if below_top else ""))
    if not 1 <= value <= top:
        raise OptionError(name, value, f"must be in [1, {top}] ({note})",
                          f"{name}={value} is outside [1, {top}] ({note})")


def check_method_options(method, *, num_layers: int | None = None, exit_layer=None,
                         draft_exit=None, verify_exits=None, draft_len=None, verify_window=None,
                         adaptive=False, acceptance=None, sv_profile=None, tau=None,
                         anneal=None, depth_bound=None, width=None, lookup=None,
                         max_ngram=None, lookup_gate=None, exit_gate=False, draft=None,
                         draft_k=None, draft_gate=None) -> None:
    """Raises `OptionError` if `method` or its options are invalid.

    Checks what needs no weights: the method name, which options the method takes, integer
    ranges (layers in [1, num_layers] when `num_layers` is given), strictly increasing
    explicit exits, the acceptance rule and the acceptance gates (`lookup_gate` False turns
    the lookup drafter's off, `exit_gate` True turns the exit drafter's on), and the draft
    model's settings (`draft`: whether a draft model is given, a model or its path; `draft_k`,
    `draft_gate`). `None` / False mean "not given" (`lookup_gate`, `draft_gate`: None).
    """
    if method not in METHODS:
        raise OptionError("method", method, f"must be one of {', '.join(METHODS)}",
                          f"method={method!r} is not one of {METHODS}")
    _check_lookup(method, lookup, max_ngram, adaptive)
    _check_gates(method, lookup, lookup_gate, exit_gate)
    _check_draft(method, draft, draft_k, draft_gate, lookup_gate=lookup_gate,
                 adaptive=adaptive, exit_gate=exit_gate)
    if method in ("lookup", "draft"):
        given = {"exit_layer": exit_layer, "draft_exit": draft_exit, "verify_exits": verify_exits,
                 "draft_len": draft_len, "verify_window": verify_window,
                 "adaptive": adaptive or None, "sv_profile": sv_profile, "tau": tau,
                 "anneal": anneal, "depth_bound": depth_bound, "width": width}
        given = {k: v for k, v in given.items() if v is not None}
        takes = ("lookup, max_ngram" if method == "lookup"
                 else "draft_k, draft_gate, lookup, max_ngram")
        under = "lookup=K" if method == "lookup" else "a draft model"
        if given:
            name = sorted(given)[0]
            raise OptionError(name, given[name], f"method {method!r} takes only {takes} and "
                              "acceptance",
                              f"method {method!r} does not take {', '.join(sorted(given))} "
                              f"(it has no exit level; use {under} under layerskip or hispec)")
        if acceptance is not None and acceptance not in ACCEPTANCE_RULES:
            raise OptionError("acceptance", acceptance,
                              f"must be one of {', '.join(ACCEPTANCE_RULES)}",
                              f"acceptance={acceptance!r} is not one of {list(ACCEPTANCE_RULES)}")
        return
    extra = {"sv_profile": sv_profile, "tau": tau, "anneal": anneal, "depth_bound": depth_bound,
             "width": width}
    for name, value in extra.items():
        if value is not None and name not in METHOD_OPTIONS.get(method, ()):
            owner = next(m for m, names in METHOD_OPTIONS.items() if name in names)
            raise OptionError(name, value, f"only method {owner!r} takes it",
                              f"method {method!r} does not take {name} (method {owner!r} does)")
    if method == "specbound":
        _check_specbound(num_layers, draft_exit=draft_exit, verify_exits=verify_exits,
                         draft_len=draft_len, verify_window=verify_window, adaptive=adaptive,
                         acceptance=acceptance, **{k: v for k, v in extra.items()
                                                   if k != "sv_profile"})
        return
    if method == "sv":
        for name, value in (("verify_window", verify_window), ("adaptive", adaptive or None)):
            if value is not None:
                raise OptionError(name, value, "method 'sv' chooses its verification length "
                                  "from the companion's signals",
                                  f"method 'sv' does not take {name} (it chooses the "
                                  "verification length itself)")
        if verify_exits is not None and not _is_int(verify_exits) and len(tuple(verify_exits)) != 1:
            raise OptionError("verify_exits", verify_exits, "method 'sv' takes exactly one "
                              "companion exit", "method 'sv' takes exactly one companion exit "
                              f"in verify_exits, got {verify_exits!r}")
        if acceptance == "blockwise":
            raise OptionError("acceptance", acceptance, "method 'sv' verifies token-wise",
                              "method 'sv' supports acceptance='tokenwise' only (its "
                              "verification length is a stopping time of the drafts)")
    given = {"draft_exit": draft_exit, "verify_exits": verify_exits, "draft_len": draft_len,
             "verify_window": verify_window, "adaptive": adaptive or None,
             "acceptance": acceptance}
    given = {k: v for k, v in given.items() if v is not None}
    if method in ("ar", "exit", "auto"):
        if given:
            name = sorted(given)[0]
            raise OptionError(name, given[name],
                              f"method {method!r} does not take it (only "
                              f"{', '.join(SPECULATIVE_METHODS)} do)",
                              f"method {method!r} does not take {', '.join(sorted(given))}")
        if method in ("ar", "auto") and exit_layer is not None:
            raise OptionError("exit_layer", exit_layer,
                              f"method {method!r} does not take it (use method 'exit')",
                              f"method {method!r} does not take exit_layer (use method='exit')")
        if method == "exit":
            if exit_layer is None:
                raise OptionError("exit_layer", None, "method 'exit' needs it",
                                  "method 'exit' needs exit_layer")
            _check_layer("exit_layer", exit_layer, num_layers, below_top=False)
        return
    if exit_layer is not None:
        raise OptionError("exit_layer", exit_layer,
                          f"method {method!r} does not take it (use draft_exit)",
                          f"method {method!r} does not take exit_layer (use draft_exit)")
    if method == "layerskip":
        for name in ("verify_exits", "verify_window"):
            if name in given:
                raise OptionError(name, given[name],
                                  "method 'layerskip' has no intermediate verifier "
                                  "(use method 'hispec')",
                                  "method 'layerskip' has no intermediate verifier: "
                                  "verify_exits / verify_window are not allowed")
    if draft_exit is not None:
        _check_layer("draft_exit", draft_exit, num_layers, below_top=True)
    if verify_exits is not None:
        exits = (verify_exits,) if _is_int(verify_exits) else tuple(verify_exits)
        if not exits:
            raise OptionError("verify_exits", verify_exits, "must name at least one exit",
                              "verify_exits must name at least one intermediate exit")
        for e in exits:
            _check_layer("verify_exits", e, num_layers, below_top=True)
        chain = ((draft_exit,) if draft_exit is not None else ()) + exits
        if any(a >= b for a, b in zip(chain, chain[1:])):
            raise OptionError(
                "verify_exits", verify_exits,
                "must be strictly increasing and above the draft exit"
                + (f" ({draft_exit})" if draft_exit is not None else ""),
                f"exits must be strictly increasing: draft_exit={draft_exit}, "
                f"verify_exits={list(exits)}")
    if draft_len is not None:
        check_positive_int("draft_len", draft_len)
    if verify_window is not None:  # one for every intermediate exit, or one per exit
        windows = tuple(verify_window) if isinstance(verify_window, (tuple, list)) else (
            verify_window,)
        for w in windows:
            check_positive_int("verify_window", w)
        if isinstance(verify_window, (tuple, list)) and verify_exits is not None and len(
                windows) != (1 if _is_int(verify_exits) else len(tuple(verify_exits))):
            raise OptionError("verify_window", verify_window,
                              "one window per intermediate exit (or one for all)",
                              f"verify_window {list(windows)} does not name one window per "
                              f"intermediate exit {verify_exits!r}")
    if acceptance is not None and acceptance not in ACCEPTANCE_RULES:
        raise OptionError("acceptance", acceptance, f"must be one of {', '.join(ACCEPTANCE_RULES)}",
                          f"acceptance={acceptance!r} is not one of {list(ACCEPTANCE_RULES)}")


def _check_specbound(num_layers, *, tau, anneal, depth_bound, width, acceptance, **others):
    given = {k: v for k, v in others.items() if v is not None and v is not False}
    if given:
        name = sorted(given)[0]
        raise OptionError(name, given[name], "method 'specbound' picks each draft's exit itself "
                          "(use tau, anneal, depth_bound, width)",
                          f"method 'specbound' does not take {', '.join(sorted(given))} "
                          "(use tau, anneal, depth_bound, width)")
    if tau is not None and not (_is_real(tau) and 0 < tau <= 1):
        raise OptionError("tau", tau, "must be in (0, 1]",
                          f"tau (the confidence threshold) must be in (0, 1], got {tau!r}")
    if anneal is not None and not (_is_real(anneal) and math.isfinite(anneal) and anneal >= 0):
        raise OptionError("anneal", anneal, "must be a finite number >= 0",
                          f"anneal (the temperature schedule's alpha) must be >= 0, got {anneal!r}")
    if depth_bound is not None:
        _check_layer("depth_bound", depth_bound, num_layers, below_top=True)
    if width is not None:
        check_positive_int("width", width)
    if acceptance is not None and acceptance not in ACCEPTANCE_RULES:
        raise OptionError("acceptance", acceptance, f"must be one of {', '.join(ACCEPTANCE_RULES)}",
                          f"acceptance={acceptance!r} is not one of {list(ACCEPTANCE_RULES)}")


def _check_lookup(method, lookup, max_ngram, adaptive) -> None:
    """`lookup` (k tokens per lookup) in [1, MAX_LOOKUP], only for LOOKUP_METHODS;
    `max_ngram` in [1, MAX_NGRAM], only with a lookup drafter."""
    if lookup is not None:
        if method not in LOOKUP_METHODS:
            raise OptionError("lookup", lookup, f"only methods {', '.join(LOOKUP_METHODS)} "
                              "take it", f"method {method!r} does not take lookup (only "
                              f"{', '.join(LOOKUP_METHODS)} can put the n-gram drafter below "
                              "their levels)")
        if not _is_int(lookup) or not 1 <= lookup <= MAX_LOOKUP:
            raise OptionError("lookup", lookup, f"must be an integer in [1, {MAX_LOOKUP}] "
                              "(tokens proposed per lookup)",
                              f"lookup must be an integer in [1, {MAX_LOOKUP}] (tokens "
                              f"proposed per lookup), got {lookup!r}")
        if adaptive:
            raise OptionError("adaptive", adaptive, "adaptive windows do not combine with "
                              "lookup", "adaptive windows do not combine with lookup (the "
                              "lookup drafter proposes up to its k tokens each round)")
    if max_ngram is not None:
        if lookup is None and method != "lookup":
            raise OptionError("max_ngram", max_ngram, "needs a lookup drafter (method "
                              "'lookup' or lookup=K)",
                              f"max_ngram needs a lookup drafter (method 'lookup', or "
                              f"lookup=K with {', '.join(LOOKUP_METHODS[1:])})")
        if not _is_int(max_ngram) or not 1 <= max_ngram <= MAX_NGRAM:
            raise OptionError("max_ngram", max_ngram, f"must be an integer in [1, {MAX_NGRAM}]",
                              f"max_ngram must be an integer in [1, {MAX_NGRAM}] (the longest "
                              f"suffix matched), got {max_ngram!r}")


def _check_draft(method, draft, draft_k, draft_gate, *, lookup_gate, adaptive,
                 exit_gate) -> None:
    """A draft model only for `DRAFT_METHODS` (method "draft" needs one) and "auto" (which
    takes no draft setting: its plan sets them), without adaptive windows, the exit gate or
    the lookup gate (a lookup under a draft model proposes to the draft model, which checks
    its tokens in passes it runs anyway); `draft_k` in [1, MAX_DRAFT_K] and `draft_gate` (a
    bool) only with a draft model."""
    given = draft is not None and draft is not False
    if method == "auto":  # the pair's tuned plan sets them
        for name, value in (("draft_k", draft_k), ("draft_gate", draft_gate)):
            if value is not None:
                raise OptionError(name, value, "method 'auto' does not take it (the tuned "
                                  "plan sets it)", f"method 'auto' does not take {name} (the "
                                  "tuned plan sets it)")
        return
    if method == "draft" and not given:
        raise OptionError("draft", draft, "method 'draft' needs a draft model",
                          "method 'draft' needs a draft model (draft=MODEL; on the command "
                          "line --draft-model PATH)")
    if given:
        if method not in DRAFT_METHODS:
            raise OptionError("draft", draft if isinstance(draft, str) else None,
                              f"method {method!r} does not take a draft model (only "
                              f"{', '.join(DRAFT_METHODS)} do)",
                              f"method {method!r} does not take a draft model (only "
                              f"{', '.join(DRAFT_METHODS)} do: 'draft' verifies its drafts with "
                              "the final layer, the others with their exits first)")
        for name, value in (("adaptive", adaptive or None), ("exit_gate", exit_gate or None),
                            ("lookup_gate", lookup_gate)):
            if value is not None:
                raise OptionError(name, value, "does not combine with a draft model",
                                  f"{name} does not combine with a draft model (the draft "
                                  "model is the level above the lookup; its own gate is "
                                  "draft_gate)")
    for name, value in (("draft_k", draft_k), ("draft_gate", draft_gate)):
        if value is not None and not given:
            raise OptionError(name, value, "needs a draft model",
                              f"{name} needs a draft model (draft=MODEL; on the command line "
                              "--draft-model PATH)")
    ks = draft_k if isinstance(draft_k, (tuple, list)) else (draft_k,)
    if draft_k is not None and (not 1 <= len(ks) <= 2 or not all(
            _is_int(k) and 1 <= k <= MAX_DRAFT_K for k in ks)):
        raise OptionError("draft_k", draft_k, f"must be an integer in [1, {MAX_DRAFT_K}] "
                          "(tokens drafted per round), or two (the smaller draft model's "
                          "first)",
                          f"draft_k must be an integer in [1, {MAX_DRAFT_K}] (tokens the draft "
                          f"model drafts per round), or two such integers with two draft "
                          f"models (the smaller's per pass of the larger, then the larger's "
                          f"per round), got {draft_k!r}")
    if draft_gate is not None and not isinstance(draft_gate, bool):
        raise OptionError("draft_gate", draft_gate, "must be True or False",
                          f"draft_gate must be True or False, got {draft_gate!r}")


def _check_gates(method, lookup, lookup_gate, exit_gate) -> None:
    """`lookup_gate` (a bool) only with a lookup drafter; `exit_gate` (a bool) only for an
    exit drafter at level 0: `EXIT_GATE_METHODS` without `lookup`."""
    if lookup_gate is not None:
        if not isinstance(lookup_gate, bool):
            raise OptionError("lookup_gate", lookup_gate, "must be True or False",
                              f"lookup_gate must be True or False, got {lookup_gate!r}")
        if method != "lookup" and lookup is None:
            raise OptionError("lookup_gate", lookup_gate, "needs a lookup drafter (method "
                              "'lookup' or lookup=K)",
                              f"lookup_gate needs a lookup drafter (method 'lookup', or "
                              f"lookup=K with {', '.join(LOOKUP_METHODS[1:])})")
    if exit_gate is None or exit_gate is False:
        return
    if not isinstance(exit_gate, bool):
        raise OptionError("exit_gate", exit_gate, "must be True or False",
                          f"exit_gate must be True or False, got {exit_gate!r}")
    if method not in EXIT_GATE_METHODS or lookup is not None:
        raise OptionError("exit_gate", exit_gate, "only methods "
                          f"{', '.join(EXIT_GATE_METHODS)} without lookup take it (their level "
                          "0 is the draft exit)",
                          f"method {method!r}" + (" with lookup" if lookup is not None else "")
                          + " does not take exit_gate (only "
                          f"{', '.join(EXIT_GATE_METHODS)} without lookup: the gate shortens "
                          "the draft exit's windows)")
