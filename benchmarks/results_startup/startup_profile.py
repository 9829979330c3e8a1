"""Where a `hispec` start's seconds go, per compiled program: tracing, lowering (jaxpr to
MLIR), XLA compile (persistent-cache hit or miss), weight loading (docs/startup.md).

    python benchmarks/results_startup/startup_profile.py            # every case, cold + warm
    python benchmarks/results_startup/startup_profile.py --case chat

Each case runs as a fresh `hispec` process twice with one new, empty JAX persistent cache
directory and one new, empty program cache (`$HISPEC_CACHE/programs`, `HISPEC_CACHE` set to
a directory inside it): "cold" (the caches start empty) and "warm" (the caches the cold run
filled), as a user's first and second start. Inside the process, `jax.monitoring` duration listeners
collect per-program tracing / lowering / compile seconds (the `fun_name` JAX reports) and
the cache hit / miss events between them ("-": JAX did not look the program up, as for
programs that compile in under a second); `load_model` is timed by wrapping it. `hispec
chat` reads one question from stdin; its first-answer time is from reading the question to
the first character of the answer.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import subprocess
import sys
import tempfile
import time

T_START = time.perf_counter()

TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE = "/jax/core/compile/backend_compile_duration"

QUESTION = "What is the capital of France?"
CASES = {
    "generate-ar": ["generate", "--method", "ar", "The capital of France is"],
    "generate-hispec": ["generate", "--method", "hispec", "The capital of France is"],
    "generate-lookup": ["generate", "--method", "lookup", "The capital of France is"],
    "chat": ["chat"],
    "smollm2-lookup": ["generate", "--model", "{smollm2}", "--method", "lookup",
                       "The capital of France is"],
}


def child(argv: list[str]) -> None:
    """Runs `hispec ARGV` in this process with the listeners on; prints one JSON line."""
    import jax

    programs = []  # one dict per jaxpr traced / module lowered / executable compiled
    pending = collections.Counter()  # cache events since the last compile ended
    current: dict[str, dict] = {}

    phase = ["main"]

    def on_duration(event, seconds, **kw):
        name = kw.get("fun_name", "?")
        if name.startswith("jit(") and name.endswith(")"):  # lowering's name for `name`
            name = name[4:-1]
        if event == TRACE:
            current[name] = {"name": name, "trace": seconds, "lower": 0.0, "compile": 0.0,
                             "cache": "", "phase": phase[0]}
        elif event in (LOWER, COMPILE):
            entry = current.get(name)
            if entry is None or (event == LOWER and entry["lower"]) or entry["compile"]:
                entry = current[name] = {"name": name, "trace": 0.0, "lower": 0.0,
                                         "compile": 0.0, "cache": "", "phase": phase[0]}
            if event == LOWER:
                entry["lower"] = seconds
            else:
                entry["compile"] = seconds
                entry["cache"] = ("hit" if pending["/jax/compilation_cache/cache_hits"]
                                  else "miss" if pending["/jax/compilation_cache/cache_misses"]
                                  else "-")
                pending.clear()
                programs.append(current.pop(name))

    def on_event(event, **kw):
        pending[event] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)

    from hispec_jax import cli
    from hispec_jax.models import model as model_lib

    load_seconds = []
    real_load = model_lib.load_model

    def timed_load(*a, **k):
        t0 = time.perf_counter()
        phase[0] = "load_model"
        m = real_load(*a, **k)
        phase[0] = "main"
        load_seconds.append(time.perf_counter() - t0)
        return m

    model_lib.load_model = timed_load
    marks = {}

    class Clock(io.TextIOBase):
        """stdout for chat: notes when the answer's first character is written."""

        def write(self, s):
            if s.strip() and "asked" in marks and "first" not in marks:
                marks["first"] = time.perf_counter()
            return sys.__stdout__.write(s)

        def flush(self):
            sys.__stdout__.flush()

    class Question(io.StringIO):
        def readline(self, *a):
            line = super().readline(*a)
            if line.strip() == QUESTION:
                marks["asked"] = time.perf_counter()
            return line

    if argv[0] == "chat":
        sys.stdin = Question(QUESTION + "\n/quit\n")
        sys.stdout = Clock()
    t_import = time.perf_counter() - T_START
    t0 = time.perf_counter()
    rc = cli.main(argv)
    wall = time.perf_counter() - t0
    sys.stdout = sys.__stdout__
    # Programs traced or lowered but compiled elsewhere (e.g. `jax.export`) still count.
    programs.extend(current.values())
    result = {"rc": rc, "import_seconds": t_import, "main_seconds": wall,
              "load_seconds": sum(load_seconds), "programs": programs}
    if "first" in marks:
        result["first_answer_seconds"] = marks["first"] - marks["asked"]
        result["prompt_seconds"] = marks["asked"] - t0
    print("STARTUP_JSON " + json.dumps(result), flush=True)


def run_case(name: str, cache_dir: str, smollm2: str) -> dict:
    argv = [a.format(smollm2=smollm2) for a in CASES[name]]
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PLATFORMS="cpu",
               HISPEC_CACHE=os.path.join(cache_dir, "hispec"))  # the program cache's home
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(argv)],
                          capture_output=True, text=True, env=env)
    process_seconds = time.perf_counter() - t0
    lines = [l for l in proc.stdout.splitlines() if l.startswith("STARTUP_JSON ")]
    if not lines:
        sys.exit(f"{name}: no result\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("STARTUP_JSON "):])
    result["process_seconds"] = process_seconds
    result["summary_line"] = [l for l in proc.stderr.splitlines() if l.startswith("[")][-1:]
    return result


def report(name: str, run: str, r: dict) -> str:
    progs = r["programs"]
    tot = {k: sum(p[k] for p in progs) for k in ("trace", "lower", "compile")}
    big = [p for p in progs if p["trace"] + p["lower"] + p["compile"] >= 0.1]
    lines = [f"== {name} ({run}): process {r['process_seconds']:.1f} s = imports "
             f"{r['import_seconds']:.1f} s + main {r['main_seconds']:.1f} s; load_model "
             f"{r['load_seconds']:.1f} s; {len(progs)} programs compiled "
             f"({sum(p['cache'] == 'hit' for p in progs)} persistent-cache hits), "
             f"{len(big)} taking >= 0.1 s; trace {tot['trace']:.1f} s, lower "
             f"{tot['lower']:.1f} s, XLA compile {tot['compile']:.1f} s"]
    if "first_answer_seconds" in r:
        lines.append(f"   prompt shown after {r['prompt_seconds']:.1f} s; first answer "
                     f"character {r['first_answer_seconds']:.1f} s after the question")
    for line in r["summary_line"]:
        lines.append(f"   {line}")
    lines.append(f"   {'program':<44} {'trace':>7} {'lower':>7} {'compile':>8} cache")
    for p in sorted(big, key=lambda p: -(p["trace"] + p["lower"] + p["compile"])):
        lines.append(f"   {p['name'][:44]:<44} {p['trace']:7.2f} {p['lower']:7.2f} "
                     f"{p['compile']:8.2f} {p['cache']}")
    for phase in ("load_model", "main"):
        small = [p for p in progs if p not in big and p.get("phase") == phase]
        if small:
            label = f"{len(small)} small programs ({phase})"
            lines.append(f"   {label:<44} {sum(p['trace'] for p in small):7.2f} "
                         f"{sum(p['lower'] for p in small):7.2f} "
                         f"{sum(p['compile'] for p in small):8.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", default=None)
    parser.add_argument("--case", action="append", choices=list(CASES))
    parser.add_argument("--json", default=None, help="also write the raw results here")
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    from hispec_jax.models.pull import cached_path

    smollm2 = str(cached_path("smollm2-135m-instruct"))
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)", flush=True)
    raw = {}
    for name in args.case or list(CASES):
        with tempfile.TemporaryDirectory(prefix="startup-cache-") as cache_dir:
            for run in ("cold", "warm"):
                r = run_case(name, cache_dir, smollm2)
                r["load_average"] = os.getloadavg()[0]
                raw[f"{name}/{run}"] = r
                print(report(name, run, r) + f"\n   (load average {r['load_average']:.1f})",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)


if __name__ == "__main__":
    main()
