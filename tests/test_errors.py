"""Bad arguments to `generate` raise ValueError naming the problem, before compiling anything."""

import dataclasses

import pytest

import hispec_jax
from hispec_jax import load_model
from hispec_jax.decoding import engine as engine_lib
from hispec_jax.decoding import generate as generate_module

OK = [1, 5, 6, 7]


@pytest.fixture(scope="module")
def model(hf_models):
    return load_model(hf_models["llama3"][1])


def assert_rejected(model, match, prompts=(OK,), **kwargs):
    before = engine_lib.compilations
    with pytest.raises(ValueError, match=match):
        hispec_jax.generate(model, list(prompts) if isinstance(prompts, tuple) else prompts,
                            **kwargs)
    assert engine_lib.compilations == before, "compiled something before rejecting"


# (id, prompts, kwargs, regex the message must match)
CASES = [
    ("token_too_large", [[1, 97]], {}, r"token id 97 .*vocabulary.*97"),
    ("token_far_too_large", [OK, [1, 5, 10**9]], {}, r"prompts\[1\].*token id 1000000000"),
    ("token_negative", [[1, -3, 5]], {}, r"token id -3"),
    ("empty_token_list", [[]], {}, r"prompts\[0\] is empty"),
    ("second_prompt_empty", [OK, []], {}, r"prompts\[1\] is empty"),
    ("no_prompts", [], {}, r"non-empty"),
    ("over_context", [[1] * 200], {"method": "ar", "max_new_tokens": 57},
     r"200.*57.*257.*256.*max_position_embeddings"),
    ("over_context_longest_prompt", [OK, [1] * 256], {"method": "ar", "max_new_tokens": 1},
     r"256.*257.*256"),
    ("over_max_cache_len", [[1] * 10], {"method": "ar", "max_new_tokens": 60,
                                        "max_cache_len": 64},
     r"70.*64.*max_cache_len"),
    ("max_new_tokens_zero", (OK,), {"max_new_tokens": 0}, r"max_new_tokens"),
    ("max_new_tokens_negative", (OK,), {"max_new_tokens": -5}, r"max_new_tokens"),
    ("max_new_tokens_float", (OK,), {"max_new_tokens": 4.0}, r"max_new_tokens"),
    ("bad_method", (OK,), {"method": "beam"}, r"method='beam'"),
    ("exit_without_layer", (OK,), {"method": "exit"}, r"exit_layer"),
    ("exit_layer_zero", (OK,), {"method": "exit", "exit_layer": 0}, r"exit_layer=0.*\[1, 4\]"),
    ("exit_layer_past_last", (OK,), {"method": "exit", "exit_layer": 5}, r"exit_layer=5.*\[1, 4\]"),
    ("exit_layer_negative", (OK,), {"method": "exit", "exit_layer": -1}, r"exit_layer"),
    ("exit_layer_float", (OK,), {"method": "exit", "exit_layer": 2.0}, r"exit_layer"),
    ("ar_with_exit_layer", (OK,), {"method": "ar", "exit_layer": 2}, r"'ar'.*exit_layer"),
    ("ar_with_unknown_option", (OK,), {"method": "ar", "draft_len": 3}, r"'ar'.*draft_len"),
    ("default_plan_with_an_option_it_lacks", (OK,), {"draft_len": 3}, r"'lookup'.*draft_len"),
    ("exit_with_unknown_option", (OK,), {"method": "exit", "exit_layer": 2, "draft_len": 3},
     r"'exit'.*draft_len"),
    ("batch_size_zero", (OK,), {"batch_size": 0}, r"batch_size"),
    ("batch_size_negative", (OK,), {"batch_size": -2}, r"batch_size"),
    ("temperature_negative", (OK,), {"temperature": -0.5}, r"temperature"),
    ("top_p_zero", (OK,), {"temperature": 1.0, "top_p": 0.0}, r"top_p"),
    ("top_p_above_one", (OK,), {"temperature": 1.0, "top_p": 1.5}, r"top_p"),
    ("top_k_negative", (OK,), {"temperature": 1.0, "top_k": -1}, r"top_k"),
    ("unknown_acceptance_rule", (OK,), {"method": "layerskip", "temperature": 1.0,
                                        "acceptance": "exact"}, r"acceptance"),
    ("draft_exit_at_top", (OK,), {"method": "layerskip", "draft_exit": 4}, r"draft_exit=4"),
    ("exits_not_increasing", (OK,), {"method": "hispec", "draft_exit": 3, "verify_exits": (2,)},
     r"increasing"),
    ("seed_float", (OK,), {"temperature": 1.0, "seed": 1.5}, r"seed"),
]


@pytest.mark.parametrize("prompts,kwargs,match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejected_before_compiling(model, prompts, kwargs, match):
    assert_rejected(model, match, prompts, **kwargs)


def test_string_prompt_without_tokenizer(model):
    bare = dataclasses.replace(model, tokenizer=None)
    assert_rejected(bare, r"prompts\[0\].*string.*tokenizer", ["the cat sat"])
    assert_rejected(bare, r"prompts\[1\].*string.*tokenizer", [OK, "the cat sat"])
    assert_rejected(bare, r"string.*tokenizer", "the cat sat")


def test_exact_fit_is_accepted_by_planning():
    """The limit is inclusive: prompt + max_new_tokens == capacity fits (checked without
    compiling, through the planner `generate` uses)."""
    block, capacity = generate_module.plan_shapes(200, 56, 0, 256, None)
    # the prefill runs chunks of `block` positions (at most PREFILL_CHUNK): two here
    assert capacity == 256 and block == min(generate_module.PREFILL_CHUNK, 256)
    block, capacity = generate_module.plan_shapes(10, 54, 0, 256, 64)
    assert capacity == 64 and 10 <= block <= capacity
    with pytest.raises(ValueError, match="lookahead"):
        generate_module.plan_shapes(10, 54, 1, 256, 64)


@pytest.mark.parametrize("prompts", [[[1, 5.7, 6]], [1.5, 2.5], [None], [[1, None]]],
                         ids=["fractional_id", "flat_floats", "none_prompt", "none_id"])
def test_non_integer_token_ids_are_rejected(model, prompts):
    """Token ids must be integers: 5.7 must not silently become 5, and malformed prompts must
    raise ValueError (not TypeError from inside tokenization)."""
    assert_rejected(model, r"prompt", prompts)
