"""No user error ends in a traceback anywhere in the `hispec` command: for bad input to every
subcommand (and every benchmark tool), exit status 2 and one line on stderr that names the
problem. Run in-process (`main([...])`, fast), plus a few cases as real processes."""

import subprocess
import sys

import pytest

import hispec_jax
from hispec_jax import cli
from hispec_jax.bench import tools

DEFAULT = hispec_jax.DEFAULT_MODEL_DIR


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """A file where a directory is expected, a non-GGUF .gguf, an empty directory."""
    root = tmp_path_factory.mktemp("bad")
    (root / "file").write_text("x")
    (root / "bad.gguf").write_text("not a gguf file")
    (root / "empty").mkdir()
    (root / "badjson").mkdir()
    (root / "badjson" / "config.json").write_text("{bad")
    (root / "blank.txt").write_text("\n  \n")
    (root / "badline.txt").write_text('first\n"unterminated\n')
    return root


# (argv with {tmp} for the fixture's directory, text the one-line message must contain)
CASES = [
    # generate
    ("generate --model {tmp}/none x", "--model {tmp}/none: no such directory"),
    ("generate --model {tmp}/empty x", "has no config.json"),
    ("generate --model {tmp}/badjson x", "config.json is not readable JSON"),
    ("generate --model {tmp}/bad.gguf x", "not a readable GGUF file"),
    ("generate --max-new-tokens 0 x", "--max-new-tokens 0: must be an integer >= 1"),
    ("generate --top-p 2 x", "--top-p 2.0: must be in (0, 1]"),
    ("generate --mesh data=x x", "--mesh data=x: size of 'data'"),
    ("generate --method exit x", "--exit-layer: method 'exit' needs it"),
    ("generate --method sv --sv-profile {tmp}/none.json x", "--sv-profile {tmp}/none.json: no such"),
    ("generate --verify-exits a,b --method hispec x", "expected comma-separated integers"),
    ("generate --method nope x", "invalid choice: 'nope'"),
    ("generate ' '", "PROMPT 1 is empty"),
    ("generate --dtype float16 x", "argument --dtype: invalid choice: 'float16'"),
    # serving
    ("chat --max-new-tokens 0", "--max-new-tokens 0: must be an integer >= 1"),
    ("chat --model {tmp}/none", "--model {tmp}/none: no such directory"),
    ("chat --model {tmp}/bad.gguf", "not a readable GGUF file"),
    ("serve --model {tmp}/bad.gguf", "not a readable GGUF file"),
    ("serve --quantize int4", "argument --quantize: invalid choice: 'int4'"),
    ("serve --port 70000", "--port 70000: must be in [0, 65535]"),
    ("serve --slots 0", "--slots 0: must be an integer >= 1"),
    ("serve --prefill-chunk 0", "--prefill-chunk 0: must be an integer >= 1"),
    ("serve --store-tokens 1", "--store-tokens 1: must be an integer in [2, 16777216]"),
    ("serve --store-tokens 16777217", "--store-tokens 16777217: must be an integer in [2, "),
    ("serve --prefill-share -1", "--prefill-share -1.0: must be a number in [0, 100]"),
    ("serve --prefill-share nan", "--prefill-share nan: must be a number in [0, 100]"),
    ("serve --step-log {tmp}/none/steps.jsonl",
     "--step-log {tmp}/none/steps.jsonl: no such file or directory"),
    ("serve --prefill-chunk 96 --max-cache-len 64",
     "--prefill-chunk 96: must be at most --max-cache-len 64"),
    ("serve --method ar --draft-len 2", "--draft-len 2: method 'ar' does not take it"),
    ("serve --lookup 0", "--lookup 0: must be an integer in [1, 64]"),
    ("chat --method lookup --max-ngram 99", "--max-ngram 99: must be an integer in [1, 16]"),
    ("serve --method ar --lookup 4", "--lookup 4: only methods lookup, layerskip, hispec"),
    ("serve --method ar --no-lookup-gate", "--no-lookup-gate: needs a lookup drafter"),
    ("chat --method lookup --exit-gate", "--exit-gate: only methods layerskip, hispec"),
    ("generate --method hispec --lookup 4 --exit-gate x", "--exit-gate: only methods"),
    ("generate --method ar --cross-request x", "--cross-request: needs prompt lookup"),
    ("generate --method lookup --cross-request --stream x",
     "--cross-request drafts from earlier batches; it does not combine with --stream"),
    ("generate --method ar", "no prompt: give PROMPT arguments or --prompts-file PATH"),
    ("generate --method ar --prompts-file {tmp}/none.txt", "--prompts-file {tmp}/none.txt: "
     "cannot read it"),
    ("generate --method ar --prompts-file {tmp}/blank.txt", "no prompt in it"),
    ("generate --method ar --prompts-file {tmp}/badline.txt", "line 2: not a JSON string"),
    # models
    ("convert {tmp}/none.gguf {tmp}/out", "no such GGUF file"),
    ("convert {tmp}/bad.gguf {tmp}/out", "not a readable GGUF file"),
    ("pull nosuchmodel", "unknown model 'nosuchmodel'"),
    ("pull", "give a model NAME"),
    ("init-model {tmp}/m --config nosuchpreset", "'nosuchpreset' is neither a file nor a preset"),
    ("init-model {tmp}/m --config.bogus=1", "config has no key 'bogus'"),
    ("init-model {tmp}/m --config.num_layers=abc", "cannot parse 'abc' as int"),
    ("init-model {tmp}/m --bogus", "unrecognized argument '--bogus'"),
    ("init-model {tmp}/file --config.num_layers=1 --config.hidden_size=8 "
     "--config.intermediate_size=8 --config.num_heads=1 --config.num_kv_heads=1 "
     "--config.head_dim=8", "File exists: {tmp}/file"),
    # training
    ("pretrain --config {tmp}/none.py", "pretrain config '{tmp}/none.py' is not a file"),
    ("pretrain --small --config.bogus_key=1", "config has no key 'bogus_key'"),
    ("train-heads --config nosuchconfig", "'nosuchconfig' is neither a file nor a config name"),
    ("train-heads --config.bogus=1", "train config has no key 'bogus'"),
    ("draft-vocab --model {tmp}/none --size 10 --exits 1 --out {tmp}/dv", "no such directory"),
    ("draft-vocab --model {default} --size 0 --exits 1 --out {tmp}/dv", "--size must be >= 1"),
    ("draft-vocab --model {default} --size 9 --exits 99 --out {tmp}/dv", "--exits 99: must be in"),
    ("draft-vocab --size 9", "required: --model"),
    # memory
    ("plan-memory --config nosuchpreset", "'nosuchpreset' is neither a file nor a preset"),
    ("plan-memory --config tiny --batch-size 0", "--batch-size 0: must be an integer >= 1"),
    ("plan-memory --config tiny --prompt-len 64 --max-len 64", "must be below --max-len 64"),
    # bench
    ("bench --model {tmp}/none", "--model {tmp}/none: no such directory"),
    ("bench --tuned 1,2", "--tuned takes Ld,Li,Nd,Ni"),
    ("bench --auto", "--auto is a --tasks flag: give --tasks too"),
    ("bench --lookup 4", "--lookup is a --tasks flag: give --tasks too"),
    ("bench --stop-at-eos", "--stop-at-eos is a --tasks flag: give --tasks too"),
    ("bench --tasks extract --auto --stop-at-eos", "--stop-at-eos with --auto: auto's tune"),
    ("bench --tasks chat --auto --auto-prompts 0", "--auto-prompts 0: must be >= 1"),
    ("bench --tasks chat --lookup 99", "--lookup 99: must be an integer in [1, 64]"),
    ("bench --tasks chat --auto-verify", "--auto-verify chooses auto's plan: give --auto too"),
    ("bench --tasks chat --auto --auto-choose prediction", "unrecognized arguments: --auto-choose"),
    ("bench --batch-sizes x", "--batch-sizes: expected comma-separated integers"),
    ("bench --mesh model=0", "--mesh model=0"),
    ("bench --oracle --shapes tiny", "the oracle benchmark is `hispec bench-tool oracle`"),
    ("bench-oracle --shapes tiny", "the oracle benchmark is `hispec bench-tool oracle`"),
    ("bench-tool nosuchtool", "unknown tool 'nosuchtool'"),
    # planner
    ("tune --model {tmp}/none", "--model {tmp}/none: no such directory"),
    ("tune --batch-size 0", "--batch-size must be >= 1"),
    ("tune --max-levels 9", "invalid choice: 9"),
    ("tune --task poems", "--task poems: expected one of chat, summarize, extract, code"),
    ("tune --chat", "--chat renders --task prompts; give --task too"),
    ("tune --choose prediction", "unrecognized arguments: --choose"),
    ("profile-sv --model {tmp}/none", "no such directory"),
    ("profile-sv --draft-exit 0", "--draft-exit 0: must be in [1, 23]"),
    ("profile-sv --prompts 0", "prompts must be an integer >= 1"),
    # doctor
    ("doctor --bogus", "unrecognized arguments: --bogus"),
    # no command
    ("nosuchcommand", "invalid choice: 'nosuchcommand'"),
    ("", "required: COMMAND"),
]

# A flag every tool rejects before doing anything (after its required arguments).
REQUIRED: dict[str, str] = {}
TOOL_CASES = [(f"bench-tool {tool} {REQUIRED.get(tool, '')} --no-such-flag",
               "unrecognized arguments: --no-such-flag") for tool in tools.TOOLS]


def argv_of(text: str, tmp) -> list[str]:
    import shlex

    return shlex.split(text.format(tmp=tmp, default=DEFAULT))


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    return code, capsys.readouterr().err


def assert_one_line_error(code, err, expected):
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0], err
    assert expected in lines[0], err


@pytest.mark.parametrize("argv, expected", CASES + TOOL_CASES,
                         ids=[c[0][:60] for c in CASES + TOOL_CASES])
def test_bad_input_is_one_line_and_exit_2(argv, expected, paths, capsys):
    code, err = run_main(argv_of(argv, paths), capsys)
    assert_one_line_error(code, err, expected.format(tmp=paths))


def test_the_table_covers_every_subcommand():
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    covered = {c[0].split()[0] for c in CASES if c[0]}
    assert set(sub.choices) <= covered, set(sub.choices) - covered


@pytest.mark.parametrize("argv, expected", [
    ("generate --model {tmp}/none x", "--model {tmp}/none: no such directory"),
    ("init-model {tmp}/file --config.num_layers=1", "File exists: {tmp}/file"),
    ("nosuchcommand", "invalid choice: 'nosuchcommand'"),
])
def test_as_a_process(argv, expected, paths):
    run = subprocess.run([sys.executable, "-m", "hispec_jax.cli", *argv_of(argv, paths)],
                         capture_output=True, text=True, timeout=300)
    assert_one_line_error(run.returncode, run.stderr, expected.format(tmp=paths))
    assert run.stdout == ""
