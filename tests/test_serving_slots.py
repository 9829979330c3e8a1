"""Resumable engine runs and slots (decoding/slots.py) on the shipped default model: a request
inserted into a slot while other slots decode gets exactly its offline `generate` tokens."""

from __future__ import annotations

import types

import numpy as np
import pytest

import hispec_jax
from hispec_jax.decoding import engine as engine_lib
from hispec_jax.decoding import methods as methods_lib
from hispec_jax.decoding.generate import plan_shapes
from test_engine_step import make_request
from hispec_jax.decoding.sampling import SamplingParams
from hispec_jax.decoding.slots import SlotEngine, SlotRequest, active_rows

from conftest import shipped_model_scanned

PROMPTS = ["Once upon a time", "The cat sat on the mat and", "Hello",
           "In the beginning the world was dark and cold, and people",
           "Why is the sky blue?"]
BUDGETS = [12, 5, 9, 3, 7]


@pytest.fixture(scope="module")
def model():
    return shipped_model_scanned()


def _offline(model, method, **kw):
    return [hispec_jax.generate(model, p, method=method, max_new_tokens=n, **kw).token_ids[0]
            for p, n in zip(PROMPTS, BUDGETS)]


def _interleaved(model, method, slots, sampling=lambda i: SamplingParams(), rounds=2):
    """Requests enter free slots as others finish; returns each request's tokens."""
    decoder = methods_lib.make_method(model, method, greedy=sampling(0).greedy)
    eng = SlotEngine(model, decoder, slots=slots, capacity=128, greedy=sampling(0).greedy,
                     eos_ids=model.eos_token_ids)
    ids = [list(model.tokenizer(p)["input_ids"]) for p in PROMPTS]
    waiting = list(range(len(PROMPTS)))
    owner, got = {}, {i: [] for i in waiting}
    while waiting or owner:
        for slot in eng.free_slots():
            if waiting:
                i = waiting.pop(0)
                eng.insert(slot, SlotRequest(tuple(ids[i]), BUDGETS[i], sampling(i)))
                owner[slot] = i
        for u in eng.generate(rounds):
            got[owner[u.slot]] += u.new_token_ids
            if u.done:
                del owner[u.slot]
    return [got[i] for i in range(len(PROMPTS))]


@pytest.mark.parametrize("method", ["ar", "layerskip", "hispec"])
def test_interleaved_slots_equal_offline_generate(model, method):
    assert _interleaved(model, method, slots=2) == _offline(model, method)


def test_sampling_slots_equal_offline_generate_with_the_same_seed(model):
    def sampling(i):
        return SamplingParams(temperature=[0.7, 1.0, 0.9, 1.2, 0.8][i], top_k=[0, 50, 0, 20, 0][i],
                              top_p=[1.0, 0.9, 0.95, 1.0, 0.8][i], seed=100 + i)
    got = _interleaved(model, "hispec", slots=3, sampling=sampling, rounds=1)
    want = [hispec_jax.generate(model, p, method="hispec", max_new_tokens=n,
                                temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                seed=s.seed).token_ids[0]
            for p, n, s in zip(PROMPTS, BUDGETS, map(sampling, range(5)))]
    assert got == want


def test_cancel_frees_the_slot_and_leaves_the_others(model):
    decoder = methods_lib.make_method(model, "layerskip")
    eng = SlotEngine(model, decoder, slots=2, capacity=128, greedy=True,
                     eos_ids=model.eos_token_ids)
    ids = [tuple(model.tokenizer(p)["input_ids"]) for p in PROMPTS[:2]]
    eng.insert(0, SlotRequest(ids[0], 12))
    eng.insert(1, SlotRequest(ids[1], 24))  # still running after a round (up to Nd + 1 tokens)
    eng.generate(1)
    eng.cancel(0)
    assert eng.free_slots() == [0]
    eng.insert(0, SlotRequest(ids[0], 12))
    got = {0: [], 1: []}
    while not all(not b for b in eng.busy) or not got[0]:
        for u in eng.generate(3):
            got[u.slot] += u.new_token_ids
    assert got[0] == _offline(model, "layerskip")[0]


def test_the_rounds_run_only_the_rows_up_to_the_last_decoding_slot():
    """With slots 0 and 2 of 4 decoding, the rounds loop runs rows [0, 4); once slot 2 is
    done, row 0 alone. The tokens stay offline generate's (the lookup gate prices the rows
    the loop runs), and every row count was compiled by the warm-up."""
    from test_engine import tiny_model

    from hispec_jax.decoding.slots import backend_compiles

    assert [active_rows(b) for b in (1, 3, 4, 8)] == [(1,), (1, 2, 3), (1, 2, 4),
                                                      (1, 2, 4, 8)]
    model = tiny_model(4, 1, max_len=128)
    rng, V = np.random.RandomState(1), model.cfg.vocab_size
    motif = rng.randint(4, V, 5).tolist()
    prompts = [(motif * 4)[:18], rng.randint(4, V, 7).tolist()]
    decoder = methods_lib.make_method(model, "lookup", lookup=4)
    eng = SlotEngine(model, decoder, slots=4, capacity=96, greedy=True,
                     eos_ids=model.eos_token_ids)
    eng.warm_up()
    compiled = backend_compiles()
    eng.insert(0, SlotRequest(tuple(prompts[0]), 24))  # at most 5 tokens a round: 5 or more
    eng.insert(2, SlotRequest(tuple(prompts[1]), 2))
    rows, got = [], {0: [], 2: []}
    while any(eng.busy):
        for u in eng.generate(1):
            got[u.slot] += u.new_token_ids
        rows.append(eng.last_rows)
    assert rows[0] == 4 and rows[-1] == 1, rows
    assert backend_compiles() == compiled
    want = [hispec_jax.generate(model, [p], method="lookup", lookup=4, max_new_tokens=n
                                ).token_ids[0] for p, n in [(prompts[0], 24), (prompts[1], 2)]]
    assert [got[0], got[2]] == want


def test_prepare_loads_every_program_the_warm_up_runs():
    """`SlotEngine.prepare` compiles (in a thread pool, from shapes alone) the whole fixed
    set: each prefill chunk, finish, cancel, a rounds loop per row count and the round over
    all rows a prefill chunk rides; the warm-up that runs them afterwards adds no program."""
    from test_engine import tiny_model

    from hispec_jax.decoding.engine import compile_cache

    model = tiny_model(4, 1, max_len=128)
    eng = SlotEngine(model, methods_lib.make_method(model, "ar"), slots=2, capacity=88,
                     greedy=True, eos_ids=model.eos_token_ids,  # a capacity no test shares
                     ride_prefill=True)
    assert len(eng._chunks()) == 2  # the small chunk and the full one
    before = len(compile_cache._PROGRAMS)
    ready = []
    eng.prepare(on_ready=lambda k, n: ready.append((k, n)))
    assert ready == [(k, 8) for k in range(1, 9)]
    # chunks, finish, cancel, the rounds per row count, the round a chunk of each size
    # rides (all rows)
    assert len(compile_cache._PROGRAMS) - before == 2 + 1 + 1 + 2 + 2
    assert eng.compiled_rows == (1, 2) and list(eng.ride_rows) == [2]
    assert sorted(eng._riding) == [(2, 16), (2, eng.prefill_chunk)]
    after = len(compile_cache._PROGRAMS)
    eng.warm_up()
    assert len(compile_cache._PROGRAMS) == after


def test_run_rounds_resumes_to_the_uninterrupted_run(model):
    """Engine.run_rounds, one bound at a time, ends where Engine.run ends (sampling:
    the same tokens for the same seed), with one compilation for every bound."""
    import jax

    sampling = SamplingParams(temperature=0.9, seed=3)
    decoder = methods_lib.make_method(model, "hispec", greedy=False)
    ids = [list(model.tokenizer(p)["input_ids"]) for p in PROMPTS[:3]]
    block, capacity = plan_shapes(max(map(len, ids)), 10, decoder.lookahead(), 2048, None)
    eng = engine_lib.Engine.for_model(model, decoder.hierarchy, engine_lib.Shapes(
        batch=3, capacity=capacity, prompt_block=block), greedy=False)
    req = make_request(ids, 3, 0, capacity, 10, np.asarray([-1], np.int32), sampling)
    windows = decoder.windows_array()
    out, _, _ = jax.jit(eng.run)(model.params, model.heads, req, eng.empty_cache(), windows)
    state = jax.jit(eng.init_state)(model.params, model.heads, req, eng.empty_cache(), windows)
    rounds = jax.jit(eng.run_rounds)
    for bound in [1, 2, 1, 3] + [100]:
        state = rounds(model.params, model.heads, req, state, np.int32(bound))
    assert rounds._cache_size() == 1
    np.testing.assert_array_equal(state.out.tokens_BxS, out.tokens_BxS)
    np.testing.assert_array_equal(state.out.num_new_B, out.num_new_B)


# ---- chunked prefill on tiny random models ------------------------------------------------
# (method, options, sampling, small chunks only: as the server prefills beside decoding slots)
CHUNKED = [("ar", {}, SamplingParams(), False),
           ("lookup", dict(lookup=4), SamplingParams(), True),
           ("hispec", dict(draft_exit=1, verify_exits=(2,), verify_window=2), SamplingParams(),
            False),
           ("layerskip", dict(draft_exit=2), SamplingParams(temperature=0.9, top_k=20, seed=7),
            True)]


@pytest.mark.parametrize("method,options,sampling,small", CHUNKED, ids=[c[0] for c in CHUNKED])
def test_a_long_prompt_enters_in_chunks_while_the_other_slots_decode(method, options, sampling,
                                                                    small):
    """A prompt of 70 positions is prefilled one chunk per step between the rounds of two
    decoding slots, in 3 chunks (two full ones of 32 positions, a small one of 16) or, with
    `small`, 5 small ones (other chunk boundaries than offline prefill's): every request
    gets its offline `generate` tokens (sampling: with the same seed), the decoding slots
    emit tokens during the prefill, and a prompt of another length compiles nothing more."""
    from test_engine import tiny_model

    from hispec_jax.decoding.slots import backend_compiles

    model = tiny_model(4, 1, max_len=128)
    rng, V = np.random.RandomState(0), model.cfg.vocab_size
    motif = rng.randint(4, V, 6).tolist()
    prompts = [rng.randint(4, V, 5).tolist(), rng.randint(4, V, 9).tolist(),
               (motif * 12)[:70], rng.randint(4, V, 23).tolist()]
    budget = 16
    decoder = methods_lib.make_method(model, method, greedy=sampling.greedy, **options)
    eng = SlotEngine(model, decoder, slots=3, capacity=112, greedy=sampling.greedy,
                     eos_ids=model.eos_token_ids, prefill_chunk=32)
    got = {i: [] for i in range(len(prompts))}
    owner = {}

    def step():
        for u in eng.generate(1):
            got[owner[u.slot]] += u.new_token_ids
            if u.done:
                del owner[u.slot]

    def request(i):  # sequence i of offline generate's batch (its PRNG key)
        return SlotRequest(tuple(prompts[i]), budget, sampling, sequence_index=i)

    for i in (0, 1):
        eng.insert(i, request(i))
        owner[i] = i
    step()
    eng.admit(2, request(2))
    owner[2] = 2
    before = {i: len(got[i]) for i in (0, 1)}
    chunks = 0
    while eng.prefilling:
        chunks += eng.prefill(1, small=small)
        step()
    assert chunks == (5 if small else 3) and all(len(got[i]) > before[i] for i in (0, 1))
    while owner:
        step()
    compiled = backend_compiles()
    eng.admit(2, request(3))  # rows [0, 3), as the rounds of the long prompt: compiled
    eng.prefill(small=small)  # chunks of the sizes this test ran (no other test's)
    owner[2] = 3
    while owner:
        step()
    assert backend_compiles() == compiled
    want = hispec_jax.generate(model, prompts, method=method, max_new_tokens=budget,
                               temperature=sampling.temperature, top_k=sampling.top_k,
                               seed=sampling.seed, **options).token_ids
    assert [got[i] for i in range(len(prompts))] == want


RIDING = [("ar", {}, SamplingParams()), ("lookup", dict(lookup=4), SamplingParams()),
          ("ar", {}, SamplingParams(temperature=0.9, top_k=20, seed=7)),
          ("lookup", dict(lookup=4), SamplingParams(temperature=0.8, seed=3))]


@pytest.mark.parametrize("method,options,sampling", RIDING,
                         ids=["ar", "lookup", "ar-sampling", "lookup-sampling"])
def test_a_prompt_rides_the_rounds_of_the_decoding_slots(method, options, sampling):
    """Where a round is one pass over every layer (AR, prompt lookup), a waiting prompt's
    chunks ride the decoding slots' rounds (`generate(ride=True)`, over all 4 rows): a
    prompt of 70 positions in slot 1 in full chunks of C = 32 and a last small one of t = 16
    (3 rounds) while slot 0 decodes, then one of 23 in slot 3 in small chunks (2 rounds)
    while slots 0-2 decode; the decoding slots emit a token every round and every request
    gets its offline `generate` tokens (sampling: with the same seed)."""
    from test_engine import tiny_model

    model = tiny_model(4, 1, max_len=128)
    rng, V = np.random.RandomState(0), model.cfg.vocab_size
    motif = rng.randint(4, V, 6).tolist()
    prompts = [rng.randint(4, V, 5).tolist(), (motif * 12)[:70], rng.randint(4, V, 9).tolist(),
               rng.randint(4, V, 23).tolist()]
    budget = 16
    decoder = methods_lib.make_method(model, method, greedy=sampling.greedy, **options)
    eng = SlotEngine(model, decoder, slots=4, capacity=112, greedy=sampling.greedy,
                     eos_ids=model.eos_token_ids, prefill_chunk=32, ride_prefill=True)
    assert eng.rides and eng._small_chunk == 16
    got = {i: [] for i in range(len(prompts))}
    owner = {}

    def step(ride=False, small=True):
        updates = eng.generate(1, ride=ride, small=small)
        for u in updates:
            got[owner[u.slot]] += u.new_token_ids
            if u.done:
                del owner[u.slot]
        return updates

    def request(i):  # sequence i of offline generate's batch (its PRNG key)
        return SlotRequest(tuple(prompts[i]), budget, sampling, sequence_index=i)

    def ride_in(i, slot, rows, riders, small):
        eng.admit(slot, request(i))
        owner[slot] = i
        rode = []
        while eng.prefilling:
            assert eng.riding_rows() == rows
            decoding = len(eng.decoding)
            updates = step(ride=True, small=small)
            assert eng.last_rows == rows
            assert sum(len(u.new_token_ids) > 0 for u in updates) == decoding
            rode.append(eng.last_rider)
        assert rode == riders and slot in eng.decoding

    eng.insert(0, request(0))
    owner[0] = 0
    step()
    ride_in(1, 1, 4, [32, 32, 16], small=False)
    eng.insert(2, request(2))
    owner[2] = 2
    ride_in(3, 3, 4, [16, 16], small=True)
    while owner:
        step()
    want = hispec_jax.generate(model, prompts, method=method, max_new_tokens=budget,
                               temperature=sampling.temperature, top_k=sampling.top_k,
                               seed=sampling.seed, **options).token_ids
    assert [got[i] for i in range(len(prompts))] == want


def test_a_round_of_several_levels_carries_no_prompt():
    """HiSpec's round runs several passes over parts of the layers: no chunk rides it, even
    asked to (the scheduler prefills beside its rounds instead); nor does any round of an
    engine not asked to."""
    from test_engine import tiny_model

    model = tiny_model(4, 1, max_len=128)
    decoder = methods_lib.make_method(model, "hispec", draft_exit=1, verify_exits=(2,),
                                      verify_window=2)
    eng = SlotEngine(model, decoder, slots=2, capacity=64, greedy=True,
                     eos_ids=model.eos_token_ids, ride_prefill=True)
    eng.insert(0, SlotRequest((5, 6, 7), 8))
    eng.admit(1, SlotRequest(tuple(range(4, 40)), 4))
    assert not eng.rides and eng.riding_rows() is None
    eng.generate(1, ride=True)
    assert eng.last_rider is None and eng.prefilling == [1]
    ar = SlotEngine(model, methods_lib.make_method(model, "ar"), slots=2, capacity=64,
                    greedy=True, eos_ids=model.eos_token_ids)
    assert not ar.rides and ar.ride_rows == ()


def test_the_server_warm_up_loads_stored_row_counts_and_compiles_the_rest_when_quiet(
        tmp_path, monkeypatch):
    """`server.warm_up` compiles the loop over all B slots before readiness, and the smaller
    row counts and the rounds a prefill chunk rides in a background thread that waits for
    a quiet server and ends, compiling nothing more, when the server stops; a later server (here: an engine of the same
    description) finds them in the program cache and loads every one before readiness,
    leaving nothing to compile beside its first requests."""
    import threading
    import time

    from test_engine import tiny_model

    from hispec_jax.decoding.engine import compile_cache
    from hispec_jax.serving import server as server_lib

    monkeypatch.setattr(compile_cache, "PROGRAM_CACHE", str(tmp_path))
    monkeypatch.setattr(server_lib, "QUIET_SECONDS", 0.3)
    model = tiny_model(2, 0, max_len=128)

    def engines():
        return {True: SlotEngine(model, methods_lib.make_method(model, "ar"), slots=2,
                                 capacity=80, greedy=True, eos_ids=(), ride_prefill=True)}

    first, busy = engines(), [True]
    assert not first[True].rounds_stored(1)
    thread = server_lib.warm_up(first, idle=lambda: not busy[0])
    assert first[True].compiled_rows == (2,) and first[True].rows_to_compile() == [1, 2]
    time.sleep(1.0)  # busy: the background compile waits
    assert first[True].compiled_rows == (2,) and thread.is_alive()
    busy[0] = False
    thread.join(120)
    # then the loop over 1 slot, then the round over both slots a chunk rides
    assert first[True].compiled_rows == (1, 2) and first[True].rows_to_compile() == []
    # a server stopping before it was quiet (a program cache without the loop over 1 slot)
    monkeypatch.setattr(compile_cache, "PROGRAM_CACHE", str(tmp_path / "other"))
    stopped, stop = engines(), threading.Event()
    thread = server_lib.warm_up(stopped, idle=lambda: False, stop=stop)
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and stopped[True].compiled_rows == (2,)
    monkeypatch.setattr(compile_cache, "PROGRAM_CACHE", str(tmp_path))
    later = engines()
    assert later[True].rounds_stored(1) and later[True].riding_stored(2)
    server_lib.warm_up(later).join(120)
    assert later[True].compiled_rows == (1, 2) and later[True].rows_to_compile() == []
    assert sorted(p.suffix for p in tmp_path.iterdir()).count(".program") >= 2


def test_the_scheduler_runs_a_long_prompt_between_the_rounds_of_a_stream():
    """The engine thread prefills a prompt of 4 chunks one chunk per step, each riding the
    decoding stream's round (AR: a round is one pass): the stream keeps receiving tokens
    until the long prompt's first token, and both get their offline `generate` tokens. The
    step log has every step: a chunk riding each round beside the stream and none run
    beside it, every prompt position in some chunk, every token handed out in some round.
    (The rounds a chunk rides are compiled in the background once the server is ready: the
    test waits for them.)"""
    import asyncio
    import io
    import json
    import threading
    import time

    from test_engine import tiny_model

    from hispec_jax.serving import server as server_lib
    from hispec_jax.serving.scheduler import Job, Scheduler, StepLog

    model = tiny_model(2, 0, max_len=128)
    rng, V = np.random.RandomState(1), model.cfg.vocab_size
    short, long_ = rng.randint(4, V, 6).tolist(), rng.randint(4, V, 60).tolist()
    engines = {True: SlotEngine(model, methods_lib.make_method(model, "ar"), slots=2,
                                capacity=128, greedy=True, eos_ids=(), prefill_chunk=16,
                                ride_prefill=True)}
    log = io.StringIO()
    scheduler = Scheduler(engines, warmup=server_lib.warm_up, prefill_share=0.0,
                          step_log=StepLog(log))
    scheduler.start()
    scheduler.ready.wait(120)
    deadline = time.time() + 120  # the background compiles: the rounds a chunk rides
    while engines[True].rows_to_compile() and time.time() < deadline:
        time.sleep(0.1)

    async def run():
        loop, events = asyncio.get_running_loop(), []

        def job(ids, budget):
            return Job(ids, budget, SamplingParams(), loop, asyncio.Queue())

        async def collect(name, j):
            while True:
                kind, value = await j.queue.get()
                events.append((name, kind, value))
                if kind == "done":
                    return

        a = job(short, 40)
        scheduler.submit(a)
        kind, value = await a.queue.get()  # a decodes
        events.append(("a", kind, value))
        b = job(long_, 8)
        scheduler.submit(b)
        events.append(("b", "submitted", None))
        await asyncio.gather(collect("a", a), collect("b", b))
        return events

    try:
        events = asyncio.run(run())
    finally:
        scheduler.stop(timeout=120)  # a background compile under way finishes first
    assert scheduler.error is None
    assert not any(t.name == "hispec-compile-rows" and t.is_alive() for t in threading.enumerate())
    start = events.index(("b", "submitted", None))
    first_b = next(i for i, e in enumerate(events) if e[0] == "b" and e[1] == "tokens")
    assert sum(e[:2] == ("a", "tokens") for e in events[start:first_b]) >= 3
    got = {name: sum((e[2] for e in events if e[:2] == (name, "tokens")), [])
           for name in ("a", "b")}
    want = tuple(hispec_jax.generate(model, [p], method="ar",
                                     max_new_tokens=n, ignore_eos=True).token_ids[0]
                 for p, n in ((short, 40), (long_, 8)))
    assert (got["a"], got["b"]) == want
    steps = [json.loads(line) for line in log.getvalue().splitlines()]
    assert {k for r in steps for k in r} == {
        "time", "engine", "decoding", "prompts", "rows", "chunks", "rider", "prefill_seconds",
        "round_seconds", "tokens", "proposed", "accepted"}
    assert all(r["proposed"] == r["accepted"] == [] for r in steps)  # AR: no verifying level
    assert sum(r["tokens"] for r in steps) == 40 + 8
    assert sum(sum(r["chunks"]) + (r["rider"] or 0) for r in steps) >= len(short) + len(long_)
    # (the first step prefills the short prompt whole: nothing decodes yet)
    riding = [r for r in steps if r["rider"]]
    assert [r["rider"] for r in riding] == [16] * 4 and all(
        r["decoding"] == r["prompts"] == 1 and not r["chunks"] for r in riding)
    assert all(r["engine"] == "greedy" and r["round_seconds"] > 0 for r in steps)


class _ChunkClock:
    """A fake clock and a fake slot engine whose prefill chunks take `seconds[size]`: one
    waiting prompt of `rest` positions, full chunks of 64, small ones of 16."""

    def __init__(self, rest: int, seconds: dict[int, float]):
        self.now, self.rest, self.seconds, self.ran = 0.0, rest, seconds, []
        self.state = types.SimpleNamespace(cache=None)

    def perf_counter(self) -> float:
        return self.now

    @property
    def prefilling(self) -> list[int]:
        return [0] if self.rest > 0 else []

    def next_chunk(self, small: bool = False):
        return None if self.rest <= 0 else (16 if small or self.rest <= 32 else 64)

    def prefill(self, max_chunks, small=False):
        size = self.next_chunk(small)
        self.now += self.seconds[size]
        self.rest -= size
        self.ran.append(size)
        return 1


@pytest.mark.parametrize("round_seconds,share,known,want", [
    (0.08, 1.0, {}, [16]),  # nothing measured yet: a small chunk; a second would not fit
    (0.12, 1.0, {}, [16, 16]),  # it fits
    (0.08, 1.0, {64: 0.15}, [16]),  # a full chunk does not fit one round
    (0.16, 1.0, {64: 0.15}, [64]),  # it does: one, then 0.01 left (no small chunk fits)
    (0.30, 1.0, {64: 0.15}, [64, 64]),  # two
    (0.08, 0.0, {64: 0.15}, [16]),  # no budget: still one chunk a step
    (0.02, 1.0, {}, [16]),  # a chunk dearer than the budget: one, and stop
])
def test_the_prefill_beside_decoding_slots_takes_a_share_of_the_round_time(
        monkeypatch, round_seconds, share, known, want):
    """Between two rounds the scheduler runs chunks until their time reaches
    `prefill_share` times the last round's: a full chunk where its last measured time fits
    what is left, else a small one, and always at least one."""
    from hispec_jax.serving import scheduler as scheduler_lib

    fake = _ChunkClock(rest=500, seconds={64: 0.15, 16: 0.05})
    monkeypatch.setattr(scheduler_lib.time, "perf_counter", fake.perf_counter)
    scheduler = scheduler_lib.Scheduler({}, prefill_share=share)
    scheduler._round_seconds[True] = round_seconds
    scheduler._chunk_seconds.update({(True, size): t for size, t in known.items()})
    scheduler._prefill_beside_rounds(True, fake)
    assert fake.ran == want
    assert scheduler._chunk_seconds[True, want[-1]] == fake.seconds[want[-1]]


class _RidingPrompt:
    """A fake slot engine with `waiting` prompts admitted and waiting, the oldest with `rest`
    positions left: full chunks of 64, small ones of 16 (the last 32 positions in small
    ones)."""

    def __init__(self, rest: int, waiting: int = 2):
        self.rest, self.prefilling = rest, list(range(waiting))

    def next_chunk(self, small: bool = False):
        return None if self.rest <= 0 else (16 if small or self.rest <= 32 else 64)


@pytest.mark.parametrize("rest,waiting,steps,full,since,share,small", [
    (500, 2, [0.1], [], 0, 1.0, False),  # a full chunk never rode: it rides, to be measured
    (500, 2, [0.1], [0.3, 0.3], 0, 1.0, False),  # measured less than RIDE_PROBES times
    (500, 2, [0.1], [0.19, 0.25, 0.18], 0, 1.0, False),  # it fits (1 + share) steps
    (500, 2, [0.1, 0.11, 0.09], [0.19, 0.25, 0.21], 0, 1.0, True),  # it does not
    (500, 2, [0.1], [0.19] * 3, 0, 0.5, True),  # nor with a smaller share
    (500, 2, [0.1] * 7 + [0.3], [0.19] * 7 + [0.5], 0, 1.0, False),  # one slow round each
    (500, 2, [0.1] * 32 + [0.05] * 32, [0.19] * 3, 0, 1.0, True),  # the last 32 steps count
    (500, 2, [0.1], [0.3] * 3, 64, 1.0, False),  # after 64 small rides: measured again
    (30, 2, [0.1], [0.11] * 3, 0, 1.0, True),  # the rest of the prompt is small chunks
    (500, 1, [0.1], [], 0, 1.0, True),  # one prompt waits: small chunks
])
def test_a_full_chunk_rides_where_its_round_fits_the_budget(rest, waiting, steps, full, since,
                                                            share, small):
    """Where chunks ride the rounds, the same budget picks their size: while prompts queue (two
    or more admitted and waiting), a full chunk where the rounds it rode took at most
    (1 + prefill_share) times the engine's steps (medians of the last 8 and 32), else a
    small one; a full chunk rides its first 3 times, and after 64 small ones in a row, to
    be measured."""
    import collections

    from hispec_jax.serving import scheduler as scheduler_lib

    scheduler = scheduler_lib.Scheduler({}, prefill_share=share)
    scheduler._step_seconds[True] = collections.deque(steps, scheduler_lib.STEP_SAMPLES)
    scheduler._full_ride_seconds[True] = collections.deque(full, scheduler_lib.RIDE_SAMPLES)
    scheduler._small_rides[True] = since
    assert scheduler._ride_small(True, _RidingPrompt(rest, waiting)) is small


@pytest.mark.parametrize("share", [-1, "1", float("nan")])
def test_a_bad_prefill_share_is_refused(share):
    from hispec_jax.serving.scheduler import Scheduler

    with pytest.raises(ValueError, match="prefill_share"):
        Scheduler({}, prefill_share=share)


def test_without_compile_on_demand_a_slot_runs_the_smallest_compiled_rows():
    """A server's engine (`compile_on_demand` False) warmed up with the loop over all B slots
    runs B rows until the loop over fewer rows is compiled ahead of time (from another
    thread, as the server does), then that one; nothing compiles on a request, and the
    tokens are offline generate's."""
    import threading

    from test_engine import tiny_model

    from hispec_jax.decoding.slots import backend_compiles

    model = tiny_model(4, 2, max_len=128)
    decoder = methods_lib.make_method(model, "lookup", lookup=4)
    eng = SlotEngine(model, decoder, slots=4, capacity=96, greedy=True,
                     eos_ids=model.eos_token_ids)
    eng.compile_on_demand = False
    eng.warm_up(rows=(4,))
    assert eng.compiled_rows == (4,)
    prompt = list(range(4, 20))
    compiled = backend_compiles()
    eng.insert(0, SlotRequest(tuple(prompt), 12))
    got = []
    got += eng.generate(1)[0].new_token_ids
    assert eng.last_rows == 4 and backend_compiles() == compiled
    thread = threading.Thread(target=eng.compile_rounds, args=(1,))
    thread.start()
    thread.join()
    assert eng.compiled_rows == (1, 4)
    compiled = backend_compiles()
    while eng.busy[0]:
        got += eng.generate(1)[0].new_token_ids
        assert eng.last_rows == 1
    # the state the ahead-of-time loop returned feeds the jitted programs as theirs did
    eng.insert(1, SlotRequest(tuple(prompt), 3))
    while eng.busy[1]:
        eng.generate(1)
        assert eng.last_rows == 4
    assert backend_compiles() == compiled
    want = hispec_jax.generate(model, [prompt], method="lookup", lookup=4,
                               max_new_tokens=12).token_ids[0]
    assert got == want


def test_the_server_rides_prefill_only_when_asked():
    """`build_engines(ride_prefill=True)` (`hispec serve --ride-prefill`) gives AR's engines
    the round a chunk rides, over all slots; by default chunks run beside the rounds."""
    from test_engine import tiny_model

    from hispec_jax.serving import server as server_lib

    model = tiny_model(2, 0, max_len=128)
    asked = server_lib.build_engines(model, "ar", slots=4, max_cache_len=64, ride_prefill=True)
    assert all(e.rides and e.ride_rows == (4,) for e in asked.values())
    default = server_lib.build_engines(model, "ar", slots=4, max_cache_len=64)
    assert not any(e.rides or e.ride_rows for e in default.values())
