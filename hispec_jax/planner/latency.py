"""The planner's predictor: how fast a hierarchy decodes on this device, as pure numpy
functions over measured numbers (`decoding.costs.Costs`, acceptance, a calibration trace).

`Predictor` is the one entry point. It uses the exact renewal formulas (`predict`) where
they hold, and otherwise replays the engine's round on the calibration trace (`replay`)
and prices the passes the replay counted (`price`).

What one loop trip of the engine costs (greedy "sync" schedule), for exits
e_0 < ... < e_{K-1} = L and windows (Nd, N_2, ..., N_{K-1}):

    round     round_s (the loop's fixed cost per trip)
    draft     Nd + 1 steps, each stage(0, e_0, T=1)
    verify 1  stage(e_0, e_1, T=block_1) over Nd + 1 positions (checks Nd + 1 drafts)
    verify k  stage(e_{k-1}, e_k, T=block_k) when level k's input holds N_k + 1 positions

    stage(a, b, T) = (b - a) * layer_s(T) + head_scale(b) * head_s(T) + pass_s

with `block_k` the engine's static block lengths (`windows.block_lengths`): a pass costs
its static block whatever number of positions is valid in it.

The formulas. A verifying level that checks n tokens with i.i.d. acceptance alpha emits
Y = j + 1 tokens at a first rejection j < n, else n: E[Y] = (1 - alpha^n) / (1 - alpha).
Level 1 checks n = Nd + 1 tokens every round. Level k >= 2 collects the tokens level k - 1
emits until it holds N_k + 1 (f_k deliveries: the HSD paper's f_i, computed exactly by a
small dynamic program over the delivery distribution, `collect`), then checks them with
alpha(e_{k-1}, e_k). Renewal-reward: seconds per token = E[cycle cost of the top level] /
E[tokens it emits per cycle], where a level-k cycle costs f_k * (level k-1 cycle) +
verify_k (Wald) — the paper's L_i = f_i (L_{i-1} + c_i). This is exact for K <= 3 at
batch 1 under i.i.d. acceptance.

The replay is needed where the formulas do not hold: the prompt-lookup drafter (its
acceptance is not i.i.d. per token), K >= 4 (a rejection at the top discards what the
middle levels collected) and batches (the "sync" schedule verifies every sequence when any
one is ready). It is the engine itself: the compiled loop run on a model that answers
every exit with the choice the calibration recorded (`trace_model.py`), its counters
(rounds, passes per level and block, tokens proposed, accepted and emitted) priced by
`price`. There is no second implementation of the round to keep in step.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from hispec_jax.decoding import windows as windows_lib
from hispec_jax.decoding.costs import Costs
from hispec_jax.models import heads as heads_lib

AlphaFn = Callable[[int, int], float]


@dataclasses.dataclass(frozen=True)
class Prediction:
    """Predicted steady-state decoding speed of a hierarchy.

    Attributes:
      tokens_per_round: tokens one sequence gets per loop trip.
      seconds_per_token: wall seconds per emitted token of one sequence (the batch
        advances together: B tokens per this many seconds).
      tokens_per_second: B / seconds_per_token.
    """

    tokens_per_round: float
    seconds_per_token: float
    tokens_per_second: float


def blocks(windows: tuple[int, ...]) -> tuple[int, ...]:
    """The engine's static block length of each verifying level for fixed windows."""
    return windows_lib.block_lengths(tuple(w + 1 for w in windows))


# ------------------------------------------------------------------ the renewal formulas
def expected_emitted(alpha: float, n: int) -> float:
    """E[tokens a verifier emits] when it checks n tokens with i.i.d. acceptance alpha:
    (1 - alpha^n) / (1 - alpha) (n when alpha = 1)."""
    if alpha >= 1.0:
        return float(n)
    return (1.0 - alpha ** n) / (1.0 - alpha)


def emitted_distribution(alpha: float, n: int) -> np.ndarray:
    """P(Y = y) for y = 0..n (entry 0 is 0): Y = j + 1 at a first rejection j < n, else n."""
    p = np.zeros(n + 1)
    for y in range(1, n):
        p[y] = alpha ** (y - 1) * (1.0 - alpha)
    p[n] = alpha ** (n - 1) if n >= 1 else 0.0
    return p


def collect(delivery: np.ndarray, threshold: int) -> tuple[float, np.ndarray]:
    """A level collects deliveries (distribution `delivery` over 0..Ymax, no mass at 0) until
    it holds >= `threshold` tokens. Returns (expected number of deliveries f, distribution
    of the total held when it stops, over 0..threshold + Ymax - 1)."""
    ymax = len(delivery) - 1
    reach = np.zeros(threshold)  # P(the running total is ever exactly s), s < threshold
    reach[0] = 1.0
    final = np.zeros(threshold + ymax)
    for s in range(threshold):
        if reach[s] == 0.0:
            continue
        for y in range(1, ymax + 1):
            if delivery[y] == 0.0:
                continue
            if s + y < threshold:
                reach[s + y] += reach[s] * delivery[y]
            else:
                final[s + y] += reach[s] * delivery[y]
    return float(reach.sum()), final


def level_alphas(exits: tuple[int, ...], alpha: AlphaFn) -> list[float]:
    """alpha(e_{k-1}, e_k) for k = 1..K-1; `alpha(a, b)` is a callable over exit layers."""
    return [float(alpha(a, b)) for a, b in zip(exits, exits[1:])]


def predict(exits: tuple[int, ...], windows: tuple[int, ...], alphas: list[float],
            costs: Costs, draft_s: float | None = None) -> Prediction:
    """The renewal formulas: expected tokens per round and latency per token of a
    fixed-window exit hierarchy (see the module docstring; exact for K <= 3 at batch 1,
    the batch priced as if in phase).

    Args:
      exits: (e_0, ..., e_{K-1}); K = 1 is AR from e_0.
      windows: (Nd, N_2, ..., N_{K-1}), K - 1 entries.
      alphas: acceptance of each verifying level, alpha(e_{k-1}, e_k), K - 1 entries.
      costs: measured costs.
      draft_s: level 0's cost per round where it is not the target's own exit (a draft
        model's Nd steps, `draft_plans`: e_0 = 0 and level 1 checks its Nd drafts and its
        own next token, the bonus); None: Nd + 1 steps of stage(0, e_0, 1).
    """
    K = len(exits)
    if K == 1:
        t = costs.stage(0, exits[0], 1) + costs.round_s
        return Prediction(1.0, t, costs.batch / t)
    blk = blocks(windows)
    nd = windows[0]
    # Level 1: one cycle = one round.
    drafting = (nd + 1) * costs.stage(0, exits[0], 1) if draft_s is None else draft_s
    cost = costs.round_s + drafting + costs.stage(exits[0], exits[1], blk[0])
    out = emitted_distribution(alphas[0], nd + 1)
    rounds = 1.0
    for k in range(2, K):
        f, held = collect(out, windows[k - 1] + 1)
        cost = f * cost + costs.stage(exits[k - 1], exits[k], blk[k - 1])
        rounds *= f
        nxt = np.zeros(len(held))
        for n, p in enumerate(held):
            if p > 0.0:
                nxt[:n + 1] += p * emitted_distribution(alphas[k - 1], n)
        out = nxt
    tokens = float(np.dot(np.arange(len(out)), out))
    t = cost / tokens
    return Prediction(tokens / rounds, t, costs.batch / t)


def work_costs(model) -> Costs:
    """`Costs` in layer equivalents instead of seconds: a layer pass costs 1 at any block
    length, exit e's head `head_cost_layers(e)`, nothing else (no fixed round or pass cost).
    A prediction's `seconds_per_token` at these costs is the hierarchy's expected
    `work_per_token`, the engine's measured `stats["work_per_token"]` (`methods.work_stats`)."""
    cfg, L = model.cfg, model.cfg.num_layers
    shared = heads_lib.head_cost_layers(cfg, model.heads, L)
    return Costs(batch=1, num_layers=L, block_sizes=(1, 2), layer_s=(1.0, 1.0),
                 head_s=(shared, shared), head_scale=heads_lib.head_cost_scales(cfg, model.heads))


def end_to_end_tokens_per_second(pred: Prediction, costs: Costs, new_tokens: int) -> float:
    """What `generate` reports for one batch of `new_tokens` tokens per sequence: the first
    token comes from prefill (`costs.prefill_s`), the rest from the loop."""
    seconds = costs.prefill_s + max(new_tokens - 1, 0) * pred.seconds_per_token
    return costs.batch * new_tokens / seconds


# ------------------------------------------------------------------ the replay
@dataclasses.dataclass(frozen=True)
class Trace:
    """The calibration prompts' greedy continuations and every exit's greedy choice along
    them (`calibrate.measure_trace`): what `replay` runs the engine's round on.

    Attributes:
      max_ngram: N, the lookup drafter's longest matched suffix.
      sequences: per prompt, its tokens + the model's greedy continuation (what every
        greedy method outputs).
      starts: per prompt, P (its length: the continuation's first token is at P).
      predictions: ((exit e, per prompt exit e's greedy token after position q, for
        q = P .. len - 1), ...), teacher-forced on the sequence, for the exits below L
        (the final layer's choices are the sequence itself).
    """

    max_ngram: int
    sequences: tuple[tuple[int, ...], ...]
    starts: tuple[int, ...]
    predictions: tuple[tuple[int, tuple[tuple[int, ...], ...]], ...]

    def to_json(self) -> dict:
        return {"max_ngram": self.max_ngram, "sequences": [list(s) for s in self.sequences],
                "starts": list(self.starts),
                "predictions": {str(e): [list(p) for p in per] for e, per in self.predictions}}

    @classmethod
    def from_json(cls, d: dict) -> "Trace":
        return cls(max_ngram=int(d["max_ngram"]),
                   sequences=tuple(tuple(int(t) for t in s) for s in d["sequences"]),
                   starts=tuple(int(p) for p in d["starts"]),
                   predictions=tuple(sorted((int(e), tuple(tuple(int(t) for t in p) for p in per))
                                            for e, per in d["predictions"].items())))


@dataclasses.dataclass(frozen=True)
class LookupProfile:
    """What `method="lookup"` did on the calibration prompts (`calibrate.measure_lookup`),
    with the trace every replay runs on.

    Attributes:
      k: the lookup's k (the `lookup` option it ran with).
      rounds: loop trips of `method="lookup"` over the calibration prompts.
      tokens: tokens it emitted in the loop (per sequence, summed over the prompts).
      verified: [k + 1] (sequence, verification) pairs by the positions n each one ran
        (the engine's `verified_length_histogram`; a round without a match is n = 1).
      trace: the continuations and every exit's choices along them (`Trace`; None: no
        lookup candidate can be predicted).
    """

    k: int
    rounds: int
    tokens: int
    verified: tuple[int, ...]
    trace: Trace | None = None

    def to_json(self) -> dict:
        return {"k": self.k, "rounds": self.rounds, "tokens": self.tokens,
                "verified": list(self.verified),
                "trace": self.trace.to_json() if self.trace is not None else None}

    @classmethod
    def from_json(cls, d: dict) -> "LookupProfile":
        return cls(k=int(d["k"]), rounds=int(d["rounds"]), tokens=int(d["tokens"]),
                   verified=tuple(int(n) for n in d["verified"]),
                   trace=Trace.from_json(d["trace"]) if d.get("trace") else None)


@dataclasses.dataclass(frozen=True)
class Run:
    """What `replay` counted, summed over the calibration prompts (from the engine's
    `Counters`).

    Attributes:
      level_exits: the exit of every level, level 0 (the drafter) first; 0 is the lookup
        drafter's level (no layers).
      batch: sequences per replayed loop (the calibration prompts are cycled to fill the
        last group; every row counts as a sequence).
      rounds: loop trips (summed over groups).
      passes: ((level k, block T), count) of every pass: level 0's draft steps (T = 1; one
        lookup a round), then every verification by the block it ran
        (`Counters.block_passes_KxT`).
      proposed: [K] tokens submitted to each verifying level (level 0: 0).
      accepted: [K] of those, tokens the level accepted.
      emitted: tokens the loop emitted, per sequence (summed over groups, / batch).
      verified: the top level's (sequence, verification) pairs by positions n (the
        engine's `verified_length_histogram`).
    """

    level_exits: tuple[int, ...]
    batch: int
    rounds: int
    passes: tuple[tuple[tuple[int, int], int], ...]
    proposed: tuple[int, ...]
    accepted: tuple[int, ...]
    emitted: float
    verified: tuple[int, ...]

    def actions_per_level(self) -> list[int]:
        """Passes per level (the engine's `actions_per_level`)."""
        actions = [0] * len(self.level_exits)
        for (level, _), count in self.passes:
            actions[level] += count
        return actions


def replay(trace: Trace, exits: tuple[int, ...], windows: tuple[int, ...], lookup: int = 0,
           batch: int = 1) -> Run:
    """The engine's greedy loop (`Engine.run`: the compiled round of `engine/round.py`) on
    `trace`, the model replaced by the trace's recorded choices (`trace_model.py`), and
    what it counted:

        exits (d, L), windows (Nd,)              LayerSkip: exit d drafts Nd + 1 tokens
        exits (d, i, L), windows (Nd, Ni)        HiSpec
        lookup=k, exits (L,), windows ()          method="lookup"
        lookup=k, exits (d, L), windows (Nd,)     the lookup under LayerSkip: exit d
                                                  verifies its proposals, L verifies
                                                  once Nd + 1 tokens are pending

    The calibration prompts run in groups of `batch` (the last group filled by cycling
    them; every row counts as a sequence); the lookup's acceptance gate weighs the
    backend's default pass cost (`gate.default_pass_cost`)."""
    from hispec_jax.planner import trace_model

    exits, windows = tuple(exits), tuple(windows)
    if len(exits) + bool(lookup) < 2 or len(windows) != len(exits) - 1:
        raise ValueError(f"replay needs a drafter below a verifier and one window per level "
                         f"above the first exit: exits {exits}, windows {windows}")
    _, counters = trace_model.run_counters(trace, exits, windows, lookup, batch)
    total = jax.tree.map(lambda *xs: np.sum(np.stack(xs), axis=0), *counters)
    level_exits = ((0,) if lookup else ()) + exits
    passes = [((0, 1), int(total.actions_K[0]))] + [
        ((k, T), int(n)) for k in range(1, len(level_exits))
        for T, n in enumerate(total.block_passes_KxT[k]) if n]
    return Run(level_exits=level_exits, batch=batch, rounds=int(total.rounds),
               passes=tuple(passes), proposed=tuple(int(n) for n in total.proposed_K),
               accepted=tuple(int(n) for n in total.accepted_K),
               emitted=int(total.emitted) / batch,
               verified=tuple(int(n) for n in total.verified_hist))


def price(run: Run, costs: Costs) -> Prediction:
    """The seconds of a replayed loop at `costs`: each round `round_s`, each pass at level k
    `stage(e_{k-1}, e_k, its block)` (level 0: `stage(0, e_0, 1)` per draft step; the
    lookup runs no layers).

        seconds per token = (rounds * round_s + sum passes * stage) / tokens per sequence"""
    lows = (0,) + run.level_exits[:-1]
    seconds = run.rounds * costs.round_s + sum(
        count * costs.stage(lows[level], run.level_exits[level], block)
        for (level, block), count in run.passes if run.level_exits[level])
    t = seconds / max(run.emitted, 1e-9)
    return Prediction(run.emitted / max(run.rounds, 1), t, costs.batch / t)


# ------------------------------------------------------------------ the predictor
@dataclasses.dataclass(frozen=True)
class Predictor:
    """The planner's predictor of a hierarchy on one calibration: the renewal formulas
    (`predict`) where they hold (exit hierarchies of K <= 3 at batch 1, or any exit
    hierarchy without a trace), else the replay of the calibration trace (`replay`,
    priced by `price`): the lookup drafter, K >= 4 and batches.

    Attributes:
      alpha: alpha(a, b), the acceptance of exit a's tokens by exit b (the formulas').
      costs: the measured costs (their batch size is the plans').
      trace: the calibration trace (None: no lookup plan can be predicted).
      work: `work_costs` of the model, or None: each prediction's work per token.
    """

    alpha: AlphaFn | None
    costs: Costs
    trace: Trace | None = None
    work: Costs | None = None

    def replays(self, exits: tuple[int, ...], lookup: int = 0) -> bool:
        """Whether `exits` (with the lookup drafter at k = `lookup`) is replayed."""
        return bool(lookup) or (self.trace is not None and len(exits) > 1
                                and (self.costs.batch > 1 or len(exits) > 3))

    def prepare(self, plans) -> None:
        """Compiles, several at once, the replays of the plans ((exits, windows, lookup k),
        ...) this predictor will score (`trace_model.prepare`); the rest cost nothing."""
        from hispec_jax.planner import trace_model

        plans = [(tuple(e), tuple(w), k) for e, w, k in plans if self.replays(tuple(e), k)]
        if plans and self.trace is not None:
            trace_model.prepare(self.trace, plans, self.costs.batch)

    def __call__(self, exits, windows, lookup: int = 0) -> tuple[Prediction, float | None]:
        """(the prediction, its work per token or None without `work`)."""
        exits, windows = tuple(exits), tuple(windows)
        if self.replays(exits, lookup):
            if self.trace is None:
                raise ValueError("the lookup drafter is predicted on a calibration trace; "
                                 "this calibration has none")
            run = replay(self.trace, exits, windows, lookup, self.costs.batch)
            work = price(run, self.work).seconds_per_token if self.work is not None else None
            return price(run, self.costs), work
        alphas = level_alphas(exits, self.alpha)
        work = (predict(exits, windows, alphas, self.work).seconds_per_token
                if self.work is not None else None)
        return predict(exits, windows, alphas, self.costs), work
