"""`python -m hispec_jax.bench TOOL` / `hispec bench-tool TOOL`: the listing, every tool's
--help, unknown tools and bad flags (rejected before anything heavy runs), the compare
tool's small pure functions, and one compare run end to end on a tiny random model."""

import itertools
import json
import re
import subprocess
import sys

import pytest

from hispec_jax import cli
from hispec_jax.bench import compare, tools


def test_listing_names_every_tool_with_its_description(capsys):
    for argv in ([], ["--help"], ["-h"]):
        assert tools.main(argv) == 0
        lines = capsys.readouterr().out.splitlines()
        for tool in tools.TOOLS:
            description = tools.description(tool)
            assert description, f"{tool}: its module has no docstring"
            assert any(line.split()[:1] == [tool] and line.endswith(description)
                       for line in lines), tool
    assert set(tools.TOOLS) == {"compare", "oracle", "pass-cost", "accelerator", "serve", "tasks",
                                "work", "draft-model"}


def test_listing_imports_neither_jax_nor_torch():
    code = ("import sys; from hispec_jax.bench import tools; tools.main([]); tools.main(['x']); "
            "assert 'jax' not in sys.modules and 'torch' not in sys.modules, 'heavy import'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("tool", list(tools.TOOLS))
def test_every_tool_help_exits_0(tool, capsys):
    with pytest.raises(SystemExit) as info:
        tools.main([tool, "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")


def test_unknown_tool_names_it_and_the_tools(capsys):
    assert tools.main(["bench_nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown tool 'bench_nope'" in err
    assert "choose from: " + ", ".join(tools.TOOLS) in err


def test_module_spelling_is_accepted():
    assert tools.resolve("compare") == "compare"
    assert tools.resolve("oracle") == "oracle"
    assert tools.resolve("bench_ar") is None
    assert tools.resolve("memory") is None  # `hispec plan-memory --compare`


def test_hispec_bench_tool_is_the_same_dispatcher(capsys):
    assert cli.main(["bench-tool"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hispec bench-tool TOOL [args]")
    assert all(tool in out for tool in tools.TOOLS)
    assert cli.main(["bench-tool", "nope"]) == 2
    assert "hispec bench-tool: error: unknown tool 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["bench-tool", "compare", "--help"])
    assert info.value.code == 0
    assert "--transformers" in capsys.readouterr().out
    usage = cli.__doc__[cli.__doc__.index("hispec bench-tool"):].split("hispec tune")[0]
    assert all(re.search(rf"\b{tool}\b", usage) for tool in tools.TOOLS), usage


@pytest.mark.parametrize("argv, message", [
    (["compare", "--threads", "0"], "--threads must be in [1, "),
    (["compare", "--batch-sizes", "1,x"], "expected comma-separated integers"),
    (["compare", "--prompt-len", "9:8"], "expected 1 <= MIN <= MAX"),
    (["compare", "--methods", "ar,medusa"], "unknown medusa; choose from ar, layerskip"),
    (["compare", "--synthetic", "agree:-1"], "--synthetic: expected 'random' or 'agree:S'"),
    (["compare", "--synthetic", "random", "--model", "m"], "--model or --synthetic: give one"),
    (["compare", "--synthetic", "random", "--dataset", "sharegpt"],
     "--dataset sharegpt calibrates or reads text: needs --model"),
    (["compare", "--synthetic", "random", "--methods", "sv"], "sv calibrates or reads text"),
    (["compare", "--synthetic", "random", "--heads", "3"], "must be a multiple of the heads"),
    (["compare", "--temperatures", "0.6,0"], "--temperatures must be > 0"),
    (["compare", "--transformers", "--loop-time"], "leave out --loop-time"),
    (["compare", "--transformers", "--temperatures", "1"], "leave out --temperatures"),
    (["compare", "--model", "/nonexistent"], "--model /nonexistent: no such file"),
    (["accelerator", "--parts", "layouts,roofline"], "--parts: roofline; choose from"),
    (["accelerator", "--parts", ","], "--parts: none given"),
    (["accelerator", "--shapes", "llama9"], "--shapes: model config 'llama9' is neither"),
    (["accelerator", "--rounds", "0"], "--rounds must be >= 1"),
    (["accelerator", "--default-model", "/nonexistent"], "--default-model /nonexistent does "
                                                        "not exist"),
    (["serve", "--task", "poems"], "--task poems: expected sharegpt or one of chat, summarize"),
    (["serve", "--chat"], "--chat renders --task prompts; give a --task"),
    (["serve", "--repeats", "0"], "--repeats must be >= 1"),
    (["serve", "--methods", "ar,ar+fast"], "--methods ar+fast: expected METHOD, METHOD+ride"),
])
def test_bad_flags_fail_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        tools.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_residual_scale():
    assert compare.residual_scale("random") == 1.0
    assert compare.residual_scale("agree:0.05") == 0.05
    assert compare.residual_scale("agree:0") == 0.0
    for bad in ("agree", "agree:x", "agree:-0.1", "same:0.1"):
        with pytest.raises(Exception, match="expected 'random' or 'agree:S'"):
            compare.residual_scale(bad)


def test_cost_columns_per_sequence():
    # 2 prompts in one batch of 2, 8 tokens each, 4 rounds, 10 layer passes per token at
    # 50 tokens/s: 4 trips / 8 tokens; 1000 / (50 * 10) * 2 ms per layer pass.
    stats = {"rounds": 4, "actions_per_level": [9, 9], "new_tokens": 16,
             "layer_passes_per_token": 10.0}
    cost = compare.cost_columns(stats, 50.0, num_prompts=2, batch_size=2)
    assert cost == pytest.approx({"trips_per_token": 0.5, "ms_per_layer_pass": 4.0})
    actions = {**stats, "rounds": None}  # no rounds counted: one action per trip
    assert compare.cost_columns(actions, 50.0, 2, 2)["trips_per_token"] == pytest.approx(18 / 8)


def test_scaled_residuals_scales_only_the_output_projections():
    import jax.numpy as jnp
    import numpy as np

    from hispec_jax import Model, ModelConfig
    from hispec_jax.bench import oracle

    cfg = ModelConfig(model_type="llama", vocab_size=16, hidden_size=8, intermediate_size=16,
                      num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
    stacked = {"wq": jnp.full((2, 8, 8), 3.0), "wo": jnp.full((2, 8, 8), 2.0),
               "w_down": jnp.full((2, 16, 8), -4.0)}  # [L, in, out], scan layout
    model = Model(cfg=cfg, params={"embed": jnp.ones((16, 8)), "layers": stacked})
    half = oracle.scaled_residuals(model, 0.5)
    for name, layer in stacked.items():
        factor = 0.5 if name in ("wo", "w_down") else 1.0
        np.testing.assert_array_equal(half.params["layers"][name], layer * factor)
    zero = oracle.always_agree(model)
    assert not np.any(np.asarray(zero.params["layers"]["wo"])) and zero.heads == {}


def test_method_list_puts_ar_first_once():
    assert compare.method_list("hispec,ar,sv,hispec") == ("ar", "hispec", "sv")
    assert compare.method_list("lookup") == ("ar", "lookup")
    assert compare.prompt_lengths("48") == (48, 48)
    assert compare.prompt_lengths("32:64") == (32, 64)


def test_method_specs_name_one_row_per_method_and_draft_exit():
    args = compare.parse_args(["--methods", "layerskip,hispec,hispec-adaptive,specbound,lookup",
                               "--draft-exits", "2,4"])
    specs = compare.method_specs(None, args, 1, None, print)
    assert [(s.name, s.method, dict(s.options)) for s in specs] == [
        ("ar", "ar", {}), ("layerskip d=2", "layerskip", {"draft_exit": 2}),
        ("layerskip d=4", "layerskip", {"draft_exit": 4}), ("hispec defaults", "hispec", {}),
        ("hispec adaptive", "hispec", {"adaptive": True}),
        ("specbound defaults", "specbound", {}), ("lookup", "lookup", {})]


def test_compare_runs_ar_and_our_methods_against_transformers(tmp_path, capsys):
    """The tool end to end on a tiny synthetic model: our methods and transformers on the
    same weights (written as a Hugging Face directory), one table per batch size, every
    output equal to AR's."""
    pytest.importorskip("torch")
    out = tmp_path / "compare.json"
    code = compare.main(["--synthetic", "agree:0", "--layers", "2", "--hidden", "64",
                         "--vocab", "64", "--methods", "ar,layerskip", "--draft-exits", "1",
                         "--transformers", "--batch-sizes", "1,2", "--prompts", "2",
                         "--prompt-len", "3:5", "--max-new-tokens", "4", "--rounds", "1",
                         "--out", str(out)])
    assert code == 0
    tables = json.loads(out.read_text())["tables"]
    assert list(tables) == ["batch 1", "batch 2"]
    for rows in tables.values():
        assert list(rows) == ["ar", "layerskip d=1", "transformers"]
        assert all(r["identical_to_ar"] for r in rows.values())
    assert "| transformers |" in capsys.readouterr().out



def test_specbound_sweep_stage_two_searches_depth_and_width_at_stage_ones_best(monkeypatch):
    from types import SimpleNamespace

    from hispec_jax.planner import calibrate

    grids = []

    def fake_sweep(model, prompts, new_tokens, grid, rounds, progress=None):
        grids.append(grid)
        rows = [{"name": "ar", "identical_to_ar": True, "speedup_vs_ar": 1.0,
                 "layer_passes_per_token": 24.0, "tokens_per_round": 1.0}]
        for i, (tau, anneal, depth, width) in enumerate(itertools.product(
                grid["tau"], grid["anneal"], grid["depth_bound"], grid["width"])):
            rows.append({"name": f"row {i}", "tau": tau, "anneal": anneal, "depth_bound": depth,
                         "width": width, "identical_to_ar": True,
                         "speedup_vs_ar": 2.0 if (tau, anneal) == (0.7, 1.0) else 1.5,
                         "layer_passes_per_token": 3.0, "tokens_per_round": 2.0})
        return rows

    monkeypatch.setattr(compare, "specbound_sweep", fake_sweep)
    monkeypatch.setattr(calibrate, "calibration_prompts", lambda model, n, length: [[1, 2]] * n)
    model = SimpleNamespace(cfg=SimpleNamespace(num_layers=24))
    args = compare.parse_args(["--specbound-sweep", "--sweep-prompts", "2"])
    report, saves = {}, []
    compare.sweep(model, args, report, lambda: saves.append(1), lambda msg: None)
    assert grids[0]["depth_bound"] == [12] and grids[0]["width"] == [4]
    assert grids[1] == {"tau": [0.7], "anneal": [1.0], "depth_bound": [6, 8, 12, 16],
                        "width": [2, 4, 8]}
    assert set(report) == {"specbound_sweep_stage1", "specbound_sweep_stage2", "specbound_best"}
    assert len(saves) == 2


def test_serve_load_rows_are_medians_over_repeats():
    from hispec_jax.bench import serve_load

    def run(alone, load, ratio, mismatches):
        lat = {"p50": 0.01, "p90": 0.02, "p99": 0.03}
        part = {"ttft": lat, "ttft_short_prompts": lat, "tpot": lat, "itl": lat}
        return {"method": "default", "plan": "lookup", "alone": {**part, "tokens_per_second": alone},
                "load": {**part, "tokens_per_second": load}, "alone_x_first": ratio,
                "load_x_first": ratio / 2, "recompiles_after_warmup": 0,
                "greedy_mismatches": mismatches, "checked_outputs": 24}

    row = serve_load.combine([run(30.0, 90.0, 1.6, 0), run(10.0, 50.0, 1.2, 1),
                              run(20.0, 70.0, 1.4, 0)])
    assert row["alone"]["tokens_per_second"] == 20.0
    assert row["load"]["tokens_per_second"] == 70.0
    assert row["alone_x_first"] == 1.4 and row["load_x_first"] == 0.7
    assert (row["greedy_mismatches"], row["checked_outputs"]) == (1, 72)
    line = serve_load.table([row], clients=8).split("\n")[-1]
    assert line.startswith("| default (lookup) | 20.0 | 1.40x | 70.0 | 0.70x |")
    assert line.endswith("| 0 | 71/72 |")


def test_serve_load_interleave_starts_each_server_once_and_alternates_the_repeats(
        monkeypatch, tmp_path):
    """--interleave: one server per method, started before the first repeat and stopped
    after the last; the repeats measured against them in turn (A B A B), each reading the
    server's one step log; the exit codes come last."""
    from hispec_jax.bench import serve_load

    events = []

    class Proc:
        def __init__(self, method):
            self.method = method

        def poll(self):
            return 0

    def start(method, args, repeat=0):
        events.append(("start", method))
        return Proc(method), f"http://{method}"

    def measure(method, url, args, requests, want, step_log):
        events.append(("measure", method, url, step_log))
        return {"method": method}

    def stop(proc):
        events.append(("stop", proc.method))
        return 0

    monkeypatch.setattr(serve_load, "start_server", start)
    monkeypatch.setattr(serve_load, "measure", measure)
    monkeypatch.setattr(serve_load, "stop_server", stop)
    args = serve_load.parse_args(["--log-dir", str(tmp_path), "--repeats", "2", "--interleave"])
    got = list(serve_load.interleaved_runs(["ar", "default"], args, [], {}))
    assert [(r, m) for r, m, _ in got] == [(0, "ar"), (0, "default"), (1, "ar"), (1, "default"),
                                         (None, "ar"), (None, "default")]
    log = {m: str(tmp_path / f"steps-{m}.jsonl") for m in ("ar", "default")}
    assert events == [("start", "ar"), ("start", "default"),
                      ("measure", "ar", "http://ar", log["ar"]),
                      ("measure", "default", "http://default", log["default"]),
                      ("measure", "ar", "http://ar", log["ar"]),
                      ("measure", "default", "http://default", log["default"]),
                      ("stop", "ar"), ("stop", "default")]


def test_serve_load_distinct_requests_give_each_interleaved_repeat_its_own_mix(
        monkeypatch, tmp_path):
    """--distinct-requests under --interleave: the servers stay up across repeats, so each
    repeat sends its own --requests (a store of earlier requests never holds the answer to a
    request it is timed on); every method of a repeat gets the same part. Servers started per
    repeat (no --interleave) send the one mix every time."""
    from hispec_jax.bench import serve_load

    sent = []

    class Proc:
        def poll(self):
            return 0

    def measure(method, url, args, requests, want, step_log):
        sent.append((method, [i for i, _, _ in requests]))
        return {"method": method}

    monkeypatch.setattr(serve_load, "start_server", lambda m, a, r=0: (Proc(), "http://x"))
    monkeypatch.setattr(serve_load, "measure", measure)
    monkeypatch.setattr(serve_load, "stop_server", lambda proc: 0)
    flags = ["--log-dir", str(tmp_path), "--repeats", "3", "--requests", "12",
             "--alone-requests", "2", "--clients", "8", "--distinct-requests"]
    args = serve_load.parse_args(flags + ["--interleave"])
    assert serve_load.mix_slices(args) == 3
    mix = [(i, [i], 8) for i in range(36)]
    list(serve_load.interleaved_runs(["ar", "default"], args, mix, {}))
    assert sent == [(m, list(range(12 * r, 12 * (r + 1))))
                    for r in range(3) for m in ("ar", "default")]
    assert serve_load.mix_slices(serve_load.parse_args(flags)) == 1
    assert serve_load.repeat_requests(mix[:12], serve_load.parse_args(flags), 2) == mix[:12]


def test_serve_load_passes_the_prefill_share_to_every_server(monkeypatch, tmp_path):
    """`--prefill-share X` and `--ride-prefill` reach each server's command line; without
    them the server keeps its own defaults. Every server writes its step log in the log
    directory."""
    from hispec_jax.bench import serve_load

    commands = []

    class Started(Exception):
        pass

    def popen(cmd, **kwargs):
        commands.append(cmd)
        raise Started

    monkeypatch.setattr(serve_load.subprocess, "Popen", popen)
    for extra in ([], ["--prefill-share", "0.5", "--ride-prefill"]):
        args = serve_load.parse_args(["--log-dir", str(tmp_path), *extra])
        with pytest.raises(Started):
            serve_load.start_server("ar", args)
    assert "--prefill-share" not in commands[0] and "--ride-prefill" not in commands[0]
    assert commands[1][commands[1].index("--prefill-share") + 1] == "0.5"
    assert "--ride-prefill" in commands[1]
    assert commands[0][commands[0].index("--step-log") + 1] == str(tmp_path / "steps-ar.jsonl")
    args = serve_load.parse_args(["--log-dir", str(tmp_path), "--ride-prefill"])
    for method in ("ar+budget", "default+ride"):  # a method's own scheduler
        with pytest.raises(Started):
            serve_load.start_server(method, args)
    budget, ride = commands[2:]
    assert "--no-ride-prefill" in budget and "--ride-prefill" not in budget
    assert budget[budget.index("--method") + 1] == "ar"
    assert "--ride-prefill" in ride and "--method" not in ride
    assert ride[ride.index("--step-log") + 1] == str(tmp_path / "steps-default+ride.jsonl")
    del commands[2:]
    args = serve_load.parse_args(["--log-dir", str(tmp_path), "--repeats", "2"])
    with pytest.raises(Started):  # each repeat keeps its own log
        serve_load.start_server("default", args, repeat=1)
    assert commands[2][commands[2].index("--step-log") + 1] == str(
        tmp_path / "steps-default-r2.jsonl")


def test_serve_load_step_summary_reads_the_load_phase_steps():
    """Only the steps that started in the load window and had a slot decoding count; the
    shares with chunks and with a chunk riding the round, and the percentiles, come from
    those; a speculative server's rounds are split by level 1's block."""
    from hispec_jax.bench import serve_load

    def step(time, chunks, prefill, round_, decoding=8):
        return {"time": time, "engine": "greedy", "decoding": decoding, "prompts": 1,
                "rows": 8, "chunks": chunks, "prefill_seconds": prefill,
                "round_seconds": round_, "tokens": decoding}

    records = [step(0.5, [64], 0.3, 0.1),                   # before the window
               step(1.0, [16], 0.05, 0.06), step(1.1, [], 0.0, 0.06),
               step(1.2, [], 0.0, 0.06), step(1.3, [], 0.0, 0.12),
               step(1.4, [64], 0.2, 0.0, decoding=0),        # nothing decoding
               step(9.0, [], 0.0, 1.0)]                      # after it
    got = serve_load.step_summary(records, 1.0, 2.0)
    assert got["steps"] == 4 and got["with_chunks"] == 0.25
    assert got["round"]["p50"] == pytest.approx(0.06)
    assert got["step"]["p50"] == pytest.approx(0.085)
    assert got["step"]["p99"] == pytest.approx(0.12, abs=0.01)
    assert got["prefill"]["p50"] == pytest.approx(0.05)
    line = serve_load.steps_lines([{"method": "ar", "load_steps": got}])
    assert line.startswith("ar: 4 steps under load, 25 % with prefill chunks (their prefill "
                           "p50 50 ms)")
    assert "blocks" not in got  # AR's records propose nothing
    # a speculative server's rounds, split by level 1's block: two one-position rounds (8
    # sequences, 8 proposed), one longer (8 sequences, 20 proposed, 10 kept, 18 tokens)
    spec = [dict(step(1.0, [], 0.0, 0.06), proposed=[8], accepted=[3]),
            dict(step(1.1, [], 0.0, 0.07), proposed=[8], accepted=[2]),
            dict(step(1.2, [], 0.0, 0.12), proposed=[20], accepted=[10], tokens=18)]
    blocks = serve_load.step_summary(spec, 1.0, 2.0)["blocks"]
    assert blocks["one"]["rounds"] == 2 and blocks["one"]["seconds"] == pytest.approx(0.065)
    assert blocks["one"]["tokens_per_sequence"] == 1.0
    assert blocks["one"]["kept"] == pytest.approx(5 / 16)
    assert blocks["longer"] == {"rounds": 1, "seconds": pytest.approx(0.12), "rows": 8.0,
                                "tokens_per_sequence": 2.25, "kept": 0.5}
    line = serve_load.steps_lines([{"method": "default", "load_steps": {
        **serve_load.step_summary(spec, 1.0, 2.0)}}]).splitlines()[1]
    assert line == ("default: rounds by level 1's block: one 2 rounds, 65 ms on 8.0 rows, 1.00 "
                    "tokens per sequence, 31 % of proposed kept; longer 1 rounds, 120 ms on "
                    "8.0 rows, 2.25 tokens per sequence, 50 % of proposed kept")
    # rounds that carried a prefill chunk (`rider`)
    ridden = [dict(step(1.0, [], 0.0, 0.08), rider=16), step(1.1, [], 0.0, 0.06),
              dict(step(1.2, [], 0.0, 0.07), rider=None)]
    got = serve_load.step_summary(ridden, 1.0, 2.0)
    assert got["with_rider"] == pytest.approx(1 / 3) and got["with_chunks"] == 0
    assert got["ridden"]["p50"] == pytest.approx(0.08)
    assert serve_load.steps_lines([{"method": "ar", "load_steps": got}]).startswith(
        "ar: 3 steps under load, 0 % with prefill chunks (their prefill p50 - ms), 33 % with "
        "a chunk riding the round (those rounds p50 80 ms); rounds p50/p99 70/")
    empty = {"p50": None, "p90": None, "p99": None}
    assert serve_load.step_summary([], 0, 1) == {
        "steps": 0, "with_chunks": None, "with_rider": None, "round": empty, "step": empty,
        "prefill": empty, "ridden": empty}
