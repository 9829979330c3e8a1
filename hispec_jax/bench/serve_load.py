"""Load benchmark of `hispec serve`: N concurrent streaming clients, throughput, TTFT,
per-token latency, recompilations, greedy outputs checked against offline `generate`.

For each method a server is started as a subprocess (`hispec serve --warmup`: every program
compiled before it listens) on a free localhost port; then

    alone   one client sends the first K requests of the mix, one after another
    load    N clients at once, each sending its share of the mix, one after another

Requests are ShareGPT evaluation prompts (`datasets.load_prompts`, mixed lengths; or, with
--task, the prompts of one `hispec bench --tasks` task, rendered with the model's chat
template under --chat) sent as token ids to /v1/completions with stream=True, temperature 0
and max_tokens cycling through --max-tokens (mixed output lengths). Per request: time to
first token (TTFT: first text chunk), time per output token after the first (TPOT = (last -
first) / (tokens - 1)) and the gaps between chunks (ITL; a speculative round delivers several
tokens per chunk). Recompilations: the server's own count of XLA compilations (/health)
after warm-up. Every output is compared with offline greedy AR (`generate` with
method="ar") of the same prompt and budget: a greedy method must give AR's text. Each
server writes its step log (`hispec serve --step-log`, in --log-dir), and the steps of the
load phase are summarised under the table (`step_summary`): how many ran a prompt's
prefill chunks, and the rounds' and steps' medians and 99th percentiles, which say what
the inter-token latency's tail is made of; for a speculative method, its rounds split by
level 1's block (one position per sequence, an AR step, or longer) with their time and
tokens per sequence, which say whether the longer blocks paid. With --repeats each repeat
keeps its own log (steps-METHOD-rN.jsonl) and prints its own summary.

The method `default` starts the server without --method: the model's default plan
(`recommended.default_plan`, what a user who names no method gets); a method with +ride or
+budget runs its server with or without --ride-prefill, so `--methods
ar+budget,ar+ride,default+budget,default+ride` compares the two prefill schedulers in one
run. With --repeats R the
methods' servers run R times in turn (A B A B ...) and each figure is the median over the
repeats; the `x first` columns divide by the first method's throughput in the same repeat
(median of the R ratios), alone and under load. With --interleave every method's server is
started once and the repeats run against them in turn: the methods of a repeat are measured
seconds apart, not a server start (minutes) apart, which on a shared machine whose speed
drifts is most of the spread between repeats.

    python -m hispec_jax.bench serve --methods ar,layerskip,hispec --clients 8
    hispec bench-tool serve --model SmolLM2.gguf --task extract --chat --methods ar,default \
        --clients 8 --requests 16 --alone-requests 8 --max-tokens 128 --repeats 2
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

from hispec_jax.bench import args as args_lib


DEFAULT_METHOD = "default"  # the server without --method: the model's default plan


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        return json.loads(r.read().decode())


# a method's suffix -> the server's prefill scheduler: `default+ride` against `default+budget`
SCHEDULERS = {"ride": "--ride-prefill", "budget": "--no-ride-prefill"}
# a method's suffix -> the server with or without its store of earlier requests:
# `default+store` against `default+nostore`
SUFFIXES = {**SCHEDULERS, "store": "--cross-request", "nostore": "--no-cross-request"}


def server_flags(method: str, args) -> list[str]:
    """The `hispec serve` flags of `method`: METHOD[+SUFFIX...], METHOD `default` for no
    --method (the model's default plan), SUFFIX `ride` (--ride-prefill) or `budget`
    (--no-ride-prefill; without either, --ride-prefill where the bench was given it), and
    `store` / `nostore` (--cross-request / --no-cross-request: prompt lookup with or
    without earlier requests' tokens)."""
    base, *suffixes = method.split("+")
    flags = [] if base == DEFAULT_METHOD else ["--method", base]
    flags += [SUFFIXES[s] for s in suffixes]
    if args.ride_prefill and not set(suffixes) & set(SCHEDULERS):
        flags.append("--ride-prefill")
    return flags


def start_server(method: str, args, repeat: int = 0) -> tuple[subprocess.Popen, str]:
    """A `hispec serve` subprocess of `method` (`server_flags`), warmed up, answering
    /health with "ok", its rounds loops over fewer slots compiled; its step log is
    `step_log_path(method, args, repeat)`."""
    port = _free_port()
    cmd = [sys.executable, "-c", "import sys; from hispec_jax.cli import main; sys.exit(main())",
           "serve", *server_flags(method, args), "--port",
           str(port), "--slots", str(args.slots), "--max-cache-len", str(args.max_cache_len),
           "--warmup", "--rounds-per-step", str(args.rounds_per_step)]
    if args.model:
        cmd += ["--model", args.model]
    if args.prefill_share is not None:
        cmd += ["--prefill-share", str(args.prefill_share)]
    os.makedirs(args.log_dir, exist_ok=True)
    cmd += ["--step-log", step_log_path(method, args, repeat)]
    log = open(os.path.join(args.log_dir, f"serve-{method}.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + args.startup_timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: see {log.name}")
        try:
            health = _health(url)
            # ready, and the background work (rounds over fewer rows, the lookup gate's
            # pass costs where this host kept none) done
            if health["status"] == "ok" and not any(
                    e.get("rows_to_compile") or e.get("measuring_pass_cost")
                    for e in health["engines"].values()):
                return proc, url
        except OSError:
            pass
        if time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"the server did not start in {args.startup_timeout} s")
        time.sleep(0.5)


def step_log_path(method: str, args, repeat: int = 0) -> str:
    """The step log of `method`'s server in `repeat` (0-based): steps-METHOD.jsonl, with
    -rN before the suffix when there are several repeats on servers of their own (each
    keeps its own; --interleave's one server per method writes one log)."""
    suffix = f"-r{repeat + 1}" if args.repeats > 1 and not args.interleave else ""
    return os.path.join(args.log_dir, f"steps-{method}{suffix}.jsonl")


def step_summary(records: list[dict], start: float, end: float) -> dict:
    """The engine steps (`scheduler.StepLog` records) that started in [start, end]: their
    number, the share that ran prefill chunks before their round and the share whose round
    carried one (`rider`), and percentiles of their rounds' seconds, of their whole seconds
    (prefill + round: a stream's gap), of the prefill seconds of those with chunks and of
    the rounds that carried a chunk. For a speculative method (records with
    `proposed`), `blocks`: its rounds split by what level 1 verified, `"one"` (every
    decoding sequence its one position: an AR step) and `"longer"` (some sequence a
    longer block), each with its rounds, their mean seconds and rows, the tokens per
    decoding sequence, and the share of proposed tokens level 1 kept: whether the longer
    blocks paid for their time."""
    steps = [r for r in records if start <= r["time"] <= end and r["decoding"] > 0]
    chunked = [r for r in steps if r["chunks"]]
    riding = [r for r in steps if r.get("rider")]
    share = lambda group: len(group) / len(steps) if steps else None
    summary = {"steps": len(steps), "with_chunks": share(chunked), "with_rider": share(riding),
               "round": percentiles([r["round_seconds"] for r in steps]),
               "step": percentiles([r["prefill_seconds"] + r["round_seconds"] for r in steps]),
               "prefill": percentiles([r["prefill_seconds"] for r in chunked]),
               "ridden": percentiles([r["round_seconds"] for r in riding])}
    verified = [r for r in steps if r.get("proposed")]
    if verified:
        split = {"one": [r for r in verified if r["proposed"][0] <= r["decoding"]],
                 "longer": [r for r in verified if r["proposed"][0] > r["decoding"]]}
        summary["blocks"] = {name: _block_class(group) for name, group in split.items()}
    return summary


def _block_class(rounds: list[dict]) -> dict:
    """`step_summary`'s figures for one class of rounds."""
    if not rounds:
        return {"rounds": 0}
    sequences = sum(r["decoding"] for r in rounds)
    proposed = sum(r["proposed"][0] for r in rounds)
    return {"rounds": len(rounds),
            "seconds": float(np.mean([r["round_seconds"] for r in rounds])),
            "rows": float(np.mean([r["rows"] for r in rounds])),
            "tokens_per_sequence": sum(r["tokens"] for r in rounds) / sequences,
            "kept": sum(r["accepted"][0] for r in rounds) / proposed if proposed else None}


def _read_steps(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def stream_request(client, model_name: str, prompt_ids: list[int], max_tokens: int) -> dict:
    """One streamed completion, timed on arrival of each chunk that delivers tokens (every
    chunk before the one with the finish reason: the server sends one per delivery, its
    text "" while held back, as vLLM's benchmark stamps them)."""
    t0 = time.perf_counter()
    stamps, text, usage, reason = [], "", None, None
    for chunk in client.completions.create(model=model_name, prompt=prompt_ids,
                                           max_tokens=max_tokens, temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
        now = time.perf_counter() - t0
        if chunk.choices:
            if chunk.choices[0].finish_reason is None:  # a delivery, its text maybe ""
                stamps.append(now)
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        if chunk.usage is not None:
            usage = chunk.usage
    end = time.perf_counter() - t0
    n = usage.completion_tokens
    return {"prompt_tokens": len(prompt_ids), "max_tokens": max_tokens, "tokens": n,
            "text": text, "finish_reason": reason, "ttft": stamps[0] if stamps else end,
            "tpot": (stamps[-1] - stamps[0]) / (n - 1) if n > 1 and stamps else None,
            "itl": list(np.diff(stamps)), "start": t0, "seconds": end}


def run_clients(url: str, model_name: str, work: list[list[tuple]]) -> tuple[list[dict], float]:
    """Each inner list is one client's requests (index, prompt ids, max_tokens), sent one
    after another; clients run at once. Returns (results, wall seconds)."""
    import openai

    results: list[dict] = []
    lock = threading.Lock()

    def client_loop(requests):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                               timeout=600)
        for index, prompt_ids, max_tokens in requests:
            r = stream_request(client, model_name, prompt_ids, max_tokens)
            r["index"] = index
            with lock:
                results.append(r)

    threads = [threading.Thread(target=client_loop, args=(w,)) for w in work]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def percentiles(values, qs=(50, 90, 99)) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {f"p{q}": None for q in qs}
    return {f"p{q}": float(np.percentile(values, q)) for q in qs}


def summarize(results: list[dict], seconds: float, short_prompt: int) -> dict:
    tokens = sum(r["tokens"] for r in results)
    return {"requests": len(results), "tokens": tokens, "seconds": seconds,
            "tokens_per_second": tokens / seconds,
            "ttft": percentiles([r["ttft"] for r in results]),
            "ttft_short_prompts": percentiles([r["ttft"] for r in results
                                               if r["prompt_tokens"] <= short_prompt]),
            "tpot": percentiles([r["tpot"] for r in results]),
            "itl": percentiles([x for r in results for x in r["itl"]])}


def offline_texts(model, requests: list[tuple]) -> dict:
    """Request index -> offline greedy AR text (one `generate` batch per budget)."""
    import hispec_jax

    out = {}
    for budget in sorted({m for _, _, m in requests}):
        batch = [(i, p) for i, p, m in requests if m == budget]
        texts = hispec_jax.generate(model, [p for _, p in batch], method="ar",
                                    max_new_tokens=budget).texts
        out.update({i: t for (i, _), t in zip(batch, texts)})
    return out


def bench_method(method: str, args, requests: list[tuple], want: dict, repeat: int = 0) -> dict:
    """One server of `method` (in `repeat`): the lone client, then the clients at once;
    every output checked against `want` (request index -> AR's text)."""
    proc, url = start_server(method, args, repeat)
    try:
        run = measure(method, url, args, requests, want, step_log_path(method, args, repeat))
        run["sigterm_exit_code"] = stop_server(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    return run


def stop_server(proc: subprocess.Popen) -> int:
    """SIGTERM, then the server's exit code."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


def measure(method: str, url: str, args, requests: list[tuple], want: dict,
            step_log: str) -> dict:
    """The lone client, then the clients at once, against the running server of `method`
    at `url`; every output checked against `want` (request index -> AR's text); the load
    phase's steps read from `step_log`."""
    health = _health(url)
    name = health["model"]
    plan = health.get("plan", method)  # what runs, as the server says it
    compiles_ready = health["compiles"]
    run_clients(url, name, [requests[:2]])  # the HTTP path, not measured
    if args.distinct_requests:  # warm-up, alone and load: disjoint parts of the mix
        first, rest = 2 + args.alone_requests, requests[2 + args.alone_requests:]
        alone, alone_s = run_clients(url, name, [requests[2:first]])
    else:
        rest = requests
        alone, alone_s = run_clients(url, name, [requests[:args.alone_requests]])
    work = [rest[c::args.clients] for c in range(args.clients)]
    load_start = time.time()
    load, load_s = run_clients(url, name, work)
    steps = step_summary(_read_steps(step_log), load_start, time.time())
    recompiles = _health(url)["compiles"] - compiles_ready
    mismatches = sum(r["text"] != want[r["index"]] for r in load + alone)
    a = summarize(alone, alone_s, args.short_prompt)
    b = summarize(load, load_s, args.short_prompt)
    return {"method": method, "plan": plan, "alone": a, "load": b, "load_steps": steps,
            "recompiles_after_warmup": recompiles, "greedy_mismatches": mismatches,
            "checked_outputs": len(load) + len(alone)}


def mix_slices(args) -> int:
    """How many disjoint mixes of --requests the run needs: one per repeat where the servers
    stay up across repeats (--interleave) and every request is sent once
    (--distinct-requests), so that a server's store of earlier requests never holds the
    answer to a request it is timed on; else one."""
    return args.repeats if args.distinct_requests and args.interleave else 1


def repeat_requests(requests: list[tuple], args, repeat: int) -> list[tuple]:
    """The part of `requests` that `repeat` (0-based) sends (`mix_slices`)."""
    if mix_slices(args) == 1:
        return requests
    return requests[repeat * args.requests:(repeat + 1) * args.requests]


def interleaved_runs(methods: list[str], args, requests: list[tuple], want: dict):
    """--interleave: every method's server started once and kept up (an idle server waits
    on a condition: no work beside the measured one), then the repeats measured in turn
    against them (A B A B ...), a repeat's methods seconds apart instead of a server start
    apart. Yields (repeat, method, run)."""
    servers = {}
    try:
        for method in methods:
            servers[method] = start_server(method, args)
        for repeat in range(args.repeats):
            for method in methods:
                yield repeat, method, measure(method, servers[method][1], args,
                                              repeat_requests(requests, args, repeat), want,
                                              step_log_path(method, args))
        for method in methods:
            code = stop_server(servers[method][0])
            yield None, method, code
    finally:
        for proc, _ in servers.values():
            if proc.poll() is None:
                proc.kill()


def separate_runs(methods: list[str], args, requests: list[tuple], want: dict):
    """Each repeat's methods on servers of their own, started and stopped in turn. Yields
    (repeat, method, run)."""
    for repeat in range(args.repeats):
        for method in methods:
            yield repeat, method, bench_method(method, args, requests, want, repeat)


def _ms(x) -> str:
    return "-" if x is None else f"{1000 * x:.0f}"


def table(rows: list[dict], clients: int) -> str:
    """One row per method (medians over its repeats when `rows` hold several)."""
    lines = [f"| method (plan) | 1 client tok/s | x first | {clients} clients tok/s | x first | "
             "TTFT p50/p90 ms (short prompts p90) | TPOT p50/p90 ms | ITL p50/p99 ms | "
             "recompiles | same as AR |", "|" + "---|" * 10]
    for r in rows:
        b = r["load"]
        lines.append(
            f"| {r['method']} ({r['plan']}) | {r['alone']['tokens_per_second']:.1f} | "
            f"{_ratio(r.get('alone_x_first'))} | {b['tokens_per_second']:.1f} | "
            f"{_ratio(r.get('load_x_first'))} | "
            f"{_ms(b['ttft']['p50'])}/{_ms(b['ttft']['p90'])} "
            f"({_ms(b['ttft_short_prompts']['p90'])}) | "
            f"{_ms(b['tpot']['p50'])}/{_ms(b['tpot']['p90'])} | "
            f"{_ms(b['itl']['p50'])}/{_ms(b['itl']['p99'])} | {r['recompiles_after_warmup']} | "
            f"{r['checked_outputs'] - r['greedy_mismatches']}/{r['checked_outputs']} |")
    return "\n".join(lines)


def steps_lines(rows: list[dict]) -> str:
    """One line per method: what its server's steps under load were made of."""
    lines = []
    for r in rows:
        st = r.get("load_steps")
        if not st or not st["steps"]:
            continue
        riding = (f", {100 * st['with_rider']:.0f} % with a chunk riding the round (those "
                  f"rounds p50 {_ms(st['ridden']['p50'])} ms)") if st.get("with_rider") else ""
        lines.append(
            f"{r['method']}: {st['steps']} steps under load, {100 * st['with_chunks']:.0f} % "
            f"with prefill chunks (their prefill p50 {_ms(st['prefill']['p50'])} ms){riding}; "
            f"rounds p50/p99 {_ms(st['round']['p50'])}/{_ms(st['round']['p99'])} ms, whole "
            f"steps p50/p99 {_ms(st['step']['p50'])}/{_ms(st['step']['p99'])} ms")
        blocks = st.get("blocks")
        if blocks:
            lines.append(f"{r['method']}: rounds by level 1's block: " + "; ".join(
                f"{name} {_block_text(c)}" for name, c in blocks.items()))
    return "\n".join(lines)


def _block_text(c: dict) -> str:
    if not c["rounds"]:
        return "none"
    kept = "-" if c["kept"] is None else f"{100 * c['kept']:.0f} %"
    return (f"{c['rounds']} rounds, {_ms(c['seconds'])} ms on {c['rows']:.1f} rows, "
            f"{c['tokens_per_sequence']:.2f} tokens per sequence, {kept} of proposed kept")


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def combine(runs: list[dict]) -> dict:
    """One method's repeats -> one row: median throughputs and latencies (the percentiles of
    the median repeat by throughput under load), mismatches and recompiles summed."""
    runs = sorted(runs, key=lambda r: r["load"]["tokens_per_second"])
    row = dict(runs[len(runs) // 2])
    for part in ("alone", "load"):
        row[part] = {**row[part], "tokens_per_second": statistics.median(
            r[part]["tokens_per_second"] for r in runs)}
        ratios = [r.get(f"{part}_x_first") for r in runs]
        row[f"{part}_x_first"] = (statistics.median(ratios) if None not in ratios else None)
    for key in ("recompiles_after_warmup", "greedy_mismatches", "checked_outputs"):
        row[key] = sum(r[key] for r in runs)
    row["repeats"] = runs
    return row


def parse_args(argv):
    p = args_lib.Parser(prog="hispec bench-tool serve", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model (default: the shipped one)")
    p.add_argument("--methods", default="ar,layerskip,hispec",
                   help=f"comma-separated methods ({DEFAULT_METHOD!r}: the server without "
                        "--method, the model's default plan), each with +ride or +budget "
                        "for its server's prefill scheduler (--ride-prefill or not): "
                        "ar+budget,ar+ride,default+budget,default+ride")
    p.add_argument("--task", default="sharegpt",
                   help="the prompts: sharegpt (ShareGPT evaluation prompts as they are) or one "
                        "task of `hispec bench --tasks` (chat, summarize, extract, code)")
    p.add_argument("--chat", action="store_true",
                   help="render --task prompts with the model's chat template")
    p.add_argument("--repeats", type=int, default=1,
                   help="run the methods' servers this many times in turn; medians")
    p.add_argument("--interleave", action="store_true",
                   help="start each method's server once and measure the repeats against "
                        "them in turn (A B A B ...): a repeat's methods minutes closer")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients under load")
    p.add_argument("--requests", type=int, default=32, help="requests in the mix")
    p.add_argument("--alone-requests", type=int, default=8,
                   help="requests the lone client sends")
    p.add_argument("--max-tokens", type=args_lib.positive_int_list, default=(16, 64, 32, 96),
                   help="budgets, cycled over requests (comma-separated)")
    p.add_argument("--max-prompt-tokens", type=int, default=200)
    p.add_argument("--short-prompt", type=int, default=32,
                   help="prompts of at most this many tokens count as short (TTFT)")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--max-cache-len", type=int, default=512)
    p.add_argument("--rounds-per-step", type=int, default=1)
    p.add_argument("--prefill-share", type=float, default=None, metavar="X",
                   help="every server's --prefill-share (default: the server's)")
    p.add_argument("--ride-prefill", action="store_true",
                   help="start every server with --ride-prefill")
    p.add_argument("--distinct-requests", action="store_true",
                   help="send every request of the mix once: the HTTP warm-up, the lone "
                        "client and the clients under load take disjoint parts of it (2, "
                        "--alone-requests, the rest), so a server that drafts from earlier "
                        "requests (`hispec serve`'s store) is never timed on a repeat; "
                        "with --interleave each repeat sends its own --requests (R x "
                        "--requests prompts in all)")
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--log-dir", default=os.path.join(tempfile.gettempdir(), "hispec-bench-serve"),
                   help="where the servers' logs go, serve-METHOD.log (created; default: "
                        "hispec-bench-serve in the temporary directory)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results here")
    args = p.parse_args(argv)
    from hispec_jax.bench import tasks

    if args.task != "sharegpt" and args.task not in tasks.TASKS:
        p.error(f"--task {args.task}: expected sharegpt or one of {', '.join(tasks.TASKS)}")
    for method in args.methods.split(","):
        if any(s not in SUFFIXES for s in method.split("+")[1:]):
            p.error(f"--methods {method}: expected METHOD, METHOD+ride, METHOD+budget or "
                    "METHOD+store or METHOD+nostore")
    if args.chat and args.task == "sharegpt":
        p.error("--chat renders --task prompts; give a --task")
    for name in ("clients", "requests", "alone_requests", "slots", "max_cache_len", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not args.max_tokens:
        p.error("--max-tokens: give at least one budget")
    if args.distinct_requests and args.requests < 2 + args.alone_requests + args.clients:
        p.error("--distinct-requests: --requests must hold the 2 warm-up requests, "
                "--alone-requests and at least one per client")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import hispec_jax
    from hispec_jax.bench import tasks
    from hispec_jax.datasets import load_prompts

    model = hispec_jax.load_model(args.model or hispec_jax.DEFAULT_MODEL_DIR)
    num_prompts = args.requests * mix_slices(args)
    if args.task == "sharegpt":
        prompts = load_prompts("sharegpt", model.tokenizer, num_prompts, args.max_prompt_tokens)
    else:
        prompts = tasks.task_prompts(model, args.task, num_prompts, args.max_prompt_tokens,
                                     args.chat)
    requests = [(i, p, args.max_tokens[i % len(args.max_tokens)]) for i, p in enumerate(prompts)]
    want = offline_texts(model, requests)
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[:3]
    methods = args.methods.split(",")
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    exit_codes = {}
    schedule = interleaved_runs if args.interleave else separate_runs
    for repeat, method, run in schedule(methods, args, requests, want):
        if repeat is None:  # an interleaved server's exit code, after the last repeat
            exit_codes[method] = run
            continue
        run["repeat"] = repeat + 1  # (`combine` orders a method's repeats by throughput)
        first = runs[methods[0]][repeat] if method != methods[0] else run
        for part in ("alone", "load"):
            run[f"{part}_x_first"] = (run[part]["tokens_per_second"]
                                      / first[part]["tokens_per_second"])
        runs[method].append(run)
        print(f"repeat {repeat + 1}: " + table([run], args.clients).split("\n")[-1],
              flush=True)
        if args.repeats > 1:
            for line in steps_lines([run]).splitlines():
                print(f"repeat {repeat + 1}: {line}", flush=True)
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[:3]
    for method, code in exit_codes.items():
        for run in runs[method]:
            run["sigterm_exit_code"] = code
    rows = [combine(runs[m]) for m in methods]
    print(f"task {args.task}{' (chat template)' if args.chat else ''}: {len(requests)} "
          f"requests, prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
          f"max_tokens {','.join(map(str, args.max_tokens))}, {args.slots} slots, "
          f"{args.repeats} repeat(s), medians")
    print(table(rows, args.clients))
    print(steps_lines(rows))
    print(f"load average before {' '.join(load_before)}, after {' '.join(load_after)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "load_before": load_before, "load_after": load_after,
                       "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
