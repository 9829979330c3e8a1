"""`python -m hispec_jax.bench accelerator`: the parts' judgements against their
targets, the exactness verdict, the departures count, and one small part run end to end
(the tiny preset's layouts, files written). The GPU numbers themselves come from a lent
machine (docs/accelerator_checks.md)."""

import json

import jax

from hispec_jax import Model, ModelConfig
from hispec_jax.bench import accelerator
from hispec_jax.bench.suite import MethodSpec
from hispec_jax.models.params import init_params


def oracle_rows(efficiencies, identical=True):
    rows = [{"name": "ar", "efficiency": 1.0, "efficiency_with_heads": 1.0,
             "identical_to_ar": True}]
    rows += [{"name": f"m{i}", "efficiency": e, "efficiency_with_heads": e + 0.05,
              "identical_to_ar": identical} for i, e in enumerate(efficiencies)]
    return {"rows": rows}


def numerics(departures_highest, departures_tf32):
    configs = [(accelerator.NUMERICS["f32-highest"], departures_highest),
               (accelerator.NUMERICS["f32-default"], departures_tf32)]
    return {"configurations": [
        {"label": label, "dtype": dtype, "matmul_precision": precision,
         "must_be_exact": precision == "highest" and dtype == "float32",
         "departures": {"ar": [None, None], "hispec": departures}}
        for (label, dtype, precision), departures in configs]}


def test_judgements_hold_each_number_to_its_target():
    results = {
        "layouts": {"layouts": {"scan": {"fraction_of_roofline": 0.4},
                                "unrolled": {"fraction_of_roofline": 0.93}}},
        "oracle": oracle_rows([0.95, 0.85]),
        "oracle-default": oracle_rows([0.81]),
        "numerics": numerics([None, None], [None, 83]),
    }
    rows = accelerator.judgements(results)
    met = [(r["what"].split(":")[0], r["target"], r["met"]) for r in rows]
    assert met == [("AR, scan layout", None, None), ("AR, unrolled layout", 0.9, True),
                   ("oracle", 0.9, True), ("oracle", 0.9, False), ("oracle-default", 0.8, True),
                   ("numerics, float32 highest", 0, True),
                   ("numerics, float32 default (TF32 on GPUs)", None, None)]
    assert [r["value"] for r in rows][-2:] == [0, 1]
    assert accelerator.exact(results)  # TF32's departure is reported, not failed


def test_unknown_bandwidth_is_not_judged():
    results = {"layouts": {"layouts": {"scan": {"fraction_of_roofline": None},
                                       "unrolled": {"fraction_of_roofline": None}}}}
    assert [r["met"] for r in accelerator.judgements(results)] == [None, None]


def test_a_departure_at_highest_or_in_the_oracle_fails_the_run():
    assert not accelerator.exact({"numerics": numerics([None, 5], [None, None])})
    assert not accelerator.exact({"oracle": oracle_rows([0.9], identical=False)})
    assert accelerator.exact({"oracle": oracle_rows([0.5])})  # slow is not inexact


def test_first_departures_are_none_for_an_exact_method():
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8)
    model = Model(cfg=cfg, params=init_params(cfg, jax.random.PRNGKey(3), init_std=0.3))
    specs = [MethodSpec.of("ar", "ar"),
             MethodSpec.of("layerskip", "layerskip", draft_exit=1, draft_len=3)]
    out = accelerator.first_departures(model, [[1, 2, 3], [4, 5, 6, 7]], specs, 12)
    assert out == {"ar": [None, None], "layerskip": [None, None]}


def test_layouts_part_runs_and_writes_its_files(tmp_path, capsys):
    status = accelerator.main(["--parts", "layouts", "--shapes", "tiny", "--dtype", "float32",
                               "--quick", "--out-dir", str(tmp_path)])
    assert status == 0
    report = json.loads((tmp_path / "accelerator.json").read_text())
    layouts = report["results"]["layouts"]["layouts"]
    assert set(layouts) == {"scan", "unrolled"}
    assert all(row["tokens_per_second"] > 0 for row in layouts.values())
    assert report["settings"]["max_new_tokens"] == 8
    md = (tmp_path / "accelerator.md").read_text()
    assert "| AR, unrolled layout: share of the HBM roofline | - |" in md  # CPU: unknown
    assert md in capsys.readouterr().out


def test_numerics_configurations_are_chosen_by_key_and_bad_keys_are_refused(capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        accelerator.main(["--parts", "numerics", "--numerics", "f32-highest,fp8"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--numerics" in err and "fp8" in err and "f32-highest" in err
    assert list(accelerator.NUMERICS) == ["f32-highest", "f32-default", "bf16-highest"]
    assert accelerator.NUMERICS["f32-highest"][1:] == ("float32", "highest")
