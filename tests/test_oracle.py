"""`hispec_jax.bench.oracle`: the always-agree variant, the cost model and a small run."""

import jax
import jax.numpy as jnp
import pytest

from hispec_jax import Model, ModelConfig
from hispec_jax.bench import oracle
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import init_params, layer_layout, with_layer_layout
from hispec_jax.models.transformer import embed, run_layers_cached


def tiny(layout="unrolled") -> Model:
    cfg = ModelConfig(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=48,
                      num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8)
    params = init_params(cfg, jax.random.PRNGKey(1), init_std=0.3)
    return Model(cfg=cfg, params=with_layer_layout(params, layout))


def exit_predictions(model: Model) -> list:
    """Greedy predictions [1, 10] of every exit 1..L on a fixed sequence (index e - 1)."""
    tokens = jnp.arange(10)[None] * 7 % 96
    x = embed(model.params, tokens)
    cache = KVCache.zeros(model.cfg, 1, 16, per_layer=layer_layout(model.params) == "unrolled")
    L = model.cfg.num_layers
    out = []
    for e in range(1, L + 1):
        h, _ = run_layers_cached(model.params, model.cfg, x, jnp.arange(10)[None], cache, 0, e)
        out.append(jnp.argmax(exit_logits(model.params, {}, model.cfg, h, e), -1))
    return out


def check_always_agree(transform, layout):
    """`transform(model)` makes every exit predict what the final layer predicts, on a
    model whose exits do not (the transform must have changed something)."""
    original = exit_predictions(tiny(layout))
    assert not all(jnp.array_equal(p, original[-1]) for p in original[:-1]), \
        "the original model's exits already agree: the check could not fail"
    agreed = exit_predictions(transform(tiny(layout)))
    for e, p in enumerate(agreed[:-1], start=1):
        assert jnp.array_equal(p, agreed[-1]), f"exit {e} disagrees with the final layer"


@pytest.mark.parametrize("layout", ["scan", "unrolled"])
def test_always_agree_every_exit_equals_the_final_layer(layout):
    check_always_agree(oracle.always_agree, layout)


def test_always_agree_check_catches_a_no_op_transform():
    """Negative control: a transform that leaves the model as it is fails the check."""
    with pytest.raises(AssertionError, match="disagrees with the final layer"):
        check_always_agree(lambda model: model, "unrolled")


def test_head_cost_and_prediction():
    model = tiny()
    layer_bytes = sum(x.nbytes for x in jax.tree.leaves(model.params["layers"])) / 4
    assert oracle.head_cost_in_layers(model, 4) == pytest.approx(32 * 96 * 4 / layer_bytes)
    stats = {"new_tokens": 10, "layer_passes": 20, "actions_per_level": [8, 2], "exits": [1, 4]}
    passes, units = oracle.cost_units(model, stats)
    assert passes == 2.0
    assert units == pytest.approx(2.0 + 10 * oracle.head_cost_in_layers(model, 4) / 10)


def test_small_run_reports_every_method(monkeypatch):
    from hispec_jax.planner import calibrate

    measured_blocks = []

    def flat_costs(model, batch, capacity, blocks, repeats, context=None):
        """1 ms per layer and 0.5 ms per head whatever the block: the stage model then
        counts passes, with the heads and the round's extra (masked) draft step."""
        measured_blocks.append(tuple(blocks))
        return [1e-3] * len(blocks), [5e-4] * len(blocks)

    monkeypatch.setattr(calibrate, "measure_stage_costs", flat_costs)
    model = tiny()
    specs = oracle.default_specs(model)[:2]  # AR and LayerSkip L/4 n=8 (compile time)
    report = oracle.run(model, specs, prompts=1, prompt_len=5, max_new_tokens=12,
                        batch_size=1, rounds=1)
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows) == [s.name for s in specs]
    assert all(r["identical_to_ar"] for r in rows.values())
    assert rows["ar"]["predicted_speedup"] == 1.0
    # every draft is accepted: LayerSkip L/4 n=8 runs far fewer layer passes than AR
    ls = rows["layerskip d=2 n=8"]
    assert ls["layer_passes_per_token"] < 0.6 * rows["ar"]["layer_passes_per_token"]
    assert ls["predicted_speedup"] > 1.6
    # stage model, one round = 9 draft steps (2 layers + head) + a 2-layer verification of
    # 9 tokens + head, emitting 9 tokens; AR: 4 layers + head per token
    assert measured_blocks == [(1, 9)]
    round_ms = 9 * (2 + 0.5) + (2 + 0.5)
    assert ls["predicted_speedup_stages"] == pytest.approx(4.5 / (round_ms / 9))
    assert rows["ar"]["predicted_speedup_stages"] == 1.0
    assert ls["efficiency_stages"] == pytest.approx(ls["speedup"] / ls["predicted_speedup_stages"])
    assert report["ar_fraction_of_roofline"] is None  # CPU: bandwidth unknown
    text = oracle.markdown(report)
    assert "| layerskip d=2 n=8 |" in text and "roofline" in text


def test_bad_methods_are_named():
    with pytest.raises(ValueError, match="'hispec:1:2' is not layerskip:D:N"):
        oracle._parse_specs("hispec:1:2", tiny())
    with pytest.raises(ValueError, match="first method of an oracle run must be AR"):
        oracle.run(tiny(), oracle.default_specs(tiny())[1:], prompts=1, prompt_len=4,
                   max_new_tokens=4, batch_size=1, rounds=1)


def test_cli_names_a_bad_method(capsys):
    from hispec_jax.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench-tool", "oracle", "--shapes", "tiny", "--methods", "hispec:1:2"])
    assert exit_info.value.code == 2
    assert "'hispec:1:2' is not layerskip:D:N" in capsys.readouterr().err


def test_the_oracle_starts_one_way(capsys, monkeypatch):
    """`hispec bench-tool oracle ARGS` runs the oracle with ARGS; the spellings
    `hispec bench-oracle` and `hispec bench --oracle` exit 2 naming that one way."""
    from hispec_jax import cli

    seen = []
    monkeypatch.setattr(oracle, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["bench-tool", "oracle", "--shapes", "llama3-8b", "--dtype", "bfloat16"]) == 0
    assert seen == [["--shapes", "llama3-8b", "--dtype", "bfloat16"]]
    for argv in (["bench", "--oracle", "--shapes", "tiny"], ["bench-oracle", "--shapes", "tiny"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "hispec bench-tool oracle" in err, err
    assert seen == [["--shapes", "llama3-8b", "--dtype", "bfloat16"]]
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--oracle" not in out and "hispec bench-" in out  # (-tool: wrapped at the hyphen)