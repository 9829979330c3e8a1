"""`hispec chat`: a multi-turn conversation on the terminal, streamed as it is decoded.

    ⠋ compiling the prefill and the decode loop (3 s)          (while it starts, stderr)
    ready: compiled 9 programs in 21.4 s
    > Hello
    Hi! How can I help?
    [hispec] 9 tokens, 41.2 tokens/s decoding, first token 0.05 s    (on stderr)
    > /reset                                                    (forget the conversation)
    > /quit                                                     (or end of input)

Ctrl-C during an answer stops it and returns to the prompt (the conversation keeps what was
said so far); at the prompt it says how to leave. End of input (Ctrl-D) leaves with code 0.

Each answer is `generate_stream` of the whole conversation so far (the chat template, or a
plain transcript when the model has none: `prompts.py`) with one fixed cache capacity, so
the programs do not depend on the conversation's length: the prompt enters the slot in
fixed-size prefill chunks (`slots.py`). Before the first prompt the loop compiles every
program an answer runs (`stream.warm_up_stream`: the decoding state, the prefill chunks,
finish, the decode loop), saying so on one progress line; no answer compiles anything.
The speed after an answer is the decode loop's (tokens after the first over the time
after the first), with the time to the first token beside it.
"""

from __future__ import annotations

import sys
import time

from hispec_jax.serving import prompts as prompts_lib
from hispec_jax.serving.stream import generate_stream, warm_up_stream

COMMANDS = ("/reset", "/quit")
WARMUP_QUESTION = "Hello"


class _Elapsed:
    """A step's text with the seconds it has taken so far, rendered afresh at every refresh
    of the spinner: a long compile still changes the line every second."""

    def __init__(self, text: str):
        self.text, self.t0 = text, time.perf_counter()

    def __rich__(self) -> str:
        return f"{self.text} ({time.perf_counter() - self.t0:.0f} s)"


class StartupProgress:
    """One line on `stream` saying what `hispec chat` does while it starts: a rich spinner
    with the step's seconds on a terminal, a plain line per step otherwise."""

    def __init__(self, stream):
        from rich.console import Console

        self.console = Console(file=stream, highlight=False)
        self.stream = stream
        self.t0 = time.perf_counter()
        self._status = None

    def update(self, text: str) -> None:
        if not self.console.is_terminal:
            print(f"{text}...", file=self.stream, flush=True)
        elif self._status is None:
            self._status = self.console.status(_Elapsed(text))
            self._status.start()
        else:
            self._status.update(_Elapsed(text))

    def done(self, text: str | None = None) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        if text:
            print(f"{text} in {time.perf_counter() - self.t0:.1f} s", file=self.stream,
                  flush=True)


def warm_up(model, *, method, capacity: int, history: list[dict], max_new_tokens: int,
            progress: StartupProgress, **options) -> int:
    """Compiles what every answer runs (`warm_up_stream` on a dummy turn of the
    conversation); returns the compilations."""
    prompt, chat = prompts_lib.conversation_prompt(
        model, history + [{"role": "user", "content": WARMUP_QUESTION}])
    return warm_up_stream(model, prompt, on_phase=progress.update, method=method,
                          max_new_tokens=max_new_tokens, max_cache_len=capacity, chat=chat,
                          **options)


def chat_loop(model, *, method=None, max_new_tokens: int = 256, max_cache_len: int | None = None,
              system: str | None = None, stdin=None, stdout=None, stderr=None,
              warmup: bool = True, progress: StartupProgress | None = None,
              **options) -> int:
    """Reads user turns from `stdin` until /quit or end of input; streams every answer to
    `stdout`; prints the method and speed of each answer on `stderr`. `options`:
    `generate_stream`'s (temperature, top_k, top_p, seed, method options). With `warmup`,
    compiles what the first answer runs before reading the first turn, on `progress`'s
    line (a new `StartupProgress` on `stderr` when None).

    Returns the exit code (0)."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    capacity = max_cache_len or model.cfg.max_position_embeddings
    history: list[dict] = [{"role": "system", "content": system}] if system else []
    if warmup:
        progress = progress or StartupProgress(stderr)
        compiled = warm_up(model, method=method, capacity=capacity, history=history,
                           max_new_tokens=max_new_tokens, progress=progress, **options)
        progress.done(f"ready: compiled {compiled} programs")
    elif progress is not None:
        progress.done()
    if not prompts_lib.has_chat_template(model):
        print("(the model has no chat template: turns are written as a plain transcript)",
              file=stderr)
    return _converse(model, history, system, capacity, max_new_tokens, method, options,
                     stdin, stdout, stderr)


def _stream_answer(stream, stdout) -> str:
    """Writes the answer's text as it is decoded; returns it. Ctrl-C stops it where it is
    (the stream's `result` stays None) and returns the text so far."""
    text = []
    try:
        for delta in stream:
            text.append(delta)
            stdout.write(delta)
            stdout.flush()
    except KeyboardInterrupt:
        stream.close()
    stdout.write("\n")
    stdout.flush()
    return stream.result.texts[0] if stream.result is not None else "".join(text)


def _converse(model, history, system, capacity, max_new_tokens, method, options,
              stdin, stdout, stderr) -> int:
    interactive = stdin.isatty()
    while True:
        if interactive:
            stdout.write("> ")
            stdout.flush()
        try:
            line = stdin.readline()
        except KeyboardInterrupt:  # Ctrl-C at the prompt: nothing to stop
            print("\n(/quit or Ctrl-D leaves)", file=stdout, flush=True)
            continue
        if not line:  # end of input
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/quit":
            return 0
        if text == "/reset":
            history = history[:1] if system else []
            print("(conversation reset)", file=stdout, flush=True)
            continue
        if text.startswith("/"):
            print(f"unknown command {text.split()[0]} (commands: {', '.join(COMMANDS)})",
                  file=stdout, flush=True)
            continue
        history.append({"role": "user", "content": text})
        prompt, chat = prompts_lib.conversation_prompt(model, history)
        try:
            stream = generate_stream(model, prompt, method=method, max_new_tokens=max_new_tokens,
                                     max_cache_len=capacity, chat=chat, **options)
        except ValueError as e:  # the conversation outgrew the cache
            history.pop()
            print(f"error: {e} (/reset starts a new conversation)", file=stdout, flush=True)
            continue
        answer = _stream_answer(stream, stdout)
        history.append({"role": "assistant", "content": answer.strip()})
        if stream.result is None:  # stopped by Ctrl-C: no stats
            print("[stopped]", file=stderr, flush=True)
            continue
        stats = stream.result.stats
        ttft, decode = stats["time_to_first_token"], stats["decode_tokens_per_second"]
        print(f"[{stats['method']}] {stats['new_tokens']} tokens"
              + (f", {decode:.1f} tokens/s decoding" if decode is not None else "")
              + (f", first token {ttft:.2f} s" if ttft is not None else "")
              + (f", compiled {stats['compile_count']} programs" if stats["compile_count"] else ""),
              file=stderr, flush=True)
