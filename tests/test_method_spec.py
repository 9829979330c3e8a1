"""One method vocabulary (`decoding/method_spec.py`): typed specs checked when made, one
JSON form, the same tokens as the flat spelling, and one resolver whose default plan is the
same for Python and the command line."""

from __future__ import annotations

import argparse

import pytest

import hispec_jax
from hispec_jax.cli import common as cli_common
from hispec_jax.decoding import method_spec, recommended
from hispec_jax.decoding.options import OptionError
from hispec_jax.models.model import load_model
from hispec_jax.planner.plan import Plan

from test_recommended import model_dir  # noqa: F401 (a fixture: an 8-layer random model)

PROMPTS = [[5, 9, 11, 2, 5, 9], [7, 1, 7, 1]]

FLAT = [
    ("ar", {}),
    ("exit", {"exit_layer": 3}),
    ("lookup", {"lookup": 8, "max_ngram": 3}),
    ("lookup", {"lookup_gate": False, "acceptance": "blockwise"}),
    ("layerskip", {"draft_exit": 2, "draft_len": 3, "adaptive": True}),
    ("layerskip", {"draft_exit": 2, "lookup": 4, "max_ngram": 2, "lookup_gate": False}),
    ("hispec", {"draft_exit": 1, "verify_exits": (2, 4), "verify_window": (3, 5),
                "exit_gate": True}),
    ("hispec", {"draft_k": (2, 4), "lookup": 3}),
    ("draft", {"draft_k": 4, "draft_gate": False, "lookup": 3}),
    ("sv", {"draft_exit": 2, "verify_exits": (4,), "draft_len": 3}),
    ("specbound", {"tau": 0.5, "anneal": 0.1, "width": 3}),
]


@pytest.mark.parametrize("method,options", FLAT)
def test_flat_spelling_json_and_spec_are_one(method, options):
    spec = method_spec.of(method, **options)
    assert isinstance(spec, method_spec.SPECS[method]) and spec.method == method
    name, flat = spec.flat()
    assert name == method and method_spec.of(name, **flat) == spec
    assert method_spec.from_json(spec.to_json()) == spec
    assert method_spec.from_json(__import__("json").dumps(spec.to_json())) == spec
    assert str(spec).startswith(type(spec).__name__ + "(")


@pytest.mark.parametrize("make,message", [
    (lambda: method_spec.of("ar", draft_len=2), "method 'ar' does not take draft_len"),
    (lambda: method_spec.Lookup(k=0), "lookup must be an integer in [1, 64]"),
    (lambda: method_spec.HiSpec(verify_exits=(4, 6), verify_window=(3,)),
     "does not name one window per intermediate exit"),
    (lambda: method_spec.HiSpec(draft_exit=4, verify_exits=(3,)), "strictly increasing"),
    (lambda: method_spec.LayerSkip(lookup=method_spec.Lookup(acceptance="blockwise")),
     "outer method's acceptance"),
    (lambda: method_spec.LayerSkip(lookup=4), "is not a Lookup(...) spec"),
    (lambda: method_spec.of("nope"), "method='nope' is not one of"),
    (lambda: method_spec.of("auto"), "has no spec"),
    (lambda: method_spec.from_json('{"draft_exit": 2}'), "an object with a \"method\" name"),
    (lambda: method_spec.from_json("hispec("), "is not valid JSON"),
    (lambda: method_spec.resolve(method_spec.AR(), {"draft_len": 2}), "part of the spec"),
])
def test_a_bad_spec_is_one_line_naming_what_is_wrong(make, message):
    with pytest.raises(OptionError) as e:
        make()
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_spec_decodes_as_its_flat_spelling_and_as_ar(model_dir):
    model = load_model(model_dir)
    run = dict(max_new_tokens=10, ignore_eos=True)
    ar = hispec_jax.generate(model, PROMPTS, method=hispec_jax.AR(), **run)
    assert ar.stats["method_spec"] == {"method": "ar"}
    spec = hispec_jax.HiSpec(draft_exit=1, verify_exits=(2, 4), verify_window=(2, 3),
                             lookup=hispec_jax.Lookup(k=4))
    got = hispec_jax.generate(model, PROMPTS, method=spec, **run)
    flat = hispec_jax.generate(model, PROMPTS, method="hispec", draft_exit=1,
                               verify_exits=(2, 4), verify_window=(2, 3), lookup=4, **run)
    assert got.token_ids == flat.token_ids == ar.token_ids
    assert got.stats["method"] == "hispec" and got.stats["exits"] == [0, 1, 2, 4, 8]
    assert got.stats["window_bounds"] == [4, 2, 2, 3]  # the lookup's k, then one per level
    assert got.stats["method_spec"] == spec.to_json() and got.stats["plan_reason"] == "given"


def test_a_plan_is_its_spec(model_dir):
    """A K = 4 plan's windows, one per level, reach the hierarchy through its spec."""
    model = load_model(model_dir)
    plan = Plan(exits=(1, 2, 4, 8), windows=(2, 3, 5))
    assert plan.spec() == hispec_jax.HiSpec(draft_exit=1, verify_exits=(2, 4), draft_len=2,
                                            verify_window=(3, 5))
    assert plan.to_json()["spec"] == plan.spec().to_json()
    decoder = plan.decoder(model)
    assert decoder.windows == (2, 3, 5) and decoder.hierarchy.exits == (1, 2, 4, 8)
    assert Plan(exits=(8,), lookup=6).spec() == hispec_jax.Lookup(k=6)


def test_python_and_the_command_line_default_to_the_same_plan(model_dir):
    """No method: the model's default plan, in `generate`, `generate_stream`'s resolver and
    `hispec generate`'s (which reads no weights): gated lookup without a recommended plan,
    the recommended HiSpec plan with one; output AR's."""
    model = load_model(model_dir)

    def cli_method(path):
        args = argparse.Namespace(method=None, draft_model=None)
        cli_common.apply_default_plan(args, str(path), None)
        return args.method, args.plan_reason

    run = dict(max_new_tokens=8, ignore_eos=True)
    ar = hispec_jax.generate(model, PROMPTS, method="ar", **run)
    plain = hispec_jax.generate(model, PROMPTS, **run)
    assert plain.stats["method"] == "lookup" == cli_method(model_dir)[0]
    assert plain.stats["plan_reason"] == cli_method(model_dir)[1]
    assert plain.token_ids == ar.token_ids
    ungated = hispec_jax.generate(model, PROMPTS, lookup_gate=False, **run)  # on top of it
    assert ungated.stats["method_spec"]["lookup_gate"] is False
    recommended.save(model_dir, {"hispec": {"exits": (2, 4, 8), "windows": (2, 3)}},
                     "a recorded sweep (test)")
    try:
        model = load_model(model_dir)
        planned = hispec_jax.generate(model, PROMPTS, **run)
        assert planned.stats["method"] == "hispec" == cli_method(model_dir)[0]
        assert planned.stats["exits"] == [2, 4, 8] and planned.token_ids == ar.token_ids
        assert planned.stats["plan_reason"].startswith("the model's recommended plan")
        rec = recommended.load(model_dir, "hispec", 8)
        assert method_spec.of_recommended(rec) == hispec_jax.HiSpec(draft_exit=2, verify_exits=(4,), draft_len=2,
                                               verify_window=3)
    finally:
        recommended.path_for(model_dir).unlink()
