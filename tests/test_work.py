"""Work accounting: layer passes plus exit-head evaluations at their multiply-add cost, in
layer equivalents per emitted token (`methods.work_stats`), for AR and every method."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from hispec_jax import Model, ModelConfig, generate
from hispec_jax.models.heads import head_cost_layers, head_macs, layer_macs
from hispec_jax.models.params import head_specs, init_params


def _cfg(**overrides) -> ModelConfig:
    base = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
                num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8,
                max_position_embeddings=128)
    return ModelConfig(**{**base, **overrides})


def test_smollm2_shared_head_costs_eight_layers():
    """SmolLM2-135M: D 576, 9 heads x 64, 3 KV heads, F 1536, V 49152 — the figure the
    docs quote (its LM head is as costly as 8 of its 30 layers)."""
    cfg = _cfg(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
               num_heads=9, num_kv_heads=3, head_dim=64)
    assert layer_macs(cfg) == 576 * 64 * (2 * 9 + 2 * 3) + 3 * 576 * 1536
    assert head_cost_layers(cfg, {}, 30) == pytest.approx(8.0)


def test_trained_head_costs_follow_their_shapes():
    cfg = _cfg()
    D, V = cfg.hidden_size, cfg.vocab_size
    low_rank = {name: np.zeros(spec.shape, np.float32)
                for name, spec in head_specs(cfg, rank=4).items()}
    vocab = np.arange(16, dtype=np.int32)
    small = {name: np.zeros(spec.shape, np.float32)
             for name, spec in head_specs(cfg, draft_vocab=16).items()}
    small["vocab"] = vocab
    heads = {"1": low_rank, "2": small}
    assert head_macs(cfg, heads, 1) == D * 4 + 4 * V
    assert head_macs(cfg, heads, 2) == D * 16
    assert head_macs(cfg, heads, 3) == D * V  # no trained head: the shared one
    assert head_cost_layers(cfg, heads, 1) < head_cost_layers(cfg, heads, 3)


@pytest.fixture(scope="module")
def model() -> Model:
    cfg = _cfg(num_layers=6)
    params = init_params(cfg, jax.random.PRNGKey(1), init_std=0.3)
    params["layers"]["wo"] = params["layers"]["wo"] * 0.1
    params["layers"]["w_down"] = params["layers"]["w_down"] * 0.1
    return Model(cfg=cfg, params=params, generation_config={"eos_token_id": 3})


def test_ar_work_is_layers_plus_the_final_head(model):
    r = generate(model, [[5, 9, 11]], method="ar", max_new_tokens=10, ignore_eos=True)
    L = model.cfg.num_layers
    head = head_cost_layers(model.cfg, model.heads, L)
    assert r.stats["head_evals_per_exit"] == {L: 9}  # the first token comes from prefill
    assert r.stats["work_per_token"] == pytest.approx(L + head)
    assert r.stats["work_speedup"] == pytest.approx(1.0)


@pytest.mark.parametrize("method,options", [
    ("hispec", dict(draft_exit=1, verify_exits=(3,), draft_len=2, verify_window=3)),
    ("specbound", dict(depth_bound=3, tau=0.5)),
])
def test_every_head_evaluation_is_counted(model, method, options):
    """Static levels evaluate their head once per pass; SpecBound's drafter evaluates the
    head of every candidate exit it passes, so its draft heads outnumber its draft steps."""
    r = generate(model, [[5, 9, 11], [7, 1]], method=method, max_new_tokens=16,
                 ignore_eos=True, **options)
    s = r.stats
    evals, actions, exits = s["head_evals_per_exit"], s["actions_per_level"], s["exits"]
    for k in range(1, len(exits)):
        assert evals[exits[k]] == actions[k]
    draft_heads = sum(n for e, n in evals.items() if e < exits[1])
    if method == "specbound":
        assert max(e for e in evals if e < exits[-1]) <= 3  # no head above the depth bound
        assert draft_heads > actions[0]  # some tokens went past the first candidate exit
    else:
        assert draft_heads == actions[0]
    cost = lambda e: head_cost_layers(model.cfg, model.heads, e)
    tokens = s["layer_passes"] / s["layer_passes_per_token"]
    expected = (s["layer_passes"] + sum(n * cost(e) for e, n in evals.items())) / tokens
    assert s["work_per_token"] == pytest.approx(expected)
    assert s["work_speedup"] == pytest.approx(s["ar_work_per_token"] / expected)


def test_work_tool_measures_every_method_and_checks_it_equals_ar(model):
    """`hispec bench-tool work`'s rows: every method at its defaults, AR-identical, with
    AR's row at work speedup 1 (on a tiny model with no tokenizer: `measure` directly)."""
    from hispec_jax.bench import work

    rows = work.measure(model, [[5, 9, 11], [7, 1, 2, 8]], 8)
    names = [r["name"] for r in rows]
    assert names[0] == "ar" and {"layerskip", "hispec", "specbound", "lookup"} <= set(names)
    assert all(r["identical_to_ar"] for r in rows)
    assert rows[0]["work_speedup"] == pytest.approx(1.0)
    assert all(r["work_per_token"] > 0 for r in rows)
    assert "| ar | 6 |" in work.table(rows)


def test_work_measure_takes_given_plans(model):
    """`measure(plans=...)` counts the given plans (benchmarks' plan sweeps), not the
    defaults."""
    from hispec_jax.bench import work

    plans = [("ar", "ar", {}), ("ls 1x2", "layerskip", {"draft_exit": 1, "draft_len": 2})]
    rows = work.measure(model, [[5, 9, 11]], 8, plans=plans)
    assert [r["name"] for r in rows] == ["ar", "ls 1x2"]
    assert rows[1]["exits"][0] == 1 and all(r["identical_to_ar"] for r in rows)
