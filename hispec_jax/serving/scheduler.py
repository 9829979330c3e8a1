"""Continuous batching: one engine thread moves requests through the slots of two
`SlotEngine`s (greedy requests in one, sampling requests in the other: `greedy` is a static
property of a compiled loop).

    HTTP handlers --submit(job)--> waiting (FIFO per engine)
                                      |  a slot is free: admit (the prompt waits in it)
                                      v
    engine thread:  loop { admit waiting jobs into free slots; cancel abandoned ones;
                           with no slot decoding, prefill the oldest admitted prompt
                           whole, in full chunks; else prefill chunks for about
                           prefill_share of the last round's time (or, on an engine
                           built with ride_prefill, let a chunk ride the round);
                           generate(rounds_per_step) on each engine with decoding slots;
                           hand each job its new tokens }  --events--> job's asyncio queue

A long prompt enters its slot chunk by chunk while the other slots decode, so their
streams pause for a few chunks at a time, not for its whole prefill. The pause is a time
budget: chunks run until their time reaches `prefill_share` times the engine's last round
(at least one chunk a step), each a full chunk of C positions where the last one measured
fits what is left of the budget, else a small one (t = C / 4, at least 16). So the gap
between two of a stream's token deliveries stays within (1 + prefill_share) rounds (one
small chunk more at most), and the waiting prompts get a share of the time that grows with
the rounds: speculation's longer rounds do not starve them.

    step:  | chunk | chunk |  round of the decoding slots  | chunk | ...
           |<-- <= prefill_share x last round -->|

An engine built with `ride_prefill` (AR, prompt lookup: a round is one pass over every
layer) lets the next chunk of the oldest waiting prompt ride each round's pass instead
(`SlotEngine.generate(ride=True)`): the streams wait for the chunk's extra compute, about
a quarter of a round for a small chunk on a CPU, not a second pass. The same budget picks
its size: a full chunk of C positions rides while prompts queue, where the rounds it rode
took at most (1 + prefill_share) times the engine's steps (medians of the last few:
`_ride_small`), else a small one of t, so a queue of prompts enters as fast as the
streams' gaps allow (docs/serving.md).

    riding:  | round + chunk | round + chunk | round + chunk + finish | round | ...

A job's events are `("tokens", [ids])` and finally `("done", finish_reason)` with
finish_reason "stop" (EOS / end of turn), "length" (max_tokens) or "cancelled".
A handler that stops listening (client gone, stop string matched) calls `cancel`: the slot
is freed before the next round.

With a warm-up, the engine thread runs it first and only then takes requests (`ready`):
requests submitted meanwhile wait in the queue. The thread records what it hands out in
`stats` (`metrics.ServingStats`, read by /health and /metrics without waiting for a step),
and with a step log each engine step as one JSON line (`StepLog`): what made a gap in the
streams long, a prompt's chunks or a slow round.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import json
import logging
import statistics
import threading
import time
from typing import TextIO

import jax

from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.decoding.suffix_store import NO_SCOPE
from hispec_jax.serving import metrics as metrics_lib
from hispec_jax.decoding import slots as slots_lib

log = logging.getLogger("hispec.serve")

# What `Scheduler._ride_small` compares: the median of the last RIDE_SAMPLES rounds a full
# chunk rode against the median of an engine's last STEP_SAMPLES steps; a full chunk
# rides its first RIDE_PROBES times, and once more after RIDE_REPROBE small chunks rode
# in a row, to be measured again.
RIDE_SAMPLES = 8
STEP_SAMPLES = 32
RIDE_PROBES = 3
RIDE_REPROBE = 64


@dataclasses.dataclass(eq=False)
class Job:
    """One request inside the server.

    Attributes:
      prompt_ids: the prompt's token ids.
      max_new_tokens: the token budget.
      sampling: temperature (0: greedy engine), top_k, top_p, seed.
      loop, queue: where the engine thread delivers events (thread-safe hand-off).
      cancel_reason: the finish reason a cancellation counts as ("cancelled", or "stop"
        when a stop string ended the request).
      last_token_at: when the job's latest tokens were handed out (inter-token latency).
      ignore_eos, min_tokens: vLLM's extensions (`slots.SlotRequest`): run past EOS; no
        EOS before this many new tokens.
      scope: the scope of earlier requests' tokens it drafts from and enters
        (`slots.SlotRequest.scope`).
    """

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    id: int = dataclasses.field(default_factory=itertools.count().__next__)
    submitted: float = dataclasses.field(default_factory=time.perf_counter)
    cancelled: bool = False
    cancel_reason: str = "cancelled"
    last_token_at: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    scope: int = NO_SCOPE

    def deliver(self, event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed (shutdown)
            pass


class StepLog:
    """Each engine step as one JSON line of `stream` (`hispec serve --step-log`):

        {"time": 1764388800.12, "engine": "greedy", "decoding": 7, "prompts": 2, "rows": 8,
         "chunks": [], "rider": 16, "prefill_seconds": 0.0, "round_seconds": 0.083,
         "tokens": 9, "proposed": [11], "accepted": [4]}

    time: wall-clock seconds (`time.time()`) at the step's start; decoding: slots decoding
    in its round; prompts: prompts admitted and not yet prefilled when it started; rows:
    the batch rows its round ran (`SlotEngine.rows_for`); chunks: the positions of each
    prefill chunk it ran before the round; rider: the positions of the chunk that rode its
    round (null: none); tokens: the new tokens the round handed out;
    proposed, accepted: per verifying level (1 .. K-1; none for AR), the tokens submitted
    to it in the round and those it accepted (the engine's `proposed_K`, `accepted_K`).
    A gap between two tokens of a stream is the prefill and the round of one step, so a
    log read beside a client's latencies says which of the two made a gap long
    (`bench.serve_load.step_summary`)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self._lock = threading.Lock()

    def write(self, record: dict) -> None:
        with self._lock:
            self.stream.write(json.dumps(record) + "\n")
            self.stream.flush()


class Scheduler:
    """The engine thread and its two slot engines.

    Args:
      engines: {True: the greedy SlotEngine, False: the sampling SlotEngine}.
      rounds_per_step: speculation rounds per `generate` call (1: a new request waits at
        most one round for a slot to be looked at).
      prefill_share: where no chunk rides an engine's rounds, the prefill time
        between two `generate` calls while some of its slots decode, as a multiple of its
        last `generate` call's time (at least one chunk; with no slot decoding, the oldest
        admitted prompt is prefilled whole: it holds up no stream); where chunks ride, a full
        chunk rides while prompts queue, where its rounds take at most (1 + prefill_share)
        times the engine's steps, else a small one (`_ride_small`). Larger: the waiting
        prompts' first tokens sooner, longer pauses in the streams.
      warmup: None (`ready` from the start), or a callable the engine thread runs (with
        `engines`, `idle` and `stop=` the scheduler's stop event: `server.warm_up`) before
        it takes requests; `ready` is set when it returns. If it returns a thread (work
        it left running, the background compiles), `stop` joins that thread too.
      step_log: None, or a `StepLog` that gets every engine step after the warm-up.
      followers: on process 0 of a multi-host server, the `follower.Followers` its engines
        (`follower.Leader`s) send each call to: the engine thread also sends them "idle"
        while no request runs and "stop" when it ends. None: one process.

    `on_failure`, if set (`server.serve` on several hosts), is called from the engine
    thread when it fails.
    """

    def __init__(self, engines: dict[bool, slots_lib.SlotEngine], rounds_per_step: int = 1,
                 warmup=None, prefill_share: float = 1.0, step_log: StepLog | None = None,
                 followers=None):
        if not isinstance(prefill_share, (int, float)) or not prefill_share >= 0:
            raise ValueError(f"prefill_share must be a number >= 0, got {prefill_share!r}")
        self.engines = engines
        self.rounds_per_step = rounds_per_step
        self.prefill_share = float(prefill_share)
        # seconds of each engine's last `generate` call and of its last chunk of each size
        # run beside the rounds; of its last STEP_SAMPLES calls, whatever they carried, and
        # its last RIDE_SAMPLES calls with a full chunk riding; small chunks ridden since
        self._round_seconds = {g: 0.0 for g in engines}
        self._chunk_seconds: dict[tuple[bool, int], float] = {}
        self._step_seconds = {g: collections.deque(maxlen=STEP_SAMPLES) for g in engines}
        self._full_ride_seconds = {g: collections.deque(maxlen=RIDE_SAMPLES) for g in engines}
        self._small_rides = {g: 0 for g in engines}
        self._step_chunks: list[int] = []  # the chunks of the step under way, for step_log
        self._step_counters: dict = {g: None for g in engines}  # each engine's, last step
        self.step_log = step_log
        self.followers = followers
        self.on_failure = None
        self._warmup = warmup
        self.ready = threading.Event()
        if warmup is None:  # nothing to wait for: ready from the start
            self.ready.set()
        self.warmup_seconds: float | None = None
        self.warmup_compiles: int | None = None
        self._waiting = {g: collections.deque() for g in engines}
        self._running: dict[bool, dict[int, Job]] = {g: {} for g in engines}
        self._wake = threading.Condition()
        self._stopped = threading.Event()  # set by `stop`: the engine thread and the
        # warm-up's background work end
        self._background: threading.Thread | None = None  # what the warm-up left running
        self._thread = threading.Thread(target=self._run, name="hispec-engine", daemon=True)
        self.error: BaseException | None = None
        self.stats = metrics_lib.ServingStats(
            {g: e.engine.hierarchy for g, e in engines.items()},
            running=lambda: sum(len(r) for r in self._running.values()),
            waiting=lambda: sum(len(w) for w in self._waiting.values()),
            model=next((e.model for e in engines.values()), None))

    # ---- called from the server's threads ---------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the engine thread and whatever the warm-up left running (a compile under
        way finishes first), so a stopped scheduler leaves no work behind."""
        with self._wake:
            self._stopped.set()
            self._wake.notify()
        self._thread.join(timeout)
        if self._background is not None:
            self._background.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def idle(self) -> bool:
        """No request runs or waits (read from any thread without locking: a hint)."""
        return not any(self._running.values()) and not any(self._waiting.values())

    def engine_for(self, sampling: SamplingParams) -> slots_lib.SlotEngine:
        return self.engines[sampling.greedy]

    def submit(self, job: Job) -> None:
        with self._wake:
            self._waiting[job.sampling.greedy].append(job)
            self._wake.notify()

    def cancel(self, job: Job, reason: str = "cancelled") -> None:
        """The job's client stopped listening (`reason` "cancelled") or a stop string ended
        it ("stop"): free its slot (or drop it from the queue)."""
        with self._wake:
            job.cancelled, job.cancel_reason = True, reason
            self._wake.notify()

    @property
    def finished(self) -> dict[str, int]:
        """Finished requests by finish reason."""
        return self.stats.snapshot()["finished"]

    def load(self) -> dict:
        """Busy slots and waiting requests per engine (and where the pass costs its lookup
        gate weighs come from), finished requests and tokens, the process's compilations
        (for /health). Reads without waiting for a step."""
        engines = {metrics_lib.engine_label(g): {
            "slots": self.engines[g].slots, "busy": len(self._running[g]),
            "waiting": len(self._waiting[g]),
            "rows_compiled": list(self.engines[g].compiled_rows),
            "pass_cost": self.engines[g].pass_cost_source,
            "measuring_pass_cost": self.engines[g].pass_cost_pending,
            "rows_to_compile": self.engines[g].rows_to_compile()}
            for g in self.engines}
        store = next((e.store for e in self.engines.values() if e.store is not None), None)
        return {"engines": engines, **self.stats.snapshot(),
                "compiles": slots_lib.backend_compiles(),
                "cross_request_store": None if store is None else store.describe()}

    # ---- the engine thread --------------------------------------------------------------
    def _admit(self) -> bool:
        """Cancels abandoned jobs and fills free slots; returns whether any slot is busy."""
        busy = False
        for greedy, engine in self.engines.items():
            running, waiting = self._running[greedy], self._waiting[greedy]
            for slot, job in list(running.items()):
                if job.cancelled:
                    engine.cancel(slot)
                    del running[slot]
                    self.stats.finish(job.cancel_reason)
                    job.deliver(("done", "cancelled"))
            while waiting and waiting[0].cancelled:
                self._drop(waiting.popleft())
            for slot in engine.free_slots():
                while waiting and waiting[0].cancelled:
                    self._drop(waiting.popleft())
                if not waiting:
                    break
                job = waiting.popleft()
                engine.admit(slot, slots_lib.SlotRequest(
                    tuple(job.prompt_ids), job.max_new_tokens, job.sampling,
                    ignore_eos=job.ignore_eos, min_tokens=job.min_tokens, scope=job.scope))
                running[slot] = job
                self.stats.admitted(len(job.prompt_ids))
            busy |= bool(running)
        return busy

    def _warm_up(self) -> None:
        """Runs the warm-up, then takes the engines' counters as the metrics' baseline."""
        if self._warmup is not None:
            t0, before = time.perf_counter(), slots_lib.backend_compiles()
            left = self._warmup(self.engines, self.idle, stop=self._stopped)
            if isinstance(left, threading.Thread):
                self._background = left
            self.warmup_seconds = time.perf_counter() - t0
            self.warmup_compiles = slots_lib.backend_compiles() - before
            log.info("warm-up compiled %d programs in %.1f s; ready", self.warmup_compiles,
                     self.warmup_seconds)
        for greedy, engine in self.engines.items():
            self._step_counters[greedy] = engine.counters()
            self.stats.engine_counters(greedy, self._step_counters[greedy])
        self.ready.set()

    def _prefill_chunk(self, greedy: bool, engine: slots_lib.SlotEngine, small: bool) -> float:
        """Runs the next prefill chunk to completion; returns its seconds (also kept, by
        chunk size, for `_prefill_beside_rounds`)."""
        size = engine.next_chunk(small)
        t0 = time.perf_counter()
        engine.prefill(1, small=small)
        # wait for it, to time it: the round after it would wait for it anyway (one
        # device, one cache), so only the next round's dispatch overlaps less
        jax.block_until_ready(engine.state.cache)
        seconds = time.perf_counter() - t0
        if size is not None:
            self._chunk_seconds[greedy, size] = seconds
            self._step_chunks.append(size)
        return seconds

    def _prefill_beside_rounds(self, greedy: bool, engine: slots_lib.SlotEngine) -> None:
        """Prefill chunks while `engine`'s slots decode, until their time reaches
        `prefill_share` times its last round's: a full chunk where its last measured time
        fits what is left, else a small one; at least one chunk."""
        budget = self.prefill_share * self._round_seconds[greedy]
        spent = 0.0
        while engine.prefilling:
            left = budget - spent
            full = self._chunk_seconds.get((greedy, engine.next_chunk(small=False)))
            small = full is None or full > left
            if spent > 0 and small:
                guess = self._chunk_seconds.get((greedy, engine.next_chunk(small=True)))
                if guess is None or guess > left:
                    break
            spent += self._prefill_chunk(greedy, engine, small)
            if spent >= budget:
                break

    def _ride_small(self, greedy: bool, engine: slots_lib.SlotEngine) -> bool:
        """Whether a small chunk rides the next round rather than a full one. A full one
        rides only while prompts queue (two or more admitted and waiting: one prompt at a
        time enters fast enough in small chunks, which keep the streams' gaps even), and
        where the rounds it rode took at most (1 + prefill_share) times the engine's steps
        (the streams' gaps, whatever the steps carried): medians of the last RIDE_SAMPLES
        and STEP_SAMPLES, so one slow round on a busy machine decides nothing. It rides its
        first RIDE_PROBES times, and after RIDE_REPROBE small chunks in a row, to be
        measured. Where the rest of the prompt is no full chunk: a small one."""
        if (len(engine.prefilling) < 2
                or engine.next_chunk(small=False) == engine.next_chunk(small=True)):
            return True
        riding = self._full_ride_seconds[greedy]
        if len(riding) < RIDE_PROBES or self._small_rides[greedy] >= RIDE_REPROBE:
            return False
        return statistics.median(riding) > (1 + self.prefill_share) * statistics.median(
            self._step_seconds[greedy])

    def _drop(self, job: Job) -> None:
        """A job cancelled while it waited."""
        self.stats.finish(job.cancel_reason)
        job.deliver(("done", "cancelled"))

    def _end_followers(self) -> None:
        """On several hosts: "stop" to the followers (with the error, if the engine thread
        failed), then `on_failure` after a failure: a server whose processes no longer run
        together stops."""
        if self.followers is None:
            return
        try:
            self.followers.stop(self.error)
        except Exception:  # noqa: BLE001 - a follower that died: JAX ends the processes
            log.exception("telling the followers to stop failed")
        if self.error is not None:
            log.error("the engine thread failed on process 0 of a multi-host server: "
                      "stopping the server (every process runs each step together)")
            if self.on_failure is not None:
                self.on_failure()

    def _run(self) -> None:
        try:
            self._warm_up()
            while True:
                with self._wake:
                    if self._stopped.is_set():
                        break
                    busy = self._admit()
                    if not busy:
                        self._wake.wait(timeout=0.5)
                if not busy:
                    if self.followers is not None:
                        self.followers.idle()
                    continue
                for greedy, engine in self.engines.items():
                    if not self._running[greedy]:
                        continue
                    started, prompts = time.time(), len(engine.prefilling)
                    self._step_chunks = []
                    t_prefill = time.perf_counter()
                    # a chunk rides the round where the engine lets it, else chunks run
                    # beside the round
                    ride = engine.riding_rows() is not None
                    if engine.decoding and not ride:
                        self._prefill_beside_rounds(greedy, engine)
                    while engine.prefilling and not engine.decoding:  # it holds up no stream
                        self._prefill_chunk(greedy, engine, small=False)
                    decoding = len(engine.decoding)
                    small = ride and self._ride_small(greedy, engine)
                    t0 = time.perf_counter()
                    updates = engine.generate(self.rounds_per_step, ride=ride, small=small)
                    seconds = self._round_seconds[greedy] = time.perf_counter() - t0
                    self._step_seconds[greedy].append(seconds)
                    if engine.last_rider is not None and not small:
                        self._full_ride_seconds[greedy].append(seconds)
                        self._small_rides[greedy] = 0
                    elif engine.last_rider is not None:
                        self._small_rides[greedy] += 1
                    counters = engine.counters()
                    self.stats.engine_counters(greedy, counters)
                    if self.step_log is not None:
                        last, self._step_counters[greedy] = self._step_counters[greedy], counters
                        # tokens submitted to / accepted by each verifying level this step
                        proposed, accepted = (
                            [int(x) for x in (getattr(counters, f) - getattr(last, f))[1:]]
                            for f in ("proposed_K", "accepted_K"))
                        self.step_log.write({
                            "time": started, "engine": "greedy" if greedy else "sampling",
                            "decoding": decoding, "prompts": prompts, "rows": engine.last_rows,
                            "chunks": self._step_chunks, "rider": engine.last_rider,
                            "prefill_seconds": t0 - t_prefill,
                            "round_seconds": self._round_seconds[greedy],
                            "tokens": sum(len(u.new_token_ids) for u in updates),
                            "proposed": proposed, "accepted": accepted})
                    now = time.perf_counter()
                    for update in updates:
                        with self._wake:
                            job = self._running[greedy].get(update.slot)
                            if update.done:
                                self._running[greedy].pop(update.slot, None)
                        if job is None:
                            continue
                        if update.new_token_ids:
                            self.stats.delivered(job, len(update.new_token_ids), now)
                            job.deliver(("tokens", update.new_token_ids))
                        if update.done:
                            reason = "stop" if update.hit_eos else "length"
                            self.stats.finish(reason)
                            job.deliver(("done", reason))
        except BaseException as e:  # noqa: BLE001 - reported to every waiting client
            log.exception("engine thread failed")
            self.error = e
        finally:
            with self._wake:
                for greedy in self.engines:
                    for job in list(self._running[greedy].values()) + list(self._waiting[greedy]):
                        self.stats.finish("error" if self.error else "cancelled")
                        job.deliver(("done", "error" if self.error else "cancelled"))
                    self._running[greedy].clear()
                    self._waiting[greedy].clear()
            self._end_followers()
