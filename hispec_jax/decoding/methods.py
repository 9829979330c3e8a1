"""Decoding methods: every method is an exit hierarchy run by the one engine (`engine/`).

`make_method` turns a method name and options into a `Decoder` (plain data, validated
before any compilation); `Decoder` tells `generate` how many cache layers it needs, how far
past the last emitted token it may write (`lookahead`), and how to summarize the loop's
counters into stats. Compiling is `engine.Engine`'s job.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import jax
import jax.numpy as jnp

from hispec_jax.decoding import method_spec
from hispec_jax.decoding import options as options_lib
from hispec_jax.decoding import recommended
from hispec_jax.decoding.acceptance import RULES, GreedyAcceptance
from hispec_jax.decoding.draft import DynamicDraftExit, StaticDraftExit
from hispec_jax.decoding.engine import (Counters, DraftModelDrafter, ExitDrafter, Hierarchy,
                                       InnerDraftModel, LookupDrafter)
from hispec_jax.decoding.lookup import PromptLookup
from hispec_jax.decoding.windows import (DRAFT_LEN_RANGE, VERIFY_WINDOW_RANGE, AdaptiveWindows,
                                         FixedWindows, power_of_two_blocks)
from hispec_jax.models import heads as heads_lib
from hispec_jax.models.model import Model


@dataclasses.dataclass(frozen=True)
class Decoder:
    """A decoding method as plain data: an exit hierarchy (static) and its initial windows.

    K = 1 is autoregressive decoding from `exits[0]` (`ar`: the final layer; `exit`: an
    early exit); K = 2 LayerSkip self-speculation; K >= 3 HiSpec. `generate` builds an
    `engine.Engine` from it and the request's shapes.
    """

    hierarchy: Hierarchy
    windows: tuple[int, ...] = ()  # initial (draft_len, verify_window, ...), K - 1 entries
    # where the exits came from, for the stats: "given", "paper defaults (L/8, L/4)",
    # "recommended: <source>" (`recommended.py`); "" for hand-built decoders
    source: str = ""

    def __post_init__(self):
        if len(self.windows) != self.hierarchy.num_levels - 1:
            raise ValueError(f"windows={self.windows} needs one entry per verifying level "
                             f"({self.hierarchy.num_levels - 1})")
        if any(w > b for w, b in zip(self.windows, self.hierarchy.max_windows)):
            raise ValueError(f"windows={self.windows} exceed the hierarchy's bounds "
                             f"max_windows={self.hierarchy.max_windows}")

    @property
    def cache_layers(self) -> int:
        """Layers the KV cache holds: [0, top exit)."""
        return self.hierarchy.exits[-1]

    def lookahead(self) -> int:
        return self.hierarchy.lookahead

    def windows_array(self) -> jax.Array:
        """The initial windows [K - 1] int32 (an argument of the loop: no recompiles)."""
        return jnp.asarray(self.windows, jnp.int32).reshape(len(self.windows))


def summarize_counters(h: Hierarchy, counters: list[Counters], batch_sequences: list[int],
                       model: Model | None = None) -> dict[str, Any]:
    """Stats of paper App. H / Table 9 from the loops' counters (one entry per batch, with
    the number of real sequences in it), summed over batches. With the `model`, also the
    work accounting (`work_stats`)."""
    total = jax.tree.map(lambda *xs: np.sum(np.stack([np.asarray(x) for x in xs]), axis=0), *counters)
    K = h.num_levels
    proposed, accepted = total.proposed_K.tolist(), total.accepted_K.tolist()
    rate = lambda a, b: (a / b) if b else None
    full_verifications = int(total.verifications_K[K - 1])
    stats = {
        "exits": list(h.exits),
        "window_bounds": list(h.max_windows),
        "rounds": int(total.rounds),
        "actions_per_level": total.actions_K.tolist(),
        "acceptance_rate_per_level": [None] + [rate(accepted[k], proposed[k]) for k in range(1, K)],
        "final_acceptance_rate": rate(accepted[K - 1], proposed[K - 1]) if K > 1 else None,
        "false_accept_rate": (1 - rate(accepted[K - 1], proposed[K - 1]))
        if K > 2 and proposed[K - 1] else None,
        "true_reject_rate": rate(int(total.true_rejects), int(total.reject_checks)) if K > 2 else None,
        # Per sequence: tokens the top level emitted per verification pass it made.
        "tokens_per_full_pass": rate(int(total.emitted), full_verifications) if K > 1 else 1.0,
        "layer_passes": int(total.layer_passes),
        "layer_token_evals": int(total.layer_token_evals),
        "emitted_in_loop": int(total.emitted),
    }
    # Per sequence: decode-loop passes over the tokens a sequence of the batch emitted in
    # the loop (the first token of every sequence comes from prefill). AR gives `top`.
    per_sequence_tokens = sum(int(c.emitted) / max(n, 1) for c, n in zip(counters, batch_sequences))
    stats["layer_passes_per_token"] = (int(total.layer_passes) / per_sequence_tokens
                                       if per_sequence_tokens else None)
    rounds = int(total.rounds)
    stats["tokens_per_round"] = per_sequence_tokens / rounds if rounds else None
    stats["head_evals_per_exit"] = {int(e): int(n) for e, n in
                                    enumerate(total.head_evals_E.tolist()) if n}
    if model is not None:
        stats.update(work_stats(model, int(total.layer_passes), stats["head_evals_per_exit"],
                                per_sequence_tokens))
    # How many tokens each top-level verification checked (SV's verified lengths), and the
    # layer each draft token exited at (SpecBound's depths; one bar for a static exit).
    stats["verified_length_histogram"] = total.verified_hist.tolist() if K > 1 else []
    # Passes of each verifying level by the block length they ran at (level 0: none here;
    # its draft steps are `actions_per_level[0]`).
    stats["passes_per_block"] = [{int(T): int(n) for T, n in enumerate(row) if n}
                                 for row in total.block_passes_KxT.tolist()]
    stats.update(h.drafter.stats(h, total))  # the drafter's own (`Drafter.stats`)
    if model is not None and "draft_model" in stats and stats.get("work_per_token"):
        stats["draft_model"]["work_share"] = draft_work_share(
            model, h, int(total.layer_passes), stats["head_evals_per_exit"],
            int(total.actions_K[0]), total.drafter)
    return stats


def draft_work_share(model: Model, h, layer_passes: int, head_evals: dict[int, int],
                     draft_passes: int, drafter_counters) -> float | None:
    """The draft models' share of a run's work, by multiply-adds: their passes
    (`Drafter.work_layers`, a draft model's) over theirs plus the target's layer passes and
    exit heads (`work_stats`' numerator). None where nothing ran."""
    draft = h.drafter.work_layers(model.cfg, draft_passes, drafter_counters)
    target = layer_passes + heads_work(model, head_evals)
    return draft / (draft + target) if draft + target else None


def heads_work(model: Model, head_evals: dict[int, int]) -> float:
    """Exit-head evaluations {exit: count} in layer equivalents (`heads.head_cost_layers`)."""
    return sum(n * heads_lib.head_cost_layers(model.cfg, model.heads, e)
               for e, n in head_evals.items())


def ar_work_per_token(model: Model) -> float:
    """AR's work per token in layer equivalents: L layers and the final head."""
    L = model.cfg.num_layers
    return L + heads_lib.head_cost_layers(model.cfg, model.heads, L)


def work_stats(model: Model, layer_passes: int, head_evals: dict[int, int],
               tokens: float) -> dict[str, Any]:
    """The hardware-free cost of a run, in layer equivalents per emitted token:

        work_per_token = (layer passes + sum_e head evaluations at e x head cost(e)) / tokens

    where a head's cost is its multiply-adds over one layer's (`models.heads.head_cost_layers`:
    SmolLM2's shared head is 8 layers, the default model's 0.7). Passes and head evaluations
    count once per pass whatever its block length: on memory-bound hardware a block of a few
    tokens costs about one. AR does `L + head cost(L)`; `work_speedup` is AR's work over the
    method's, what a perfect engine on such hardware would turn into a wall-clock speedup.
    """
    if not tokens:
        return {"work_per_token": None, "work_speedup": None}
    head_work = heads_work(model, head_evals)
    work = (layer_passes + head_work) / tokens
    ar = ar_work_per_token(model)
    return {"work_per_token": work, "head_work_per_token": head_work / tokens,
            "ar_work_per_token": ar, "work_speedup": ar / work if work else None}


METHODS = options_lib.METHODS


def available_exits(model: Model) -> tuple[int, ...]:
    """Exits that have a head: all layers when the model has no trained heads (LayerSkip-style
    shared head), else the trained heads' layers plus the final layer."""
    L = model.cfg.num_layers
    if not model.heads:
        return tuple(range(1, L + 1))
    return tuple(sorted({int(e) for e in model.heads} | {L}))


def default_exits(model: Model) -> tuple[int, int]:
    """(draft exit ~ L/8, intermediate verifier ~ L/4), snapped to exits that have heads."""
    L = model.cfg.num_layers
    candidates = [e for e in available_exits(model) if e < L]
    if not candidates:
        raise ValueError(f"the model has no exit below its final layer {L}")
    snap = lambda target: min(candidates, key=lambda e: (abs(e - target), e))
    draft = snap(max(1, round(L / 8)))
    above = [e for e in candidates if e > draft]
    verify = min(above, key=lambda e: (abs(e - max(draft + 1, round(L / 4))), e)) if above else None
    return draft, verify


def _check_window(name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def make_method(model: Model, method, *, greedy: bool = True, **options) -> Decoder:
    """The decoding method object of `method`: a `method_spec.MethodSpec` (no options
    then), or a method name and its options (`method_spec.of`'s spelling); ValueError on
    bad settings. See `_make_method` for the methods and their defaults."""
    if isinstance(method, method_spec.MethodSpec):
        given = {k: v for k, v in options.items() if v is not None and v is not False}
        if given:
            raise ValueError(f"method options are part of the spec {method}; pass none with "
                             f"one (got {', '.join(sorted(given))})")
        method, options = method.flat()
    return _make_method(model, method, greedy=greedy, **options)


def _make_method(model: Model, method: str, *, exit_layer: int | None = None,
                draft_exit: int | None = None, verify_exits=None, draft_len: int | None = None,
                verify_window: int | tuple[int, ...] | None = None, adaptive: bool = False,
                acceptance: str | None = None, sv_profile=None, tau: float | None = None,
                anneal: float | None = None, depth_bound: int | None = None,
                width: int | None = None, lookup: int | None = None,
                max_ngram: int | None = None, lookup_gate: bool | None = None,
                exit_gate: bool = False, draft_k: int | None = None,
                draft_gate: bool | None = None, greedy: bool = True):
    """The decoding method object for `method` and its options; ValueError on bad settings.

    Methods: "ar" (K = 1, top = L), "exit" (K = 1, top = exit_layer), "layerskip"
    (K = 2: draft_exit, L), "hispec" (K >= 3: draft_exit, verify_exits..., L), "sv"
    (draft_exit, one companion exit in verify_exits, L; the companion picks how many of the
    draft_len drafts the final layer verifies from an `sv_profile`: `sv.py`), "specbound"
    (each draft exits at the first exit <= depth_bound whose annealed confidence clears
    tau, at most width drafts per round: `draft.DynamicDraftExit`), "lookup" (prompt-lookup
    n-gram drafts of up to `lookup` tokens, matching suffixes of up to `max_ngram` tokens,
    verified by the final layer: `lookup.py`). `lookup=k` with "layerskip" or "hispec" puts
    the lookup drafter below their levels: its drafts are verified by the draft exit first;
    a round without a match is the draft exit's own draft step. "draft" (a draft model, the
    model's `with_draft`: up to `draft_k` drafts a round verified by the final layer,
    `engine/draft_model.py`); a model with a draft model under "layerskip" or "hispec" puts
    it below their levels, its drafts verified by the draft exit first.
    Defaults: the model's recommended plan for "layerskip" / "hispec" when it has one and
    no exits are given (`recommended.py`: its exits, and its windows where none are given),
    else the paper's (§3.3, §6): draft_exit ~ L/8, verify_exits ~ (L/4,), draft_len 2,
    verify_window 4; SpecBound: `options.SPECBOUND_DEFAULTS`, depth_bound ~ 2L/3.
    `acceptance` picks the sampling-mode rule of every verifying level: "tokenwise"
    (default) or "blockwise"; greedy decoding always uses the greedy rule.
    The acceptance gates (`gate.py`, docs/lookup.md): `lookup_gate` (default on) shortens
    each lookup proposal to what its estimated acceptance pays for; `exit_gate` (default
    off; "layerskip" and "hispec" without lookup) shortens each draft exit's window the same
    way (docs/engine.md, "The exit drafter's gate"); `draft_gate` (default on) each draft
    model's window.
    """
    cfg = model.cfg
    L = cfg.num_layers
    # What needs no weights (names, which method takes what, ranges) is checked by the rules
    # the command line also applies before importing JAX (`options.py`); here: exit heads
    # and defaults.
    options_lib.check_method_options(
        method, num_layers=L, exit_layer=exit_layer, draft_exit=draft_exit,
        verify_exits=verify_exits, draft_len=draft_len, verify_window=verify_window,
        adaptive=adaptive, acceptance=acceptance, sv_profile=sv_profile, tau=tau,
        anneal=anneal, depth_bound=depth_bound, width=width, lookup=lookup, max_ngram=max_ngram,
        lookup_gate=lookup_gate, exit_gate=exit_gate, draft=model.draft, draft_k=draft_k,
        draft_gate=draft_gate)
    if method == "draft":
        rule, schedule = _sampling_rule(acceptance, greedy)
        return _with_draft(Decoder(Hierarchy(exits=(L,), rule=rule, schedule=schedule)),
                           model, draft_k, draft_gate, lookup, max_ngram)
    if method == "lookup":
        rule, schedule = _sampling_rule(acceptance, greedy)
        return _with_lookup(Decoder(Hierarchy(exits=(L,), rule=rule, schedule=schedule)),
                            lookup, max_ngram, lookup_gate)
    if method == "ar":
        return Decoder(Hierarchy(exits=(L,)))
    if method == "exit":
        return Decoder(Hierarchy(exits=(check_exit(model, "exit_layer", exit_layer),)))
    if method == "specbound":
        return _specbound(model, tau, anneal, depth_bound, width, acceptance, greedy)
    source = "given"
    if draft_exit is None and verify_exits is None:
        rec = recommended.load(model.path, method, L)
        if rec is None:
            source = "paper defaults (L/8, L/4)"
        else:  # the model's own best hierarchy; windows given explicitly still win
            opts, source = rec.options(), f"recommended: {rec.source}"
            draft_exit, verify_exits = opts["draft_exit"], opts.get("verify_exits")
            draft_len = opts["draft_len"] if draft_len is None else draft_len
            if verify_window is None:
                verify_window = opts.get("verify_window")
            adaptive = adaptive or opts.get("adaptive", False)
    default_draft, default_verify = default_exits(model)
    draft = check_exit(model, "draft_exit", default_draft if draft_exit is None else draft_exit,
                       below_top=True)
    if method == "layerskip":
        mids: tuple[int, ...] = ()
    else:
        if verify_exits is None:
            if default_verify is None or (draft_exit is not None and draft >= default_verify):
                raise ValueError(f"method {method!r} needs verify_exits above draft_exit "
                                 f"(no default fits draft_exit={draft}, L={L})")
            verify_exits = (default_verify,)
        if isinstance(verify_exits, (int, np.integer)):
            verify_exits = (verify_exits,)
        mids = tuple(check_exit(model, "verify_exits", e, below_top=True) for e in verify_exits)
        if not mids:
            raise ValueError("verify_exits must name at least one intermediate exit")
    exits = (draft,) + mids + (L,)
    if any(a >= b for a, b in zip(exits, exits[1:])):
        raise ValueError(f"exits must be strictly increasing: draft_exit={draft}, "
                         f"verify_exits={list(mids)}, final layer {L}")
    if method == "sv":
        return _sv(model, exits, 2 if draft_len is None else draft_len, sv_profile, greedy)
    nd = _check_window("draft_len", 2 if draft_len is None else draft_len)
    given = 4 if verify_window is None else verify_window
    per_level = tuple(given) if isinstance(given, (tuple, list)) else (given,) * len(mids)
    if len(per_level) != len(mids):
        raise ValueError(f"verify_window {list(per_level)} names {len(per_level)} windows for "
                         f"{len(mids)} intermediate exits {list(mids)}")
    windows = (nd,) + tuple(_check_window("verify_window", w) for w in per_level)
    # Static block sizes come from window *bounds*; the windows themselves are arrays.
    # Fixed windows are their own bounds (the smallest blocks: verification cost grows
    # with the block length), and `generate` reuses a loop compiled with larger bounds when
    # windows shrink; adaptive windows are bounded by the paper's App. J ranges.
    max_windows = windows
    if adaptive:
        max_windows = (max(nd, DRAFT_LEN_RANGE[1]),) + tuple(
            max(w, VERIFY_WINDOW_RANGE[1]) for w in windows[1:])
    rule, schedule = _sampling_rule(acceptance, greedy)
    hierarchy = Hierarchy(exits=exits, max_windows=max_windows,
                          window_policy=AdaptiveWindows() if adaptive else FixedWindows(),
                          rule=rule, schedule=schedule,
                          drafter=ExitDrafter(StaticDraftExit(), gate=bool(exit_gate)))
    decoder = Decoder(hierarchy=hierarchy, windows=windows, source=source)
    if model.draft is not None:
        return _with_draft(decoder, model, draft_k, draft_gate, lookup, max_ngram)
    return decoder if lookup is None else _with_lookup(decoder, lookup, max_ngram, lookup_gate)


def _with_draft(decoder: Decoder, model: Model, k, gate: bool | None = None,
                lookup: int | None = None, max_ngram: int | None = None) -> Decoder:
    """The decoder with `model`'s draft model (`Model.with_draft`) as a new level 0 (exit
    0: none of the target's layers) below its levels; its window (and static bound) is k
    (an int, or (k', k) with two draft models: k' the smaller's tokens per pass of the
    draft model); `gate` None: the gate on. Below the draft model: its own draft model
    (HSD's two draft models) or `lookup` (k of a prompt lookup): each draft step checks
    their tokens in the draft model's pass."""
    ks = (k,) if k is None or isinstance(k, (int, np.integer)) else tuple(k)
    draft = model.draft
    inner = draft.params.get("draft") if isinstance(draft.params, dict) else None
    if inner is None and len(ks) == 2:
        raise ValueError(f"draft_k={list(ks)} gives two draft models' k, the model has one "
                         "draft model")
    if inner is not None and lookup is not None:
        raise ValueError("lookup does not combine with two draft models (the smaller one "
                         "drafts for the larger)")
    below = None
    if inner is not None:
        inner_k = ks[0] if len(ks) == 2 else options_lib.DEFAULT_INNER_DRAFT_K
        below = {"inner": InnerDraftModel(cfg=inner.cfg, k=int(inner_k),
                                          per_layer=inner.per_layer)}
    elif lookup is not None:
        below = {"lookup": PromptLookup(
            max_tokens=int(lookup), max_ngram=(options_lib.DEFAULT_MAX_NGRAM
                                               if max_ngram is None else int(max_ngram)),
            gate=False)}
    k = options_lib.DEFAULT_DRAFT_K if ks[-1] is None else int(ks[-1])
    drafter = DraftModelDrafter(cfg=draft.cfg, k=k, per_layer=draft.per_layer,
                                gate=True if gate is None else bool(gate), **(below or {}))
    h = decoder.hierarchy
    hierarchy = dataclasses.replace(h, exits=(0,) + h.exits, max_windows=(k,) + h.max_windows,
                                    drafter=drafter)
    return Decoder(hierarchy=hierarchy, windows=(k,) + decoder.windows, source=decoder.source)


def _with_lookup(decoder: Decoder, lookup: int | None, max_ngram: int | None,
                 gate: bool | None = None) -> Decoder:
    """The decoder with the prompt-lookup drafter as a new level 0 (exit 0: no layers)
    below its levels; its window (and static bound) is k; `gate` None: the gate on."""
    drafter = PromptLookup(max_tokens=options_lib.DEFAULT_LOOKUP if lookup is None else int(lookup),
                           max_ngram=(options_lib.DEFAULT_MAX_NGRAM if max_ngram is None
                                      else int(max_ngram)),
                           gate=True if gate is None else bool(gate))
    h, k = decoder.hierarchy, drafter.max_tokens
    hierarchy = dataclasses.replace(h, exits=(0,) + h.exits, max_windows=(k,) + h.max_windows,
                                    drafter=LookupDrafter(drafter))
    return Decoder(hierarchy=hierarchy, windows=(drafter.max_tokens,) + decoder.windows,
                   source=decoder.source)


def for_engine(decoder: Decoder, greedy: bool) -> Decoder:
    """`decoder` with an acceptance rule that an engine of this kind runs, as `make_method`
    picks them: greedy decoding verifies with the greedy rule (a sampling rule would draw),
    sampling with the decoder's own rule when it reads the proposals' distributions, else
    token-wise rejection; a one-level decoder verifies nothing and stays as it is."""
    h = decoder.hierarchy
    if h.num_levels == 1 or (h.rule.needs_proposal_dists != greedy):
        return decoder
    rule, schedule = _sampling_rule(None, greedy)
    return dataclasses.replace(decoder, hierarchy=dataclasses.replace(
        h, rule=rule, schedule=schedule))


def _sampling_rule(acceptance: str | None, greedy: bool):
    if greedy:  # every rule reduces to the greedy one for one-hot distributions
        return GreedyAcceptance(), "sync"
    return RULES[acceptance or "tokenwise"], "own"


def _sv(model: Model, exits: tuple[int, ...], draft_len, sv_profile, greedy: bool) -> Decoder:
    """SV: level 1 (the companion) passes a prefix of the drafts to the top level, which
    runs at the shortest compiled block that holds it (`sv.py`)."""
    from hispec_jax.decoding import sv as sv_lib

    nd = _check_window("draft_len", draft_len)
    table = sv_lib.find_table(model.path, sv_profile, exits=(exits[0], exits[1]))
    sv_lib.warn_if_other_device(table)
    companion = sv_lib.selector(table, exits[0], exits[1], model.cfg.num_layers, nd, greedy)
    rule, schedule = _sampling_rule(None, greedy)
    windows = (nd, 0)  # the top level verifies whatever the companion passes up, every round
    hierarchy = Hierarchy(exits=exits, max_windows=windows, rule=rule, schedule=schedule,
                          companion=companion, top_blocks=power_of_two_blocks(nd + 1))
    return Decoder(hierarchy=hierarchy, windows=windows)


def _specbound(model: Model, tau, anneal, depth_bound, width, acceptance, greedy) -> Decoder:
    """SpecBound: K = 2 (draft level [0, D), final layer [D, L)) with a dynamic draft exit."""
    L = model.cfg.num_layers
    d = options_lib.SPECBOUND_DEFAULTS
    tau = d["tau"] if tau is None else float(tau)
    anneal = d["anneal"] if anneal is None else float(anneal)
    width = _check_window("width", d["width"] if width is None else width)
    candidates = [e for e in available_exits(model) if e < L]
    if not candidates:
        raise ValueError(f"the model has no exit below its final layer {L}")
    if depth_bound is None:  # the deepest exit with a head at or below 2L/3
        num, den = options_lib.SPECBOUND_DEPTH_FRACTION
        bound = max(1, num * L // den)
        depth_bound = max([e for e in candidates if e <= bound] or candidates[:1])
    depth_bound = check_exit(model, "depth_bound", depth_bound, below_top=True)
    exits = tuple(e for e in candidates if e <= depth_bound)
    policy = DynamicDraftExit(exits=exits, tau=tau, anneal=anneal, num_layers=L)
    rule, schedule = _sampling_rule(acceptance, greedy)
    hierarchy = Hierarchy(exits=(depth_bound, L), max_windows=(width,), rule=rule,
                          schedule=schedule, drafter=ExitDrafter(policy))
    return Decoder(hierarchy=hierarchy, windows=(width,))


def check_exit(model: Model, name: str, value, below_top: bool = False) -> int:
    L = model.cfg.num_layers
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer layer, got {value!r}")
    top = L - 1 if below_top else L
    if not 1 <= value <= top:
        raise ValueError(f"{name}={value} is outside [1, {top}] (the model has {L} layers"
                         + ("; the final layer is always the top verifier)" if below_top else ")"))
    if value not in available_exits(model):
        raise ValueError(f"{name}={value} has no exit head; exits with heads: "
                         f"{list(available_exits(model))}")
    return int(value)
