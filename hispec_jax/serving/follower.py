"""Serving over several hosts: process 0 takes the HTTP requests and decides every step;
each other process follows it, making the same calls on its own slot engines, so that
every process runs the same compiled programs over the global mesh in the same order (a
program over the devices of several processes runs only when every one of them runs it).

    process 0                                             process i > 0
    HTTP -> scheduler -> Leader(engine).generate(...)     follow(engines)
                           | broadcast {"op": "generate",    | receive the op
                           |   "engine": "greedy",           | engine.generate(...)
                           |   "args": {...}} ----------->   | receive the next op ...
                           | engine.generate(...)
                           v  (the same programs, together)

Each call of a `SlotEngine` that runs a program or changes what later programs receive is
sent before it runs (`distributed.broadcast_work`): admit (the request's token ids and
sampling settings), prefill, cancel, generate, warm_up, counters where reading them
gathers from every process (`sharding.gathers`; replicated counters are read on process 0
alone), then "stop". Then the host-side bookkeeping (which slots are busy, the prompts
waiting, the store of earlier requests' tokens, which every process fills from the tokens
its own `generate` returns) stays the same in every process: each makes the same calls on
the same values. Whatever depends on time or on this process's history is decided on
process 0 and reaches the followers as arguments: how many prefill chunks run beside a
round and of which size, whether a chunk rides a round (the scheduler's time budget), and
the rows a round runs over (which programs process 0 has compiled so far: it compiles the
rest in the background; a follower compiles a program at its first use). The lookup
gate's pass costs are process 0's too (`device_costs` keeps them per host).

While no request runs, process 0 sends "idle" every `KEEPALIVE_SECONDS`, so that no
follower sits in one collective for hours. A follower that dies stops process 0: JAX's
coordination service misses its heartbeats (`--heartbeat-timeout`) and ends every other
process, or a collective fails first and the engine thread's error stops the server
(`hispec serve` exits with status 1). When process 0 stops (SIGTERM, Ctrl-C), its engine
thread sends "stop" and every follower returns.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from hispec_jax import distributed
from hispec_jax.decoding import gate as gate_lib
from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.models import sharding
from hispec_jax.decoding import slots as slots_lib

NAMES = {True: "greedy", False: "sampling"}  # the engines, by `greedy`
KEEPALIVE_SECONDS = 10.0


class FollowerError(RuntimeError):
    """A follower cannot go on: process 0 serves another plan, is gone, or its engine
    failed (`LeaderFailed`)."""


class LeaderFailed(FollowerError):
    """Process 0's engine failed; it stops, and told the followers so."""


def request_json(request: slots_lib.SlotRequest) -> dict:
    return {**dataclasses.asdict(request), "prompt_ids": list(request.prompt_ids)}


def request_from_json(fields: dict) -> slots_lib.SlotRequest:
    return slots_lib.SlotRequest(**{**fields, "prompt_ids": tuple(fields["prompt_ids"]),
                                    "sampling": SamplingParams(**fields["sampling"])})


def pass_cost_json(cost: gate_lib.PassCost) -> dict:
    return {"fixed": float(cost.fixed), "jump": float(cost.jump),
            "measured": [[b, T, c] for (b, T), c in cost.measured().items()]}


def pass_cost_from_json(fields: dict) -> gate_lib.PassCost:
    return gate_lib.PassCost.of(fields["fixed"], fields["jump"],
                                {(b, T): c for b, T, c in fields["measured"]})


def _settings(engines: dict[bool, slots_lib.SlotEngine], plan: dict) -> dict:
    """What must be equal in every process: the plan and each engine's shapes."""
    return {"plan": plan, "engines": {
        NAMES[g]: {"slots": e.slots, "capacity": e.capacity, "prefill_chunk": e.prefill_chunk,
                   "rides": e.rides, "store": None if e.store is None else e.store.size}
        for g, e in engines.items()}}


class Followers:
    """Process 0's side: sends each call to the followers (from the engine thread only: the
    broadcasts of every process must come in one order)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.last_sent = time.monotonic()

    def send(self, op: str, engine: bool | None = None, **args) -> None:
        with self._lock:
            distributed.broadcast_work({"op": op, "engine": None if engine is None
                                        else NAMES[engine], "args": args})
            self.last_sent = time.monotonic()

    def idle(self) -> None:
        """Called by the engine thread while no request runs: "idle" now and then."""
        if time.monotonic() - self.last_sent >= KEEPALIVE_SECONDS:
            self.send("idle")

    def stop(self, error: BaseException | None = None) -> None:
        """The last message: the followers return (with `error`: raise `FollowerError`)."""
        self.send("stop", error=None if error is None else f"{type(error).__name__}: {error}")


class Leader:
    """A `SlotEngine` on process 0 of a multi-host server: the calls that run programs are
    sent to the followers first (`Followers.send`), then made here; everything else is
    the engine's own (attributes read and set go to it)."""

    def __init__(self, engine: slots_lib.SlotEngine, followers: Followers):
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_followers", followers)
        object.__setattr__(self, "_pass_cost", None)

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def __setattr__(self, name, value):
        setattr(self._engine, name, value)

    def _send(self, op: str, **args) -> None:
        self._followers.send(op, self._engine.greedy, **args)

    def admit(self, slot: int, request: slots_lib.SlotRequest) -> None:
        self._engine.admit(slot, request)  # no program; sent once it is accepted
        self._send("admit", slot=slot, request=request_json(request))

    def prefill(self, max_chunks: int | None = None, small: bool = False) -> int:
        self._send("prefill", max_chunks=max_chunks, small=small)
        return self._engine.prefill(max_chunks, small=small)

    def insert(self, slot: int, request: slots_lib.SlotRequest) -> None:
        self.admit(slot, request)
        self.prefill()

    def cancel(self, slot: int) -> None:
        self._send("cancel", slot=slot)
        self._engine.cancel(slot)

    def use_pass_cost(self, cost, source: str) -> None:
        """As the engine's; the followers get it with the next `generate`."""
        object.__setattr__(self, "_pass_cost", (cost, source))
        self._engine.use_pass_cost(cost, source)

    def generate(self, max_rounds: int, ride: bool = False, small: bool = True,
                 rows: tuple[int | None, int] | None = None) -> list[slots_lib.SlotUpdate]:
        rows = self._engine.rows_planned(ride) if rows is None else rows
        pending = self.__dict__["_pass_cost"]
        object.__setattr__(self, "_pass_cost", None)
        self._send("generate", max_rounds=max_rounds, ride=ride, small=small, rows=list(rows),
                   pass_cost=None if pending is None else
                   [pass_cost_json(pending[0]), pending[1]])
        return self._engine.generate(max_rounds, ride=ride, small=small, rows=rows)

    def warm_up(self, rows: tuple[int, ...] | None = None, on_phase=None,
                riding: tuple[int, ...] | None = None) -> int:
        engine = self._engine
        rows = engine.active_rows if rows is None else tuple(rows)
        riding = tuple(r for r in rows if r in engine.ride_rows) if riding is None else riding
        self._send("warm_up", rows=list(rows), riding=list(riding),
                   compile_on_demand=engine.compile_on_demand)
        return engine.warm_up(rows, on_phase, riding)

    def counters(self):
        if sharding.gathers(self._engine.state.counters):  # else read here alone
            self._send("counters")
        return self._engine.counters()


def lead(engines: dict[bool, slots_lib.SlotEngine], plan: dict
         ) -> tuple[dict[bool, Leader], Followers]:
    """Process 0's engines, each wrapped in a `Leader`, and the `Followers` they send to;
    first sends the followers the plan and shapes to check, and the pass costs to use."""
    followers = Followers()
    followers.send("start", **_settings(engines, plan), pass_costs={
        NAMES[g]: [pass_cost_json(e.req.lookup_cost), e.pass_cost_source]
        for g, e in engines.items()})
    return {g: Leader(e, followers) for g, e in engines.items()}, followers


def _apply(engine: slots_lib.SlotEngine, op: str, args: dict) -> None:
    if op == "admit":
        engine.admit(args["slot"], request_from_json(args["request"]))
    elif op == "prefill":
        engine.prefill(args["max_chunks"], small=args["small"])
    elif op == "cancel":
        engine.cancel(args["slot"])
    elif op == "generate":
        if args["pass_cost"] is not None:
            cost, source = args["pass_cost"]
            engine.use_pass_cost(pass_cost_from_json(cost), source)
        riding, rows = args["rows"]
        engine.generate(args["max_rounds"], ride=args["ride"], small=args["small"],
                        rows=(riding, rows))
    elif op == "warm_up":
        engine.compile_on_demand = args["compile_on_demand"]
        engine.warm_up(tuple(args["rows"]), riding=tuple(args["riding"]))
    elif op == "counters":
        engine.counters()
    else:
        raise FollowerError(f"process 0 sent an unknown call {op!r}")


def _receive() -> dict:
    """Process 0's next message; `FollowerError` where it is gone (its collective failed)."""
    try:
        return distributed.broadcast_work(None)
    except Exception as e:  # noqa: BLE001 - gloo: "Connection closed by peer"
        raise FollowerError(f"lost process 0 ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''})") from e


def follow(engines: dict[bool, slots_lib.SlotEngine], plan: dict) -> dict[str, int]:
    """A follower's server: makes process 0's calls on `engines` (built as process 0 built
    its own, with the same `plan`) until it sends "stop"; returns the calls made, by name.
    Raises `FollowerError` when process 0 serves another plan or shapes, is gone, or
    stopped on an error."""
    by_name = {name: g for g, name in NAMES.items()}
    start = _receive()
    if start["op"] != "start":
        raise FollowerError(f"process 0 sent {start['op']!r} before its plan")
    mine, theirs = _settings(engines, plan), {k: start["args"][k] for k in ("plan", "engines")}
    if mine != theirs:
        raise FollowerError(f"process {distributed.process_index()} would serve {mine}, "
                            f"process 0 serves {theirs}: give every process the same "
                            "command, model and files")
    for name, (cost, source) in start["args"]["pass_costs"].items():
        engines[by_name[name]].use_pass_cost(pass_cost_from_json(cost), source)
    calls: dict[str, int] = {}
    while True:
        work = _receive()
        op, args = work["op"], work["args"]
        if op == "stop":
            if args["error"] is not None:
                raise LeaderFailed(f"process 0's engine failed ({args['error']})")
            return calls
        if op != "idle":
            _apply(engines[by_name[work["engine"]]], op, args)
        calls[op] = calls.get(op, 0) + 1
