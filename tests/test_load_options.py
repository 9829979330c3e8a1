"""How commands load a model: --dtype / --quantize / --matmul-precision on every command that
loads one (bad values: one line, exit status 2, nothing loaded), the weights' memory on the
startup line (computed from the config, equal to what loading holds), `--model org/name`
through huggingface_hub's cache, and `hispec doctor`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import hispec_jax
from hispec_jax import cli
from hispec_jax.cli import load_options
from hispec_jax.models import weight_memory

HISPEC = "import sys; from hispec_jax.cli import main; sys.exit(main())"  # the `hispec` command
LOADING_COMMANDS = [["generate", "x"], ["chat"], ["serve"], ["bench"], ["tune"], ["profile-sv"],
                    ["plan-memory", "--config", "tiny"]]


def test_the_flag_values_are_the_models_own():
    from hispec_jax.models.config import MATMUL_PRECISIONS
    from hispec_jax.models.params import WEIGHT_QUANTIZATIONS

    assert set(load_options.MATMUL_PRECISIONS) == set(MATMUL_PRECISIONS)
    assert load_options.QUANTIZATIONS == WEIGHT_QUANTIZATIONS
    assert load_options.DTYPES == ("float32", "bfloat16")


@pytest.mark.parametrize("command", LOADING_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("flag,value", [("--dtype", "float16"), ("--quantize", "int4"),
                                        ("--matmul-precision", "tf32")])
def test_bad_load_flags_are_one_line_errors_on_every_command(capsys, monkeypatch, command, flag,
                                                             value):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("hispec_jax.models.model.load_model", no_loading)
    with pytest.raises(SystemExit) as info:
        cli.main([command[0], flag, value, *command[1:]])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"argument {flag}: invalid choice: '{value}'" in err


@pytest.mark.parametrize("command", LOADING_COMMANDS, ids=lambda c: c[0])
def test_every_loading_command_takes_the_flags(command):
    args = cli.build_parser().parse_args([command[0], "--dtype", "bfloat16", "--quantize",
                                          "int8", "--matmul-precision", "high", *command[1:]])
    assert (args.dtype, args.quantize, args.matmul_precision) == ("bfloat16", "int8", "high")
    assert load_options.load_kwargs(args) == {"dtype": "bfloat16", "quantize": "int8",
                                              "layer_layout": "unrolled",
                                              "matmul_precision": "high"}


def test_plan_memory_quantize_needs_the_unrolled_layout(capsys):
    assert cli.main(["plan-memory", "--config", "tiny", "--quantize", "int8"]) == 2
    assert "--quantize int8: needs --layer-layout unrolled" in capsys.readouterr().err


def test_plan_memory_plans_the_int8_weights(capsys):
    plans = {}
    for flags in ([], ["--quantize", "int8"]):
        assert cli.main(["plan-memory", "--config", "tiny", "--layer-layout", "unrolled",
                         "--matmul-precision", "default", "--json", *flags]) == 0
        plans[bool(flags)] = json.loads(capsys.readouterr().out)
    assert plans[True]["description"]["quantize"] == "int8"
    assert plans[False]["description"]["quantize"] is None
    assert plans[True]["weights"] < plans[False]["weights"]


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("quantize", [None, "int8"])
def test_the_memory_stated_before_loading_is_what_loading_holds(dtype, quantize):
    path = hispec_jax.DEFAULT_MODEL_DIR
    stated = weight_memory.describe(path, dtype=dtype, quantize=quantize)
    model = hispec_jax.load_model(path, dtype=dtype, quantize=quantize,
                                  layer_layout="unrolled" if quantize else None)
    assert stated.bytes == weight_memory.array_bytes((model.params, model.heads))
    assert stated.dtype == model.cfg.dtype == (dtype or "float32")
    assert stated.num_layers == model.cfg.num_layers


def test_a_gguf_files_memory_comes_from_its_metadata(tmp_path):
    import gguf_files

    path = gguf_files.tiny_chat_gguf(tmp_path / "tiny.gguf")
    for dtype in (None, "bfloat16"):  # a GGUF file dequantizes to float32 unless told
        stated = weight_memory.describe(path, dtype=dtype)
        model = hispec_jax.load_model(path, dtype=dtype)
        assert stated.bytes == weight_memory.array_bytes((model.params, model.heads))
        assert stated.dtype == (dtype or "float32")


def test_generate_states_the_memory_and_runs_bfloat16_and_int8(capsys, llama_dir):
    for flags, kind in ((["--dtype", "bfloat16"], "bfloat16: weights"),
                        (["--quantize", "int8"], "float32, int8 layer projections: weights")):
        code = cli.main(["generate", "--model", str(llama_dir), "--method", "ar",
                         "--max-new-tokens", "3", "--ignore-eos", "--json", *flags, "the cat"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        first = captured.err.splitlines()[0]
        assert first.startswith(f"model {llama_dir}: 4 layers, ") and kind in first, first
        assert "(matmul precision highest)" in first
        assert len(json.loads(captured.out)["outputs"][0]["token_ids"]) == 3


# ---- --model org/name ----------------------------------------------------------------------

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, llama_dir, monkeypatch):
    """A Hugging Face cache holding `tiny-org/tiny-llama` as huggingface_hub lays it out:
    models--ORG--NAME/refs/main naming the snapshot, snapshots/REV/ with the files; offline,
    so nothing reaches the network."""
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--tiny-org--tiny-llama"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for f in llama_dir.iterdir():
        shutil.copy(f, snapshot / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hub", snapshot


def test_a_hub_id_resolves_to_its_cached_snapshot(hub_cache, capsys, llama_dir):
    from hispec_jax.models import hub

    _, snapshot = hub_cache
    assert hub.resolve("tiny-org/tiny-llama") == str(snapshot)
    assert hub.resolve(str(llama_dir)) == str(llama_dir)  # a local path stays as it is
    outputs = []
    for model in ("tiny-org/tiny-llama", str(llama_dir)):
        code = cli.main(["generate", "--model", model, "--method", "ar", "--max-new-tokens", "4",
                         "--ignore-eos", "--json", "the cat"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        outputs.append(json.loads(captured.out)["outputs"][0]["token_ids"])
    assert outputs[0] == outputs[1]


def test_an_unknown_hub_id_is_a_one_line_error_naming_it(hub_cache, capsys):
    root, _ = hub_cache
    assert cli.main(["generate", "--model", "tiny-org/nothing-here", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--model tiny-org/nothing-here: not a local path, and not in the Hugging Face cache" in err
    assert str(root) in err


def test_a_snapshot_without_config_is_named(hub_cache, capsys):
    _, snapshot = hub_cache
    (snapshot / "config.json").unlink()
    assert cli.main(["serve", "--model", "tiny-org/tiny-llama"]) == 2
    assert f"the snapshot {snapshot} has no config.json" in capsys.readouterr().err


def test_the_installed_command_resolves_offline_without_hanging(tmp_path):
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1",
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", HISPEC, "generate", "--model", "no-org/no-model",
                           "x"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"hispec: error: --model no-org/no-model: not a local path, "
                                   f"and not in the Hugging Face cache ({tmp_path}; "
                                   "HF_HUB_OFFLINE=1, so nothing is downloaded)")


# ---- hispec doctor -------------------------------------------------------------------------

def test_doctor_reports_backend_devices_versions_and_caches(capsys, monkeypatch, tmp_path):
    import jax

    monkeypatch.setenv("HISPEC_CACHE", str(tmp_path))
    assert cli.main(["doctor", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["backend"] == jax.default_backend()
    assert len(info["devices"]) == jax.device_count()
    for name in ("hispec-jax", "jax", "jaxlib", "flax", "transformers"):
        assert name in info["versions"]
    assert info["versions"]["jax"] == jax.__version__
    assert info["hispec_cache"] == str(tmp_path)
    assert cli.main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert f"jax {jax.__version__}" in text and f"backend {jax.default_backend()}:" in text
    assert f"hispec cache: {tmp_path}" in text
