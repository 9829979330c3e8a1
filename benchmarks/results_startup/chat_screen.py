"""What a user of `hispec chat` sees while it starts, timed from the outside: when the first
line appears, the longest wait without a new line before the prompt, when the prompt comes,
and how long after a question its answer's first character appears.

    python benchmarks/results_startup/chat_screen.py --starts 2 [--model PATH] > OUT.txt

Each start is a fresh `hispec chat` process (stdin and stdout pipes: the progress is one
plain line per step on stderr, and its last, "ready: ...", stands for the prompt a terminal
shows). The first start of a machine fills the caches; the later
ones are what a user meets every day. The question is asked once the prompt is shown, and
`/quit` ends the process after the answer.
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import threading
import time

QUESTION = "What is the capital of France?"


def start(model: str | None, timeout: float) -> dict:
    argv = ["hispec", "chat", "--max-new-tokens", "32"] + (["--model", model] if model else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    events: queue.Queue = queue.Queue()

    def pump(stream, name):
        while True:
            chunk = os.read(stream.fileno(), 4096)
            if not chunk:
                break
            events.put((time.perf_counter() - t0, name, chunk.decode(errors="replace")))
        events.put((time.perf_counter() - t0, name, None))

    for stream, name in ((proc.stdout, "out"), (proc.stderr, "err")):
        threading.Thread(target=pump, args=(stream, name), daemon=True).start()
    lines, asked, first_answer, ready = [], None, None, None
    closed = 0
    while closed < 2:
        try:
            t, name, text = events.get(timeout=timeout)
        except queue.Empty:
            proc.kill()
            raise SystemExit(f"no output for {timeout} s: {lines[-3:]}")
        if text is None:
            closed += 1
            continue
        lines.append((t, name, text.strip()[:100]))
        if name == "err" and "\nready: " in "\n" + text and ready is None:
            ready = asked = time.perf_counter() - t0  # the prompt ("> " on a terminal)
            proc.stdin.write((QUESTION + "\n").encode())
            proc.stdin.flush()
        if name == "out":
            if asked is not None and first_answer is None and text.strip(" >\n"):
                first_answer = t - asked
                proc.stdin.write(b"/quit\n")
                proc.stdin.flush()
    proc.wait()
    before = [t for t, _, _ in lines if asked is None or t <= asked]
    gaps = [b - a for a, b in zip([0.0] + before, before)]
    return {"first_line_s": before[0] if before else None, "longest_gap_s": max(gaps),
            "prompt_s": ready, "first_answer_char_s": first_answer,
            "lines": lines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    print(f"# hispec chat{' --model ' + args.model if args.model else ''}, "
          f"load {os.getloadavg()[0]:.2f}")
    for i in range(args.starts):
        r = start(args.model, args.timeout)
        print(f"start {i + 1}: first line {r['first_line_s']:.1f} s, longest wait without a new "
              f"line {r['longest_gap_s']:.1f} s, prompt at {r['prompt_s']:.1f} s, first answer "
              f"character {r['first_answer_char_s']:.2f} s after the question "
              f"(load {os.getloadavg()[0]:.2f})")
        for t, name, text in r["lines"]:
            print(f"    {t:7.2f} {name} {text!r}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
