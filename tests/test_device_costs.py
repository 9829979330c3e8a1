"""The lookup gate's pass costs measured on this host (`gate.PassCost`'s table,
`decoding/device_costs.py`): the gate prices a pass by the table where it has one; a
measurement is kept per host and model and read by `generate` and the serving engines;
`hispec serve` measures one in its warm-up where none is kept; `hispec bench-tool pass-cost`."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from hispec_jax import generate
from hispec_jax.bench import pass_cost as pass_cost_tool
from hispec_jax.decoding import costs, device_costs, gate, methods
from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.decoding import slots as slots_lib
from hispec_jax.serving import server as server_lib

from test_engine import tiny_model
from test_lookup_gate import BLOCKS, CYCLE_PROMPTS, pick

CPU = gate.default_pass_cost("cpu")
# every block pass priced at 50 AR steps: no proposal pays; or at one: every one does
DEAR = gate.PassCost.of(float(CPU.fixed), float(CPU.jump),
                        {(b, T): 50.0 for b in gate.TABLE_ROWS for T in gate.TABLE_BLOCKS if T > 1})
CHEAP = gate.PassCost.of(float(CPU.fixed), float(CPU.jump),
                         {(b, T): 1.0 for b in gate.TABLE_ROWS for T in gate.TABLE_BLOCKS})


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A temporary folder for the kept measurements."""
    monkeypatch.setenv("HISPEC_PASS_COSTS", str(tmp_path))
    return tmp_path


def test_block_costs_read_the_table_where_it_has_an_entry():
    """C(b, T) is the table's entry where measured, the fit's elsewhere: other blocks,
    other batches (b = 3 is no row of the table), non-power-of-two blocks."""
    cost = gate.PassCost.of(15.0, 5.0, {(1, 2): 1.83, (1, 16): 2.53, (8, 4): 2.13})
    fit = lambda b, T: float(gate.relative_cost(b, T, cost))  # noqa: E731
    got = np.asarray(gate.block_costs(1, (1, 2, 4, 16, 11), cost))
    np.testing.assert_allclose(got, [fit(1, 1), 1.83, fit(1, 4), 2.53, fit(1, 11)], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gate.block_costs(8, (2, 4), cost)),
                               [fit(8, 2), 2.13], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gate.block_costs(3, (4,), cost)), [fit(3, 4)],
                               rtol=1e-6)
    assert cost.measured() == pytest.approx({(1, 2): 1.83, (1, 16): 2.53, (8, 4): 2.13})
    assert gate.PassCost.of(15.0, 5.0).measured() == {}


def test_the_gate_weighs_the_measured_table():
    """The same fit, with a table that prices blocks dear or cheap: a likely match proposes
    nothing more than the AR step where blocks are dear, the whole schedule where they are
    free, at batch 1 and in a joint batch of 8."""
    for batch, joint in ((1, False), (8, True)):
        assert pick(0.9, 16, DEAR, batch=batch, joint=joint) == 1
        assert pick(0.9, 16, CHEAP, batch=batch, joint=joint) == 16
        assert pick(0.9, 16, CPU, batch=1, joint=False) > 1


def test_with_measured_keeps_the_relative_costs():
    seconds = {(1, 1): 0.06, (1, 2): 0.11, (1, 16): 0.15, (8, 1): 0.14, (8, 4): 0.30,
               (2, 2): 0.1}  # (2, 2) has no AR step: left to the fit
    cost = gate.with_measured(gate.PassCost.of(15.0, 5.0), seconds)
    assert cost.measured() == pytest.approx(
        {(1, 1): 1.0, (1, 2): 0.11 / 0.06, (1, 16): 0.15 / 0.06, (8, 1): 1.0,
         (8, 4): 0.30 / 0.14})


def test_a_measurement_is_kept_per_host_and_model(store, monkeypatch):
    """store -> load gives the same costs; another host's file, another model's shapes or a
    broken file read as nothing; HISPEC_PASS_COSTS=0 keeps and reads none."""
    model, other = tiny_model(2, 0), tiny_model(3, 0)
    assert device_costs.load(model) is None
    assert device_costs.for_model(model)[1] == device_costs.DEFAULT
    cost = gate.PassCost.of(12.5, 2.75, {(1, 2): 1.4, (8, 4): 2.2})
    path = device_costs.store(model, cost, {(1, 1): 0.01, (1, 2): 0.014})
    assert path.parent == store and costs.host_key() in path.name
    got, source = device_costs.for_model(model)
    assert source == device_costs.MEASURED
    assert (float(got.fixed), float(got.jump)) == (12.5, 2.75)
    assert got.measured() == pytest.approx(cost.measured())
    assert device_costs.load(other) is None  # other shapes: another key
    assert device_costs.shape_key(tiny_model(2, 1)) == device_costs.shape_key(model)  # weights
    d = json.loads(path.read_text())
    path.write_text(json.dumps({**d, "host": "cpu-elsewhere"}))
    assert device_costs.load(model) is None
    path.write_text("{ not json")
    assert device_costs.load(model) is None
    monkeypatch.setenv("HISPEC_PASS_COSTS", "0")
    assert device_costs.store(model, cost) is None and device_costs.load(model) is None


def test_host_key_names_the_cpu():
    key = costs.host_key()
    assert key.startswith(costs.device_key())
    assert key == costs.host_key()  # one host, one key


def test_generate_weighs_the_kept_measurement(store):
    """With nothing kept the gate prices passes by the backend's default; a kept table that
    prices every block dear leaves proposals at one token, a cheap one makes them longer;
    the tokens stay AR's whichever it reads, and a given `lookup_cost` wins over the kept
    one."""
    model = tiny_model(4, 0, 0.0)  # a cycling model: its matches hold
    prompts = CYCLE_PROMPTS + [[2, 4, 6]]  # a batch of 4: a row of the table
    ar = generate(model, prompts, method="ar", max_new_tokens=24, ignore_eos=True)
    run = lambda **kw: generate(model, prompts, method="lookup", max_new_tokens=24,  # noqa: E731
                                ignore_eos=True, **kw)
    default = run()
    assert default.stats["pass_cost_source"] == device_costs.DEFAULT
    device_costs.store(model, DEAR)
    dear = run()
    assert dear.stats["pass_cost_source"] == device_costs.MEASURED
    look = dear.stats["lookup"]
    assert look["matches"] > 0 and look["proposed"] == look["matches"], look
    device_costs.store(model, CHEAP)
    cheap = run()
    assert cheap.stats["lookup"]["proposed"] > 2 * cheap.stats["lookup"]["matches"]
    given = run(lookup_cost=DEAR)
    assert given.stats["pass_cost_source"] == "given"
    assert given.stats["lookup"]["proposed"] == given.stats["lookup"]["matches"]
    for r in (default, dear, cheap, given):
        assert r.token_ids == ar.token_ids
        assert r.stats["compile_count"] == 0 or r is default  # arrays: nothing recompiles


def test_serve_warm_up_measures_and_hands_the_costs_to_the_engines(store):
    """A lookup server with nothing kept and `--measure-pass-cost`: its warm-up's background
    thread measures the model's passes, keeps them, and the engines weigh them from their
    next round; a second server reads them and measures nothing."""
    model = tiny_model(2, 0, 0.0)
    engines = server_lib.build_engines(model, "lookup", slots=1, max_cache_len=64)
    assert all(e.gated and e.pass_cost_source == device_costs.DEFAULT for e in engines.values())
    thread = server_lib.warm_up(engines, idle=lambda: True, measure_pass_cost=True)
    assert all(e.pass_cost_pending for e in engines.values())  # (the bench waits for it)
    thread.join()
    assert not any(e.pass_cost_pending for e in engines.values())
    assert device_costs.load(model) is not None
    engine = engines[True]
    engine.admit(0, slots_lib.SlotRequest((5, 9, 11, 5, 9), 6, SamplingParams()))
    engine.prefill()
    engine.generate(1)
    assert engine.pass_cost_source == device_costs.MEASURED
    assert engine.req.lookup_cost.measured() == pytest.approx(device_costs.load(model).measured(),
                                                              rel=1e-3)
    again = server_lib.build_engines(model, "lookup", slots=1, max_cache_len=64)
    assert again[True].pass_cost_source == device_costs.MEASURED
    ar = server_lib.build_engines(model, "ar", slots=1, max_cache_len=64)
    assert not ar[True].gated


def test_pass_cost_tool(store, tmp_path, llama_dir, capsys):
    """`hispec bench-tool pass-cost`: a bad model is a one-line usage error (exit 2); --show
    says what the gate uses; a measurement prints its table and is kept."""
    with pytest.raises(SystemExit) as e:
        pass_cost_tool.main(["--model", str(tmp_path / "missing.gguf")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no such file or directory" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as e:
        pass_cost_tool.main(["--model", str(llama_dir), "--repeats", "0"])
    assert e.value.code == 2
    assert pass_cost_tool.main(["--model", str(llama_dir), "--repeats", "1", "--calls", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 1 | 16 |" in out and "| 8 | 4 |" in out and "kept in:" in out
    assert pass_cost_tool.main(["--model", str(llama_dir), "--show"]) == 0
    assert capsys.readouterr().out.startswith(device_costs.MEASURED)

