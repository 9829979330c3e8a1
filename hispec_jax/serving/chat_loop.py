"""`hispec chat`: a multi-turn conversation on the terminal, streamed as it is decoded.

    > Hello
    Hi! How can I help?
    [hispec] 9 tokens, 41.2 tokens/s, first token 0.05 s        (on stderr)
    > /reset                                                    (forget the conversation)
    > /quit                                                     (or end of input)

Each answer is `generate_stream` of the whole conversation so far (the chat template, or a
plain transcript when the model has none: `prompts.py`) with one fixed cache capacity, so
the loop compiles once, at the first answer.
"""

from __future__ import annotations

import sys

from hispec_jax.serving import prompts as prompts_lib
from hispec_jax.serving.stream import generate_stream

COMMANDS = ("/reset", "/quit")


def chat_loop(model, *, method="ar", max_new_tokens: int = 256, max_cache_len: int | None = None,
              system: str | None = None, stdin=None, stdout=None, stderr=None,
              **options) -> int:
    """Reads user turns from `stdin` until /quit or end of input; streams every answer to
    `stdout`; prints the method and speed of each answer on `stderr`. `options`:
    `generate_stream`'s (temperature, top_k, top_p, seed, method options).

    Returns the exit code (0)."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    capacity = max_cache_len or model.cfg.max_position_embeddings
    interactive = stdin.isatty()
    history: list[dict] = [{"role": "system", "content": system}] if system else []
    if not prompts_lib.has_chat_template(model):
        print("(the model has no chat template: turns are written as a plain transcript)",
              file=stderr)
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
        ttft = stats["time_to_first_token"]
        print(f"[{stats['method']}] {stats['new_tokens']} tokens, "
              f"{stats['tokens_per_second']:.1f} tokens/s"
              + (f", first token {ttft:.2f} s" if ttft is not None else "")
              + (f", compiled {stats['compile_count']} programs" if stats["compile_count"] else ""),
              file=stderr, flush=True)
