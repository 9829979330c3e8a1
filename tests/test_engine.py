"""The hierarchical engine is lossless (greedy == autoregressive greedy) and reuses work.

Models here are built directly from `init_params` (the AR path they are compared with is
itself checked against transformers in test_generate.py / test_numerics.py). Random models
reject most drafts; "agreeing" models have their layers' output projections scaled down so
that every exit (nearly) agrees with the final layer, exercising long accepted runs.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hispec_jax import Model, ModelConfig, generate
from hispec_jax.decoding import engine as engine_lib
from hispec_jax.decoding import methods
from hispec_jax.models.heads import head_cost_layers, lm_head_matrix
from hispec_jax.models.params import (init_params, is_fused, is_out_major, layer_dict_out_major,
                                      layer_layout, with_layer_layout)

VOCAB = 64


@functools.lru_cache(maxsize=None)
def tiny_model(num_layers: int, seed: int, layer_scale: float = 1.0, max_len: int = 256) -> Model:
    """A random Llama-style model; `layer_scale` scales every layer's residual contribution
    (0: every layer is the identity, so all exits give the final layer's argmax)."""
    cfg = ModelConfig(model_type="llama", vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                      num_layers=num_layers, num_heads=4, num_kv_heads=2, head_dim=8,
                      max_position_embeddings=max_len)
    params = init_params(cfg, jax.random.PRNGKey(seed), init_std=0.3)
    params["layers"]["wo"] = params["layers"]["wo"] * layer_scale
    params["layers"]["w_down"] = params["layers"]["w_down"] * layer_scale
    return Model(cfg=cfg, params=params, generation_config={"eos_token_id": 3})


def random_prompts(rng, batch, max_prompt_len):
    return [rng.randint(0, VOCAB, rng.randint(1, max_prompt_len + 1)).tolist() for _ in range(batch)]


@st.composite
def engine_cases(draw):
    L = draw(st.integers(2, 6))
    below = draw(st.lists(st.integers(1, L - 1), min_size=1, max_size=min(3, L - 1), unique=True))
    exits = sorted(below)
    return dict(
        L=L,
        seed=draw(st.integers(0, 3)),
        layer_scale=draw(st.sampled_from([1.0, 0.1, 0.0])),
        draft_exit=exits[0],
        verify_exits=tuple(exits[1:]),
        draft_len=draw(st.integers(1, 4)),
        verify_window=draw(st.integers(1, 5)),
        adaptive=draw(st.booleans()),
        # a few batch sizes, so that the AR reference loops are often reused (compile time)
        batch=draw(st.sampled_from([1, 3, 8])),
        max_prompt_len=draw(st.integers(1, 12)),
        max_new=draw(st.integers(1, 24)),
        ignore_eos=draw(st.booleans()),
        prompt_seed=draw(st.integers(0, 1000)),
        tight_cache=draw(st.booleans()),
    )


AR_CAPACITY = 64


def ar_reference(model, prompts, *, max_new_tokens, **options):
    """AR's result at one fixed cache capacity where the request fits it: a property test's
    cases then share a few compiled AR loops (one per batch size, prompt bucket and EOS
    setting) instead of one per case. The capacity never changes AR's tokens."""
    fits = (max(map(len, prompts)) + max_new_tokens <= AR_CAPACITY
            <= model.cfg.max_position_embeddings)
    return generate(model, prompts, max_new_tokens=max_new_tokens,
                    max_cache_len=AR_CAPACITY if fits else None, **options)


def check_equals_autoregressive(model, prompts, case, method, options):
    """Greedy `method` gives AR's tokens (case: max_new, ignore_eos, tight_cache: generation
    runs right up to the cache capacity). Returns the method's result."""
    decoder = methods.make_method(model, method, **options)
    max_cache_len = None
    if case["tight_cache"]:
        max_cache_len = max(map(len, prompts)) + case["max_new"] + decoder.lookahead()
    common = dict(max_new_tokens=case["max_new"], ignore_eos=case["ignore_eos"])
    ref = ar_reference(model, prompts, **common)
    got = generate(model, prompts, method=method, max_cache_len=max_cache_len, **common, **options)
    assert got.token_ids == ref.token_ids, (case, got.stats)
    return got


# Property tests draw from a fixed seed (derandomize: the same cases every run, nothing
# stored between runs); the awkward corners they exist for are explicit examples.
PROPERTY_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                         suppress_health_check=[HealthCheck.too_slow])
ENGINE_CASE = dict(L=4, seed=0, layer_scale=1.0, draft_exit=1, verify_exits=(), draft_len=1,
                   verify_window=1, adaptive=False, batch=1, max_prompt_len=1, max_new=1,
                   ignore_eos=False, prompt_seed=0, tight_cache=False)


@settings(max_examples=14, **PROPERTY_SETTINGS)
@given(case=engine_cases())
# one new token (prefill only), a one-token prompt, the cache exactly full
@example(case={**ENGINE_CASE, "tight_cache": True})
# every draft accepted, K = 4, a batch of one-token prompts running to the cache's last slot
@example(case={**ENGINE_CASE, "L": 6, "layer_scale": 0.0, "verify_exits": (2, 4),
               "draft_len": 4, "verify_window": 5, "batch": 8, "max_new": 24,
               "ignore_eos": True, "tight_cache": True, "prompt_seed": 3})
# adaptive windows on a model that agrees often, prompts of different lengths, EOS on
@example(case={**ENGINE_CASE, "L": 5, "layer_scale": 0.1, "verify_exits": (3,),
               "draft_len": 2, "verify_window": 3, "adaptive": True, "batch": 3,
               "max_prompt_len": 12, "max_new": 24, "prompt_seed": 7})
def test_greedy_equals_autoregressive(case):
    model = tiny_model(case["L"], case["seed"], case["layer_scale"])
    prompts = random_prompts(np.random.RandomState(case["prompt_seed"]), case["batch"],
                             case["max_prompt_len"])
    method = "hispec" if case["verify_exits"] else "layerskip"
    options = dict(draft_exit=case["draft_exit"], draft_len=case["draft_len"],
                   adaptive=case["adaptive"])
    if method == "hispec":
        options.update(verify_exits=case["verify_exits"], verify_window=case["verify_window"])
    got = check_equals_autoregressive(model, prompts, case, method, options)
    if case["ignore_eos"]:
        assert all(len(t) == case["max_new"] for t in got.token_ids)


@pytest.mark.parametrize("method,options", [
    ("layerskip", dict(draft_exit=2, draft_len=3)),
    ("hispec", dict(draft_exit=1, verify_exits=(3,), draft_len=2, verify_window=4)),
    ("hispec", dict(draft_exit=1, verify_exits=(2, 4), draft_len=2, verify_window=3)),
])
def test_always_agree_model_reaches_minimum_cost(method, options):
    """With identity layers every exit agrees with the top, so every draft is accepted:
    each layer must process each generated position exactly once (minus the last token,
    which is emitted but never fed back), and nothing is ever rolled back."""
    model = tiny_model(6, 0, layer_scale=0.0)
    prompts = [[5, 9, 11], [7], [1, 2, 3, 4, 5, 6, 7, 8]]
    N = 25
    ref = generate(model, prompts, method="ar", max_new_tokens=N, ignore_eos=True)
    got = generate(model, prompts, method=method, max_new_tokens=N, ignore_eos=True, **options)
    assert got.token_ids == ref.token_ids
    s = got.stats
    L = model.cfg.num_layers
    assert s["layer_token_evals"] == L * (N - 1) * len(prompts)
    assert all(r == 1.0 for r in s["acceptance_rate_per_level"][1:])
    assert ref.stats["layer_token_evals"] == L * (N - 1) * len(prompts)
    assert ref.stats["layer_passes_per_token"] == L


def test_always_agree_layerskip_layer_passes_formula():
    """K = 2, all accepted: a round is Nd + 1 draft passes of e_0 layers and one verify pass
    of L - e_0 layers, emitting Nd + 1 tokens."""
    model = tiny_model(6, 0, layer_scale=0.0)
    nd, e0, L = 2, 2, 6
    rounds = 8
    got = generate(model, [[4, 5]], method="layerskip", draft_exit=e0, draft_len=nd,
                   max_new_tokens=1 + rounds * (nd + 1), ignore_eos=True)
    assert got.stats["layer_passes"] == rounds * ((nd + 1) * e0 + (L - e0))
    assert got.stats["tokens_per_full_pass"] == nd + 1
    assert got.stats["layer_passes_per_token"] == pytest.approx(e0 + (L - e0) / (nd + 1))
    # work: every draft step evaluates e_0's head, every verification the final head
    assert got.stats["head_evals_per_exit"] == {e0: rounds * (nd + 1), L: rounds}
    head = head_cost_layers(model.cfg, model.heads, L)  # shared head at every exit
    tokens = rounds * (nd + 1)
    assert got.stats["work_per_token"] == pytest.approx(
        (rounds * ((nd + 1) * e0 + (L - e0)) + (rounds * (nd + 1) + rounds) * head) / tokens)
    assert got.stats["ar_work_per_token"] == pytest.approx(L + head)
    assert got.stats["work_speedup"] == pytest.approx((L + head) / got.stats["work_per_token"])


def test_batch_with_early_finishers_equals_single_runs():
    """Sequences that stop early (EOS, small budgets) do not change the others."""
    model = tiny_model(5, 1, layer_scale=0.1)
    rng = np.random.RandomState(0)
    prompts = random_prompts(rng, 6, 10)
    opts = dict(method="hispec", draft_exit=1, verify_exits=(2,), max_new_tokens=30)
    batch = generate(model, prompts, **opts)
    singles = [generate(model, [p], **opts).token_ids[0] for p in prompts]
    assert batch.token_ids == singles
    eos_hits = [t[-1] == 3 for t in batch.token_ids if len(t) < 30]
    assert all(eos_hits)


def test_stats_and_no_recompile_for_windows_and_prompt_lengths():
    model = tiny_model(4, 2, layer_scale=0.1)
    opts = dict(method="hispec", draft_exit=1, verify_exits=(2,), max_new_tokens=12)
    first = generate(model, [[1, 2, 3]], draft_len=2, verify_window=4, **opts)
    again = generate(model, [[4, 5, 6, 7, 8]], draft_len=1, verify_window=3, **opts)
    assert again.stats["compile_count"] == 0, "windows and prompt lengths must not recompile"
    s = first.stats
    for key in ("acceptance_rate_per_level", "final_acceptance_rate", "true_reject_rate",
                "false_accept_rate", "tokens_per_full_pass", "layer_passes_per_token",
                "layer_token_evals", "tokens_per_second", "compile_seconds", "actions_per_level"):
        assert key in s
    assert s["exits"] == [1, 2, 4]
    assert 0 <= s["final_acceptance_rate"] <= 1


# ----- Table 9's rates: values, and the in-loop bookkeeping behind them ------------------

def identity_above(num_layers: int, seed: int, first_identity: int, heads=None) -> Model:
    """A random model whose layers from index `first_identity` on are the identity (their
    output projections zeroed): every exit at or above layer `first_identity` sees the final
    hidden state."""
    base = tiny_model(num_layers, seed)
    layers = dict(base.params["layers"])
    keep = (jnp.arange(num_layers) < first_identity).astype(jnp.float32)
    for name in ("wo", "w_down"):
        layers[name] = layers[name] * keep.reshape((-1,) + (1,) * (layers[name].ndim - 1))
    return Model(cfg=base.cfg, params={**base.params, "layers": layers},
                 generation_config=base.generation_config, heads=heads or {})


def top_equals_verifier() -> Model:
    """Exits 2..4 give the final layer's logits, exit 1 does not: whatever the verifier at
    layer 2 passes up, the top accepts, and each of its rejections is one the top agrees
    with."""
    return identity_above(4, 3, 2)


def top_equals_drafter() -> Model:
    """Exit 1 carries the final norm + LM head and layers 2..4 are the identity, so drafts
    are the full model's own predictions; exit 2 has a random head. Every rejection by the
    verifier is then one the top disagrees with, and every correction it passes up is
    rejected by the top."""
    base = tiny_model(4, 3)
    D, V = base.cfg.hidden_size, base.cfg.vocab_size
    heads = {"1": {"norm": base.params["final_norm"], "proj": lm_head_matrix(base.params, base.cfg)},
             "2": {"norm": jnp.ones((D,)),
                   "proj": 0.3 * jax.random.normal(jax.random.PRNGKey(9), (D, V))}}
    return identity_above(4, 3, 1, heads)


RATE_PROMPTS = [[5, 9, 11], [7], [1, 2, 3, 4, 5, 6, 7, 8], [60, 2]]
RATE_OPTIONS = dict(method="hispec", draft_exit=1, verify_exits=(2,), draft_len=3,
                    verify_window=3, max_new_tokens=40, ignore_eos=True)


def check_table9_rates():
    """true_reject_rate and false_accept_rate take the values two constructed models force
    (exactly 1 and 0 when the top equals the verifier; exactly 0 and > 0 when the top
    equals the drafter), with greedy output still AR's."""
    for model, true_reject, false_accept in ((top_equals_verifier(), 1.0, 0.0),
                                             (top_equals_drafter(), 0.0, None)):
        ref = generate(model, RATE_PROMPTS, method="ar", max_new_tokens=40, ignore_eos=True)
        got = generate(model, RATE_PROMPTS, **RATE_OPTIONS)
        assert got.token_ids == ref.token_ids
        s = got.stats
        assert s["true_reject_rate"] == true_reject, s
        assert s["false_accept_rate"] == pytest.approx(1 - s["final_acceptance_rate"])
        if false_accept is None:
            assert s["false_accept_rate"] > 0.1, s
        else:
            assert s["false_accept_rate"] == false_accept, s


def test_true_reject_and_false_accept_rates_take_their_forced_values():
    check_table9_rates()


def _record_mutant(corrupt):
    """`Round.record` followed by `corrupt(old_state, new_state) -> new_state`."""
    original = engine_lib.Round.record

    def record(self, state, *args):
        return corrupt(state, original(self, state, *args))
    return record


BOOKKEEPING_MUTANTS = {
    # a rejection is never written to the ring: the top has nothing to check
    "ring_never_written": lambda old, new: new.replace(rejected_pos_BxW=old.rejected_pos_BxW),
    # every checked rejection counts as true
    "every_check_true": lambda old, new: new.replace(counters=new.counters.replace(
        true_rejects=new.counters.reject_checks)),
    # the top's agreement test inverted
    "agreement_inverted": lambda old, new: new.replace(counters=new.counters.replace(
        true_rejects=old.counters.true_rejects + (new.counters.reject_checks
                                                  - old.counters.reject_checks)
        - (new.counters.true_rejects - old.counters.true_rejects))),
}


@pytest.fixture
def fresh_compiles():
    """Compiled loops are cached by the engine's description, which a monkeypatched method
    does not change: drop them before and after a mutant runs."""
    engine_lib.clear_compiled()
    jax.clear_caches()
    yield
    engine_lib.clear_compiled()
    jax.clear_caches()


@pytest.mark.parametrize("mutant", sorted(BOOKKEEPING_MUTANTS))
def test_rate_check_catches_broken_bookkeeping(mutant, monkeypatch, fresh_compiles):
    """Negative control: each corruption of the in-loop true-reject bookkeeping (the ring
    of rejected positions and tokens, the counters) makes the check above fail."""
    monkeypatch.setattr(engine_lib.Round, "record", _record_mutant(BOOKKEEPING_MUTANTS[mutant]))
    with pytest.raises(AssertionError):
        check_table9_rates()


# ----- adaptive windows (App. J) ----------------------------------------------------------

def verified_lengths(stats) -> set[int]:
    return {n for n, count in enumerate(stats["verified_length_histogram"]) if count}


def check_windows_adapt():
    """App. J: on an always-agree model the draft length grows from 1 to its bound (3) and
    HiSpec's verify window from 3 to 8, so the top level verifies longer blocks; on a random
    model (most drafts rejected) a draft length of 3 shrinks to 1. Fixed windows keep their
    lengths throughout; the output stays AR's."""
    from hispec_jax.decoding.windows import DRAFT_LEN_RANGE, VERIFY_WINDOW_RANGE

    agree = tiny_model(6, 0, layer_scale=0.0)
    prompts = [[5, 9, 11], [7]]
    common = dict(max_new_tokens=40, ignore_eos=True)
    ref = generate(agree, prompts, **common)
    ls = dict(method="layerskip", draft_exit=2, draft_len=1, **common)
    fixed, adaptive = (generate(agree, prompts, adaptive=a, **ls) for a in (False, True))
    assert fixed.token_ids == adaptive.token_ids == ref.token_ids
    # K = 2: the top verifies Nd + 1 positions at a time (the last round may be cut short)
    assert max(verified_lengths(fixed.stats)) == 2
    assert max(verified_lengths(adaptive.stats)) == DRAFT_LEN_RANGE[1] + 1
    assert adaptive.stats["rounds"] < fixed.stats["rounds"]

    hs = dict(method="hispec", draft_exit=1, verify_exits=(3,), draft_len=1, verify_window=3,
              **common)
    fixed, adaptive = (generate(agree, prompts, adaptive=a, **hs) for a in (False, True))
    assert fixed.token_ids == adaptive.token_ids == ref.token_ids
    assert max(verified_lengths(adaptive.stats)) >= VERIFY_WINDOW_RANGE[1]
    assert max(verified_lengths(fixed.stats)) < VERIFY_WINDOW_RANGE[1]

    random_model = tiny_model(6, 1)
    ls = dict(method="layerskip", draft_exit=1, draft_len=3, **common)
    fixed, adaptive = (generate(random_model, prompts, adaptive=a, **ls) for a in (False, True))
    assert fixed.token_ids == adaptive.token_ids
    hist_fixed = fixed.stats["verified_length_histogram"]
    hist_adaptive = adaptive.stats["verified_length_histogram"]
    # fixed: nearly every verification checks 4 positions; adaptive: most check 2
    assert hist_fixed[4] > sum(hist_fixed) / 2
    assert hist_adaptive[DRAFT_LEN_RANGE[0] + 1] > sum(hist_adaptive) / 2


def test_adaptive_windows_grow_and_shrink():
    check_windows_adapt()


def test_window_check_catches_a_policy_that_never_adapts(monkeypatch, fresh_compiles):
    """Negative control: `AdaptiveWindows` whose update keeps the windows fails the check."""
    from hispec_jax.decoding import windows

    monkeypatch.setattr(windows.AdaptiveWindows, "update", windows.FixedWindows.update)
    with pytest.raises(AssertionError):
        check_windows_adapt()


def test_defaults_follow_the_paper():
    model = tiny_model(16, 0, max_len=128)
    d = methods.make_method(model, "hispec")
    assert d.hierarchy.exits == (2, 4, 16) and d.windows == (2, 4)
    d = methods.make_method(model, "layerskip")
    assert d.hierarchy.exits == (2, 16) and d.windows == (2,)


@pytest.mark.parametrize("options,match", [
    (dict(method="hispec", draft_exit=3, verify_exits=(2,)), "strictly increasing"),
    (dict(method="hispec", draft_exit=1, verify_exits=(4,)), "verify_exits=4"),
    (dict(method="layerskip", draft_exit=4), "draft_exit=4"),
    (dict(method="layerskip", draft_exit=0), "draft_exit=0"),
    (dict(method="layerskip", draft_len=0), "draft_len"),
    (dict(method="hispec", verify_window=0, draft_exit=1, verify_exits=(2,)), "verify_window"),
    (dict(method="layerskip", verify_window=2), "verify_window"),
    (dict(method="hispec", draft_exit=1, verify_exits=(2,), acceptance="exact"), "acceptance"),
    (dict(method="hispec", draft_exit=1, verify_exits=(2,), temperature=-1.0), "temperature"),
    (dict(method="hispec", draft_exit=1, verify_exits=(2,), max_new_tokens=300), "capacity"),
])
def test_bad_configurations_raise_before_compiling(options, match):
    model = tiny_model(4, 0)
    compiled_before = engine_lib.compilations
    options = {"max_new_tokens": 8, **options}
    with pytest.raises(ValueError, match=match):
        generate(model, [[1, 2]], **options)
    assert engine_lib.compilations == compiled_before


def test_exit_without_head_is_rejected():
    """A model with trained heads only has exits at those layers (and the final layer)."""
    base = tiny_model(4, 0)
    D, V = base.cfg.hidden_size, base.cfg.vocab_size
    heads = {"1": {"norm": jnp.ones((D,)), "proj": jnp.zeros((D, V))}}
    model = Model(cfg=base.cfg, params=base.params, heads=heads)
    with pytest.raises(ValueError, match="draft_exit=2 has no exit head"):
        generate(model, [[1, 2]], method="layerskip", draft_exit=2, max_new_tokens=4)
    assert methods.make_method(model, "layerskip").hierarchy.exits == (1, 4)


# The layout decides how the logits are computed, the temperature what is done with them:
# each layout once, one greedy and one sampled (the four combinations proved nothing more
# and compiled twice the loops).
# (fused in the canonical order: mesh_cases' fused AR case, against unfused AR's tokens)
@pytest.mark.parametrize("temperature,out_major,fused", [(0.0, False, False), (1.0, True, True)])
def test_unrolled_layer_layout_gives_the_same_tokens(temperature, out_major, fused):
    """The "unrolled" layout (per-layer weights, the CPU default of load_model), with its
    projections canonical or out-major (`name_T`: blocks of several rows multiply as
    `w_T @ x^T`), apart or fused (`wqkv`, `w_gate_up`: one product each), runs the same math
    as the scanned stacked weights: same tokens for every method, greedy or sampled (blocks
    of 1, 2 and more rows: drafts, lookup, verification, prefill)."""
    model = tiny_model(4, 0, 0.1)
    unrolled = dataclasses.replace(
        model, params=with_layer_layout(model.params, "unrolled", out_major=out_major,
                                        fused=fused))
    assert layer_layout(unrolled.params) == "unrolled" and layer_layout(model.params) == "scan"
    assert is_out_major(unrolled.params) == out_major and not is_out_major(model.params)
    assert is_fused(unrolled.params) == fused and not is_fused(model.params)
    prompts = random_prompts(np.random.RandomState(5), 3, 9)
    for method, options in [("ar", {}), ("exit", {"exit_layer": 2}),
                            ("layerskip", {"draft_exit": 1}),
                            ("hispec", {"draft_exit": 1, "verify_exits": (2,)}),
                            ("lookup", {"lookup": 4})]:
        runs = [generate(m, prompts, method=method, max_new_tokens=12, temperature=temperature,
                         seed=3, **options) for m in (model, unrolled)]
        assert runs[0].token_ids == runs[1].token_ids, method
        assert runs[0].stats["layer_passes"] == runs[1].stats["layer_passes"], method


def test_layer_layout_round_trip_and_errors():
    params = tiny_model(3, 1).params
    unrolled = with_layer_layout(params, "unrolled", out_major=False)
    assert len(unrolled["layers"]) == 3 and unrolled["layers"][1]["wq"].shape == params["layers"]["wq"].shape[1:]
    back = with_layer_layout(unrolled, "scan")
    jax.tree.map(np.testing.assert_array_equal, back, params)
    # out-major: every projection transposed to [out..., in...], and back exactly
    out_major = with_layer_layout(params, "unrolled", out_major=True)
    L, D, N, H = params["layers"]["wq"].shape
    assert out_major["layers"][1]["wq_T"].shape == (N, H, D)
    assert out_major["layers"][1]["wo_T"].shape == (D, N, H)
    assert "wq" not in out_major["layers"][1] and "attn_norm" in out_major["layers"][1]
    jax.tree.map(np.testing.assert_array_equal, with_layer_layout(out_major, "scan"), params)
    canonical = with_layer_layout(out_major, "unrolled", out_major=False)
    jax.tree.map(np.testing.assert_array_equal, canonical, unrolled)
    # fused: q/k/v grouped per kv head, gate/up stacked; either order, and back exactly
    K, F = params["layers"]["wk"].shape[2], params["layers"]["w_up"].shape[2]
    G = N // K
    for om in (False, True):
        fused = with_layer_layout(params, "unrolled", out_major=om, fused=True)
        layer = layer_dict_out_major(fused["layers"][1], False)
        assert set(layer) == {"attn_norm", "wqkv", "wo", "mlp_norm", "w_gate_up", "w_down"}
        assert layer["wqkv"].shape == (D, K, G + 2, H) and layer["w_gate_up"].shape == (D, 2, F)
        np.testing.assert_array_equal(layer["wqkv"][:, 1, G], params["layers"]["wk"][1, :, 1])
        np.testing.assert_array_equal(layer["wqkv"][:, 1, G + 1], params["layers"]["wv"][1, :, 1])
        np.testing.assert_array_equal(layer["wqkv"][:, 1, 1], params["layers"]["wq"][1, :, G + 1])
        np.testing.assert_array_equal(layer["w_gate_up"][:, 1], params["layers"]["w_up"][1])
        jax.tree.map(np.testing.assert_array_equal, with_layer_layout(fused, "scan"), params)
        jax.tree.map(np.testing.assert_array_equal,
                     with_layer_layout(fused, "unrolled", out_major=False, fused=False), unrolled)
    host = jax.tree.map(np.asarray, params)  # NumPy stays NumPy, both ways
    fused_host = with_layer_layout(host, "unrolled", fused=True)
    assert isinstance(fused_host["layers"][0]["wqkv"], np.ndarray)
    jax.tree.map(np.testing.assert_array_equal, with_layer_layout(fused_host, "scan"), host)
    with pytest.raises(ValueError, match="layer_layout='stacked'"):
        with_layer_layout(params, "stacked")


def test_attention_spans_keep_every_method_equal_to_whole_cache_ar(monkeypatch, fresh_compiles):
    """With a cache of several attention spans (`transformer.attention_spans`: S = 384 here,
    spans 128 / 256 / 384) and sequences crossing slot 128, AR, lookup, HiSpec with lookup
    below it, LayerSkip and SpecBound (dynamic-exit drafts) give the tokens of AR whose every
    attention reads the whole cache (the spans patched away, loops compiled afresh). A span
    one step too short fails it."""
    from hispec_jax.models import transformer

    model = tiny_model(5, 2, layer_scale=0.1, max_len=512)
    rng = np.random.RandomState(4)
    passage = rng.randint(0, VOCAB, 40).tolist()
    prompts = [rng.randint(0, VOCAB, 100).tolist(),
               rng.randint(0, VOCAB, 30).tolist() + passage + rng.randint(0, VOCAB, 40).tolist()
               + passage[:20]]
    common = dict(max_new_tokens=48, ignore_eos=True, max_cache_len=384)
    spans = transformer.attention_spans
    monkeypatch.setattr(transformer, "attention_spans", lambda capacity: (capacity,))
    whole = generate(model, prompts, **common)
    monkeypatch.setattr(transformer, "attention_spans", spans)
    engine_lib.clear_compiled()
    jax.clear_caches()
    assert len(spans(whole.stats["cache_capacity"])) == 3, whole.stats["cache_capacity"]
    for method, options in (("ar", {}), ("lookup", dict(lookup=6)),
                            ("hispec", dict(draft_exit=1, verify_exits=(3,), lookup=4)),
                            ("layerskip", dict(draft_exit=2)), ("specbound", {})):
        got = generate(model, prompts, method=method, **common, **options)
        assert got.token_ids == whole.token_ids, (method, got.stats)
