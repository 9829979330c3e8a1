"""`decoding/policies.py`'s contracts hold: every drafter, window, draft-exit, acceptance and
companion policy the methods use has exactly the Protocol's methods and parameters, and
every method's hierarchy is made of them."""

import inspect

import pytest

from hispec_jax.decoding import acceptance, draft, engine, lookup, methods, policies, sv, windows
from test_engine import tiny_model
from test_sv_specbound import synthetic_table

IMPLEMENTATIONS = [
    (policies.Drafter, engine.ExitDrafter(draft.StaticDraftExit())),
    (policies.Drafter, engine.LookupDrafter(lookup.PromptLookup())),
    (policies.WindowPolicy, windows.FixedWindows()),
    (policies.WindowPolicy, windows.AdaptiveWindows()),
    (policies.DraftExitPolicy, draft.StaticDraftExit()),
    (policies.DraftExitPolicy, draft.DynamicDraftExit(exits=(1, 2), tau=0.5, anneal=0.0,
                                                       num_layers=4)),
    (policies.AcceptanceRule, acceptance.GreedyAcceptance()),
    (policies.AcceptanceRule, acceptance.TokenwiseRejection()),
    (policies.AcceptanceRule, acceptance.BlockwiseVerification()),
    (policies.Companion, sv.selector(synthetic_table(1, 2, 4), 1, 2, 4, 3, greedy=True)),
]


def parameters(fn) -> list[str]:
    """Parameter names, "_logp" dropped: a rule's target is logits (greedy) or
    log-probabilities (sampling) under the same position."""
    return [p.replace("_logp", "") for p in inspect.signature(fn).parameters if p != "self"]


def contract(protocol) -> dict[str, list[str]]:
    """{method: parameter names} of a Protocol."""
    return {name: parameters(fn) for name, fn in vars(protocol).items()
            if inspect.isfunction(fn) and not name.startswith("_")}


@pytest.mark.parametrize("protocol, policy", IMPLEMENTATIONS,
                         ids=[type(p).__name__ for _, p in IMPLEMENTATIONS])
def test_every_policy_keeps_its_contract(protocol, policy):
    assert isinstance(policy, protocol)
    for name, params in contract(protocol).items():
        assert parameters(getattr(policy, name)) == params, name
    hash(policy)  # part of the compile key


def test_the_hierarchy_is_typed_with_the_contracts():
    fields = {f.name: f.type for f in engine.Hierarchy.__dataclass_fields__.values()}
    assert fields["window_policy"] == "policies.WindowPolicy"
    assert fields["drafter"] == "policies.Drafter"
    assert fields["rule"] == "policies.AcceptanceRule"
    assert fields["companion"] == "policies.Companion | None"


@pytest.mark.parametrize("method, options, greedy", [
    ("ar", {}, True), ("layerskip", {}, False), ("hispec", {"adaptive": True}, True),
    ("hispec", {"acceptance": "blockwise"}, False), ("specbound", {}, True),
    ("sv", {"draft_exit": 1, "verify_exits": 2, "sv_profile": synthetic_table(1, 2, 4)}, False),
    ("lookup", {}, True), ("layerskip", {"lookup": 3}, False),
])
def test_every_method_is_made_of_policies(method, options, greedy):
    h = methods.make_method(tiny_model(4, 0), method, greedy=greedy, **options).hierarchy
    assert isinstance(h.drafter, policies.Drafter)
    assert isinstance(h.drafter, engine.LookupDrafter) == ("lookup" in options
                                                           or method == "lookup")
    assert isinstance(h.window_policy, policies.WindowPolicy)
    if isinstance(h.drafter, engine.ExitDrafter):
        assert isinstance(h.drafter.draft_exit, policies.DraftExitPolicy)
    assert isinstance(h.rule, policies.AcceptanceRule)
    assert h.companion is None or isinstance(h.companion, policies.Companion)
    assert (h.companion is not None) == (method == "sv")


def test_the_round_asks_the_drafter_and_holds_no_drafter_code():
    """Level 0 is reached only through `policies.Drafter`: the round reads neither the
    lookup drafter's settings nor the draft-exit policy."""
    source = inspect.getsource(engine.round)
    for name in ("h.lookup", "draft_exit", "PromptLookup", "lookup_lib", "draft_lib"):
        assert name not in source, name
