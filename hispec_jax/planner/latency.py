"""The expected-latency model of the engine's hierarchies (HSD, SPEC.md section 5), as pure
numpy functions over measured numbers.

What one loop trip of the engine costs (`decoding/engine.py`, greedy "sync" schedule), for
exits e_0 < ... < e_{K-1} = L and windows (Nd, N_2, ..., N_{K-1}):

    round     round_s (the loop's fixed cost per trip: state updates, conds, bookkeeping)
    draft     Nd + 1 steps, each stage(0, e_0, T=1)
    verify 1  stage(e_0, e_1, T=block_1) over Nd + 1 positions (checks Nd + 1 drafts)
    verify k  stage(e_{k-1}, e_k, T=block_k) when level k's input holds N_k + 1 positions

    stage(a, b, T) = (b - a) * layer_s(T) + head_scale(b) * head_s(T) + pass_s

(`head_s` is the shared head's cost; exit b's own head, low rank or with a draft
vocabulary, costs `head_scale(b)` times it: 1 for the shared head.)

with `block_k` the engine's static block lengths (`windows.block_lengths`): a pass costs
its static block whatever number of positions is valid in it.

A verifying level that checks n tokens with i.i.d. acceptance alpha emits Y tokens:
Y = j + 1 if the first rejection is at (0-based) j < n, Y = n if all are accepted, so
E[Y] = (1 - alpha^n) / (1 - alpha) (SPEC section 5 with gamma = n - 1 drafts + a bonus).
Level 1 checks n = Nd + 1 tokens every round. Level k >= 2 collects the tokens level k - 1
emits until it holds N_k + 1 (f_k deliveries: the HSD paper's f_i, computed exactly here by
a small dynamic program over the delivery distribution, with the overshoot distribution),
then checks them with alpha(e_{k-1}, e_k). Renewal-reward: seconds per token =
E[cycle cost of the top level] / E[tokens it emits per cycle], where a level-k cycle costs
f_k * (level k-1 cycle) + verify_k (Wald) — the paper's L_i = f_i (L_{i-1} + c_i).

This is exact for K <= 3 at batch 1 under the i.i.d. model. For K >= 4 (a rejection at the
top also discards what the middle levels had collected) and for batches (the "sync"
schedule verifies every sequence when any one is ready) `simulate` runs the engine's state
machine itself on i.i.d. coin flips.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from hispec_jax.decoding import windows as windows_lib
from hispec_jax.decoding.costs import Costs
from hispec_jax.models import heads as heads_lib


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


def level_alphas(exits: tuple[int, ...], alpha) -> list[float]:
    """alpha(e_{k-1}, e_k) for k = 1..K-1; `alpha(a, b)` is a callable over exit layers."""
    return [float(alpha(a, b)) for a, b in zip(exits, exits[1:])]


def predict(exits: tuple[int, ...], windows: tuple[int, ...], alphas: list[float],
            costs: Costs) -> Prediction:
    """Expected tokens per round and latency per token of a fixed-window hierarchy at
    batch 1 (renewal-reward over the levels' cycles; see the module docstring).

    Args:
      exits: (e_0, ..., e_{K-1}); K = 1 is AR from e_0.
      windows: (Nd, N_2, ..., N_{K-1}), K - 1 entries.
      alphas: acceptance of each verifying level, alpha(e_{k-1}, e_k), K - 1 entries.
      costs: measured costs.
    """
    K = len(exits)
    if K == 1:
        t = costs.stage(0, exits[0], 1) + costs.round_s
        return Prediction(1.0, t, costs.batch / t)
    blk = blocks(windows)
    nd = windows[0]
    # Level 1: one cycle = one round.
    cost = costs.round_s + (nd + 1) * costs.stage(0, exits[0], 1) + costs.stage(exits[0], exits[1], blk[0])
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


def simulate(exits: tuple[int, ...], windows: tuple[int, ...], alphas: list[float],
             costs: Costs, *, rounds: int = 4000, adaptive: bool = False,
             seed: int = 0) -> Prediction:
    """The engine's greedy "sync" state machine on i.i.d. acceptance coin flips, for
    `costs.batch` sequences in lock step (budgets and EOS ignored: steady state).

    Per sequence it keeps pend[k] = c_{k-1} - c_k, the positions level k's input holds;
    each loop trip runs the draft phase, verify 1, and verify k >= 2 when some sequence's
    level-k input is ready, every pass charged at its static block. With `adaptive`,
    windows follow App. J (`windows.AdaptiveWindows`), blocks sized by its bounds.
    """
    rng = np.random.default_rng(seed)
    K, B = len(exits), costs.batch
    if K == 1:
        return predict(exits, windows, alphas, costs)
    if adaptive:
        bounds = (max(windows[0], windows_lib.DRAFT_LEN_RANGE[1]),) + tuple(
            max(w, windows_lib.VERIFY_WINDOW_RANGE[1]) for w in windows[1:])
    else:
        bounds = tuple(windows)
    blk = blocks(bounds)
    draft_cost = costs.stage(0, exits[0], 1)
    verify_cost = [None] + [costs.stage(exits[k - 1], exits[k], blk[k - 1]) for k in range(1, K)]
    win = np.tile(np.asarray(windows, np.int64), (B, 1))  # [B, K-1]
    rates = np.ones((B, K - 1))
    pend = np.zeros((B, K), np.int64)  # pend[:, k], k = 1..K-1
    seconds, emitted = 0.0, 0

    def accepted(n_B, alpha):
        if alpha >= 1.0:
            return n_B.copy()
        if alpha <= 0.0:
            return np.zeros_like(n_B)
        first_reject = rng.geometric(1.0 - alpha, size=n_B.shape) - 1
        return np.minimum(first_reject, n_B)

    for _ in range(rounds):
        seconds += costs.round_s
        higher_ready = np.zeros(B, bool)
        for k in range(2, K):
            higher_ready |= pend[:, k] >= win[:, k - 1] + 1
        for step in range(blk[0]):
            part = ~higher_ready & (pend[:, 1] < win[:, 0] + 1)
            if step == 0 or part.any():
                seconds += draft_cost
                pend[:, 1] += part
        for k in range(1, K):
            part = pend[:, k] > 0
            if k >= 2 and not (part & (pend[:, k] >= win[:, k - 1] + 1)).any():
                continue
            seconds += verify_cost[k]
            n = np.where(part, pend[:, k], 0)
            m = accepted(n, alphas[k - 1])
            reject = part & (m < n)
            adv = np.where(reject, m + 1, n)
            pend[:, k] = 0
            pend[reject, 1:k] = 0  # lower levels roll back to the rejected position
            if k == K - 1:
                emitted += int(adv.sum())
            else:
                pend[:, k + 1] += adv
            if adaptive:
                seen = part & (n > 0)
                rate = np.where(seen, 0.5 * rates[:, k - 1] + 0.5 * m / np.maximum(n, 1),
                                rates[:, k - 1])
                rates[:, k - 1] = rate
                if k == 1:
                    lo, hi = windows_lib.DRAFT_LEN_RANGE
                    new = np.where(rate >= windows_lib.DRAFT_UP, np.minimum(win[:, 0] + 1, hi),
                                   np.where(rate < windows_lib.DRAFT_DOWN,
                                            np.maximum(win[:, 0] - 1, lo), win[:, 0]))
                    win[:, 0] = np.where(seen, new, win[:, 0])
                if k == K - 1 and K >= 3:
                    lo, hi = windows_lib.VERIFY_WINDOW_RANGE
                    new = np.where(rate >= windows_lib.VERIFY_UP, np.minimum(win[:, k - 1] + 1, hi),
                                   np.where(rate < windows_lib.VERIFY_DOWN,
                                            np.maximum(win[:, k - 1] - 1, lo), win[:, k - 1]))
                    win[:, k - 1] = np.where(seen, new, win[:, k - 1])
    per_sequence = emitted / B
    t = seconds / per_sequence
    return Prediction(per_sequence / rounds, t, B / t)


def work_costs(model) -> Costs:
    """`Costs` in layer equivalents instead of seconds: a layer pass costs 1 at any block
    length, exit e's head `head_cost_layers(e)`, nothing else (no fixed round or pass cost).
    `predict(..., work_costs(...)).seconds_per_token` is then the hierarchy's expected
    `work_per_token`, the engine's measured `stats["work_per_token"]` (`methods.work_stats`)."""
    cfg, L = model.cfg, model.cfg.num_layers
    shared = heads_lib.head_cost_layers(cfg, model.heads, L)
    return Costs(batch=1, num_layers=L, block_sizes=(1, 2), layer_s=(1.0, 1.0),
                 head_s=(shared, shared), head_scale=heads_lib.head_cost_scales(cfg, model.heads))


@dataclasses.dataclass(frozen=True)
class LookupProfile:
    """What the prompt-lookup drafter did on calibration prompts (`calibrate.measure_lookup`):
    measured, not modelled, because its acceptance is not i.i.d. per token (a copy runs
    until the text departs from its context; chat matches are spurious).

    Attributes:
      k: the lookup's k (the `lookup` option it ran with).
      rounds: loop trips of `method="lookup"` over the calibration prompts.
      tokens: tokens it emitted in the loop (per sequence, summed over the prompts).
      verified: [k + 1] (sequence, verification) pairs by the positions n each one ran
        (the engine's `verified_length_histogram`; a round without a match is n = 1).
      trace: the continuations and every exit's choices along them (`LookupTrace`): what
        the lookup under an exit is simulated on (None: lookup alone only).
    """

    k: int
    rounds: int
    tokens: int
    verified: tuple[int, ...]
    trace: "LookupTrace | None" = None

    def to_json(self) -> dict:
        return {"k": self.k, "rounds": self.rounds, "tokens": self.tokens,
                "verified": list(self.verified),
                "trace": self.trace.to_json() if self.trace is not None else None}

    @classmethod
    def from_json(cls, d: dict) -> "LookupProfile":
        return cls(k=int(d["k"]), rounds=int(d["rounds"]), tokens=int(d["tokens"]),
                   verified=tuple(int(n) for n in d["verified"]),
                   trace=LookupTrace.from_json(d["trace"]) if d.get("trace") else None)


def predict_lookup(profile: LookupProfile, costs: Costs, top: int) -> Prediction:
    """`method="lookup"` at the measured rounds and blocks: each verification over n
    positions is a pass of all `top` layers at the shortest compiled block holding n
    (`windows.power_of_two_blocks(k)`), each round adds `round_s`.

        seconds per token = (rounds * round_s + sum_n verified[n] * stage(0, top, block(n)))
                            / tokens

    At batch B a round runs every sequence at the block of its longest proposal; the
    histogram counts each sequence's own n, so this is a lower bound there."""
    compiled = windows_lib.power_of_two_blocks(profile.k)
    block = lambda n: min(b for b in compiled if b >= n)
    seconds = profile.rounds * costs.round_s + sum(
        count * costs.stage(0, top, block(n)) for n, count in enumerate(profile.verified)
        if n and count) / costs.batch
    tokens = profile.tokens / costs.batch  # per sequence
    t = seconds / max(tokens, 1e-9)
    return Prediction(tokens / max(profile.rounds, 1), t, costs.batch / t)


def end_to_end_tokens_per_second(pred: Prediction, costs: Costs, new_tokens: int) -> float:
    """What `generate` reports for one batch of `new_tokens` tokens per sequence: the first
    token comes from prefill (`costs.prefill_s`), the rest from the loop."""
    seconds = costs.prefill_s + max(new_tokens - 1, 0) * pred.seconds_per_token
    return costs.batch * new_tokens / seconds


# ------------------------------------------------------------------ lookup under exits
@dataclasses.dataclass(frozen=True)
class LookupTrace:
    """The calibration prompts' greedy continuations and every exit's greedy choice along
    them (`calibrate.measure_lookup_trace`): what `simulate_lookup` replays the prompt-lookup
    drafter under exits on.

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
    def from_json(cls, d: dict) -> "LookupTrace":
        return cls(max_ngram=int(d["max_ngram"]),
                   sequences=tuple(tuple(int(t) for t in s) for s in d["sequences"]),
                   starts=tuple(int(p) for p in d["starts"]),
                   predictions=tuple(sorted((int(e), tuple(tuple(int(t) for t in p) for p in per))
                                            for e, per in d["predictions"].items())))


@dataclasses.dataclass(frozen=True)
class LookupRun:
    """What `simulate_lookup` counted, summed over the calibration prompts.

    Attributes:
      batch: sequences per simulated loop (the calibration prompts are cycled to fill
        the last group; every row counts as a sequence).
      rounds: loop trips (summed over groups).
      passes: ((level k, block T), count) of every verification pass.
      emitted: tokens the loop emitted, per sequence (summed over groups, / batch).
      verified: [k + 1] the top level's (sequence, verification) pairs by positions n
        (the engine's `verified_length_histogram`).
    """

    batch: int
    rounds: int
    passes: tuple[tuple[tuple[int, int], int], ...]
    emitted: float
    verified: tuple[int, ...]


def _lookup_proposal(context: list[int], drafter, limit: int):
    """`drafter.propose` (a `lookup.PromptLookup`) for one sequence in numpy: (tokens,
    matched)."""
    c = len(context) - 1
    arr = np.asarray(context)
    # the longest suffix with an earlier occurrence
    for n in range(min(drafter.max_ngram, c), 0, -1):
        rows = np.lib.stride_tricks.sliding_window_view(arr[:c], n)  # row r ends at r + n - 1
        hits = np.flatnonzero((rows == arr[c - n + 1:]).all(axis=1))
        if hits.size:
            j = int(hits[-1]) + n - 1  # the most recent end
            m = max(1, min(c - j, limit, drafter.ngram_tokens(n)))  # ngram_tokens <= k
            return context[j + 1:j + 1 + m], True
    return [context[c]], False  # the placeholder: the newest token again


def simulate_lookup(trace: LookupTrace, k: int, exits: tuple[int, ...],
                    windows: tuple[int, ...], batch: int = 1) -> LookupRun:
    """The engine's greedy "sync" round loop with the prompt-lookup drafter as level 0 below
    exits (e_1, ..., e_{K-1} = L) (`engine.py`: `draft_phase`, `_Round.lookup_draft`,
    `verify`), replayed on the calibration continuations: level k verifies with exit e_k's
    recorded greedy choices, the top level with the continuation itself, so the lookup's
    matches and what each exit keeps of them are the measured ones.

        exits (L,)        method="lookup"
        exits (d, L)      lookup under layerskip: windows (Nd,), L verifies Nd + 1 tokens
        exits (d, i, L)   lookup under hispec: windows (Nd, Ni)

    The lookup's k moves as the engine's (`PromptLookup.adapt_one`, the drafter `methods`
    builds: by default "fixed", k every round). Exact at
    batch 1 where the exits' choices are context-free (the always-agree model) and for
    exits (L,); otherwise an exit's choice after a token the final layer will reject is
    read off the continuation's context (those tokens are discarded either way)."""
    from hispec_jax.decoding import lookup as lookup_lib

    K = len(exits) + 1  # level 0: the lookup drafter
    L = exits[-1]
    drafter = lookup_lib.PromptLookup(max_tokens=k, max_ngram=trace.max_ngram)  # as `methods`
    preds = dict(trace.predictions)
    thresholds = (k,) + tuple(w + 1 for w in windows)
    static = windows_lib.block_lengths(thresholds)
    # every level above the lookup runs at the shortest power-of-two block holding its
    # input (`Hierarchy.level_blocks`)
    level_blocks = {level: windows_lib.power_of_two_blocks(static[level - 1])
                    for level in range(1, K)}
    n_seq = len(trace.sequences)
    groups = [[(g + b) % n_seq for b in range(batch)] for g in range(0, n_seq, batch)]
    rounds, passes, emitted = 0, collections.Counter(), 0
    verified = np.zeros(static[-1] + 1, np.int64)
    for group in groups:
        seqs = [list(trace.sequences[s]) for s in group]
        P = [trace.starts[s] for s in group]
        buf = [seq[:p + 1] for seq, p in zip(seqs, P)]
        c = [[p] * K for p in P]
        max_new = [len(seq) - p for seq, p in zip(seqs, P)]
        num_new = [1] * batch
        window = [drafter.initial_window()] * batch
        looked = [0] * batch

        def choice(b, level, q):  # exit e_level's greedy token after position q
            if exits[level - 1] == L:
                return seqs[b][q + 1]
            per = preds[exits[level - 1]][group[b]]
            return per[min(q - P[b], len(per) - 1)]

        def pending(b, level):
            return c[b][level - 1] - c[b][level]

        def ready(b, level):
            if level == 1:
                return pending(b, 1) > 0
            ahead = c[b][level - 1] + 1 - (P[b] + num_new[b])
            return (pending(b, level) >= windows[level - 2] + 1
                    or (ahead >= max_new[b] - num_new[b] and pending(b, level) > 0))

        while any(n < m for n, m in zip(num_new, max_new)):
            rounds += 1
            active = [n < m for n, m in zip(num_new, max_new)]
            for b in range(batch):  # the draft phase: one lookup
                if not active[b] or ready(b, 1) or any(ready(b, j) for j in range(2, K)):
                    continue
                c0, length = c[b][0], P[b] + num_new[b]
                limit = max(1, min(window[b], max_new[b] - num_new[b] - (c0 + 1 - length), k))
                tokens, matched = _lookup_proposal(buf[b][:c0 + 1], drafter, limit)
                buf[b][c0 + 1:c0 + 1 + len(tokens)] = tokens
                c[b][0] = c0 + len(tokens)
                looked[b] = len(tokens) if matched else 0
            for level in range(1, K):
                part = [active[b] and pending(b, level) > 0 for b in range(batch)]
                if level >= 2 and not any(p and ready(b, level) for b, p in enumerate(part)):
                    continue
                longest = max([pending(b, level) for b in range(batch) if part[b]], default=0)
                sizes = level_blocks[level]
                block = next((t for t in sizes if t >= longest), sizes[-1])
                passes[(level, block)] += 1
                for b in range(batch):
                    if not part[b]:
                        continue
                    start, n = c[b][level], pending(b, level)
                    m = 0
                    while m < n and buf[b][start + 1 + m] == choice(b, level, start + m):
                        m += 1
                    if m < n:  # level's own token replaces the rejected one; lower levels roll back
                        pos = start + m + 1
                        buf[b][pos] = choice(b, level, start + m)
                        del buf[b][pos + 1:]
                        c[b][:level + 1] = [pos] * (level + 1)
                    else:
                        c[b][level] = c[b][level - 1]
                    if level == 1:  # `PromptLookup.adapt`
                        window[b] = drafter.adapt_one(window[b], looked[b], min(m, looked[b]))
                    if level == K - 1:
                        verified[n] += 1
                        count = min(c[b][level] - start, max_new[b] - num_new[b])
                        num_new[b] += count
                        emitted += count
    return LookupRun(batch=batch, rounds=rounds, passes=tuple(sorted(passes.items())),
                     emitted=emitted / batch, verified=tuple(int(v) for v in verified))


def predict_lookup_run(run: LookupRun, exits: tuple[int, ...], costs: Costs) -> Prediction:
    """The seconds of a simulated lookup loop at `costs`: each round `round_s`, each pass at
    level k `stage(e_{k-1}, e_k, its block)` (level 1 from layer 0: the lookup runs none).

        seconds per token = (rounds * round_s + sum passes * stage) / tokens per sequence"""
    lows = (0,) + tuple(exits[:-1])
    seconds = run.rounds * costs.round_s + sum(
        count * costs.stage(lows[level - 1], exits[level - 1], block)
        for (level, block), count in run.passes)
    t = seconds / max(run.emitted, 1e-9)
    return Prediction(run.emitted / max(run.rounds, 1), t, costs.batch / t)
