"""The `hispec` command line: in-process through `cli.main`, and once as the installed script."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hispec_jax
from hispec_jax import cli, load_model

PROMPTS = ["the cat", "a dog ran"]
STATS_KEYS = ("tokens_per_second", "compile_seconds", "compile_count", "decode_seconds",
              "new_tokens")


@pytest.fixture(scope="module")
def model_dir(hf_models):
    return str(hf_models["llama3"][1])


@pytest.fixture(scope="module")
def api_result(model_dir):
    return hispec_jax.generate(load_model(model_dir), PROMPTS, max_new_tokens=8, ignore_eos=True)


def run_json(capsys, *args):
    code = cli.main(["generate", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = [line for line in captured.out.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one JSON line, got {captured.out!r}"
    return json.loads(lines[0])


def test_json_output(capsys, model_dir, api_result):
    data = run_json(capsys, "--model", model_dir, "--json", "--max-new-tokens", "8",
                    "--ignore-eos", *PROMPTS)
    assert set(data) == {"outputs", "stats"}
    assert [o["prompt"] for o in data["outputs"]] == PROMPTS
    for o in data["outputs"]:
        assert set(o) == {"prompt", "token_ids", "text"}
    assert [o["token_ids"] for o in data["outputs"]] == api_result.token_ids
    assert [o["text"] for o in data["outputs"]] == api_result.texts
    for key in STATS_KEYS:
        assert key in data["stats"], key
    assert data["stats"]["new_tokens"] == 16


def test_batch_size_1_same_outputs(capsys, model_dir, api_result):
    data = run_json(capsys, "--model", model_dir, "--json", "--max-new-tokens", "8",
                    "--ignore-eos", "--batch-size", "1", *PROMPTS)
    assert [o["token_ids"] for o in data["outputs"]] == api_result.token_ids
    assert data["stats"]["batches"] == 2


def test_exit_method(capsys, model_dir):
    data = run_json(capsys, "--model", model_dir, "--json", "--max-new-tokens", "8",
                    "--ignore-eos", "--method", "exit", "--exit-layer", "2", *PROMPTS)
    expected = hispec_jax.generate(load_model(model_dir), PROMPTS, method="exit", exit_layer=2,
                                   max_new_tokens=8, ignore_eos=True)
    assert [o["token_ids"] for o in data["outputs"]] == expected.token_ids
    assert data["stats"]["exits"] == [2]


def test_plain_text_output(capsys, model_dir, api_result):
    code = cli.main(["generate", "--model", model_dir, "--max-new-tokens", "8", "--ignore-eos",
                     *PROMPTS])
    captured = capsys.readouterr()
    assert code == 0
    for p, text in zip(PROMPTS, api_result.texts):
        assert f"{p}{text}" in captured.out
    assert "tokens/s" in captured.err


def test_bad_exit_layer_is_a_usage_error(capsys, model_dir):
    code = cli.main(["generate", "--model", model_dir, "--method", "exit", "--exit-layer", "99",
                     "the cat"])
    captured = capsys.readouterr()
    assert code == 2
    assert "exit_layer" in captured.err
    assert captured.out == ""


def test_unknown_choice_is_an_argparse_error(capsys, model_dir):
    with pytest.raises(SystemExit) as info:
        cli.main(["generate", "--model", model_dir, "--method", "nope", "the cat"])
    assert info.value.code == 2
    assert "--method" in capsys.readouterr().err


def test_installed_console_script(model_dir, api_result):
    script = Path(sys.executable).parent / "hispec"
    assert script.exists(), f"console script not installed at {script}"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [str(script), "generate", "--model", model_dir, "--json", "--max-new-tokens", "8",
         "--ignore-eos", *PROMPTS],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [o["token_ids"] for o in data["outputs"]] == api_result.token_ids
    assert data["stats"]["compile_count"] == 1

    bad = subprocess.run(
        [str(script), "generate", "--model", model_dir, "--method", "exit", "--exit-layer", "0",
         "the cat"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2
    assert "exit_layer" in bad.stderr
