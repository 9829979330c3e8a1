"""bfloat16 on the CPU: every lossless decoding method's greedy output equals bfloat16 AR's
token for token, except where bfloat16 rounding decides a near-tie (docs/numerics.md states
what this does and does not cover).

A decoding step (one position) and a verification block (several) compute the same
products through different kernels; in float32 their results differ in the last bits, in
bfloat16 activations by up to a few bfloat16 steps, so where the top two logits are that
close the two paths may choose differently. The test takes that as the only allowed
departure: each sequence equals AR's up to its first difference, and there the two tokens
chosen are both within `NEAR_TIE` of the best logit of the model (a third computation: the
whole sequence in one uncached pass, `scan_exits`). A departure anywhere else fails it.

The model is the smallest of tests/test_engine.py (4 layers, D = 32, V = 64) in bfloat16
weights and activations, its layers scaled down so that exits agree often and drafts are
accepted in runs (rejections and long accepted runs both happen). bfloat16 on XLA:CPU is
slow, so one batch of two prompts and a few tokens. Not covered: `exit` (early exit is
lossy by design) and `auto` (a saved plan of one of these methods)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hispec_jax import generate
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.transformer import scan_exits
from test_engine import VOCAB, tiny_model
from test_sv_specbound import synthetic_table

L = 4
NEW_TOKENS = 12
NEAR_TIE = 2 ** -6  # relative to the largest logit's magnitude: 4 bfloat16 steps
METHODS = [
    ("layerskip", dict(draft_exit=1, draft_len=3)),
    ("hispec", dict(draft_exit=1, verify_exits=(2,), draft_len=2, verify_window=3)),
    ("hispec", dict(draft_exit=1, verify_exits=(2,), lookup=4)),  # lookup below the exit
    ("sv", dict(draft_exit=1, verify_exits=(2,), draft_len=3,
                sv_profile=synthetic_table(1, 2, L))),
    ("specbound", dict(tau=0.1, width=3)),
    ("lookup", dict(lookup=4)),
]


@pytest.fixture(scope="module")
def model():
    f32 = tiny_model(L, 0, layer_scale=0.1)
    return dataclasses.replace(
        f32, cfg=f32.cfg.replace(dtype="bfloat16"),
        params=jax.tree.map(lambda x: x.astype(jnp.bfloat16), f32.params))


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.RandomState(0)
    passage = rng.randint(0, VOCAB, 6).tolist()  # repeated, so lookup finds matches
    return [rng.randint(0, VOCAB, 5).tolist() + passage + passage[:3],
            rng.randint(0, VOCAB, 9).tolist()]


@pytest.fixture(scope="module")
def ar(model, prompts):
    return generate(model, prompts, method="ar", max_new_tokens=NEW_TOKENS,
                    ignore_eos=True).token_ids


def final_logits(model, tokens: list[int]) -> np.ndarray:
    """The final layer's logits after `tokens`, from one uncached pass over all of them."""
    h_1xTxD, _ = scan_exits(model.params, model.cfg, jnp.asarray([tokens]), lambda h, i: ())
    return np.asarray(exit_logits(model.params, {}, model.cfg, h_1xTxD, L)[0, -1], np.float32)


@pytest.mark.parametrize("method,options", METHODS,
                         ids=[f"{m}-{'-'.join(o)}" for m, o in METHODS])
def test_bfloat16_greedy_equals_bfloat16_ar_but_at_near_ties(model, prompts, ar, method,
                                                              options):
    got = generate(model, prompts, method=method, max_new_tokens=NEW_TOKENS, ignore_eos=True,
                   **options)
    assert model.params["embed"].dtype == jnp.bfloat16
    for prompt, ours, reference in zip(prompts, got.token_ids, ar):
        assert len(ours) == len(reference) == NEW_TOKENS
        i = next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), None)
        if i is None:
            continue
        logits = final_logits(model, prompt + reference[:i])
        best = logits.max()
        tie = NEAR_TIE * max(1.0, abs(best))
        assert best - logits[reference[i]] <= tie and best - logits[ours[i]] <= tie, (
            f"{method} departs from AR at new token {i} ({ours[i]} for {reference[i]}), "
            f"not at a near-tie: logits {logits[ours[i]]:.4f}, {logits[reference[i]]:.4f}, "
            f"best {best:.4f}")
