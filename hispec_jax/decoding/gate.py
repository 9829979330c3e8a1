"""The acceptance gates: how many tokens a prompt-lookup proposal is worth (docs/lookup.md,
"The acceptance gate"), and how long an exit drafter's window is worth (`choose_window`,
docs/engine.md, "The exit drafter's gate").

A proposal of m tokens is verified by one level-1 pass over m positions (m = 1 is exactly an
AR step), compiled at the shortest block T >= m of `windows.power_of_two_blocks`. Two
numbers decide whether it pays:

    expected tokens   E(m) = 1 + a + ... + a^(m-1) = (1 - a^m) / (1 - a)
                      (per-token acceptance a, geometric; every pass emits at least one
                      token: the accepted prefix, then the correction)
    relative cost     C(b, T) = cost(b, T) / cost(b, 1),  cost(b, T) = F + b T + J [T > 1]
                      (a pass over T positions of b sequences, in units of one row, a
                      position of a sequence: a fixed part F, one unit per row, and the
                      jump J from the AR step, one position per sequence, to a block pass,
                      the verification's own code path, that a CPU shows), or the
                      C(b, T) this device measured where `PassCost` has it
                      (`measure_pass_cost`, `block_costs`)

`choose` picks each round's block T* maximising expected tokens per unit of cost, so a
sequence whose drafts do not pay proposes 1 token: an AR step that still checks the match's
first token, so its estimate keeps learning.

The per-token acceptance is estimated online, per sequence and per kind of proposal: the
n of the n-gram that matched (1..N), and for prompt lookup whether the sequence is on a run
(its proposals kept `RUN` or more tokens in a row, no rejection since: it is copying a
passage). Each bucket keeps decayed counts of kept tokens and of rejections (a proposal
that kept fewer tokens than it proposed); a = kept / (kept + rejections) with a prior of
`PRIOR_KEPT` kept and `PRIOR_REJECTED` rejections (on a run `PRIOR_RUN_KEPT` and
`PRIOR_RUN_REJECTED`), the maximum likelihood estimate of a geometric run length. Shapes
are fixed ([B, 2N] float32 twice with runs, else [B, N]) and every number (F, J, the
counts) is an array: nothing recompiles.

    columns    0 .. N-1                  N .. 2N-1
               match of n = 1 .. N       the same, on a run (>= RUN tokens kept in a row)

The geometric model's acceptance is one number per bucket, while a quoted passage's
continuation is far likelier once a few of its tokens have held: on the planner's replay of
SmolLM2-135M's greedy answers (`latency.replay`, batch 1, the CPU's default pass cost) the
run buckets moved the gated loop from 0.955 to 0.990 of ungated lookup on extract, 0.979 to
0.997 on summarize, 0.944 to 0.977 on code, and left open chat at 1.01
(docs/lookup.md, "The acceptance gate").

Only proposal lengths change, and they depend on the past only, so greedy output stays AR's
and sampling stays exact (q one-hot, `lookup.one_hot_logq`).

An exit drafter's drafts are one kind of proposal: one bucket of the same counts per
sequence (`GateState` with N = 1), and `choose_window` weighs each window's expected tokens
against its draft steps and level-1 pass at the same `PassCost`.
"""

from __future__ import annotations

import time

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.decoding import xla_options
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.transformer import embed, run_layers_cached

# A fresh bucket's estimate a = 2 / 3: with it a first match proposes 8 of k = 16 tokens at
# the CPU's default pass cost (a = 1 / 2 proposed 4), and 2 tokens, not 1, in a busy batch
# of 8. Chosen on the planner's replay (`latency.replay`) of SmolLM2-135M's greedy answers
# to 8 prompts of each `hispec bench --tasks` task against ungated lookup: prior (1, 1) ->
# (2, 1) moved the gated loop from 0.92-0.95 to 0.94-0.98 of the ungated one on extract,
# summarize and code without the run buckets (0.97-0.99 to 0.98-1.00 with them), and left
# chat at 1.01 (docs/lookup.md, "The acceptance gate"). More optimistic priors gain a little
# more there; the replay prices a batch of one, not the busy batches where the gate's
# caution pays.
PRIOR_KEPT = 2.0
PRIOR_REJECTED = 1.0
# On a run (the sequence's proposals kept RUN or more tokens in a row, none rejected since)
# a fresh bucket's estimate is 8 / 9: a copied passage goes on. RUN = 1, 2 or 4 replay
# alike at batch 1; 4 proposed less in busy batches of 8 (the same replay).
RUN = 4
PRIOR_RUN_KEPT = 8.0
PRIOR_RUN_REJECTED = 1.0
DECAY = 0.9  # each new proposal of a bucket weighs its counts by this: about the last 10

# Default (F, J) per backend, in units of one row of the verification pass. CPU: fitted
# (`fit_pass_cost`) to SmolLM2-135M's passes on 2 cores without XLA's YNNPACK fusions, one
# sequence's blocks of 2-16 positions and batches of 2-8 at 2-4 positions (docs/lookup.md,
# "The acceptance gate"). Accelerators: a decode pass is memory-bound
# up to a few hundred rows (the ridge point of an H100 in bf16 is about 300 flops per byte,
# one row of a pass about 1 flop per weight byte). `measure_pass_cost` measures a model.
DEFAULT_PASS_COST = {"cpu": (15.75, 4.25), "gpu": (256.0, 0.0), "tpu": (256.0, 0.0)}

# The passes a measured table holds (`PassCost.measured_RxT`): the batches of a server's busy
# rows (`slots.active_rows`) and the power-of-two blocks a level above a lookup is compiled
# at (`windows.power_of_two_blocks`, up to options.MAX_LOOKUP).
TABLE_ROWS = (1, 2, 4, 8, 16, 32, 64)
TABLE_BLOCKS = (1, 2, 4, 8, 16, 32, 64)


@flax.struct.dataclass
class PassCost:
    """What a verification pass costs on this device, in units of one row (one position of
    one sequence). Arrays, so a new measurement never recompiles.

    Two x86 hosts with the same cores can price the same pass differently (for SmolLM2 a
    block of 2 positions has cost one 2-core host 1.2 AR steps and another, AVX2 without
    AVX-512, 1.8): the fit is the shape of the curve, the table what this device measured
    (`measure_pass_cost`; `device_costs.py` keeps it per host and model).

    Attributes:
      fixed: [] float32, F: the part of a pass that does not grow with its rows (weights
        read, dispatch, the loop's own work).
      jump: [] float32, J: what a block pass (several positions per sequence) costs beyond
        F + rows, against the AR step (0 on an accelerator).
      measured_RxT: [len(TABLE_ROWS), len(TABLE_BLOCKS)] float32, the relative costs
        C(b, T) measured on this device (row b of `TABLE_ROWS`, block T of
        `TABLE_BLOCKS`); NaN where not measured, there the fit (F, J) prices the pass.
    """

    fixed: jax.Array
    jump: jax.Array
    measured_RxT: jax.Array

    @classmethod
    def of(cls, fixed: float, jump: float = 0.0,
           measured: dict[tuple[int, int], float] | None = None) -> "PassCost":
        """(F, J), and `measured` {(b, T): C(b, T)} for the passes in the table (others are
        ignored)."""
        table = np.full((len(TABLE_ROWS), len(TABLE_BLOCKS)), np.nan, np.float32)
        for (b, T), c in (measured or {}).items():
            if b in TABLE_ROWS and T in TABLE_BLOCKS:
                table[TABLE_ROWS.index(b), TABLE_BLOCKS.index(T)] = c
        return cls(fixed=jnp.asarray(fixed, jnp.float32), jump=jnp.asarray(jump, jnp.float32),
                   measured_RxT=jnp.asarray(table))

    def measured(self) -> dict[tuple[int, int], float]:
        """{(b, T): C(b, T)} of the table's measured entries (host values)."""
        table = np.asarray(self.measured_RxT)
        return {(b, T): float(table[i, j]) for i, b in enumerate(TABLE_ROWS)
                for j, T in enumerate(TABLE_BLOCKS) if not np.isnan(table[i, j])}


def default_pass_cost(backend: str | None = None) -> PassCost:
    """`DEFAULT_PASS_COST` of `backend` (default: JAX's default backend)."""
    backend = backend or jax.default_backend()
    return PassCost.of(*DEFAULT_PASS_COST.get(backend, DEFAULT_PASS_COST["gpu"]))


def pass_cost(batch, block, cost: PassCost):
    """cost(b, T) = F + b T + J [T > 1]: a pass over T positions of b sequences, in units
    of one row."""
    batch = jnp.asarray(batch, jnp.float32)
    block = jnp.asarray(block, jnp.float32)
    return cost.fixed + batch * block + cost.jump * (block > 1)


def relative_cost(batch, block, cost: PassCost):
    """C(b, T) = cost(b, T) / cost(b, 1): a pass over a block of T positions of b sequences
    against the AR step of the same b sequences (C(b, 1) = 1)."""
    return pass_cost(batch, block, cost) / pass_cost(batch, 1, cost)


def block_costs(batch: int, blocks: tuple[int, ...], cost: PassCost) -> jax.Array:
    """[J] float32, C(b, T) of a pass over each block T of `blocks` for a static batch of
    b = `batch` sequences: the measured table's entry where it has one, else the fit's."""
    fitted_J = relative_cost(batch, jnp.asarray(blocks, jnp.float32), cost)
    if batch not in TABLE_ROWS:
        return fitted_J
    row = cost.measured_RxT[TABLE_ROWS.index(batch)]
    nan = jnp.asarray(jnp.nan, jnp.float32)
    measured_J = jnp.stack([row[TABLE_BLOCKS.index(T)] if T in TABLE_BLOCKS else nan
                            for T in blocks])
    return jnp.where(jnp.isnan(measured_J), fitted_J, measured_J)


def expected_tokens(accept, length):
    """E(m) = (1 - a^m) / (1 - a) = 1 + a + ... + a^(m-1): the tokens a pass over a proposal
    of m tokens emits when each is accepted with probability a, independently, until the
    first rejection (whose correction is the pass's last token). E(1) = 1."""
    accept = jnp.asarray(accept, jnp.float32)
    length = jnp.asarray(length, jnp.float32)
    # the sum form for a near 1, where 1 - a^m and 1 - a both vanish
    near_one = accept > 1.0 - 1e-4
    safe = jnp.where(near_one, 0.5, accept)
    return jnp.where(near_one, length, (1.0 - safe ** length) / (1.0 - safe))


@flax.struct.dataclass
class GateState:
    """Each sequence's acceptance estimates, per n-gram length of the match (and, with
    `runs`, per whether the sequence is on a run).

    Attributes:
      kept_BxN: [B, N] float32 ([B, 2N] with runs), decayed tokens kept of proposals from
        an n-gram match (column n - 1; on a run N + n - 1).
      rejected_BxN: the same shape, decayed rejections (proposals that kept fewer tokens
        than they proposed).
      ngram_B: [B] int32, the n of the match behind level 1's pending proposal (0: none).
      run_B: [B] int32, the tokens the sequence's proposals kept in a row since its last
        rejection.
      runs: (static) whether the buckets tell runs apart (prompt lookup: on; the exit
        drafter's one bucket: off).
    """

    kept_BxN: jax.Array
    rejected_BxN: jax.Array
    ngram_B: jax.Array
    run_B: jax.Array
    runs: bool = flax.struct.field(pytree_node=False, default=False)

    @classmethod
    def init(cls, batch: int, max_ngram: int, runs: bool = False) -> "GateState":
        zeros = jnp.zeros((batch, max_ngram * (2 if runs else 1)), jnp.float32)
        none_B = jnp.zeros((batch,), jnp.int32)
        return cls(kept_BxN=zeros, rejected_BxN=zeros, ngram_B=none_B, run_B=none_B, runs=runs)

    @property
    def max_ngram(self) -> int:
        return self.kept_BxN.shape[1] // (2 if self.runs else 1)

    def acceptance(self) -> jax.Array:
        """[B, N] (with runs [B, 2N]) float32 a = kept / (kept + rejections), with the
        prior, in (0, 1)."""
        N = self.max_ngram
        prior_kept, prior_rejected = [PRIOR_KEPT] * N, [PRIOR_REJECTED] * N
        if self.runs:
            prior_kept += [PRIOR_RUN_KEPT] * N
            prior_rejected += [PRIOR_RUN_REJECTED] * N
        kept = self.kept_BxN + jnp.asarray(prior_kept, jnp.float32)
        return kept / (kept + self.rejected_BxN + jnp.asarray(prior_rejected, jnp.float32))

    def column(self, ngram_B: jax.Array) -> jax.Array:
        """[B] int32, the bucket of a match of n = `ngram_B` (>= 1; 0 reads n = 1) for each
        sequence as it stands (on a run or not)."""
        col_B = jnp.clip(ngram_B - 1, 0, self.max_ngram - 1)
        if self.runs:
            col_B = col_B + self.max_ngram * (self.run_B >= RUN)
        return col_B

    def of_match(self, ngram_B: jax.Array) -> jax.Array:
        """[B] the estimate of each sequence's bucket for a match of n = `ngram_B`."""
        return jnp.take_along_axis(self.acceptance(), self.column(ngram_B)[:, None],
                                   axis=1)[:, 0]

    def record(self, proposed_B: jax.Array, kept_B: jax.Array) -> "GateState":
        """Level 1 kept `kept_B` of the `proposed_B` tokens of the pending proposals (from
        matches of n = `ngram_B`, chosen in the bucket the sequence was in then); proposed
        0 (no match, not verified) changes nothing."""
        M = self.kept_BxN.shape[1]
        proposed = proposed_B > 0
        hit_BxM = proposed[:, None] & (jnp.arange(M)[None, :] == self.column(self.ngram_B)[:, None])
        whole_B = kept_B >= proposed_B
        rejected_B = (~whole_B).astype(jnp.float32)
        kept = jnp.where(hit_BxM, DECAY * self.kept_BxN + kept_B[:, None], self.kept_BxN)
        rejected = jnp.where(hit_BxM, DECAY * self.rejected_BxN + rejected_B[:, None],
                             self.rejected_BxN)
        run_B = jnp.where(proposed, jnp.where(whole_B, self.run_B + kept_B, 0), self.run_B)
        return self.replace(kept_BxN=kept, rejected_BxN=rejected, run_B=run_B)


def choose(accept_B: jax.Array, length_B: jax.Array, matched_B: jax.Array, part_B: jax.Array,
           blocks: tuple[int, ...], cost: PassCost, *, joint: bool) -> jax.Array:
    """The gated proposal lengths: [B] int32 in [1, length_B].

    Args:
      accept_B: [B] float32, each sequence's estimated per-token acceptance a.
      length_B: [B] int32 >= 1, what the ungated drafter proposes: the match's length
        within the schedule's and the budget's limits (1: no match, the placeholder).
      matched_B: [B] bool, a real match (the placeholder has length 1 whatever the gate).
      part_B: [B] bool, the sequences taking part in this round.
      blocks: the block lengths level 1's pass is compiled at (ascending).
      cost: the device's `PassCost`.
      joint: one block for the batch (greedy, "sync": the pass runs at the longest block of
        its participants, over all B rows): T* maximises the batch's expected tokens per
        unit of cost, and every sequence fills it. Otherwise (sampling, "own": a sequence's
        draws never depend on the rest of the batch) each sequence picks its own T* with
        the cost of a batch of one.
    """
    B = length_B.shape[0]
    T_J = jnp.asarray(blocks, jnp.int32)
    m_BxJ = jnp.minimum(T_J[None, :], length_B[:, None])
    m_BxJ = jnp.where(matched_B[:, None], m_BxJ, 1)
    tokens_BxJ = expected_tokens(accept_B[:, None], m_BxJ)
    if joint:
        # rows of the pass: all B (done and idle rows run too), at the block T
        score_J = jnp.sum(jnp.where(part_B[:, None], tokens_BxJ, 0.0), axis=0) / block_costs(
            B, blocks, cost)
        score_BxJ = jnp.broadcast_to(score_J[None, :], tokens_BxJ.shape)
    else:
        score_BxJ = tokens_BxJ / block_costs(1, blocks, cost)[None, :]
    # the longest block among equals: equal scores mean the longer block costs no more
    best_B = len(blocks) - 1 - jnp.argmax(score_BxJ[:, ::-1], axis=1)
    return jnp.where(matched_B, m_BxJ[jnp.arange(B), best_B], 1).astype(jnp.int32)


def proposal_value(accept_B: jax.Array, length_B: jax.Array, matched_B: jax.Array,
                   blocks: tuple[int, ...], cost: PassCost) -> jax.Array:
    """[B] float32, what a proposal is worth: the most expected tokens per unit of cost
    that a pass over any block of it (its first min(T, m) tokens, T of `blocks`) brings a
    sequence on its own, max_T E(min(T, m)) / C(1, T). No match: 1, the AR step's
    E(1) / C(1, 1). How the lookup weighs a match in the sequence's own context against
    one in earlier requests' store, each at its own bucket's estimate (`LookupDrafter`)."""
    T_J = jnp.asarray(blocks, jnp.int32)
    m_BxJ = jnp.where(matched_B[:, None], jnp.minimum(T_J[None, :], length_B[:, None]), 1)
    score_BxJ = expected_tokens(accept_B[:, None], m_BxJ) / block_costs(1, blocks, cost)[None, :]
    return jnp.where(matched_B, jnp.max(score_BxJ, axis=1), 1.0)


# ------------------------------------------------------------- the exit drafter's gate
def exit_round_cost(batch, window, draft_fraction, verify_fraction, cost: PassCost,
                    bonus: bool = False):
    """What a round of an exit drafter at window W costs, in units of one row of a full
    pass: W + 1 draft steps over the b rows of the batch through the draft exit's share
    f_0 of the model, then level 1's pass over b (W + 1) rows through its share f_1:

        cost(W) = (W + 1) f_0 cost(b, 1) + f_1 cost(b, W + 1)

    With `bonus` (a draft model: W drafts, and level 1's last position a placeholder it
    replaces with its own token) the round runs W draft steps, not W + 1."""
    n = jnp.asarray(window, jnp.float32) + 1.0
    b = jnp.asarray(batch, jnp.float32)
    steps = n - 1.0 if bonus else n
    return (steps * draft_fraction * pass_cost(b, 1, cost)
            + verify_fraction * pass_cost(b, n, cost))


def choose_window(accept_B: jax.Array, limit_B: jax.Array, part_B: jax.Array,
                  max_window: int, draft_fraction, verify_fraction, cost: PassCost, *,
                  joint: bool, bonus: bool = False) -> jax.Array:
    """The exit drafter's gated windows: [B] int32 in [0, limit_B].

    A round at window W drafts W + 1 tokens, of which level 1 keeps E(W + 1) in
    expectation (`expected_tokens`: a geometric run, then the correction); it costs
    `exit_round_cost`. With `bonus` (a draft model) a round at W drafts W tokens and level
    1 emits E(W + 1) (the run, then the correction or, after W kept, its bonus token); W = 0
    is an AR step. Each candidate W = 0 .. `max_window` (the compiled bound) is scored
    by expected tokens per unit of cost, and the best one wins (the longest among equals).
    A sequence whose drafts do not pay gets W = 0: one draft, checked by a one-position
    pass, the least a round of an exit drafter does.

    Args:
      accept_B: [B] float32, each sequence's estimated per-token acceptance a.
      limit_B: [B] int32, the window policy's window (the gate never exceeds it).
      part_B: [B] bool, the sequences that run the next round.
      max_window: the largest window the loop is compiled for (static).
      draft_fraction, verify_fraction: f_0 and f_1, the shares of a full pass (layers and
        head) a draft step and level 1's pass run per row.
      cost: the device's `PassCost`.
      joint: one window for the batch (greedy, "sync": draft steps and level 1's pass run
        over all B rows at the longest window of the batch); otherwise (sampling, "own")
        each sequence picks its own with the cost of a batch of one.
    """
    B = accept_B.shape[0]
    W_J = jnp.arange(max_window + 1, dtype=jnp.int32)
    m_BxJ = jnp.minimum(W_J[None, :], limit_B[:, None]) + 1
    tokens_BxJ = expected_tokens(accept_B[:, None], m_BxJ)
    if joint:
        score_J = jnp.sum(jnp.where(part_B[:, None], tokens_BxJ, 0.0), axis=0) / exit_round_cost(
            B, W_J, draft_fraction, verify_fraction, cost, bonus)
        score_BxJ = jnp.broadcast_to(score_J[None, :], tokens_BxJ.shape)
    else:
        score_BxJ = tokens_BxJ / exit_round_cost(1, W_J, draft_fraction, verify_fraction,
                                                 cost, bonus)[None, :]
    best_B = max_window - jnp.argmax(score_BxJ[:, ::-1], axis=1)
    return jnp.minimum(W_J[best_B], limit_B).astype(jnp.int32)


# ------------------------------------------------------------------------ measuring F, J
def fit_pass_cost(seconds: dict[tuple[int, int], float]) -> PassCost:
    """(F, J) whose relative costs C(b, T) best match measured ones, from the seconds of a
    pass over T positions of b sequences, `seconds[b, T]` (each b with T = 1, the AR step
    of b sequences, and at least one T > 1): least squares of log C over every measured
    (b, T > 1), on a grid of F in [0, 64] and J in [0, 32] in steps of 1/4."""
    pairs = [(b, T) for (b, T) in seconds if T > 1 and (b, 1) in seconds]
    if not pairs:
        raise ValueError("fit_pass_cost needs a pass over T > 1 positions and the AR step "
                         "of the same batch")
    b = np.asarray([p[0] for p in pairs], np.float64)
    T = np.asarray([p[1] for p in pairs], np.float64)
    want = np.log([seconds[p] / seconds[(p[0], 1)] for p in pairs])
    F = np.arange(0.0, 64.0 + 1e-9, 0.25)[:, None, None]
    J = np.arange(0.0, 32.0 + 1e-9, 0.25)[None, :, None]
    cost = lambda b, T: F + b * T + J * (T > 1)  # noqa: E731
    err = ((np.log(cost(b, T) / cost(b, 1)) - want) ** 2).sum(-1)
    i, j = np.unravel_index(np.argmin(err), err.shape)
    return PassCost.of(float(F[i, 0, 0]), float(J[0, j, 0]))


def time_passes(model, shapes, context: int = 256, capacity: int = 512, repeats: int = 5,
                calls: int = 10) -> dict[tuple[int, int], float]:
    """Seconds of `model`'s verification pass (every layer, the final head, argmax) over T
    positions of b sequences with `context` cached positions, for every (b, T) of `shapes`.
    Interleaved repeats, the fastest of each: contention only ever adds time."""
    cfg, params = model.cfg, model.params
    L = cfg.num_layers
    per_layer = isinstance(params["layers"], (tuple, list))

    def program(b, T):
        positions = context + jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (b, T))

        def f(params, tokens, cache):
            h, cache = run_layers_cached(params, cfg, embed(params, tokens), positions, cache,
                                         0, L)
            return jnp.argmax(exit_logits(params, {}, cfg, h, L), -1), cache
        return jax.jit(f, donate_argnums=(2,))

    shapes = tuple(dict.fromkeys(shapes))
    caches = {s: KVCache.zeros(cfg, s[0], capacity, per_layer=per_layer) for s in shapes}
    tokens = {s: jnp.zeros(s, jnp.int32) for s in shapes}
    options = xla_options.PLATFORM_OPTIONS.get(jax.default_backend()) or None
    progs = {s: program(*s).lower(params, tokens[s], caches[s]).compile(
        compiler_options=options) for s in shapes}  # the decoding loops' options

    def timed(s):
        t0 = time.perf_counter()
        for _ in range(calls):
            out, caches[s] = progs[s](params, tokens[s], caches[s])
        jax.block_until_ready(out)
        return (time.perf_counter() - t0) / calls

    for s in shapes:  # compile and warm
        timed(s)
    best = {s: np.inf for s in shapes}
    for _ in range(repeats):
        for s in shapes:
            best[s] = min(best[s], timed(s))
    return best


# The (b, T) `measure_pass_cost` times: one sequence's blocks, and the batches of a server's
# busy rows (`slots.active_rows`) at short blocks.
MEASURED_PASSES = ((1, 1), (1, 2), (1, 4), (1, 8), (1, 16), (2, 1), (2, 2), (2, 4), (4, 1),
                   (4, 2), (4, 4), (8, 1), (8, 2), (8, 4))


def measure_pass_cost(model, context: int = 256, capacity: int = 512, repeats: int = 5,
                      calls: int = 10, shapes=MEASURED_PASSES) -> PassCost:
    """`model`'s passes timed on this device (`time_passes` over `shapes`): their relative
    costs C(b, T) as the table, and (F, J) fitted to them (`fit_pass_cost`) for the passes
    it does not hold. Run once per device and model (`device_costs.measure_and_store` keeps
    it); the result goes with the request (`Request.lookup_cost`)."""
    return measured_pass_cost(time_passes(model, shapes, context, capacity, repeats, calls))


def measured_pass_cost(seconds: dict[tuple[int, int], float]) -> PassCost:
    """The `PassCost` of measured passes' `seconds`: (F, J) fitted to them, their relative
    costs as the table."""
    return with_measured(fit_pass_cost(seconds), seconds)


def with_measured(cost: PassCost, seconds: dict[tuple[int, int], float]) -> PassCost:
    """`cost` with the relative costs C(b, T) = seconds[b, T] / seconds[b, 1] of every
    measured pass (whose AR step of b sequences is measured too) as its table."""
    measured = {(b, T): s / seconds[b, 1] for (b, T), s in seconds.items() if (b, 1) in seconds}
    return PassCost.of(float(cost.fixed), float(cost.jump), measured)
