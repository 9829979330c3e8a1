"""`hispec chat`: a multi-turn conversation on the terminal, streamed as it is decoded.

    ⠋ compiling the decode loop                                 (while it starts, stderr)
    ready: compiled 9 programs in 21.4 s
    > Hello
    Hi! How can I help?
    [hispec] 9 tokens, 41.2 tokens/s decoding, first token 0.05 s    (on stderr)
    > /reset                                                    (forget the conversation)
    > /quit                                                     (or end of input)

Each answer is `generate_stream` of the whole conversation so far (the chat template, or a
plain transcript when the model has none: `prompts.py`) with one fixed cache capacity, so
the programs do not depend on the conversation's length except for the prefill's prompt
bucket. Before the first prompt the loop compiles what the first answer runs
(`stream.warm_up_stream`: the decoding state, the prefill of prompts up to
`WARMUP_PROMPT_BLOCKS[-1]` tokens, the decode loop), saying so on one progress line; a
longer conversation compiles its bucket's prefill once, when it gets there. The speed after
an answer is the decode loop's (tokens after the first over the time after the first),
with the time to the first token beside it.
"""

from __future__ import annotations

import sys
import threading
import time

from hispec_jax.serving import prompts as prompts_lib
from hispec_jax.serving.slots import prompt_block
from hispec_jax.serving.stream import generate_stream, prompt_length, warm_up_stream

COMMANDS = ("/reset", "/quit")
# Prompt buckets compiled before the first prompt: a first question with its template fits.
WARMUP_PROMPT_BLOCKS = (16, 32)
WARMUP_QUESTION = "Hello"
NEXT_TURN_TOKENS = 32  # the next question is assumed to add at most this many tokens


class StartupProgress:
    """One line on `stream` saying what `hispec chat` does while it starts: a rich spinner
    on a terminal, a plain line per step otherwise."""

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
            self._status = self.console.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def done(self, text: str | None = None) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        if text:
            print(f"{text} in {time.perf_counter() - self.t0:.1f} s", file=self.stream,
                  flush=True)


def warm_up(model, *, method, capacity: int, history: list[dict], max_new_tokens: int,
            progress: StartupProgress, **options) -> int:
    """Compiles what the first answer runs (`warm_up_stream` on a dummy turn of the
    conversation, for prompts up to `WARMUP_PROMPT_BLOCKS[-1]` tokens); returns the
    compilations."""
    prompt, chat = prompts_lib.conversation_prompt(
        model, history + [{"role": "user", "content": WARMUP_QUESTION}])
    return warm_up_stream(model, prompt, prompt_blocks=WARMUP_PROMPT_BLOCKS,
                          on_phase=progress.update, method=method,
                          max_new_tokens=max_new_tokens, max_cache_len=capacity, chat=chat,
                          **options)


class _CompileAhead:
    """While the user types, compiles the prefill of the bucket the next turn's prompt
    lands in (the conversation so far plus up to `NEXT_TURN_TOKENS`), on a thread that
    the next answer waits for: JAX never runs on two threads at once here."""

    def __init__(self, model, capacity: int, warmed, **stream_options):
        self.model, self.capacity, self.options = model, capacity, stream_options
        self.warmed = set(warmed)
        self.thread: threading.Thread | None = None

    def start(self, history: list[dict]) -> None:
        model = self.model
        prompt, chat = prompts_lib.conversation_prompt(model, history)
        try:
            n = prompt_length(model, prompt, chat)
        except ValueError:
            return
        blocks = sorted({prompt_block(m, self.capacity)
                         for m in range(n + 1, min(n + NEXT_TURN_TOKENS, self.capacity) + 1)}
                        - self.warmed)
        if not blocks:
            return
        self.warmed.update(blocks)

        def run():
            try:
                warm_up_stream(model, prompt, prompt_blocks=tuple(blocks), chat=chat,
                               max_cache_len=self.capacity, **self.options)
            except Exception:  # noqa: BLE001 - the answer then compiles its own prefill
                pass

        self.thread = threading.Thread(target=run, name="hispec-chat-compile", daemon=True)
        self.thread.start()

    def wait(self) -> float:
        """Waits for the compilation (if any); returns the seconds waited."""
        t0 = time.perf_counter()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        return time.perf_counter() - t0


def chat_loop(model, *, method="ar", max_new_tokens: int = 256, max_cache_len: int | None = None,
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
    ahead = _CompileAhead(model, capacity, WARMUP_PROMPT_BLOCKS if warmup else (),
                          method=method, max_new_tokens=max_new_tokens, **options)
    try:
        return _converse(model, history, system, capacity, max_new_tokens, method, options,
                         ahead if warmup else None, stdin, stdout, stderr)
    finally:
        ahead.wait()  # never leave a compilation running at exit


def _converse(model, history, system, capacity, max_new_tokens, method, options, ahead,
              stdin, stdout, stderr) -> int:
    interactive = stdin.isatty()
    while True:
        if interactive:
            stdout.write("> ")
            stdout.flush()
        line = stdin.readline()
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
        waited = ahead.wait() if ahead is not None else 0.0
        try:
            stream = generate_stream(model, prompt, method=method, max_new_tokens=max_new_tokens,
                                     max_cache_len=capacity, chat=chat, **options)
        except ValueError as e:  # the conversation outgrew the cache
            history.pop()
            print(f"error: {e} (/reset starts a new conversation)", file=stdout, flush=True)
            continue
        for delta in stream:
            stdout.write(delta)
            stdout.flush()
        stdout.write("\n")
        stdout.flush()
        answer = stream.result.texts[0]
        history.append({"role": "assistant", "content": answer.strip()})
        stats = stream.result.stats
        ttft, decode = stats["time_to_first_token"], stats["decode_tokens_per_second"]
        print(f"[{stats['method']}] {stats['new_tokens']} tokens"
              + (f", {decode:.1f} tokens/s decoding" if decode is not None else "")
              + (f", first token {ttft:.2f} s" if ttft is not None else "")
              + (f" (after {waited:.1f} s compiling this prompt's prefill)"
                 if waited >= 0.05 else "")
              + (f", compiled {stats['compile_count']} programs" if stats["compile_count"] else ""),
              file=stderr, flush=True)
        if ahead is not None:
            ahead.start(history)
