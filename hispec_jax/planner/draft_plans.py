"""A draft model's plans for `tune`: measured acceptance and draft-step cost -> the latency
model -> plans scored like the exit and lookup hierarchies.

A draft model drafting k tokens for the final layer (method "draft", the bonus: a round at
k drafts checks k + 1 positions and emits the accepted run, then the correction or, after k
kept drafts, the target's own next token):

    round cost   round_s + k t_draft + stage(0, L, block(k + 1))
    tokens       E(k + 1) = 1 + a + ... + a^k             (i.i.d. per-token acceptance a)

with the target's stages as `calibrate` measured them, t_draft the draft model's AR step
priced as the target's AR stage times the ratio of the two models' AR passes timed side by
side here (`gate.time_passes`), and a fitted to what the draft model's ungated drafts kept
on the calibration prompts (`acceptance`). The gate that the plan runs with (default on)
drafts fewer where drafts do not pay; the price here is the fixed-window one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hispec_jax.decoding.costs import Costs
from hispec_jax.models.model import Model
from hispec_jax.planner import latency
from hispec_jax.planner.plan import Plan

# the k a tune prices (and the k its acceptance is measured at: the largest)
CANDIDATE_KS = (1, 2, 3, 4, 5, 6, 8)


def per_token_acceptance(accepted: int, proposed: int, k: int) -> float:
    """The i.i.d. per-token acceptance a whose geometric run of at most k drafts keeps, in
    expectation, accepted / proposed of them: a + a^2 + ... + a^k = k accepted / proposed
    (bisection)."""
    if proposed <= 0:
        return 0.0
    want = k * accepted / proposed
    kept = lambda a: sum(a ** i for i in range(1, k + 1))  # noqa: E731
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if kept(mid) < want else (lo, mid)
    return (lo + hi) / 2


def acceptance(model: Model, prompts: list[list[int]], new_tokens: int, batch_size: int,
               k: int = max(CANDIDATE_KS)) -> dict[str, Any]:
    """What the draft model's ungated drafts of k tokens kept on `prompts` (greedy, EOS
    ignored): {"proposed", "accepted", "alpha"}."""
    from hispec_jax.decoding.generate import generate

    out = generate(model, prompts, method="draft", draft_k=k, draft_gate=False,
                   max_new_tokens=new_tokens, batch_size=batch_size, ignore_eos=True)
    stats = out.stats["draft_model"]
    return {"proposed": stats["proposed"], "accepted": stats["accepted"], "k": k,
            "alpha": per_token_acceptance(stats["accepted"], stats["proposed"], k)}


def draft_step_ratio(model: Model, batch_size: int, context: int, capacity: int,
                     repeats: int = 5) -> float:
    """The draft model's AR step over the target's, both timed here (`gate.time_passes`,
    interleaved, the fastest of `repeats`)."""
    from hispec_jax.decoding import gate

    draft = Model(cfg=model.draft.cfg, params=model.draft.params, generation_config={})
    target = Model(cfg=model.cfg, params={k: v for k, v in model.params.items() if k != "draft"},
                   generation_config={})
    shape = [(batch_size, 1)]
    t = gate.time_passes(target, shape, context=context, capacity=capacity, repeats=repeats)
    d = gate.time_passes(draft, shape, context=context, capacity=capacity, repeats=repeats)
    return d[shape[0]] / t[shape[0]]


def predict(k: int, alpha: float, draft_step_s: float, costs: Costs,
            num_layers: int) -> latency.Prediction:
    """The draft plan's steady-state speed (module docstring)."""
    block = latency.blocks((k,))[0]
    cost = costs.round_s + k * draft_step_s + costs.stage(0, num_layers, block)
    tokens = latency.expected_emitted(alpha, k + 1)
    t = cost / tokens
    return latency.Prediction(tokens, t, costs.batch / t)


def plans(alpha: float, step_ratio: float, costs: Costs, num_layers: int,
          ks=CANDIDATE_KS, gate: bool = True) -> list[Plan]:
    """A scored `Plan` per k (speedups over AR at the same costs); `gate`: the plans run
    with the acceptance gate."""
    ar = latency.predict((num_layers,), (), [], costs)
    draft_step_s = step_ratio * costs.stage(0, num_layers, 1)
    out = []
    for k in ks:
        pred = predict(k, alpha, draft_step_s, costs, num_layers)
        out.append(Plan(exits=(num_layers,), draft_k=k, draft_gate=gate,
                        predicted_tokens_per_second=pred.tokens_per_second,
                        predicted_speedup=pred.tokens_per_second / ar.tokens_per_second,
                        tokens_per_round=pred.tokens_per_round))
    return out


def measure(model: Model, prompts: list[list[int]], new_tokens: int, batch_size: int,
            capacity: int, progress=None, k: int = max(CANDIDATE_KS)) -> dict[str, Any]:
    """The draft model's acceptance on `prompts` (ungated drafts of `k` tokens) and its
    step's cost ratio (what `plans` takes)."""
    if progress:
        progress("draft model: acceptance on the calibration prompts")
    measured = acceptance(model, prompts, new_tokens, batch_size, k)
    if progress:
        progress("draft model: its step's cost against the target's")
    context = min(capacity // 2, int(np.mean([len(p) for p in prompts])) + new_tokens // 2)
    measured["step_ratio"] = draft_step_ratio(model, batch_size, context, capacity)
    return measured
