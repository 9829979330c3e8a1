"""`hispec generate` rejects bad arguments at once: before importing JAX or reading weights,
with a message naming the flag, the value and what is allowed. Also: help shows defaults,
the summary line names the model, and transformers' "PyTorch was not found" advice is
silenced (the library never needs torch)."""

import argparse
import json
import os
import subprocess
import sys
import textwrap

import pytest

import hispec_jax
from hispec_jax import cli
from hispec_jax.cli import generate as cli_generate
from hispec_jax.decoding import options

PROMPT = "User: hi\nAssistant:"
DEFAULT = hispec_jax.DEFAULT_MODEL_DIR

# (id, argv after "generate", substrings the error must contain)
CASES = [
    ("no_such_dir", ["--model", "/nonexistent/model", PROMPT],
     ["--model /nonexistent/model", "no such directory"]),
    ("no_such_gguf", ["--model", "/nonexistent/x.gguf", PROMPT], ["no such GGUF file"]),
    ("dir_without_config", ["--model", "{tmp}", PROMPT], ["--model", "no config.json"]),
    ("file_not_model", ["--model", "{tmp}/notes.txt", PROMPT],
     ["--model", "not a directory or a .gguf file"]),
    ("empty_prompt", [""], ["PROMPT 1 is empty"]),
    ("blank_second_prompt", [PROMPT, "  "], ["PROMPT 2 is empty"]),
    ("draft_len_zero", ["--method", "hispec", "--draft-len", "0", PROMPT],
     ["--draft-len 0", "integer >= 1"]),
    ("verify_window_negative", ["--method", "hispec", "--verify-window", "-2", PROMPT],
     ["--verify-window -2", "integer >= 1"]),
    ("ar_with_draft_len", ["--method", "ar", "--draft-len", "3", PROMPT],
     ["--draft-len 3", "'ar' does not take it", "layerskip, hispec"]),
    ("ar_with_adaptive", ["--method", "ar", "--adaptive", PROMPT],
     ["--adaptive", "'ar' does not take it"]),
    ("exit_without_layer", ["--method", "exit", PROMPT], ["--exit-layer", "'exit' needs it"]),
    ("lookup_gate_without_lookup", ["--method", "ar", "--no-lookup-gate", PROMPT],
     ["--no-lookup-gate", "needs a lookup drafter"]),
    ("exit_gate_with_lookup", ["--method", "lookup", "--exit-gate", PROMPT],
     ["--exit-gate", "only methods layerskip, hispec"]),
    ("exit_layer_past_top", ["--method", "exit", "--exit-layer", "99", PROMPT],
     ["--exit-layer 99", "[1, 24]", "24 layers"]),
    ("draft_exit_at_top", ["--method", "layerskip", "--draft-exit", "24", PROMPT],
     ["--draft-exit 24", "[1, 23]"]),
    ("exits_not_increasing", ["--method", "hispec", "--draft-exit", "8", "--verify-exits", "6",
                              PROMPT], ["--verify-exits 6", "strictly increasing", "(8)"]),
    ("layerskip_with_verifier", ["--method", "layerskip", "--verify-exits", "6", PROMPT],
     ["--verify-exits 6", "no intermediate verifier"]),
    ("temperature_negative", ["--temperature", "-0.5", PROMPT], ["--temperature -0.5", ">= 0"]),
    ("temperature_nan", ["--temperature", "nan", PROMPT], ["--temperature nan", "finite"]),
    ("top_p_zero", ["--temperature", "1", "--top-p", "0", PROMPT], ["--top-p 0.0", "(0, 1]"]),
    ("top_k_negative", ["--temperature", "1", "--top-k", "-1", PROMPT], ["--top-k -1", ">= 0"]),
    ("max_new_tokens_zero", ["--max-new-tokens", "0", PROMPT],
     ["--max-new-tokens 0", "integer >= 1"]),
    ("batch_size_zero", ["--batch-size", "0", PROMPT], ["--batch-size 0", "integer >= 1"]),
    ("specbound_tau_zero", ["--method", "specbound", "--tau", "0", PROMPT],
     ["--tau 0.0", "(0, 1]"]),
    ("specbound_depth_at_top", ["--method", "specbound", "--depth-bound", "24", PROMPT],
     ["--depth-bound 24", "[1, 23]"]),
    ("specbound_width_zero", ["--method", "specbound", "--width", "0", PROMPT],
     ["--width 0", "integer >= 1"]),
    ("specbound_anneal_negative", ["--method", "specbound", "--anneal", "-1", PROMPT],
     ["--anneal -1.0", ">= 0"]),
    ("specbound_with_draft_exit", ["--method", "specbound", "--draft-exit", "2", PROMPT],
     ["--draft-exit 2", "'specbound'"]),
    ("layerskip_with_tau", ["--method", "layerskip", "--tau", "0.5", PROMPT],
     ["--tau 0.5", "only method 'specbound'"]),
    ("sv_with_verify_window", ["--method", "sv", "--verify-window", "3", PROMPT],
     ["--verify-window 3", "'sv'"]),
    ("sv_blockwise", ["--method", "sv", "--acceptance", "blockwise", PROMPT],
     ["--acceptance blockwise", "token-wise"]),
    # a draft model (`engine/draft_model.py`): its path, its vocabulary, its method
    ("draft_model_missing", ["--draft-model", "/nonexistent/d", PROMPT],
     ["--draft-model /nonexistent/d", "no such directory"]),
    ("draft_model_other_vocabulary", ["--draft-model", "{tmp}/small_vocab", PROMPT],
     ["--draft-model", "its vocabulary has 7 entries, the model's 2048"]),
    ("draft_method_without_model", ["--method", "draft", PROMPT],
     ["--draft-model", "'draft' needs a draft model"]),
    ("draft_k_without_draft_model", ["--method", "ar", "--draft-k", "3", PROMPT],
     ["--draft-k 3", "needs a draft model"]),
    ("draft_model_with_ar", ["--method", "ar", "--draft-model", DEFAULT, PROMPT],
     ["--draft-model", "method 'ar' does not take a draft model"]),
    ("draft_k_zero", ["--draft-model", DEFAULT, "--draft-k", "0", PROMPT],
     ["--draft-k 0", "[1, 32]"]),
    ("draft_k_two_values_one_draft", ["--draft-model", DEFAULT, "--draft-k", "2,4", PROMPT],
     ["--draft-k 2,4", "two values need --smaller-draft-model"]),
    ("smaller_draft_without_draft", ["--smaller-draft-model", DEFAULT, PROMPT],
     ["--smaller-draft-model", "needs --draft-model"]),
    ("smaller_draft_other_vocabulary", ["--draft-model", DEFAULT, "--smaller-draft-model",
                                        "{tmp}/small_vocab", PROMPT],
     ["--smaller-draft-model", "its vocabulary has 7 entries, the model's 2048"]),
    ("smaller_draft_with_lookup", ["--draft-model", DEFAULT, "--smaller-draft-model", DEFAULT,
                                   "--lookup", "4", PROMPT],
     ["--lookup 4", "does not combine with --smaller-draft-model"]),
    # argparse's own errors (unknown choices, non-numbers) are just as early
    ("unknown_method", ["--method", "beam", PROMPT], ["--method", "beam", "choose from"]),
    ("top_k_not_int", ["--top-k", "x", PROMPT], ["--top-k", "'x'"]),
    # --mesh text (the device count needs JAX: test_mesh_needs_the_device_count)
    ("mesh_unknown_axis", ["--mesh", "data=2,batch=4", PROMPT],
     ["--mesh data=2,batch=4", "unknown axis 'batch'", "data, model"]),
    ("mesh_size_zero", ["--mesh", "model=0", PROMPT], ["--mesh model=0", "integer >= 1"]),
    ("mesh_not_axis_size", ["--mesh", "model", PROMPT], ["--mesh model", "not AXIS=SIZE"]),
    ("mesh_axis_twice", ["--mesh", "model=2,model=4", PROMPT], ["'model' is given twice"]),
]

_DRIVER = textwrap.dedent("""
    import contextlib, io, json, sys, time
    from hispec_jax import cli
    results = []
    for argv in json.loads(sys.argv[1]):
        err = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = cli.main(["generate", *argv])
            except SystemExit as e:
                rc = e.code
        results.append({"rc": rc, "err": err.getvalue(), "seconds": time.perf_counter() - t0})
    heavy = sorted(m for m in ("jax", "jaxlib", "numpy", "transformers", "safetensors")
                   if m in sys.modules)
    print(json.dumps({"results": results, "heavy_modules": heavy}))
""")


@pytest.fixture(scope="module")
def rejected(tmp_path_factory):
    """Runs every case in one fresh interpreter; {id: (rc, stderr)} and the heavy modules
    that interpreter ended up importing."""
    tmp = tmp_path_factory.mktemp("no_config")
    (tmp / "notes.txt").write_text("not a model")
    (tmp / "small_vocab").mkdir()
    (tmp / "small_vocab" / "config.json").write_text(json.dumps({"vocab_size": 7}))
    argvs = [[a.replace("{tmp}", str(tmp)) for a in argv] for _, argv, _ in CASES]
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(argvs)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return {c[0]: r for c, r in zip(CASES, data["results"])}, data["heavy_modules"]


@pytest.mark.parametrize("case_id,expected", [(c[0], c[2]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_rejected_with_a_message_naming_flag_and_value(rejected, case_id, expected):
    result = rejected[0][case_id]
    assert result["rc"] == 2, result
    for text in expected:
        assert text in result["err"], (text, result["err"])
    assert result["seconds"] < 2.0, result  # no model, no JAX: milliseconds in practice


def test_nothing_heavy_imported_before_rejecting(rejected):
    assert rejected[1] == [], f"imported {rejected[1]} before rejecting bad arguments"


def test_library_and_cli_share_the_rules():
    """The weight-free rules are those `make_method` / `SamplingParams` apply."""
    from hispec_jax.decoding.acceptance import RULES
    from hispec_jax.decoding.methods import METHODS
    from hispec_jax.decoding.sampling import SamplingParams

    assert tuple(sorted(RULES)) == options.ACCEPTANCE_RULES
    assert METHODS == options.METHODS
    with pytest.raises(options.OptionError) as info:
        SamplingParams(temperature=1.0, top_p=1.5)
    assert (info.value.name, info.value.value) == ("top_p", 1.5)
    with pytest.raises(ValueError, match=r"draft_len must be an integer >= 1, got 0"):
        options.check_method_options("hispec", draft_len=0)


def test_help_shows_defaults_and_every_flag_has_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("default: the model's recommended plan", "(default: 64)", "(default: 0.0)",
                 "(default: 0)",
                 "(default: 1.0)", "sampling temperature", "most likely tokens"):
        assert text in out, text
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, subparser in sub.choices.items():
        for action in subparser._actions:
            assert action.help, f"hispec {name}: {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_default_plan_and_gate_flags_before_loading(command, tmp_path):
    """Without --method, generate, chat and serve take the model's default plan (the shipped
    model's recommended HiSpec plan; lookup for a model without one) before anything is
    loaded, and pass the gate flags on as method options."""
    from hispec_jax.cli import serving

    check = (cli_generate.check_generate_args if command == "generate"
             else lambda a: serving._check(a, sampling=command == "chat"))
    prompt = [PROMPT] if command == "generate" else []
    args = cli.build_parser().parse_args([command, "--exit-gate", *prompt])
    check(args)
    assert args.method == "hispec" and "recommended plan" in args.plan_reason
    assert cli_generate.method_options(args)["exit_gate"] is True
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    args = cli.build_parser().parse_args([command, "--model", str(tmp_path), "--no-lookup-gate",
                                          *prompt])
    check(args)
    assert args.method == "lookup" and "no recommended plan" in args.plan_reason
    assert cli_generate.method_options(args)["lookup_gate"] is False
    args = cli.build_parser().parse_args([command, "--method", "ar", *prompt])
    check(args)
    assert args.method == "ar" and args.plan_reason == "--method given"


def test_summary_line_names_the_model():
    stats = {"method": "hispec", "model": "default_model", "num_layers": 24, "exits": [3, 6, 24],
             "new_tokens": 48, "tokens_per_second": 84.8, "compile_seconds": 8.8}
    assert cli_generate.summary_line(stats) == ("[hispec] default_model (24 layers, exits 3,6,24): "
                                       "48 tokens, 84.8 tokens/s (compile 8.8 s excluded)")


def test_stream_summary_line_separates_first_token_and_decode_speed():
    stats = {"method": "ar", "model": "m", "new_tokens": 11, "seconds": 2.5,
             "time_to_first_token": 2.0, "tokens_per_second": 4.4, "compile_count": 3}
    assert cli_generate.stream_summary_line(stats) == (
        "[ar] m: 11 tokens, first token 2.00 s (3 programs compiled), then 20.0 tokens/s")


def test_no_torch_advice_from_transformers():
    """Without torch, importing hispec_jax and a tokenizer prints nothing on stderr."""
    code = textwrap.dedent("""
        import importlib.util, sys
        real = importlib.util.find_spec
        def find_spec(name, *args, **kwargs):  # torch is not installed, as far as anyone asks
            return None if name.split(".")[0] == "torch" else real(name, *args, **kwargs)
        importlib.util.find_spec = find_spec
        import hispec_jax
        from transformers import AutoTokenizer
        from transformers.utils import is_torch_available
        assert not is_torch_available()
        AutoTokenizer.from_pretrained(hispec_jax.DEFAULT_MODEL_DIR)
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert "PyTorch was not found" not in proc.stderr, proc.stderr


def test_mesh_needs_the_device_count(capsys):
    """Axis sizes that do not multiply to the device count: rejected before any weights are
    read (this process has one CPU device)."""
    assert cli.main(["generate", "--mesh", "data=2,model=4", PROMPT]) == 2
    err = capsys.readouterr().err
    assert "--mesh data=2,model=4: needs 8 devices" in err and "1 cpu device is available" in err


def test_mesh_flag_in_generate_bench_and_plan_memory_help(capsys):
    for command in ("generate", "bench", "plan-memory"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "--mesh data=D,model=M" in out and "multiply to the device count" in out, command
    with pytest.raises(SystemExit):
        cli.main(["plan-memory", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in ("memory_analysis()", "(default: 4096)", "(default: ar)", "(default: scan)"):
        assert text in out, text
