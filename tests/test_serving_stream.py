"""Streaming text (serving/stream.py), `hispec generate --stream` and `hispec chat` fed from
stdin, on the shipped default model. Detokenization alone: test_serving_detok.py."""

from __future__ import annotations

import io

import pytest

import hispec_jax
from hispec_jax import cli
from hispec_jax.serving import prompts as prompts_lib
from hispec_jax.serving import stream as stream_lib

from conftest import shipped_model_scanned


@pytest.fixture(scope="module")
def model():
    return shipped_model_scanned()


@pytest.fixture(scope="module")
def cli_model():
    """The shipped model as the CLI loads it (the platform's default layout): the CLI's
    text is compared with generate's on the same program."""
    return hispec_jax.load_model(hispec_jax.DEFAULT_MODEL_DIR)


@pytest.mark.parametrize("method", ["hispec"])  # ar: test_cli_generate_stream_...
def test_generate_stream_is_generate(model, method):
    stream = hispec_jax.generate_stream(model, "Once upon a time", method=method,
                                        max_new_tokens=12)
    pieces = list(stream)
    want = hispec_jax.generate(model, "Once upon a time", method=method, max_new_tokens=12)
    assert len(pieces) > 1
    assert "".join(pieces) == want.texts[0]
    assert stream.result.token_ids == want.token_ids
    assert stream.result.stats["new_tokens"] == 12 and stream.result.stats["method"] == method


def test_after_warm_up_stream_a_stream_compiles_nothing(model):
    """`warm_up_stream` compiles what a stream with those arguments runs (a fixed cache
    capacity: the slot engine's fixed set of programs, whatever the prompt's length); the
    stream then matches generate."""
    kw = dict(method="lookup", max_new_tokens=8, max_cache_len=96)
    compiled = stream_lib.warm_up_stream(model, "x", **kw)
    assert compiled > 0
    stream = hispec_jax.generate_stream(model, "The cat sat on the mat. The cat", **kw)
    text = "".join(stream)
    stats = stream.result.stats
    assert stats["compile_count"] == 0
    assert text == hispec_jax.generate(model, "The cat sat on the mat. The cat", **kw).texts[0]
    assert stats["decode_tokens_per_second"] > 0 and stats["time_to_first_token"] > 0


def test_generate_stream_checks_its_arguments_before_decoding(model):
    with pytest.raises(ValueError, match="max_new_tokens"):
        hispec_jax.generate_stream(model, "x", method="ar", max_new_tokens=0)
    with pytest.raises(ValueError, match="one prompt"):
        hispec_jax.generate_stream(model, ["a", "b"], method="ar")
    with pytest.raises(ValueError, match="temperature"):
        hispec_jax.generate_stream(model, "x", method="ar", temperature=-1.0)
    with pytest.raises(ValueError, match="chat template"):
        hispec_jax.generate_stream(model, "x", method="ar", chat=True)


def test_cli_generate_stream_prints_the_generated_text(cli_model, capsys):
    assert cli.main(["generate", "--stream", "--max-new-tokens", "12", "Once upon a time"]) == 0
    out, err = capsys.readouterr()
    want = hispec_jax.generate(cli_model, "Once upon a time", method="ar",
                               max_new_tokens=12).texts[0]
    assert out == "Once upon a time" + want + "\n\n"  # the default plan's text is AR's
    assert err.startswith("plan: hispec (the model's recommended plan")
    assert "[hispec] default_model: 12 tokens" in err


@pytest.mark.parametrize("argv,message", [
    (["generate", "--stream", "--json", "x"], "--json"),
    (["generate", "--stream", "--batch-size", "2", "x"], "--batch-size"),
    (["chat", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["chat", "--method", "ar", "--draft-len", "2"], "draft"),
    (["serve", "--port", "-1"], "--port"),
    (["serve", "--slots", "0"], "--slots"),
    (["serve", "--mesh", "data=2", "--slots", "3"], "--slots 3: must be a multiple of"),
    (["serve", "--mesh", "data=two"], "--mesh"),
    (["chat", "--mesh", "model=0"], "--mesh"),
    (["serve", "--model", "/no/such/dir"], "--model"),
])
def test_cli_serving_flags_fail_with_one_line(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hispec: error: ") and message in err and err.count("\n") == 1


def test_cli_chat_from_stdin(cli_model, monkeypatch, capsys):
    """Two turns, a /reset, an unknown command, /quit; each answer is the continuation of
    the whole conversation so far (the transcript, this model has no chat template)."""
    monkeypatch.setattr("sys.stdin", io.StringIO(
        "Hello\nWhat is a cat?\n/bogus\n/reset\nHello\n/quit\nnot read\n"))
    assert cli.main(["chat", "--method", "layerskip", "--max-new-tokens", "6",
                     "--max-cache-len", "128"]) == 0
    out, err = capsys.readouterr()

    def answer(history):
        prompt, chat = prompts_lib.conversation_prompt(cli_model, history)
        return hispec_jax.generate(cli_model, prompt, method="ar",
                                   max_new_tokens=6, chat=chat).texts[0]

    first = answer([{"role": "user", "content": "Hello"}])
    second = answer([{"role": "user", "content": "Hello"},
                     {"role": "assistant", "content": first.strip()},
                     {"role": "user", "content": "What is a cat?"}])
    assert out == (f"{first}\n{second}\nunknown command /bogus (commands: /reset, /quit)\n"
                   f"(conversation reset)\n{first}\n")
    assert err.count("[layerskip] 6 tokens") == 3 and "tokens/s decoding" in err
    # compiled while it started, whatever the conversation's length: no answer compiles
    # anything
    assert err.startswith("plan: layerskip (--method given)\nloading the shipped model...\n")
    assert "compiling the prefill and the decode loop...\n" in err
    assert "compiling the prefill and the decode loop: 5 of 5 programs ready...\n" in err
    assert "ready: compiled " in err
    answers = [line for line in err.splitlines() if line.startswith("[layerskip]")]
    assert len(answers) == 3 and not any("compiled" in line for line in answers)


def test_cli_chat_without_a_method_runs_the_default_plan(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert cli.main(["chat", "--no-warmup"]) == 0
    assert capsys.readouterr().err.startswith(
        "plan: hispec (the model's recommended plan (recommended_plan.json): hispec exits "
        "4,12,24, windows 3,6)\n")


def test_chat_startup_progress_counts_the_seconds_of_a_step_on_a_terminal():
    """A long compile still changes the line: the spinner's text carries the step's
    seconds so far (on a terminal; a pipe gets one plain line per step)."""
    import io
    import time

    from rich.console import Console

    from hispec_jax.serving.chat_loop import StartupProgress

    buffer = io.StringIO()
    progress = StartupProgress(buffer)
    progress.console = Console(file=buffer, force_terminal=True, width=80)
    progress.update("compiling the decode loop")
    time.sleep(1.3)
    progress.done("ready")
    screen = buffer.getvalue()
    assert "compiling the decode loop (0 s)" in screen
    assert "compiling the decode loop (1 s)" in screen and "ready in " in screen

    piped = io.StringIO()
    plain = StartupProgress(piped)
    plain.update("compiling the prefill")
    assert piped.getvalue() == "compiling the prefill...\n"


class _CtrlC:
    """A terminal where the user presses Ctrl-C: `readline` at the prompt (once, first) and
    `write` of the first answer's first text raise KeyboardInterrupt."""

    def __init__(self, lines):
        self.lines, self.out, self.interrupted = ["^C"] + lines, io.StringIO(), False

    def isatty(self):
        return False

    def readline(self):
        line = self.lines.pop(0) if self.lines else ""
        if line == "^C":
            raise KeyboardInterrupt
        return line

    def write(self, text):
        if text.strip() and not self.interrupted and not text.startswith("\n("):
            self.interrupted = True
            raise KeyboardInterrupt
        return self.out.write(text)

    def flush(self):
        pass


def test_chat_ctrl_c_stops_the_answer_and_returns_to_the_prompt(cli_model):
    """Ctrl-C at the prompt says how to leave; during an answer it stops that answer (the
    next turn is answered as usual); end of input leaves with 0."""
    from hispec_jax.serving.chat_loop import chat_loop

    term, err = _CtrlC(["Hello\n", "Hello\n"]), io.StringIO()
    assert chat_loop(cli_model, method="ar", max_new_tokens=6, max_cache_len=128, stdin=term,
                     stdout=term, stderr=err, warmup=False) == 0
    assert term.out.getvalue().startswith("\n(/quit or Ctrl-D leaves)\n\n")
    assert err.getvalue().splitlines()[-2:][0] == "[stopped]"
    assert err.getvalue().splitlines()[-1].startswith("[ar] 6 tokens")
