"""`hispec bench`: a quick end-to-end run on a tiny model, its report, and its pieces."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hispec_jax import datasets as prompts_lib
from hispec_jax.bench import report, suite, sweeps
from hispec_jax.cli import main
from hispec_jax.models.config import ModelConfig
from hispec_jax.models.model import load_model, save_model
from hispec_jax.models.presets import init_random_model


@pytest.fixture(scope="module")
def byte_model_dir(tmp_path_factory):
    """A 4-layer random Llama with the byte-level tokenizer (so dataset prompts tokenize)."""
    cfg = ModelConfig(model_type="llama", vocab_size=259, hidden_size=64, intermediate_size=128,
                      num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                      max_position_embeddings=1024, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("bench_model")
    save_model(init_random_model(cfg, seed=0, init_std=0.3), path)
    return path


@pytest.fixture(scope="module")
def quick_report(byte_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_out")
    rc = main(["bench", "--model", str(byte_model_dir), "--quick", "--datasets", "sharegpt",
               "--max-prompt-tokens", "200", "--batch-sizes", "2", "--out-dir", str(out),
               "--no-progress"])
    assert rc == 0
    return out, json.loads((out / "report.json").read_text())


def test_quick_bench_is_lossless_and_complete(quick_report):
    out, report = quick_report
    assert report["complete"] is True
    methods = report["methods"]["sharegpt"]
    names = [r["name"] for r in methods]
    assert names[0] == "ar"
    assert {"layerskip d=1 n=2", "layerskip d=2 n=2", "hispec defaults",
            "hispec adaptive", "sv defaults", "specbound defaults"} <= set(names)
    # the random model has no SV profile: the bench made a quick one in its out_dir
    assert report["sv_profile"] == str(out / "sv_profile.json")
    assert (out / "sv_profile.json").is_file()
    assert report["batch"]["batch_sizes"] == [2]
    assert report["batch"]["methods"] == ["ar", "layerskip defaults", "hispec defaults",
                                          "sv defaults", "specbound defaults"]
    sv = next(r for r in methods if r["name"] == "sv defaults")
    assert sum(sv["stats"]["verified_length_histogram"]) > 0
    specbound = next(r for r in methods if r["name"] == "specbound defaults")
    assert sum(specbound["stats"]["draft_exit_histogram"].values()) > 0
    assert any(n.startswith("hispec tuned") for n in names)
    for section in (methods, report["peers"]["sharegpt"], report["grid"]["rows"],
                    *report["batch"]["rows"].values()):
        for row in section:
            assert row["identical_to_ar"] is True, row["name"]
            assert row["tokens_per_second"] > 0
            assert len(row["seconds"]) == 1
    peers = {r["name"] for r in report["peers"]["sharegpt"]}
    assert "transformers greedy" in peers and any("transformers layerskip" in n for n in peers)
    for row in methods:
        assert row["compile_seconds"] > 0 and row["memory_bytes"] > 0
    hispec = next(r for r in methods if r["name"] == "hispec defaults")
    assert hispec["stats"]["exits"] == [1, 2, 4]
    assert 0 <= hispec["stats"]["final_acceptance_rate"] <= 1
    # the 4-layer model's exit grid: exits {1, 2}, the one pair (1, 2)
    assert report["grid"]["exits"] == [1, 2]
    assert np.isnan(report["grid"]["heatmap"][0][0]) and report["grid"]["heatmap"][0][1] > 0
    assert report["agreement"]["sharegpt"]["exits"] == [1, 2, 3, 4]
    assert report["agreement"]["sharegpt"]["agreement"][-1] == 1.0
    for png in report["plots"]:
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert {"agreement.png", "exit_grid.png", "methods_sharegpt.png",
            "batch_sizes.png"} <= set(report["plots"])
    md = (out / "report.md").read_text()
    assert "## Methods: sharegpt" in md and "Table 9" in md and "identical to AR: **True**" in md


def test_exit_agreement_matches_transformers_hidden_states(hf_models):
    """Agreement from our exits == argmax of transformers' per-layer hidden states through
    the final norm and LM head."""
    import torch

    hf, path = hf_models["qwen3"]
    model = load_model(path)
    rng = np.random.RandomState(0)
    sequences = [rng.randint(3, 97, n).tolist() for n in (20, 33, 7)]
    ours = sweeps.exit_agreement(model, sequences, max_len=40, batch_size=2)
    L = model.cfg.num_layers
    agree, total = np.zeros(L), 0
    with torch.no_grad():
        for seq in sequences:
            out = hf(torch.tensor([seq]), output_hidden_states=True)
            top = [hf.lm_head(hf.model.norm(h)).argmax(-1) for h in out.hidden_states[1:L]]
            top.append(out.logits.argmax(-1))
            agree += [int((t == top[-1]).sum()) for t in top]
            total += len(seq)
    assert ours["tokens"] == total
    np.testing.assert_allclose(ours["agreement"], np.round(agree / total, 4), atol=1e-4)


def test_heatmap_layout():
    rows = [{"options": {"method": "ar"}, "speedup_vs_ar": 1.0},
            {"options": {"method": "hispec", "draft_exit": 1, "verify_exits": [3]},
             "speedup_vs_ar": 1.5}]
    grid = sweeps.heatmap(rows, [1, 2, 3])
    assert grid[0, 2] == 1.5 and np.isnan(grid).sum() == 8


def test_compare_checks_tokens_and_interleaves():
    calls = []

    def runner(name, tokens):
        def warmup():
            calls.append(("warmup", name))
            return suite.Result(name=name, token_ids=tokens, new_tokens=4)

        def timed():
            calls.append(("round", name))
            return 2.0
        return suite.Runner(name, warmup, timed)

    results = suite.compare([runner("ar", [[1, 2], [4, 5, 6]]), runner("x", [[1, 3], [4, 5, 6]])],
                            rounds=2)
    assert [r.identical_to_ar for r in results] == [True, False]
    assert results[1].departures_from_ar == [1, None]
    row = results[1].to_json(results[0])
    assert report.identical_cell(row) == "False (1/2 prompts, first at 1)"
    assert report.identical_cell(results[0].to_json()) == "True"
    assert calls == [("warmup", "ar"), ("warmup", "x"), ("round", "ar"), ("round", "x"),
                     ("round", "ar"), ("round", "x")]
    assert results[0].tokens_per_second == 2.0


def test_first_departure():
    assert suite.first_departure([1, 2, 3], [1, 2, 3]) is None
    assert suite.first_departure([1, 2, 3], [1, 9, 3]) == 1
    assert suite.first_departure([1, 2], [1, 2, 3]) == 2


def test_prompts_are_skipped_not_cut():
    from hispec_jax.models.presets import byte_tokenizer

    tok = byte_tokenizer()
    prompts = prompts_lib.load_prompts("humaneval", tok, 2, 400)
    assert all(len(p) <= 400 for p in prompts) and len(prompts) == 2
    texts = prompts_lib.dataset_texts("humaneval")
    assert tok.decode(prompts[0], skip_special_tokens=True) in texts
    with pytest.raises(ValueError, match="humaneval has only"):
        prompts_lib.load_prompts("humaneval", tok, 3, 10)


@pytest.mark.parametrize("args, message", [
    (["--datasets", "wiki"], "datasets: 'wiki'"),
    (["--draft-exits", "9"], "draft_exit=9"),
    (["--tuned", "1,2"], "--tuned takes"),
    (["--rounds", "0"], "rounds must be"),
])
def test_bad_bench_arguments_fail_before_compiling(byte_model_dir, capsys, args, message):
    from hispec_jax.decoding import engine as engine_lib

    before = engine_lib.compilations
    assert main(["bench", "--model", str(byte_model_dir), "--no-progress", *args]) == 2
    assert message in capsys.readouterr().err
    assert engine_lib.compilations == before


@pytest.mark.parametrize("argv, expected", [
    (["--quick"], dict(num_prompts=2, max_new_tokens=8, rounds=1, draft_lens=(2,),
                       batch_sizes=(1, 2))),
    (["--quick", "--batch-sizes", "2", "--rounds", "2", "--prompts", "3"],
     dict(num_prompts=3, max_new_tokens=8, rounds=2, batch_sizes=(2,))),
    ([], dict(num_prompts=8, max_new_tokens=64, rounds=3, draft_lens=(2, 4),
              batch_sizes=(1, 4, 16))),
    (["--batch-sizes", "none", "--draft-lens", "3"], dict(batch_sizes=(), draft_lens=(3,))),
])
def test_quick_sets_only_the_flags_left_out(monkeypatch, argv, expected):
    from hispec_jax.bench import run

    seen = {}

    def fake_run_bench(config):
        seen["config"] = config
        return {"methods": {}, "peers": {}, "batch": None, "plots": []}

    monkeypatch.setattr(run, "run_bench", fake_run_bench)
    assert main(["bench", "--no-progress", *argv]) == 0
    for name, value in expected.items():
        assert getattr(seen["config"], name) == value, name


def test_a_bench_stopped_after_a_phase_keeps_the_phases_it_finished(byte_model_dir, tmp_path,
                                                                     monkeypatch):
    """report.json is written after every phase: a run killed in the batch phase (a lent
    GPU's time limit) leaves the methods it measured, marked incomplete."""
    from hispec_jax.bench import run as run_lib

    def methods(self, tuned):
        self.report["methods"]["sharegpt"] = [{"name": "ar", "tokens_per_second": 1.0}]

    def batch_sizes(self):
        raise KeyboardInterrupt  # what `timeout --signal=INT` delivers

    monkeypatch.setattr(run_lib.Bench, "methods", methods)
    monkeypatch.setattr(run_lib.Bench, "batch_sizes", batch_sizes)
    config = run_lib.BenchConfig(model_dir=str(byte_model_dir), datasets=("sharegpt",),
                                 out_dir=str(tmp_path), agreement=False, grid_exits=(),
                                 transformers=False, sv_specbound=False, progress=False)
    with pytest.raises(KeyboardInterrupt):
        run_lib.Bench(config).run()
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["complete"] is False
    assert saved["methods"] == {"sharegpt": [{"name": "ar", "tokens_per_second": 1.0}]}
    assert not (tmp_path / "report.md").exists()
