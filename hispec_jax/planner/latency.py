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
    """

    k: int
    rounds: int
    tokens: int
    verified: tuple[int, ...]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "LookupProfile":
        return cls(k=int(d["k"]), rounds=int(d["rounds"]), tokens=int(d["tokens"]),
                   verified=tuple(int(n) for n in d["verified"]))


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
