"""`hispec serve`: a model, a decoding method and N slots behind the OpenAI-compatible API.

    build_app(model, slots=8)                    # the ASGI app: the model's default plan
    build_app(model, "lookup", lookup=8)         # a method and its options
    serve(app, host="127.0.0.1", port=8000)      # uvicorn; SIGTERM / Ctrl-C: graceful stop

Over several hosts (`hispec_jax.distributed`), process 0 serves
`build_app(model, ..., several_hosts=True)` and every other process runs
`follow(model, ...)` with the same engine arguments: it makes process 0's engine calls on
its own engines until process 0 stops (`follower.py`).

With no method the app runs the model's default plan (`method_spec.resolve`: its
recommended HiSpec plan, or prompt lookup), and /health says which and why.

Two slot engines share the slots' shapes: one greedy (temperature 0), one sampling. With
`warmup=True` (the default) the engine thread compiles every program serving can need (per
engine a fixed set whatever the prompts: the empty state, the two prefill chunks, finish,
the rounds loop, cancel: `SlotEngine.warm_up`) before it takes a request, and /health answers
503 "loading" until then; afterwards serving compiles nothing (`slots.backend_compiles`).
With `warmup=False` each program compiles at its first use.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time

from hispec_jax import distributed
from hispec_jax.decoding import device_costs
from hispec_jax.decoding import method_spec
from hispec_jax.decoding import methods as methods_lib
from hispec_jax.decoding import suffix_store
from hispec_jax.decoding.generate import model_name
from hispec_jax.serving import api_server
from hispec_jax.serving import follower
from hispec_jax.serving import prompts as prompts_lib
from hispec_jax.decoding import slots as slots_lib
from hispec_jax.serving.scheduler import Scheduler, StepLog
from hispec_jax.serving.stream import make_decoder

log = logging.getLogger("hispec.serve")
DEFAULT_CACHE_LEN = 1024


def build_engines(model, method="ar", *, slots: int = 8, max_cache_len: int | None = None,
                  prefill_chunk: int = slots_lib.PREFILL_CHUNK, ride_prefill: bool = False,
                  cross_request: bool = False,
                  store_tokens: int = suffix_store.DEFAULT_STORE_TOKENS,
                  **method_options) -> dict[bool, slots_lib.SlotEngine]:
    """{greedy: SlotEngine} for greedy (True) and sampling (False) requests. Every request
    stops at EOS and at the chat template's end-of-turn markers; prompts enter their slots
    in chunks of `prefill_chunk` positions (`ride_prefill`: riding the rounds where they
    can, `SlotEngine`). With `cross_request`, where the plan has prompt lookup, both engines
    share one store of `store_tokens` tokens of earlier requests that the lookup also
    drafts from (`suffix_store.SuffixStore`, in memory only; `SlotEngine.store`)."""
    if not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
    capacity = max_cache_len or min(DEFAULT_CACHE_LEN, model.cfg.max_position_embeddings)
    if not 1 <= capacity <= model.cfg.max_position_embeddings:
        raise ValueError(f"max_cache_len={capacity} must be in [1, "
                         f"{model.cfg.max_position_embeddings}] (max_position_embeddings)")
    eos = tuple(model.eos_token_ids)
    if prompts_lib.has_chat_template(model):
        eos = prompts_lib.conversation_ids(model, [{"role": "user", "content": "x"}])[1]
    engines = {}
    store = suffix_store.SuffixStore(store_tokens) if cross_request else None
    for greedy in (True, False):
        decoder = make_decoder(model, method, greedy, method_options).decoder
        if decoder.lookahead() + 2 > capacity:
            raise ValueError(f"max_cache_len={capacity} leaves no room for a prompt and a "
                             f"token with the method's lookahead {decoder.lookahead()}")
        engines[greedy] = slots_lib.SlotEngine(model, decoder, slots=slots, capacity=capacity,
                                               greedy=greedy, eos_ids=eos,
                                               prefill_chunk=prefill_chunk,
                                               ride_prefill=ride_prefill, store=store)
    return engines


# The quiet a background compile of a rounds loop waits for (`warm_up`).
QUIET_SECONDS = 1.0


def warm_up(engines: dict[bool, slots_lib.SlotEngine], idle=None,
            stop: threading.Event | None = None,
            measure_pass_cost: bool = False) -> threading.Thread:
    """Compiles every program serving can need before the first request (`SlotEngine.warm_up`,
    both engines) with the rounds loop over all B slots and over every smaller row count
    (`slots.active_rows`: 1, 2, 4, ...) the program cache holds, and the round a prefill
    chunk rides if it holds it (loading takes a second or two; compiling one takes many).
    Then starts a background thread that compiles the rest: the other rounds loops,
    smallest first, then the round a chunk rides, each serving from the moment it is
    compiled. Until then a request runs the
    smallest compiled loop that holds its slot, and a prompt's chunks run beside the
    rounds instead of riding them, so none waits for a compilation. `idle()` (the
    scheduler's: no request running or waiting) holds each of those compiles back until
    the server has been quiet for `QUIET_SECONDS`: a compile holds the GIL for seconds of
    tracing, which a request beside it would wait on. Last, with `measure_pass_cost`,
    where a plan has a lookup gate and this host has no measurement of the model's passes
    (`device_costs.py`), the thread measures them once the server is quiet, stores them and
    hands them to the engines: their gates weigh this device's costs from the next round
    (the measurement keeps the fastest of interleaved repeats, so a request arriving
    meanwhile only slows it). Once `stop` is set (the server stops) the thread compiles
    nothing more. Returns the thread."""
    rounds, riding = [], []
    for engine in engines.values():
        engine.compile_on_demand = False
        stored = tuple(r for r in engine.active_rows
                       if r == engine.slots or engine.rounds_stored(r))
        stored_riding = tuple(r for r in engine.ride_rows if engine.riding_stored(r))
        engine.warm_up(rows=stored, riding=stored_riding)
        rounds += [(engine, r) for r in engine.active_rows if r not in stored]
        riding += [(engine, r) for r in engine.ride_rows if r not in stored_riding]
    rounds.sort(key=lambda job: job[1])  # the loops a lone client runs first
    pending = ([(engine, r, engine.compile_rounds, "rounds loop") for engine, r in rounds]
               + [(engine, r, engine.compile_riding, "round a prefill chunk rides")
                  for engine, r in riding])

    stop = stop or threading.Event()
    unmeasured = [e for e in engines.values()
                  if e.gated and e.pass_cost_source != device_costs.MEASURED]
    if measure_pass_cost and unmeasured and device_costs.store_dir() is not None:
        for engine in unmeasured:
            engine.pass_cost_pending = True
        pending.append((None, 0, functools.partial(_measure_pass_cost, unmeasured),
                        "lookup gate's pass costs"))

    def quiet() -> bool:
        """Waits for `QUIET_SECONDS` of an idle server; False once `stop` is set."""
        quiet_since = time.perf_counter()
        while idle is not None and time.perf_counter() - quiet_since < QUIET_SECONDS:
            if stop.wait(0.1):
                return False
            if not idle():
                quiet_since = time.perf_counter()
        return not stop.is_set()

    def compile_rest():
        for engine, rows, compile_, what in pending:
            if not quiet():
                return
            if engine is None:  # the pass costs
                try:
                    compile_()
                except Exception:  # noqa: BLE001 - the default costs still price the gate
                    log.exception("measuring the %s failed", what)
                continue
            try:
                t0 = time.perf_counter()
                compile_(rows)
                log.info("compiled the %s %s over %d of %d slots in %.1f s",
                         "greedy" if engine.greedy else "sampling", what, rows, engine.slots,
                         time.perf_counter() - t0)
            except Exception:  # noqa: BLE001 - the loop over all slots still serves
                log.exception("compiling the %s over %d slots failed", what, rows)

    thread = threading.Thread(target=compile_rest, name="hispec-compile-rows", daemon=True)
    thread.start()
    return thread


def _measure_pass_cost(engines: list[slots_lib.SlotEngine]) -> None:
    """Measures the engines' model's passes on this host, stores them and hands them to
    the engines (`SlotEngine.use_pass_cost`)."""
    try:
        cost, _ = device_costs.measure_and_store(engines[0].model)
        for engine in engines:
            engine.use_pass_cost(cost, device_costs.MEASURED)
    finally:
        for engine in engines:
            engine.pass_cost_pending = False
    log.info("the lookup gate weighs this host's pass costs: %s", device_costs.describe(cost))


def choose_plan(model, method, method_options: dict,
                reason: str = "given") -> tuple[object, str]:
    """(method spec or "auto", or a hand-built `Decoder`, and why it runs): the one
    resolver's (`method_spec.resolve`; None: the model's default plan, with the given
    options on top); `reason` stands for "given" (the command line's own words)."""
    if isinstance(method, methods_lib.Decoder):
        return method, reason
    spec, why = method_spec.resolve(method, method_options, model_path=model.path,
                                    num_layers=model.cfg.num_layers,
                                    has_draft=model.draft is not None)
    return spec, reason if why == method_spec.GIVEN else why


def describe(engine: slots_lib.SlotEngine, method) -> str:
    """A plan in a few words: "hispec exits 4,12,24 windows 3,6", "lookup k=8 ngram<=4"."""
    h = engine.engine.hierarchy
    name = (method if isinstance(method, str) else method.method
            if isinstance(method, method_spec.MethodSpec) else "custom")
    drafted = h.drafter.describe()  # "" for an exit: the exits and windows say it
    if drafted:
        name = drafted if name == h.drafter.label(h) else f"{name} + {drafted}"
    exits = [e for e in h.exits if e > 0]
    if len(exits) > 1 or name.startswith(("exit", "custom")):
        name += f" exits {','.join(map(str, exits))}"
    # a drafter that runs no layer sits at exit 0 and describes its own window
    windows = h.max_windows if h.drafter.runs_layers else h.max_windows[1:]
    if windows:
        name += f" windows {','.join(map(str, windows))}"
    return name


def build_app(model, method=None, *, slots: int = 8, max_cache_len: int | None = None,
              warmup: bool = True, rounds_per_step: int = 1, served_name: str | None = None,
              plan_reason: str = "given", prefill_chunk: int = slots_lib.PREFILL_CHUNK,
              prefill_share: float = 1.0, step_log: str | os.PathLike | None = None,
              ride_prefill: bool = False, measure_pass_cost: bool = False,
              cross_request: bool = False,
              store_tokens: int = suffix_store.DEFAULT_STORE_TOKENS,
              several_hosts: bool = False, **method_options):
    """The ASGI app serving `model` with `method` (None: the model's default plan) over
    `slots` slots per engine; with `warmup`, its engine thread compiles everything before
    it takes requests (/health: 503 "loading" until then). `plan_reason`: why a given
    method runs (/health shows it). Prompts enter their slots in chunks of
    `prefill_chunk` positions, for about `prefill_share` times a step's time between two
    `rounds_per_step` steps of the decoding slots (`scheduler.Scheduler`), or with
    `ride_prefill` a chunk riding each round where the plan's rounds can carry one (a full
    one while prompts queue and its round fits the budget of `prefill_share` times a step,
    else a small one).
    `step_log`: a file that gets each engine step as a JSON line (`scheduler.StepLog`).
    `measure_pass_cost` (`hispec serve --measure-pass-cost`): the warm-up measures this
    host's pass costs for the lookup gate where none are kept (`warm_up`).
    `cross_request` (`hispec serve --cross-request`; off by default: it paid where requests
    share their shape and lost on open chat, BENCHMARKS.md): where the plan has prompt
    lookup, it also drafts from a store of `store_tokens` tokens of earlier requests,
    scoped per API key and `user` field (`build_engines`; /health says so).
    `several_hosts`: this is process 0 of a multi-host run (`hispec_jax.distributed`),
    whose other processes run `follow` with the same arguments: every call of the engines
    that runs a program is sent to them first (`follower.py`)."""
    if several_hosts and measure_pass_cost:
        raise ValueError("measure_pass_cost: not on several hosts (the measurement would run "
                         "on process 0 alone); measure beforehand: hispec bench-tool pass-cost")
    engines, plan, method = _engines_and_plan(
        model, method, method_options, plan_reason, slots=slots, max_cache_len=max_cache_len,
        prefill_chunk=prefill_chunk, ride_prefill=ride_prefill, cross_request=cross_request,
        store_tokens=store_tokens)
    followers = None
    if several_hosts:
        engines, followers = follower.lead(engines, plan)
    log.info("plan: %s (%s)%s%s", plan["plan"], plan["reason"],
             (f"; drafts from earlier requests: on (a store of {engines[True].store.size} "
              "tokens in memory, scoped per API key and user)" if plan["cross_request"]
              else "; drafts from earlier requests: off (--cross-request turns them on)"
              if getattr(engines[True].engine.hierarchy.drafter, "reads_store", False)
              else ""),
             "; warming up (compiling every program) before taking requests" if warmup else "")
    scheduler = Scheduler(engines, rounds_per_step=rounds_per_step,
                          prefill_share=prefill_share,
                          warmup=(functools.partial(warm_up, measure_pass_cost=measure_pass_cost)
                                  if warmup else None),
                          step_log=(None if step_log is None
                                    else StepLog(open(step_log, "w", encoding="utf-8"))),
                          followers=followers)
    name = served_name or model_name(model)
    return api_server.create_app(model, scheduler, name, plan)


def follow(model, method=None, *, slots: int = 8, max_cache_len: int | None = None,
           plan_reason: str = "given", prefill_chunk: int = slots_lib.PREFILL_CHUNK,
           ride_prefill: bool = False, cross_request: bool = False,
           store_tokens: int = suffix_store.DEFAULT_STORE_TOKENS, **method_options
           ) -> dict[str, int]:
    """A follower of a multi-host server (a process other than 0): builds the engines as
    `build_app` on process 0 does (the same arguments; those of the HTTP side and the
    scheduler are process 0's alone), then makes process 0's calls on them until it stops
    (`follower.follow`). Returns the calls made, by name."""
    engines, plan, _ = _engines_and_plan(
        model, method, method_options, plan_reason, slots=slots, max_cache_len=max_cache_len,
        prefill_chunk=prefill_chunk, ride_prefill=ride_prefill, cross_request=cross_request,
        store_tokens=store_tokens)
    log.info("plan: %s (%s); process %d follows process 0, which takes the requests",
             plan["plan"], plan["reason"], distributed.process_index())
    calls = follower.follow(engines, plan)
    log.info("process 0 stopped; calls made: %s",
             ", ".join(f"{op} {n}" for op, n in calls.items()) or "none")
    return calls


def _engines_and_plan(model, method, method_options: dict, plan_reason: str, **engine_options):
    """(the engines, the plan /health shows, the method) of `build_app` and `follow`."""
    method, reason = choose_plan(model, method, method_options, plan_reason)
    engines = build_engines(model, method, **engine_options)
    spec = method if isinstance(method, method_spec.MethodSpec) else None
    plan = {"method": method if isinstance(method, str) else "custom" if spec is None
            else spec.method,
            "plan": describe(engines[True], method), "reason": reason,
            **({"spec": spec.to_json()} if spec is not None else {}),
            "cross_request": engines[True].store is not None}
    return engines, plan, method


def serve(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> int:
    """Runs `app` on uvicorn until SIGINT / SIGTERM (in-flight requests get 5 s to end);
    returns the exit status: 0; uvicorn's 3 where it could not start (the port is taken);
    1 where the app serves with followers on other hosts and its engine thread failed (a
    follower died, or a program failed), which stops it.

    uvicorn shuts down gracefully on SIGTERM and then re-raises the signal to the handler
    that was installed before it; that handler ends the process with exit code 0, since
    SIGTERM is the ordinary way to stop a server."""
    import uvicorn
    from uvicorn.main import STARTUP_FAILURE

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           timeout_graceful_shutdown=5))
    scheduler = app.state.scheduler
    if scheduler.followers is not None:
        scheduler.on_failure = lambda: setattr(server, "should_exit", True)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.run()
    except KeyboardInterrupt:  # as `uvicorn.run`
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not server.started:  # e.g. the port is taken: uvicorn has said why
        return STARTUP_FAILURE
    return 1 if scheduler.followers is not None and scheduler.error is not None else 0
