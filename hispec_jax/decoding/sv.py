"""Speculative Verification (SV, docs/algorithms.md): how many drafts the top level verifies,
chosen from a companion's agreement signals.

In this engine SV is a 3-level hierarchy (draft exit e_0, companion exit e_1, final layer L)
whose level 1 does not reject: it continues the drafts' layer-e_0 states through
[e_0, e_1) (work the top level reuses), scores every draft token x_i with

    S_i = sum_v min(p_d(v), p_c(v))          (distribution overlap, draft vs companion)
    A_i = min(1, p_c(x_i) / p_d(x_i))        (the companion's acceptance of the token)

looks up alpha_i = mean top-level acceptance of the (S, A) bin in a profiled table
(`SVTable`, built offline by `planner/sv_profile.py`), and passes the first gamma drafts up
with the draft's own distributions (the top level verifies them against q = p_d):

    E[accepted | gamma] = sum_{k <= gamma} prod_{i <= k} alpha_i
    gamma grows from 1 while  E[accepted] / (round seconds + verify seconds(gamma))  grows

The top level's pass is compiled at a few block lengths (`Hierarchy.top_blocks`), so a
shorter verification is a cheaper one; its cost per length comes from the profile.

Exactness. gamma >= 1 always (the top level always emits a token). Verification only
shortens the draft, and the decision to include draft k uses only x_<k and the
distributions at position k: alpha_k enters as its expectation over x_k ~ q (greedy: q is
one-hot, so it is the realized alpha_k). gamma is therefore a stopping time of the draft
sequence and token-wise rejection against q keeps the target distribution exactly.

Batches. The top level's pass costs by its block length, so the paper's per-batch greedy
allocation (add the (sequence, token) with the largest marginal expected gain while the
batch's goodput grows) becomes, in a fixed-shape engine: grow the common length gamma while
the *batch's* goodput grows; every sequence submits its first min(gamma, n_b) drafts
(tokens up to the block length are free). Greedy decoding selects per batch; sampling
selects per sequence, so a sequence's draws never depend on the rest of the batch.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from hispec_jax.decoding.acceptance import Verdict, leading_run
from hispec_jax.decoding.costs import Costs, device_key
from hispec_jax.decoding.windows import power_of_two_blocks

PROFILE_FILE = "sv_profile.json"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class SVTable:
    """An offline SV profile of one (draft exit, companion exit) pair of a model.

    Attributes:
      draft_exit, companion_exit: the exits it was profiled for.
      s_edges: interior bin edges of S (equal-count bins, ascending).
      a_edges: interior bin edges of A.
      greedy_acceptance: [len(s_edges) + 1][len(a_edges) + 1] mean top-level acceptance of a
        draft token in each bin, greedy (top-1 agreement with the final layer).
      sampling_acceptance: the same for token-wise rejection, min(1, p_t(x) / p_d(x)).
      counts: [S bins][A bins] positions per bin.
      costs: `costs.Costs` as JSON (seconds of a layer / head per block length).
      meta: how it was made (prompts, positions, model key, device).
    """

    draft_exit: int
    companion_exit: int
    s_edges: tuple[float, ...]
    a_edges: tuple[float, ...]
    greedy_acceptance: tuple[tuple[float, ...], ...]
    sampling_acceptance: tuple[tuple[float, ...], ...]
    counts: tuple[tuple[int, ...], ...]
    costs: dict
    meta: dict = dataclasses.field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict[str, Any]:
        return {"version": FORMAT_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "SVTable":
        if d.get("version") != FORMAT_VERSION:
            raise ValueError(f"SV profile version {d.get('version')!r} is not {FORMAT_VERSION}; "
                             "run `hispec profile-sv` again")
        tup2 = lambda rows, f: tuple(tuple(f(x) for x in row) for row in rows)
        return cls(draft_exit=int(d["draft_exit"]), companion_exit=int(d["companion_exit"]),
                   s_edges=tuple(map(float, d["s_edges"])),
                   a_edges=tuple(map(float, d["a_edges"])),
                   greedy_acceptance=tup2(d["greedy_acceptance"], float),
                   sampling_acceptance=tup2(d["sampling_acceptance"], float),
                   counts=tup2(d["counts"], int), costs=dict(d["costs"]),
                   meta=dict(d.get("meta", {})))

    def save(self, path) -> Path:
        path = Path(path)
        if path.is_dir():
            path = path / PROFILE_FILE
        path.write_text(json.dumps(self.to_json(), indent=1))
        return path

    @classmethod
    def load(cls, path) -> "SVTable":
        path = Path(path)
        if path.is_dir():
            path = path / PROFILE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no SV profile at {path}; make one with "
                                    "`hispec profile-sv --model MODEL`")
        return cls.from_json(json.loads(path.read_text()))


def find_table(model_path, table=None, exits: tuple[int, int] | None = None) -> SVTable:
    """The SV table: `table` itself (an `SVTable`, or a path to one, or a function
    `table(draft_exit, companion_exit) -> SVTable` called with `exits` once every other
    setting was checked: `hispec_jax.generate` passes one that finds or makes a profile),
    else the model directory's `sv_profile.json`. FileNotFoundError names what is missing."""
    if isinstance(table, SVTable):
        return table
    if callable(table):
        if exits is None:
            raise ValueError("an SV profile function needs the exits it is asked for")
        return table(*exits)
    if table is not None:
        return SVTable.load(table)
    if model_path is None:
        raise FileNotFoundError("method 'sv' needs an SV profile: this model has no directory "
                                "to look in; pass sv_profile=PATH (make one with "
                                "`hispec profile-sv`), or call hispec_jax.generate, which "
                                "makes a quick one")
    directory = Path(model_path)
    if directory.is_file():  # a .gguf file: look beside it
        directory = directory.parent
    return SVTable.load(directory / PROFILE_FILE)


def warn_if_other_device(table: SVTable) -> None:
    """Warns when `table`'s stage costs were measured on another kind of device: SV's
    verification lengths may then be poor choices (its output is exact regardless)."""
    import warnings

    measured_on = table.meta.get("device")
    if measured_on and measured_on != device_key():
        warnings.warn(f"this SV profile's costs were measured on {measured_on}, not on this "
                      f"{device_key()}: verification lengths may be poor choices (the "
                      "output is exact regardless); run `hispec profile-sv` on this device",
                      stacklevel=3)


@dataclasses.dataclass(frozen=True)
class SVSelector:
    """Level 1 of an SV hierarchy: how many drafts each sequence passes to the top level.
    Static (part of the compile key): the binned table and the cost model.

    Attributes:
      s_edges, a_edges: interior bin edges of S and A.
      acceptance: [S bins][A bins] mean top-level acceptance per bin.
      round_seconds: cost of a round before the top level's pass (drafts + companion).
      verify_seconds: cost of the top level's pass for gamma = 1, 2, ... (its block length
        rounded up to the compiled lengths).
      per_batch: one gamma for the whole batch (greedy) or one per sequence (sampling).
    """

    s_edges: tuple[float, ...]
    a_edges: tuple[float, ...]
    acceptance: tuple[tuple[float, ...], ...]
    round_seconds: float
    verify_seconds: tuple[float, ...]
    per_batch: bool = True

    # What the engine asks of a level-1 companion (`policies.Companion`).
    keeps_draft_dists: ClassVar[bool] = True  # the signals compare p_d with p_c, also greedy
    rejects: ClassVar[bool] = False  # a cut shortens the verification; nothing is replaced

    def passed_up(self, verdict: Verdict, num_proposed_B) -> jax.Array:
        """[B] gamma: a cut verdict (gamma - 1 accepted) passes x_gamma up too."""
        m_B = verdict.num_accepted_B
        return jnp.where(m_B < num_proposed_B, m_B + 1, m_B)

    def passed_dists(self, companion_BxTxV, draft_logp_BxTxV) -> jax.Array:
        """The drafts' own distributions: the top level verifies against q = p_d."""
        return draft_logp_BxTxV

    def alpha(self, S_BxT, A_BxTx) -> jax.Array:
        """Table lookup: alpha for signals S [B, T] and A [B, T, ...]."""
        table = jnp.asarray(self.acceptance, jnp.float32)
        s_bin = jnp.searchsorted(jnp.asarray(self.s_edges, jnp.float32), S_BxT, side="right")
        a_bin = jnp.searchsorted(jnp.asarray(self.a_edges, jnp.float32), A_BxTx, side="right")
        s_bin = s_bin.reshape(s_bin.shape + (1,) * (A_BxTx.ndim - S_BxT.ndim))
        return table[s_bin, a_bin]

    def signals(self, companion_logp_BxTxV, draft_logp_BxTxV, proposed_BxT):
        """(S [B, T], A of the proposed tokens [B, T], A of every token [B, T, V])."""
        p_c, p_d = jnp.exp(companion_logp_BxTxV), jnp.exp(draft_logp_BxTxV)
        S_BxT = jnp.sum(jnp.minimum(p_c, p_d), axis=-1)
        A_BxTxV = jnp.exp(jnp.minimum(companion_logp_BxTxV - draft_logp_BxTxV, 0.0))
        A_BxT = jnp.take_along_axis(A_BxTxV, proposed_BxT[..., None], axis=-1)[..., 0]
        return S_BxT, A_BxT, A_BxTxV

    def select(self, companion_BxTxV, draft_logp_BxTxV, proposed_BxT, num_proposed_B,
               greedy: bool) -> Verdict:
        """gamma per sequence, as a `Verdict`: gamma = n keeps every draft; gamma < n is
        reported as gamma - 1 accepted plus the "replacement" x_gamma itself (the engine
        then cuts the drafts after x_gamma and the top level checks x_1..x_gamma)."""
        T = proposed_BxT.shape[1]
        companion_logp = jax.nn.log_softmax(companion_BxTxV.astype(jnp.float32), axis=-1)
        S_BxT, A_BxT, A_BxTxV = self.signals(companion_logp, draft_logp_BxTxV, proposed_BxT)
        valid_BxT = jnp.arange(T)[None, :] < num_proposed_B[:, None]
        alpha_BxT = self.alpha(S_BxT, A_BxT)  # realized
        if greedy:
            expected_BxT = alpha_BxT
        else:  # E over x ~ q of alpha(S, A(x)): the decision may not look at x itself
            expected_BxT = jnp.sum(jnp.exp(draft_logp_BxTxV) * self.alpha(S_BxT, A_BxTxV), -1)
        reach_BxT = jnp.cumprod(jnp.where(valid_BxT, alpha_BxT, 1.0), axis=1)  # prod_{i<=t}
        reach_prev_BxT = jnp.concatenate([jnp.ones_like(reach_BxT[:, :1]), reach_BxT[:, :-1]], 1)
        gain_BxT = jnp.where(valid_BxT, reach_prev_BxT * expected_BxT, 0.0)
        known_BxT = jnp.cumsum(jnp.where(valid_BxT, reach_BxT, 0.0), axis=1)  # E[N(t)], t=j+1
        if self.per_batch:
            gain_BxT = jnp.broadcast_to(jnp.sum(gain_BxT, 0, keepdims=True), gain_BxT.shape)
            known_BxT = jnp.broadcast_to(jnp.sum(known_BxT, 0, keepdims=True), known_BxT.shape)
        cost_T = self.round_seconds + jnp.asarray(self.verify_seconds[:T], jnp.float32)
        # Grow from t to t + 1 (t = 1..T-1) while (E[N(t)] + gain_{t+1}) / c(t+1) > E[N(t)] / c(t).
        grows_BxT1 = ((known_BxT[:, :-1] + gain_BxT[:, 1:]) * cost_T[None, :-1]
                      > known_BxT[:, :-1] * cost_T[None, 1:])
        gamma_B = 1 + leading_run(grows_BxT1, jnp.full_like(num_proposed_B, T - 1))
        gamma_B = jnp.minimum(gamma_B, num_proposed_B)
        cut_B = gamma_B < num_proposed_B
        last_B = jnp.take_along_axis(proposed_BxT, jnp.maximum(gamma_B - 1, 0)[:, None], 1)[:, 0]
        predictions_BxT = jnp.argmax(companion_logp, axis=-1).astype(jnp.int32)
        return Verdict(jnp.where(cut_B, gamma_B - 1, num_proposed_B).astype(jnp.int32),
                       last_B.astype(jnp.int32), predictions_BxT)


def selector(table: SVTable, draft_exit: int, companion_exit: int, num_layers: int,
             draft_len: int, greedy: bool) -> SVSelector:
    """The in-loop selector for a hierarchy (draft_exit, companion_exit, L) with `draft_len`
    drafts per round, from a profile table and its costs."""
    if (table.draft_exit, table.companion_exit) != (draft_exit, companion_exit):
        raise ValueError(f"the SV profile was made for exits ({table.draft_exit}, "
                         f"{table.companion_exit}), not ({draft_exit}, {companion_exit}); run "
                         f"`hispec profile-sv --draft-exit {draft_exit} --verify-exits "
                         f"{companion_exit}`")
    costs = Costs.from_json(table.costs)
    block = draft_len + 1
    sizes = power_of_two_blocks(block)  # the top level's compiled blocks
    bucket = lambda t: min(s for s in sizes if s >= t)
    round_s = (block * costs.stage(0, draft_exit, 1) + costs.stage(draft_exit, companion_exit, block)
               + costs.round_s)
    verify_s = tuple(costs.stage(companion_exit, num_layers, bucket(t)) for t in range(1, block + 1))
    acceptance = table.greedy_acceptance if greedy else table.sampling_acceptance
    return SVSelector(s_edges=table.s_edges, a_edges=table.a_edges, acceptance=acceptance,
                      round_seconds=float(round_s), verify_seconds=verify_s, per_batch=greedy)


def equal_count_edges(values: np.ndarray, bins: int) -> tuple[float, ...]:
    """Interior edges that split `values` into about `bins` equal-count bins (ties, e.g.
    the many A = 1 values, merge bins rather than split a value across two)."""
    if values.size == 0:
        return ()
    qs = np.quantile(values, np.linspace(0, 1, bins + 1)[1:-1])
    edges = np.unique(qs)
    return tuple(float(e) for e in edges if values.min() < e <= values.max())


def build_table(S: np.ndarray, A: np.ndarray, greedy_ok: np.ndarray, sampling_acc: np.ndarray,
                draft_exit: int, companion_exit: int, costs: dict, s_bins: int = 20,
                a_bins: int = 10, meta: dict | None = None) -> SVTable:
    """Bins (S, A) into equal-count bins and averages the target acceptance per bin. An
    empty bin takes its S row's mean (else the overall mean)."""
    s_edges, a_edges = equal_count_edges(S, s_bins), equal_count_edges(A, a_bins)
    si = np.searchsorted(np.asarray(s_edges), S, side="right")
    ai = np.searchsorted(np.asarray(a_edges), A, side="right")
    shape = (len(s_edges) + 1, len(a_edges) + 1)
    counts = np.zeros(shape, int)
    np.add.at(counts, (si, ai), 1)

    def mean_table(values):
        sums = np.zeros(shape)
        np.add.at(sums, (si, ai), values)
        overall = float(values.mean()) if values.size else 0.0
        rows = sums.sum(1) / np.maximum(counts.sum(1), 1)
        rows = np.where(counts.sum(1) > 0, rows, overall)
        return np.where(counts > 0, sums / np.maximum(counts, 1), rows[:, None])

    r = lambda t: tuple(tuple(round(float(x), 5) for x in row) for row in t)
    return SVTable(draft_exit=draft_exit, companion_exit=companion_exit, s_edges=s_edges,
                   a_edges=a_edges, greedy_acceptance=r(mean_table(greedy_ok.astype(float))),
                   sampling_acceptance=r(mean_table(sampling_acc.astype(float))),
                   counts=tuple(tuple(int(c) for c in row) for row in counts),
                   costs=json.loads(json.dumps(costs)),  # as it reads back from the file
                   meta=meta or {})
