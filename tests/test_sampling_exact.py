"""Sampling mode keeps the model's exact distribution.

1. Each acceptance rule alone, by exact enumeration on a tiny vocabulary: for every draft
   sequence (probability under q) take the rule's exact outcome distribution, extend every
   outcome to the full block length with the target p, and compare with p's own joint
   distribution (to 1e-6). The uncapped blockwise variant is the negative control.
2. The whole decoding loop, statistically: thousands of seeded HiSpec samples against the
   exact autoregressive distribution of the first tokens (computed by enumeration with
   the model), with a chi-square threshold derived from the number of outcomes; a broken
   rule must fail the same test.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hispec_jax import Model, ModelConfig, generate
from hispec_jax.decoding.acceptance import (BlockwiseVerification, Outcomes, TokenwiseRejection,
                                            _log_positive_part)
from hispec_jax.decoding.engine import Hierarchy
from hispec_jax.decoding.methods import Decoder
from hispec_jax.decoding.sampling import SamplingParams, filtered_logprobs
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.params import init_params
from hispec_jax.models.transformer import embed, run_layers_cached


# ---------------------------------------------------------------- 1. exact enumeration
def random_conditionals(rng, V, gamma, zero_frac):
    """p(.|prefix) for every prefix of length < gamma, some entries exactly zero."""
    table = {}
    for n in range(gamma):
        for prefix in itertools.product(range(V), repeat=n):
            w = rng.gamma(0.5, size=V)
            w[rng.rand(V) < zero_frac] = 0.0
            if w.sum() == 0:
                w[rng.randint(V)] = 1.0
            table[prefix] = w / w.sum()
    return table


def joint(table, seq):
    return math.prod(table[tuple(seq[:t])][seq[t]] for t in range(len(seq)))


def rule_outcomes(rule, p_table, q_table, V, gamma):
    """Every draft sequence with q-probability > 0, its probability, and the rule's exact
    outcome distribution for it (one batched call: row = draft sequence)."""
    drafts = [d for d in itertools.product(range(V), repeat=gamma) if joint(q_table, d) > 0]
    with np.errstate(divide="ignore"):
        logp = np.log(np.stack([[p_table[d[:t]] for t in range(gamma)] for d in drafts]))
        logq = np.log(np.stack([[q_table[d[:t]] for t in range(gamma)] for d in drafts]))
    o: Outcomes = rule.outcomes(jnp.asarray(logp, jnp.float32), jnp.asarray(logq, jnp.float32),
                                jnp.asarray(drafts, jnp.int32), jnp.full((len(drafts),), gamma))
    stop = np.asarray(o.stop_probs_BxT, np.float64)
    residual = np.exp(np.asarray(o.residual_logp_BxTxV, np.float64))
    all_prob = np.asarray(o.all_prob_B, np.float64)
    return [(d, joint(q_table, d), stop[b], residual[b], all_prob[b]) for b, d in enumerate(drafts)]


def output_distribution(rule, p_table, q_table, V, gamma):
    """Exact distribution over length-gamma sequences: rule outcome, then continue with p."""
    dist = {}
    for drafts, q_prob, stop, residual, all_prob in rule_outcomes(rule, p_table, q_table, V, gamma):
        outcomes = [(tuple(drafts), all_prob)]
        for tau in range(gamma):
            if stop[tau] <= 0:
                continue
            if residual[tau].sum() <= 0:  # p == q up to float32 rounding: stop prob ~ 0
                assert stop[tau] < 1e-6
                continue
            r = residual[tau] / residual[tau].sum()
            for y in range(V):
                if r[y] > 0:
                    outcomes.append((tuple(drafts[:tau]) + (y,), stop[tau] * r[y]))
        for prefix, prob in outcomes:  # extend to length gamma with p
            for tail in itertools.product(range(V), repeat=gamma - len(prefix)):
                seq = prefix + tail
                ext = math.prod(p_table[seq[:t]][seq[t]] for t in range(len(prefix), gamma))
                dist[seq] = dist.get(seq, 0.0) + q_prob * prob * ext
    return dist


def total_variation(dist, p_table, V, gamma):
    return 0.5 * sum(abs(dist.get(seq, 0.0) - joint(p_table, seq))
                     for seq in itertools.product(range(V), repeat=gamma))


def expected_accepted(rule, p_table, q_table, V, gamma):
    return sum(q_prob * (gamma * all_prob + sum(t * stop[t] for t in range(gamma)))
               for _, q_prob, stop, _, all_prob in rule_outcomes(rule, p_table, q_table, V, gamma))


CASES = [(V, gamma, seed, zero_frac) for V, gamma in [(2, 1), (2, 3), (3, 2), (3, 3)]
         for seed in range(2) for zero_frac in (0.0, 0.3)]


def target_and_draft(V, gamma, seed, zero_frac):
    rng = np.random.RandomState(seed)
    return random_conditionals(rng, V, gamma, zero_frac), random_conditionals(rng, V, gamma, zero_frac)


def draft_cannot_propose(p_table, q_table) -> bool:
    """Some token has q = 0 where p > 0."""
    return any(np.any((q == 0) & (p_table[k] > 0)) for k, q in q_table.items())


# the cases with zeros where some target-supported token has draft probability exactly 0
ZERO_DRAFT_CASES = [c for c in CASES if c[3] > 0 and draft_cannot_propose(*target_and_draft(*c))]


def check_rule_exact(rule, V, gamma, seed, zero_frac, draft_zeros):
    """The rule's output has exactly the target's joint distribution (total variation
    < 1e-6) for random p and q with a share `zero_frac` of exact zeros. `draft_zeros`:
    "exact" keeps q's zeros where p > 0 (tokens the draft can never propose, as a draft
    vocabulary makes them: only the replacement can produce them); "smoothed" gives
    them q = 1e-3 (tiny proposal probabilities, extreme ratios p/q)."""
    p_table, q_table = target_and_draft(V, gamma, seed, zero_frac)
    if draft_zeros == "smoothed":
        for k in q_table:
            q_table[k] = np.where((q_table[k] == 0) & (p_table[k] > 0), 1e-3, q_table[k])
            q_table[k] /= q_table[k].sum()
    else:
        assert draft_cannot_propose(p_table, q_table), "the case tests nothing new"
    dist = output_distribution(rule, p_table, q_table, V, gamma)
    assert total_variation(dist, p_table, V, gamma) < 1e-6


@pytest.mark.parametrize("V,gamma,seed,zero_frac,draft_zeros",
                         [c + ("smoothed",) for c in CASES]
                         + [c + ("exact",) for c in ZERO_DRAFT_CASES])
@pytest.mark.parametrize("rule", [TokenwiseRejection(), BlockwiseVerification()],
                         ids=["tokenwise", "blockwise"])
def test_rule_preserves_target_distribution_exactly(rule, V, gamma, seed, zero_frac, draft_zeros):
    check_rule_exact(rule, V, gamma, seed, zero_frac, draft_zeros)


@dataclasses.dataclass(frozen=True)
class DraftSupportResidual(TokenwiseRejection):
    """Mutant: the replacement is drawn only among tokens the draft could propose (q > 0),
    the slip a draft vocabulary invites. Exact whenever q > 0 everywhere."""

    def outcomes(self, target_logp_BxTxV, proposal_logp_BxTxV, proposed_BxT, num_proposed_B):
        o = super().outcomes(target_logp_BxTxV, proposal_logp_BxTxV, proposed_BxT, num_proposed_B)
        return dataclasses.replace(o, residual_logp_BxTxV=jnp.where(
            jnp.isfinite(proposal_logp_BxTxV), o.residual_logp_BxTxV, -jnp.inf))


def test_zero_probability_drafts_catch_a_draft_support_residual():
    """Negative control: the mutant passes with smoothed drafts and fails with exact zeros,
    so the "exact" cases above are the ones that guard draft vocabularies."""
    check_rule_exact(DraftSupportResidual(), 3, 2, 0, 0.3, "smoothed")
    with pytest.raises(AssertionError):
        check_rule_exact(DraftSupportResidual(), 3, 2, 0, 0.3, "exact")


def test_uncapped_blockwise_is_caught():
    """The paper code's uncapped min(1, R_gamma) variant is not exact; the test sees it."""
    worst = 0.0
    for seed in range(4):
        rng = np.random.RandomState(seed)
        p_table, q_table = (random_conditionals(rng, 3, 3, 0.0) for _ in range(2))
        dist = output_distribution(BlockwiseVerification(capped=False), p_table, q_table, 3, 3)
        worst = max(worst, total_variation(dist, p_table, 3, 3))
    assert worst > 1e-3


@pytest.mark.parametrize("seed", range(3))
def test_blockwise_accepts_at_least_as_many_tokens(seed):
    """Paper Thm 7: sequence-level verification accepts >= token-wise, same drafts."""
    rng = np.random.RandomState(seed)
    p_table, q_table = (random_conditionals(rng, 3, 3, 0.0) for _ in range(2))
    tok = expected_accepted(TokenwiseRejection(), p_table, q_table, 3, 3)
    blk = expected_accepted(BlockwiseVerification(), p_table, q_table, 3, 3)
    assert blk >= tok - 1e-6


def test_residual_of_equal_distributions_is_empty():
    p = jnp.log(jnp.asarray([[0.5, 0.5]]))
    assert not bool(jnp.any(jnp.isfinite(_log_positive_part(jnp.exp(p), jnp.exp(p)))))


# ------------------------------------------------------- 2. through the decoding loop
VOCAB = 4
NEW = 3
PROMPT = [1, 2, 3]


def small_model() -> Model:
    """The 4-layer model whose first NEW tokens are enumerated (VOCAB tokens)."""
    cfg = ModelConfig(model_type="llama", vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                      num_layers=4, num_heads=2, num_kv_heads=1, head_dim=8,
                      max_position_embeddings=64)
    params = init_params(cfg, jax.random.PRNGKey(7), init_std=0.5)
    return Model(cfg=cfg, params=params, generation_config={})


@pytest.fixture(scope="module")
def model():
    return small_model()


@functools.partial(jax.jit, static_argnames="cfg")
def _next_token_logp(params, tokens_BxT, arrays, *, cfg):
    """log P(next token | tokens) [B, V] after the sampling filters, from the final layer.
    Module-level, with the sampling settings as arrays: every exact distribution of a model
    config shares its compiled programs (one per prefix length)."""
    B, T = tokens_BxT.shape
    L = cfg.num_layers
    cache = KVCache.zeros(cfg, B, T)
    h, _ = run_layers_cached(params, cfg, embed(params, tokens_BxT),
                             jnp.broadcast_to(jnp.arange(T), (B, T)), cache, 0, L)
    logits = exit_logits(params, {}, cfg, h[:, -1:], L)[:, 0]
    return filtered_logprobs(logits, arrays)


def exact_ar_distribution(model, sampling: SamplingParams):
    """P(first NEW tokens) under autoregressive sampling, by enumerating every prefix (one
    jitted batched forward per prefix length)."""
    arrays = sampling.arrays()
    cond = {}  # prefix -> next-token distribution
    for t in range(NEW):
        prefixes = list(itertools.product(range(VOCAB), repeat=t))
        tokens = jnp.asarray([PROMPT + list(p) for p in prefixes], jnp.int32)
        probs = np.exp(np.asarray(_next_token_logp(model.params, tokens, arrays, cfg=model.cfg),
                                  np.float64))
        cond.update(zip(prefixes, probs))
    return {seq: math.prod(cond[seq[:t]][seq[t]] for t in range(NEW))
            for seq in itertools.product(range(VOCAB), repeat=NEW)}


def chi_square_test(samples, probs, n):
    """Chi-square statistic over outcomes (pooling expected counts < 5) and the 1e-6 quantile."""
    counts = {}
    for s in samples:
        counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    stat, pooled_obs, pooled_exp, df = 0.0, 0, 0.0, 0
    for seq, p in probs.items():
        e = n * p
        if e < 5:
            pooled_obs += counts.get(seq, 0)
            pooled_exp += e
            continue
        stat += (counts.get(seq, 0) - e) ** 2 / e
        df += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-9)
        df += 1
    df -= 1
    z = 4.75  # one-sided normal quantile of 1e-6: the test fails by chance once in 10^6 runs
    threshold = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3  # Wilson-Hilferty
    return stat, threshold


@dataclasses.dataclass(frozen=True)
class _ResampleFromTarget(TokenwiseRejection):
    """A broken rule: replaces a rejected token from p instead of the residual."""

    def outcomes(self, target, proposal, proposed, n):
        o = super().outcomes(target, proposal, proposed, n)
        return dataclasses.replace(o, residual_logp_BxTxV=target)


N_SAMPLES = 6000


def sample(model, method, sampling, **options):
    r = generate(model, [PROMPT] * N_SAMPLES, method=method, max_new_tokens=NEW, ignore_eos=True,
                 temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                 seed=sampling.seed, **options)
    return r.token_ids


@pytest.mark.parametrize("acceptance", ["tokenwise", "blockwise"])
def test_hispec_sampling_matches_exact_distribution(model, acceptance):
    sampling = SamplingParams(temperature=1.0, top_k=3, seed=11)
    probs = exact_ar_distribution(model, sampling)
    got = sample(model, "hispec", sampling, draft_exit=1, verify_exits=(2,), draft_len=2,
                 verify_window=2, acceptance=acceptance)
    stat, threshold = chi_square_test(got, probs, N_SAMPLES)
    assert stat < threshold, (stat, threshold)


def test_sv_sampling_matches_exact_distribution(model):
    """SV's verification length depends on the companion's signals; it is a stopping time
    of the drafts, so token-wise rejection stays exact (the table makes lengths vary)."""
    from test_sv_specbound import synthetic_table

    sampling = SamplingParams(temperature=1.0, top_k=3, seed=13)
    probs = exact_ar_distribution(model, sampling)
    r = generate(model, [PROMPT] * N_SAMPLES, method="sv", draft_exit=1, verify_exits=(2,),
                 draft_len=3, sv_profile=synthetic_table(1, 2, 4, seed=1, slope=1.0),
                 max_new_tokens=NEW, ignore_eos=True, temperature=1.0, top_k=3, seed=13)
    assert sum(n > 0 for n in r.stats["verified_length_histogram"]) >= 2
    stat, threshold = chi_square_test(r.token_ids, probs, N_SAMPLES)
    assert stat < threshold, (stat, threshold)


@pytest.mark.parametrize("acceptance", ["tokenwise", "blockwise"])
def test_specbound_sampling_matches_exact_distribution(model, acceptance):
    """Each draft's q is the distribution of the exit it left at (chosen before the draw)."""
    sampling = SamplingParams(temperature=1.0, seed=17)
    probs = exact_ar_distribution(model, sampling)
    r = generate(model, [PROMPT] * N_SAMPLES, method="specbound", tau=0.45, anneal=0.5,
                 depth_bound=3, width=2, acceptance=acceptance, max_new_tokens=NEW,
                 ignore_eos=True, temperature=1.0, seed=17)
    assert len(r.stats["draft_exit_histogram"]) >= 2, r.stats["draft_exit_histogram"]
    stat, threshold = chi_square_test(r.token_ids, probs, N_SAMPLES)
    assert stat < threshold, (stat, threshold)


def test_ar_sampling_matches_exact_distribution(model):
    sampling = SamplingParams(temperature=0.7, top_p=0.9, seed=5)
    probs = exact_ar_distribution(model, sampling)
    stat, threshold = chi_square_test(sample(model, "ar", sampling), probs, N_SAMPLES)
    assert stat < threshold, (stat, threshold)


def test_broken_rule_fails_the_same_test(model):
    sampling = SamplingParams(temperature=1.0, top_k=3, seed=11)
    probs = exact_ar_distribution(model, sampling)
    broken = Decoder(Hierarchy(exits=(1, 2, 4), max_windows=(3, 8), rule=_ResampleFromTarget(),
                               schedule="own"), windows=(2, 2))
    stat, threshold = chi_square_test(sample(model, broken, sampling), probs, N_SAMPLES)
    assert stat > threshold, (stat, threshold)


def test_sampling_is_reproducible_per_sequence_regardless_of_batch(model):
    opts = dict(method="hispec", draft_exit=1, verify_exits=(2,), max_new_tokens=12,
                ignore_eos=True, temperature=1.0, seed=3)
    alone = generate(model, [PROMPT], **opts).token_ids[0]
    batch = generate(model, [PROMPT, [0, 1], [3, 3, 3, 2]], **opts).token_ids
    assert batch[0] == alone
    again = generate(model, [PROMPT, [2]], **opts).token_ids
    assert again[0] == alone
