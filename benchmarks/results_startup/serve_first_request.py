"""`hispec serve` from start to its first answers, timed from the outside: when `/health`
turns 200, then the first and the second chat completion of the same size (the issue's
target: the first at most 2x the second, i.e. nothing left to compile on a request).

    python benchmarks/results_startup/serve_first_request.py --starts 2 [--model PATH] \
        [-- SERVE ARGS...] > OUT.txt

Each start is a fresh `hispec serve` process with its defaults (the model's default plan,
warm-up before readiness); the first start of a machine fills the caches.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: dict | None = None, timeout: float = 600) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, {}
    except (urllib.error.URLError, ConnectionError):
        return 0, {}


def start(model: str | None, serve_args: list[str], timeout: float) -> dict:
    port = free_port()
    argv = ["hispec", "serve", "--port", str(port)] + (["--model", model] if model else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv + serve_args, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            status, _ = request(base + "/health", timeout=5)
            if status == 200:
                break
            if proc.poll() is not None or time.perf_counter() - t0 > timeout:
                raise SystemExit(f"the server did not turn ready (exit {proc.poll()})")
            time.sleep(0.2)
        ready = time.perf_counter() - t0
        served = request(base + "/v1/models")[1]["data"][0]["id"]
        seconds = []
        for question in ("What is the capital of France?", "What is the capital of Italy?"):
            t = time.perf_counter()
            status, body = request(base + "/v1/chat/completions", {
                "model": served, "max_tokens": 32, "temperature": 0,
                "messages": [{"role": "user", "content": question}]})
            if status != 200:
                raise SystemExit(f"request failed: HTTP {status}")
            seconds.append(time.perf_counter() - t)
        return {"ready_s": ready, "first_s": seconds[0], "second_s": seconds[1],
                "tokens": body.get("usage", {}).get("completion_tokens")}
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=2)
    parser.add_argument("--model", default=None)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("serve_args", nargs="*", help="after --: arguments of hispec serve")
    args = parser.parse_args()
    print(f"# hispec serve{' --model ' + args.model if args.model else ''} "
          f"{' '.join(args.serve_args)}, load {os.getloadavg()[0]:.2f}")
    for i in range(args.starts):
        r = start(args.model, args.serve_args, args.timeout)
        print(f"start {i + 1}: /health 200 after {r['ready_s']:.1f} s; first request "
              f"{r['first_s']:.2f} s, second {r['second_s']:.2f} s ({r['tokens']} tokens each), "
              f"first / second {r['first_s'] / r['second_s']:.2f} "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
