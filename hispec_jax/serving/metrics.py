"""What the server counts, and `/metrics` in the Prometheus text format.

The engine thread records every event as it hands it out (a request admitted, tokens
delivered, a request finished) and, after each `generate` step, the engine's counters;
a scrape reads those numbers and never waits for a decode step. Every app has its own
`CollectorRegistry`, so several servers in one process do not collide.

Names follow vLLM's with a `hispec:` prefix:

    hispec:num_requests_running / _waiting            gauges
    hispec:request_success_total{finished_reason}     stop, length, cancelled, error
    hispec:prompt_tokens_total, hispec:generation_tokens_total
    hispec:time_to_first_token_seconds                histogram (submission -> first token)
    hispec:inter_token_latency_seconds                histogram (per token after the first)
    hispec:spec_decode_num_draft_tokens_total{engine, level, drafter}
    hispec:spec_decode_num_accepted_tokens_total{engine, level, drafter}
    hispec:spec_decode_acceptance_rate{engine, level, drafter}
    hispec:spec_decode_num_draft_tokens_by_source_total{engine, source}
    hispec:spec_decode_num_accepted_tokens_by_source_total{engine, source}
    hispec:spec_decode_num_verifications_total{engine, level}
    hispec:spec_decode_num_rounds_total{engine}
    hispec:spec_decode_tokens_per_round{engine}
    hispec:spec_decode_drafter_events_total{engine, drafter, event}   level 0's own counts
    hispec:spec_decode_draft_work_share{engine}     a draft model's share of the work

A verifying level k (1 .. K-1) checks the drafts of the level below it: the drafter label
is level 0's own (`Drafter.label`: "lookup" for the n-gram drafter, "exit<e>" for an exit)
at level 1, else "exit<e>" for the exit that drafted them; level 1 counts what the drafter
says it proposed (`Drafter.proposals`: a lookup round without a match proposes nothing). A
round of a sequence, for tokens per round, is one verification by the top level (the
final layer): the tokens it emits per such pass (1 for AR). The `_by_source` counters split
level 1's where the drafter says where its drafts came from (`Drafter.sources`, prompt
lookup: "context", the sequence's own prompt and output, and "earlier_requests", the
server's store of earlier requests' tokens).
"""

from __future__ import annotations

import collections
import threading
import time

import jax
import numpy as np
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hispec_jax.decoding import methods as methods_lib

# Counters of the engine (`engine.Counters`) that /metrics reports, summed over the batch.
SPEC_FIELDS = ("rounds", "verifications_K", "proposed_K", "accepted_K", "emitted", "drafter",
               "actions_K", "layer_passes", "head_evals_E")
TTFT_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0, 10.0)


def engine_label(greedy: bool) -> str:
    return "greedy" if greedy else "sampling"


def _delta(new, old):
    """new - old of int32 counters, across a wraparound."""
    return (np.asarray(new, np.int64) - np.asarray(old, np.int64)) % (1 << 32)


class ServingStats:
    """The server's counts (written by the engine thread) and the registry /metrics reads.

    Args:
      hierarchies: {greedy: the slot engine's `engine.Hierarchy`} (names the levels).
      running, waiting: callables giving the current number of running / waiting requests.
      model: the served model (a draft model's share of the work needs its layers' and
        heads' costs), or None.
    """

    def __init__(self, hierarchies: dict, running, waiting, model=None):
        self.hierarchies, self.model = hierarchies, model
        self._lock = threading.Lock()  # held for an update or a read, never across a step
        self.finished = collections.Counter()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self._spec = {g: {f: None for f in SPEC_FIELDS} for g in hierarchies}
        self._last = {g: None for g in hierarchies}
        self.registry = CollectorRegistry()
        self.ttft = Histogram("hispec:time_to_first_token_seconds",
                              "Time from a request's arrival to its first token",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram("hispec:inter_token_latency_seconds",
                             "Time between two tokens of a request (a step's gap spread "
                             "over the tokens it brought)",
                             buckets=ITL_BUCKETS, registry=self.registry)
        self.registry.register(_Collector(self, running, waiting))

    # ---- the engine thread -------------------------------------------------------------
    def admitted(self, prompt_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens

    def delivered(self, job, num_tokens: int, now: float | None = None) -> None:
        """`num_tokens` new tokens of `job` (a `scheduler.Job`) handed out now."""
        now = time.perf_counter() if now is None else now
        last = job.last_token_at
        if last is None:
            self.ttft.observe(now - job.submitted)
            num_gaps = num_tokens - 1
            gap = 0.0
        else:
            num_gaps = num_tokens
            gap = (now - last) / num_tokens
        for _ in range(num_gaps):
            self.itl.observe(gap)
        job.last_token_at = now
        with self._lock:
            self.generation_tokens += num_tokens

    def finish(self, reason: str) -> None:
        with self._lock:
            self.finished[reason] += 1

    def engine_counters(self, greedy: bool, counters) -> None:
        """The engine's counters after a step (cumulative, on the host); the first call
        sets the baseline (after warm-up, whose rounds are not served requests)."""
        last, self._last[greedy] = self._last[greedy], counters
        if last is None:
            return
        with self._lock:
            spec = self._spec[greedy]
            for f in SPEC_FIELDS:
                d = jax.tree.map(_delta, getattr(counters, f), getattr(last, f))
                spec[f] = d if spec[f] is None else jax.tree.map(np.add, spec[f], d)

    # ---- readers ------------------------------------------------------------------------
    def spec(self, greedy: bool) -> dict:
        """{field: summed delta} of an engine's counters since the baseline (zeros: none)."""
        with self._lock:
            spec = dict(self._spec[greedy])
        K = len(self.hierarchies[greedy].exits)
        zeros = {"verifications_K": np.zeros(K, np.int64), "proposed_K": np.zeros(K, np.int64),
                 "accepted_K": np.zeros(K, np.int64), "actions_K": np.zeros(K, np.int64),
                 "head_evals_E": np.zeros(1, np.int64), "drafter": None}
        return {f: (zeros.get(f, np.int64(0)) if v is None else v) for f, v in spec.items()}

    def snapshot(self) -> dict:
        """Request counts for /health."""
        with self._lock:
            return {"finished": dict(self.finished), "prompt_tokens": self.prompt_tokens,
                    "generation_tokens": self.generation_tokens}


def drafter_name(hierarchy, level: int) -> str:
    """What drafts the tokens level `level` verifies."""
    if level == 1:
        return hierarchy.drafter.label(hierarchy)
    return f"exit{hierarchy.exits[level - 1]}"


class _Collector:
    """Reads `ServingStats` at scrape time."""

    def __init__(self, stats: ServingStats, running, waiting):
        self.stats, self.running, self.waiting = stats, running, waiting

    def collect(self):
        s = self.stats
        yield GaugeMetricFamily("hispec:num_requests_running",
                                "Requests in a slot, being decoded", value=self.running())
        yield GaugeMetricFamily("hispec:num_requests_waiting",
                                "Requests waiting for a free slot", value=self.waiting())
        snap = s.snapshot()
        done = CounterMetricFamily("hispec:request_success", "Finished requests by finish "
                                   "reason", labels=["finished_reason"])
        for reason in sorted(set(snap["finished"]) | {"stop", "length"}):
            done.add_metric([reason], snap["finished"].get(reason, 0))
        yield done
        yield CounterMetricFamily("hispec:prompt_tokens", "Prompt tokens prefilled",
                                  value=snap["prompt_tokens"])
        yield CounterMetricFamily("hispec:generation_tokens", "Tokens generated and handed out",
                                  value=snap["generation_tokens"])
        labels = ["engine", "level", "drafter"]
        drafts = CounterMetricFamily("hispec:spec_decode_num_draft_tokens",
                                     "Draft tokens submitted to a verifying level", labels=labels)
        accepted = CounterMetricFamily("hispec:spec_decode_num_accepted_tokens",
                                       "Draft tokens a verifying level accepted", labels=labels)
        rate = GaugeMetricFamily("hispec:spec_decode_acceptance_rate",
                                 "Accepted over submitted draft tokens, per verifying level",
                                 labels=labels)
        checks = CounterMetricFamily("hispec:spec_decode_num_verifications",
                                     "(sequence, verification) pairs with something to verify",
                                     labels=["engine", "level"])
        rounds = CounterMetricFamily("hispec:spec_decode_num_rounds",
                                     "Speculation rounds (loop trips) of the batch",
                                     labels=["engine"])
        per_round = GaugeMetricFamily("hispec:spec_decode_tokens_per_round",
                                      "Tokens a sequence emits per final-layer verification "
                                      "(1 for AR)", labels=["engine"])
        work_share = GaugeMetricFamily("hispec:spec_decode_draft_work_share",
                                       "A draft model's share of the work by multiply-adds: "
                                       "its passes over them and the target's layer passes "
                                       "and exit heads", labels=["engine"])
        events = CounterMetricFamily("hispec:spec_decode_drafter_events",
                                     "Level 0's own counts (`Drafter.events`): a draft model's "
                                     "passes, tokens drafted, positions caught up, ...",
                                     labels=["engine", "drafter", "event"])
        by_source = [CounterMetricFamily(f"hispec:spec_decode_num_{what}_tokens_by_source",
                                         f"Draft tokens {verb} at level 1, by where the "
                                         "drafter found them", labels=["engine", "source"])
                     for what, verb in (("draft", "proposed"), ("accepted", "accepted"))]
        for greedy, h in s.hierarchies.items():
            e, spec, K = engine_label(greedy), s.spec(greedy), len(h.exits)
            own_events = getattr(h.drafter, "events", None)  # optional in `Drafter`
            if own_events is not None and spec["drafter"] is not None:
                for name, count in own_events(spec["drafter"]).items():
                    events.add_metric([e, drafter_name(h, 1), name], int(count))
            sources = getattr(h.drafter, "sources", None)
            if sources is not None and spec["drafter"] is not None:
                for source, counts in sources(spec["drafter"]).items():
                    for family, n in zip(by_source, counts):
                        family.add_metric([e, source], int(n))
            rounds.add_metric([e], int(spec["rounds"]))
            if (s.model is not None and spec["drafter"] is not None
                    and hasattr(h.drafter, "work_layers")):
                heads = {i: int(n) for i, n in enumerate(spec["head_evals_E"]) if n}
                share = methods_lib.draft_work_share(
                    s.model, h, int(spec["layer_passes"]), heads, int(spec["actions_K"][0]),
                    spec["drafter"])
                work_share.add_metric([e], share or 0.0)
            for k in range(1, K):
                lbl = [e, str(k), drafter_name(h, k)]
                own = (h.drafter.proposals(spec["drafter"])
                       if k == 1 and spec["drafter"] is not None else None)
                proposed, kept = ((int(spec["proposed_K"][k]), int(spec["accepted_K"][k]))
                                  if own is None else (int(own[0]), int(own[1])))
                drafts.add_metric(lbl, proposed)
                accepted.add_metric(lbl, kept)
                rate.add_metric(lbl, kept / proposed if proposed else 0.0)
                checks.add_metric([e, str(k)], int(spec["verifications_K"][k]))
            top = int(spec["verifications_K"][K - 1]) if K > 1 else 0
            per_round.add_metric([e], int(spec["emitted"]) / top if top else 1.0)
        yield from (drafts, accepted, rate, checks, rounds, per_round, events, work_share,
                    *by_source)
