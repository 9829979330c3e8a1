"""`python -m hispec_jax.bench TOOL` / `hispec bench-tool TOOL`: the listing, every tool's
--help, unknown tools and bad flags (rejected before anything heavy runs), and the folded
tools' small pure functions on tiny inputs. Nothing here decodes or compiles a loop."""

import json
import re
import subprocess
import sys

import pytest

from hispec_jax import cli
from hispec_jax.bench import loop_memory, side_by_side, tools
from hispec_jax.bench.studies import before_after, gguf_memory, plot_agreement


def test_listing_names_every_tool_with_its_description(capsys):
    for argv in ([], ["--help"], ["-h"]):
        assert tools.main(argv) == 0
        lines = capsys.readouterr().out.splitlines()
        for tool in tools.TOOLS:
            description = tools.description(tool)
            assert description, f"{tool}: its module has no docstring"
            assert any(line.split()[:1] == [tool] and line.endswith(description)
                       for line in lines), tool
    assert set(tools.TOOLS) >= {"ar", "engine", "oracle", "seed-methods", "auto", "memory",
                                "gguf-memory", "exit-agreement", "plot-agreement",
                                "before-after"}


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
    assert tools.resolve("seed_methods") == "seed-methods"
    assert tools.resolve("exit_agreement") == "exit-agreement"
    assert tools.resolve("oracle") == "oracle"
    assert tools.resolve("bench_ar") is None


def test_hispec_bench_tool_is_the_same_dispatcher(capsys):
    assert cli.main(["bench-tool"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hispec bench-tool TOOL [args]")
    assert all(tool in out for tool in tools.TOOLS)
    assert cli.main(["bench-tool", "nope"]) == 2
    assert "hispec bench-tool: error: unknown tool 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["bench-tool", "memory", "--help"])
    assert info.value.code == 0
    assert "--capacity" in capsys.readouterr().out
    usage = cli.__doc__[cli.__doc__.index("hispec bench-tool"):].split("hispec tune")[0]
    assert all(re.search(rf"\b{tool}\b", usage) for tool in tools.TOOLS), usage


@pytest.mark.parametrize("argv, message", [
    (["ar", "--threads", "0"], "--threads must be in [1, "),
    (["ar", "--batch-sizes", "1,x"], "expected comma-separated integers"),
    (["ar", "--min-prompt", "9", "--max-prompt", "8"],
     "--max-prompt (8) is below --min-prompt (9)"),
    (["engine", "--synthetic", "agree:-1"], "--synthetic: expected 'random' or 'agree:S'"),
    (["engine", "--dataset", "sharegpt"], "--dataset sharegpt needs --model"),
    (["engine", "--temperatures", "0.6,0"], "--temperatures must be > 0"),
    (["memory", "--prompt-block", "4096", "--capacity", "4096"], "must be below --capacity"),
    (["exit-agreement", "--model", "m", "--rows", "0"], "--rows must be >= 1"),
    (["decode-agreement", "--model", "m", "--prompts", "0"], "--prompts must be >= 1"),
    (["decode-agreement", "--model", "m", "--exits", "3,x"], "--exits must be comma-separated"),
    (["gguf-memory", "/nonexistent/model.gguf"], "no GGUF file at /nonexistent/model.gguf"),
    (["before-after", "--before", "/nonexistent", "--after", "."], "--before /nonexistent: no "
                                                                   "hispec_jax/ in it"),
    (["plot-agreement", "out.png", "no-equals-sign"], "is not LABEL=path"),
    (["accelerator", "--parts", "layouts,roofline"], "--parts: roofline; choose from"),
    (["accelerator", "--parts", ","], "--parts: none given"),
    (["accelerator", "--shapes", "llama9"], "--shapes: model config 'llama9' is neither"),
    (["accelerator", "--rounds", "0"], "--rounds must be >= 1"),
    (["accelerator", "--default-model", "/nonexistent"], "--default-model /nonexistent does "
                                                        "not exist"),
])
def test_bad_flags_fail_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        tools.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_residual_scale():
    assert side_by_side.residual_scale("random") == 1.0
    assert side_by_side.residual_scale("agree:0.05") == 0.05
    assert side_by_side.residual_scale("agree:0") == 0.0
    for bad in ("agree", "agree:x", "agree:-0.1", "same:0.1"):
        with pytest.raises(Exception, match="expected 'random' or 'agree:S'"):
            side_by_side.residual_scale(bad)


def test_cost_columns_per_sequence():
    # 2 prompts in one batch of 2, 8 tokens each, 4 rounds, 10 layer passes per token at
    # 50 tokens/s: 4 trips / 8 tokens; 1000 / (50 * 10) * 2 ms per layer pass.
    stats = {"rounds": 4, "actions_per_level": [9, 9], "new_tokens": 16,
             "layer_passes_per_token": 10.0}
    cost = side_by_side.cost_columns(stats, 50.0, num_prompts=2, batch_size=2)
    assert cost == pytest.approx({"trips_per_token": 0.5, "ms_per_layer_pass": 4.0})
    v1 = {**stats, "rounds": None}  # engine v1: one action per trip
    assert side_by_side.cost_columns(v1, 50.0, 2, 2)["trips_per_token"] == pytest.approx(18 / 8)


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


def test_loop_memory_table_is_relative_to_ar_of_the_same_mode():
    gib = 2**30
    row = lambda name, greedy, total: {"name": name, "greedy": greedy, "arguments": gib,
                                       "outputs": 0, "temporaries": total - gib, "total": total}
    lines = loop_memory.table_lines([row("ar", True, 2 * gib), row("hispec", True, 3 * gib),
                                     row("ar", False, 4 * gib), row("hispec", False, 5 * gib)])
    assert lines[2] == "| ar | greedy | 1.000 | 0.000 | 1.0000 | 2.000 | +0.000% |"
    assert lines[3].endswith("| 3.000 | +50.000% |")
    assert lines[4].endswith("| 4.000 | +0.000% |")
    assert lines[5].endswith("| 5.000 | +25.000% |")


def test_gguf_memory_beyond_weights():
    row = {"dtype": "float32", "layout": "scan", "load_s": 1.0, "weights_mb": 100.0,
           "baseline_mb": 400.0, "after_load_mb": 520.0, "anon_baseline_mb": 300.0,
           "anon_after_load_mb": 410.0, "peak_load_mb": 700.0, "peak_generate_mb": 800.0,
           "torch_imported": False}
    assert gguf_memory.beyond_weights(row) == {"anon_after_load": 10.0, "peak_load": 200.0,
                                               "peak_generate": 300.0}
    assert gguf_memory.table_lines([row])[2] == (
        "| float32 | scan | 1.0 | 100 | 400 | 520 (+10) | 700 (+200) | 800 (+300) | False |")


def test_plot_agreement_curves_read_replies_when_present(tmp_path):
    replies = tmp_path / "a.json"
    replies.write_text(json.dumps({"eval": {"agreement_exits": [0.1, 1.0], "perplexity": 9.0,
                                            "replies": {"agreement_exits": [0.2, 0.5, 1.0],
                                                        "perplexity": 3.456}}}))
    plain = tmp_path / "b.json"
    plain.write_text(json.dumps({"eval": {"agreement_exits": [0.3, 1.0], "perplexity": 7.0}}))
    curves = plot_agreement.curves([f"v2={replies}", f"base={plain}"])
    assert curves == {"v2 (ppl 3.46)": {"exits": [1, 2, 3], "agreement": [0.2, 0.5, 1.0]},
                      "base (ppl 7.00)": {"exits": [1, 2], "agreement": [0.3, 1.0]}}


def test_before_after_summary():
    results = {"before": [{"median": 100.0, "hlo": "abc"}, {"median": 120.0, "hlo": "abc"},
                          {"median": 110.0, "hlo": "abc"}],
               "after": [{"median": 130.0, "hlo": "abc"}]}
    lines = before_after.summary_lines(results)
    assert lines[0] == "before median of round medians  110.0 tok/s, best  120.0"
    assert lines[1] == "after  median of round medians  130.0 tok/s, best  130.0"
    assert lines[2] == "lowered single-device loop: identical"
    results["after"][0]["hlo"] = "def"
    assert before_after.summary_lines(results)[2] == (
        "lowered single-device loop: differs ['abc', 'def']")


def test_seq_rep_counts_repeated_four_grams():
    """decode-agreement's repetition measure: 0 with no repeated 4-gram, 1 - distinct/total
    otherwise, averaged over continuations; too-short continuations are left out."""
    from hispec_jax.bench.studies.decode_agreement import seq_rep

    assert seq_rep([[1, 2, 3, 4, 5, 6]]) == 0.0
    loop = [7] * 10                       # 7 four-grams, 1 distinct
    assert seq_rep([loop]) == round(1 - 1 / 7, 4)
    assert seq_rep([[1, 2, 3, 4, 5, 6], loop, [1, 2]]) == round((1 - 1 / 7) / 2, 4)
    assert seq_rep([[1, 2]]) is None
