"""A model's recommended hierarchy (`recommended_plan.json`, `decoding/recommended.py`):
`method="hispec"` / `"layerskip"` with no exits use it, say so, and stay AR-identical;
explicit exits win; a model without one falls back to the paper's L/8, L/4."""

from __future__ import annotations

import json

import jax
import pytest

from hispec_jax import Model, ModelConfig, generate, save_model
from hispec_jax.cli import generate as cli_generate
from hispec_jax.decoding import methods, recommended
from hispec_jax.models.model import load_model
from hispec_jax.models.params import init_params

PROMPTS = [[5, 9, 11, 2], [7, 1]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_layers=8, num_heads=4, num_kv_heads=2, head_dim=8,
                      max_position_embeddings=128)
    params = init_params(cfg, jax.random.PRNGKey(3), init_std=0.3)
    for name in ("wo", "w_down"):  # agreeing exits, so drafts are accepted sometimes
        params["layers"][name] = params["layers"][name] * 0.1
    path = tmp_path_factory.mktemp("rec") / "model"
    save_model(Model(cfg=cfg, params=params, generation_config={"eos_token_id": 3}), path)
    return path


def test_without_a_recommended_plan_the_paper_exits_are_the_default(model_dir):
    r = generate(load_model(model_dir), PROMPTS, method="hispec", max_new_tokens=6)
    assert r.stats["exits"] == [1, 2, 8]  # L/8, L/4
    assert r.stats["hierarchy_source"] == "paper defaults (L/8, L/4)"


def test_the_recommended_plan_is_used_and_reported(model_dir):
    path = recommended.save(model_dir, {
        "hispec": {"exits": (2, 5, 8), "windows": (3, 5)},
        "layerskip": {"exits": (4, 8), "windows": (2,), "adaptive": True}},
        "a recorded sweep (test)")
    try:
        model = load_model(model_dir)
        ar = generate(model, PROMPTS, method="ar", max_new_tokens=12)
        hs = generate(model, PROMPTS, method="hispec", max_new_tokens=12)
        assert hs.token_ids == ar.token_ids
        assert hs.stats["exits"] == [2, 5, 8] and hs.stats["window_bounds"] == [3, 5]
        assert hs.stats["hierarchy_source"] == "recommended: a recorded sweep (test) " \
                                               "(recommended_plan.json)"
        assert "exits 2,5,8; the model's recommended plan)" in cli_generate.summary_line(hs.stats)
        ls = generate(model, PROMPTS, method="layerskip", max_new_tokens=12)
        assert ls.token_ids == ar.token_ids and ls.stats["exits"] == [4, 8]
        assert ls.stats["window_bounds"][0] >= 2  # adaptive: bounded by App. J's range
        # given exits win; a given window overrides only the window
        given = generate(model, PROMPTS, method="hispec", draft_exit=1, verify_exits=(3,),
                         max_new_tokens=4)
        assert given.stats["exits"] == [1, 3, 8] and given.stats["hierarchy_source"] == "given"
        narrower = methods.make_method(model, "hispec", verify_window=2)
        assert narrower.hierarchy.exits == (2, 5, 8) and narrower.windows == (3, 2)
    finally:
        path.unlink()


@pytest.mark.parametrize("payload,problem", [
    ("{not json", "not a valid recommended plan"),
    (json.dumps({"format_version": 9, "methods": {}}), "format_version 9"),
    (json.dumps({"format_version": 1, "methods": {"hispec": {"exits": [2, 8],
                                                             "windows": [3]}}}),
     "do not fit a hispec hierarchy"),
    (json.dumps({"format_version": 1, "methods": {"hispec": {"exits": [2, 5, 7],
                                                             "windows": [3, 4]}}}),
     "8-layer model"),
])
def test_a_malformed_recommended_plan_is_an_error_naming_the_file(tmp_path, payload, problem):
    (tmp_path / "recommended_plan.json").write_text(payload)
    with pytest.raises(ValueError, match=problem) as err:
        recommended.load(tmp_path, "hispec", 8)
    assert "recommended_plan.json" in str(err.value)
    assert recommended.load(tmp_path, "specbound", 8) is None  # only layerskip / hispec


def test_save_rejects_other_methods(tmp_path):
    with pytest.raises(ValueError, match="specbound"):
        recommended.save(tmp_path, {"specbound": {"exits": (2, 8), "windows": (1,)}}, "x")


def test_the_default_plan_is_the_shipped_models_hispec_plan():
    import hispec_jax

    model = load_model(hispec_jax.DEFAULT_MODEL_DIR)
    method, options, reason = recommended.default_plan(model)
    assert (method, options) == ("hispec", {})
    assert reason == ("the model's recommended plan (recommended_plan.json): hispec exits "
                      "4,12,24, windows 3,6")
    assert methods.make_method(model, method, **options).hierarchy.exits == (4, 12, 24)
    assert recommended.default_plan_for(hispec_jax.DEFAULT_MODEL_DIR, None)[2] == reason


def test_the_default_plan_without_a_recommended_plan_is_prompt_lookup(model_dir, tmp_path):
    method, options, reason = recommended.default_plan(load_model(model_dir))
    assert (method, options) == (recommended.FALLBACK_METHOD, {}) == ("lookup", {})
    assert reason.startswith("the model has no recommended plan (recommended_plan.json)")
    assert recommended.default_plan_for(None, None)[0] == "lookup"
    # only a layerskip plan: layerskip; a malformed file: an error naming it
    (tmp_path / "recommended_plan.json").write_text(json.dumps({"format_version": 1, "methods": {
        "layerskip": {"exits": [4, 8], "windows": [2]}}}))
    assert recommended.default_plan_for(tmp_path, 8)[0] == "layerskip"
    assert recommended.default_plan_for(tmp_path, None)[0] == "layerskip"
    (tmp_path / "recommended_plan.json").write_text("{not json")
    with pytest.raises(ValueError, match="recommended_plan.json: not a valid"):
        recommended.default_plan_for(tmp_path, None)
