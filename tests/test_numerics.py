"""Logits at every exit match transformers (PyTorch) in float32: prefill and token-by-token."""

import dataclasses
import functools

import numpy as np
import pytest
import torch

import jax
import jax.numpy as jnp

from hispec_jax import load_model
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.kv_cache import KVCache
from hispec_jax.models.transformer import embed, run_layers_cached

KINDS = ("llama3", "llama2", "qwen3")
ATOL = 1e-4
ATOL_LONG, RTOL_LONG = 5e-4, 1e-3  # 100+ positions: float32 rounding grows with length


def hf_exit_logits(hf_model, tokens):
    """[exit][B, T, V]: final norm + LM head on HF hidden_states[e] (e < L), and the logits."""
    with torch.no_grad():
        out = hf_model(torch.tensor(tokens), output_hidden_states=True)
        L = hf_model.config.num_hidden_layers
        per_exit = [hf_model.lm_head(hf_model.model.norm(out.hidden_states[e])).numpy()
                    for e in range(1, L)]
    return per_exit + [out.logits.numpy()]


# Jitted as the decoding engine runs it (one compilation per layer range and block shape);
# run eagerly, a scanned layer range re-traced its scan at every call (~90 s per test).
_run_layers_cached = jax.jit(run_layers_cached, static_argnames=("cfg", "start", "stop"))


def our_exit_logits_by_layer(model, x, positions, cache):
    """Runs one layer at a time so every exit's logits come from one cached pass."""
    per_exit = []
    for e in range(1, model.cfg.num_layers + 1):
        x, cache = _run_layers_cached(model.params, model.cfg, x, positions, cache,
                                      start=e - 1, stop=e)
        per_exit.append(np.asarray(exit_logits(model.params, {}, model.cfg, x, e)))
    return per_exit, cache


@pytest.mark.parametrize("layout", ["scan", "unrolled"])
@pytest.mark.parametrize("kind", KINDS)
def test_prefill_logits_every_exit(hf_models, kind, layout):
    hf_model, path = hf_models[kind]
    model = load_model(path, layer_layout=layout)
    tokens = np.random.RandomState(0).randint(0, model.cfg.vocab_size, (2, 21))
    ref = hf_exit_logits(hf_model, tokens)
    cache = KVCache.zeros(model.cfg, 2, 32)
    positions = jnp.broadcast_to(jnp.arange(21), (2, 21))
    ours, _ = our_exit_logits_by_layer(model, embed(model.params, jnp.asarray(tokens)), positions, cache)
    for e, (o, r) in enumerate(zip(ours, ref), start=1):
        np.testing.assert_allclose(o, r, atol=ATOL, rtol=0, err_msg=f"exit {e}")


@pytest.mark.parametrize("layout,batch", [("scan", 2), ("unrolled", 2), ("unrolled", 1)])
@pytest.mark.parametrize("kind", KINDS)
def test_token_by_token_decode_every_exit(hf_models, kind, layout, batch):
    """Prefill 5 tokens, then feed one token at a time through the cache (batch 1 takes
    the single-query attention path on the CPU)."""
    hf_model, path = hf_models[kind]
    model = load_model(path, layer_layout=layout)
    T, P = 14, 5
    tokens = np.random.RandomState(1).randint(0, model.cfg.vocab_size, (batch, T))
    ref = hf_exit_logits(hf_model, tokens)
    cache = KVCache.zeros(model.cfg, batch, 16, per_layer=layout == "unrolled")
    positions = jnp.broadcast_to(jnp.arange(P), (batch, P))
    got, cache = our_exit_logits_by_layer(model, embed(model.params, jnp.asarray(tokens[:, :P])),
                                          positions, cache)
    for t in range(P, T):
        step, cache = our_exit_logits_by_layer(
            model, embed(model.params, jnp.asarray(tokens[:, t:t + 1])),
            jnp.full((batch, 1), t), cache)
        got = [np.concatenate([g, s], axis=1) for g, s in zip(got, step)]
    for e, (o, r) in enumerate(zip(got, ref), start=1):
        np.testing.assert_allclose(o, r, atol=ATOL, rtol=0, err_msg=f"exit {e}")


def test_ragged_positions_per_sequence(hf_models):
    """Two sequences at different positions in one decode step match their own HF runs."""
    hf_model, path = hf_models["llama3"]
    model = load_model(path)
    rng = np.random.RandomState(2)
    a, b = rng.randint(0, 97, 9), rng.randint(0, 97, 4)
    cache = KVCache.zeros(model.cfg, 2, 16)
    S = cache.capacity
    # prefill a[:8] and b[:3] right-padded to 8; padding uses the sentinel position S
    block = np.zeros((2, 8), np.int64)
    block[0], block[1, :3] = a[:8], b[:3]
    pos = np.array([list(range(8)), [0, 1, 2] + [S] * 5])
    L = model.cfg.num_layers
    x, cache = run_layers_cached(model.params, model.cfg, embed(model.params, jnp.asarray(block)),
                          jnp.asarray(pos), cache, 0, L)
    step = np.array([[a[8]], [b[3]]])
    x, cache = run_layers_cached(model.params, model.cfg, embed(model.params, jnp.asarray(step)),
                          jnp.asarray([[8], [3]]), cache, 0, L)
    ours = np.asarray(exit_logits(model.params, {}, model.cfg, x, L))[:, 0]
    with torch.no_grad():
        ref_a = hf_model(torch.tensor(a[None])).logits[0, -1].numpy()
        ref_b = hf_model(torch.tensor(b[None])).logits[0, -1].numpy()
    np.testing.assert_allclose(ours[0], ref_a, atol=ATOL, rtol=0)
    np.testing.assert_allclose(ours[1], ref_b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("layout", ["scan", "unrolled"])
def test_chunked_prefill_matches_transformers(hf_models, layout):
    """The engine's prefill of ragged prompts (45, 3 and 20 tokens) in full chunks of 4
    (twelve; the buffer ends mid-chunk), in a full chunk of 32 then a small one of 16, and
    in two small chunks of 32 (T = 128) gives every prompt's last-position logits as
    transformers does, and the same cache as one chunk of 64."""
    from hispec_jax.decoding.prefill import chunk_counts, prefill
    from hispec_jax.models.params import layer_layout, with_layer_layout

    hf_model, path = hf_models["llama3"]
    model = load_model(path)
    if layer_layout(model.params) != layout:
        model = dataclasses.replace(model, params=with_layer_layout(model.params, layout))
    rng = np.random.RandomState(5)
    prompts = [rng.randint(0, 97, n) for n in (45, 3, 20)]
    S, L = 50, model.cfg.num_layers  # 50: the last chunk of 4 runs past the buffer
    assert [tuple(int(n) for n in chunk_counts(45, T)) for T in (4, 32, 128, 64)] == [
        (12, 0), (1, 1), (0, 2), (1, 0)]
    tokens = np.zeros((3, S), np.int32)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = p
    lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
    run = jax.jit(prefill, static_argnames=("cfg", "stop", "chunk"))
    results = {chunk: run(model.params, model.cfg, jnp.asarray(tokens), lengths,
                          KVCache.zeros(model.cfg, 3, S, per_layer=layout == "unrolled"),
                          stop=L, chunk=chunk)
               for chunk in (4, 32, 128, 64)}
    refs = []
    for p in prompts:
        with torch.no_grad():
            refs.append(hf_model(torch.tensor(p[None])).logits[0, -1].numpy())
    one_h, one_cache = results[64]
    for chunk in (4, 32, 128):
        h_BxD, cache = results[chunk]
        ours = np.asarray(exit_logits(model.params, {}, model.cfg, h_BxD[:, None], L))[:, 0]
        for b, ref in enumerate(refs):
            np.testing.assert_allclose(ours[b], ref, atol=ATOL, rtol=0,
                                       err_msg=f"chunk {chunk}, prompt {b}")
        # (hidden states reach |h| ~ 57 and keys ~ 10 here: float32 rounding of other summation
        # orders is relative)
        np.testing.assert_allclose(np.asarray(h_BxD), np.asarray(one_h), atol=ATOL, rtol=1e-3)
        for b, p in enumerate(prompts):  # the prompt's slots; later slots are never read
            for ours_kv, one_kv in ((cache.k, one_cache.k), (cache.v, one_cache.v)):
                for layer in range(L):
                    np.testing.assert_allclose(np.asarray(ours_kv[layer])[b, :, :len(p)],
                                               np.asarray(one_kv[layer])[b, :, :len(p)],
                                               atol=ATOL, rtol=1e-3, err_msg=f"chunk {chunk}")


@pytest.mark.parametrize("layout", ["scan", "unrolled"])
def test_a_prefill_chunk_riding_a_decoding_pass_matches_passes_of_their_own(hf_models, layout):
    """A chunk of one prompt riding a pass of two decoding rows (`Rider`: one token group
    for the norms, projections and MLP) leaves the rows' states, the chunk's states and
    the cache as a pass of the rows and a pass of the chunk would, in the writing pass
    (`run_layers_cached`) and in the read-only one (`run_layers`, split context: the
    keys/values come back for the caller to write at the chunk's row)."""
    from hispec_jax.models.params import layer_layout, with_layer_layout
    from hispec_jax.models.transformer import Rider, run_layers

    _, path = hf_models["llama3"]
    model = load_model(path)
    if layer_layout(model.params) != layout:
        model = dataclasses.replace(model, params=with_layer_layout(model.params, layout))
    cfg, params, L = model.cfg, model.params, model.cfg.num_layers
    rng = np.random.RandomState(7)
    S, C, T = 32, 8, 2
    # rows 0 and 2 hold prompts of 9 and 5 tokens; row 1 the first 6 of a 12-token prompt
    prompts = [rng.randint(0, 97, n) for n in (9, 12, 5)]
    cached = (9, 6, 5)
    block = np.zeros((3, 9), np.int32)
    pos = np.full((3, 9), S, np.int32)
    for b, (p, n) in enumerate(zip(prompts, cached)):
        block[b, :n], pos[b, :n] = p[:n], np.arange(n)
    cache = KVCache.zeros(cfg, 3, S, per_layer=layout == "unrolled")
    _, cache = _run_layers_cached(params, cfg, embed(params, jnp.asarray(block)),
                                  jnp.asarray(pos), cache, start=0, stop=L)
    # the decoding block: rows 0 and 2 at their next T positions, row 1 padding
    step = jnp.asarray(rng.randint(0, 97, (3, T)), jnp.int32)
    step_pos = jnp.asarray([[9, 10], [S, S], [5, 6]], jnp.int32)
    # the chunk: row 1's positions 6..11, then two of padding
    chunk = np.zeros((1, C), np.int32)
    chunk[0, :6] = prompts[1][6:]
    chunk_pos = jnp.asarray([[6, 7, 8, 9, 10, 11, S, S]], jnp.int32)
    rider = Rider(x_1xCxD=embed(params, jnp.asarray(chunk)), positions_1xC=chunk_pos,
                  row=jnp.int32(1))

    # passes of their own: the block over every row, the chunk as a batch where only row 1
    # has positions
    x_own, cache_own = _run_layers_cached(params, cfg, embed(params, step), step_pos, cache,
                                          start=0, stop=L)
    padded = jnp.zeros((3, C), jnp.int32).at[1].set(chunk[0])
    padded_pos = jnp.full((3, C), S, jnp.int32).at[1].set(chunk_pos[0])
    xr_own, cache_own = _run_layers_cached(params, cfg, embed(params, padded), padded_pos,
                                           cache_own, start=0, stop=L)
    close = functools.partial(np.testing.assert_allclose, atol=ATOL, rtol=1e-3)

    riding = jax.jit(run_layers_cached, static_argnames=("cfg", "start", "stop"))
    x, cache_r, out = riding(params, cfg, embed(params, step), step_pos, cache, start=0,
                             stop=L, rider=rider)
    decoding = np.asarray([0, 2])  # (row 1's entry in the block is padding)
    close(np.asarray(x)[decoding], np.asarray(x_own)[decoding])
    close(np.asarray(out.x_1xCxD)[0, :6], np.asarray(xr_own)[1, :6])
    for ours, own in ((cache_r.k, cache_own.k), (cache_r.v, cache_own.v)):
        for layer in range(L):
            close(np.asarray(ours[layer])[:, :, :12], np.asarray(own[layer])[:, :, :12])

    read_only = jax.jit(run_layers, static_argnames=("cfg", "start", "stop", "split_context"))
    x, kv, out = read_only(params, cfg, embed(params, step), step_pos, cache, start=0, stop=L,
                           split_context=True, rider=rider)
    close(np.asarray(x)[decoding], np.asarray(x_own)[decoding])
    close(np.asarray(out.x_1xCxD)[0, :6], np.asarray(xr_own)[1, :6])
    written = cache.write_block(0, step_pos, kv).write_block(0, chunk_pos, out.kv, row=rider.row)
    for ours, own in ((written.k, cache_own.k), (written.v, cache_own.v)):
        for layer in range(L):
            close(np.asarray(ours[layer])[:, :, :12], np.asarray(own[layer])[:, :, :12])


def test_prefill_chunk_counts_cover_the_prompt():
    """Full and small chunks (`prefill.chunk_counts`) cover the longest prompt, with at most
    `MAX_SMALL` small ones, fewer positions to spare than one small chunk when small ones
    end it, and never a whole chunk to spare."""
    from hispec_jax.decoding.prefill import MAX_SMALL, chunk_counts, small_chunk

    for T in (16, 32, 64, 128):
        t = small_chunk(T)
        assert t == max(T // 4, 16) if T > 16 else t == T
        for longest in range(1, 4 * T + 2):
            full, small = (int(n) for n in chunk_counts(longest, T))
            covered = full * T + small * t
            assert longest <= covered < longest + T, (T, longest, full, small)
            assert small <= MAX_SMALL and small * t < T, (T, longest, small)
            if small:
                assert covered - longest < t, (T, longest, full, small)


def test_bfloat16_close_to_float32(hf_models):
    _, path = hf_models["qwen3"]
    m32, m16 = load_model(path), load_model(path, dtype="bfloat16")
    assert m16.params["embed"].dtype == jnp.bfloat16
    tokens = jnp.asarray(np.random.RandomState(3).randint(0, 97, (1, 10)))
    outs = []
    for m in (m32, m16):
        cache = KVCache.zeros(m.cfg, 1, 16)
        x, _ = run_layers_cached(m.params, m.cfg, embed(m.params, tokens), jnp.arange(10)[None], cache,
                          0, m.cfg.num_layers)
        outs.append(np.asarray(exit_logits(m.params, {}, m.cfg, x, m.cfg.num_layers)))
    assert outs[1].dtype == np.float32
    # bf16 keeps ~3 significant digits; random models with init 0.3 have logits of O(10)
    assert np.mean(np.abs(outs[0] - outs[1])) < 0.1 * np.mean(np.abs(outs[0]))


@pytest.fixture(scope="module")
def linear_rope_model(tmp_path_factory):
    """A tiny Llama 2 style model with `linear` RoPE scaling (factor 2), saved in HF layout."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from conftest import build_tokenizer, hf_config

    fields = hf_config("llama2").to_dict()
    for key in ("rope_scaling", "rope_parameters"):
        fields.pop(key, None)
    cfg = LlamaConfig(**fields, rope_scaling={"rope_type": "linear", "factor": 2.0})
    torch.manual_seed(3)
    hf_model = AutoModelForCausalLM.from_config(cfg).eval()
    assert hf_model.model.rotary_emb.rope_type == "linear"
    path = tmp_path_factory.mktemp("llama_linear_rope")
    hf_model.save_pretrained(path, safe_serialization=True)
    build_tokenizer().save_pretrained(path)
    return hf_model, path


@pytest.mark.parametrize("layout", ["scan", "unrolled"])
def test_linear_rope_scaling_logits_every_exit(linear_rope_model, layout):
    """`linear` RoPE scaling (positions divided by the factor) matches transformers at every
    exit; the same weights without the scaling do not (the check can fail)."""
    hf_model, path = linear_rope_model
    model = load_model(path, layer_layout=layout)
    assert model.cfg.rope_scaling_dict == {"rope_type": "linear", "factor": 2.0}
    tokens = np.random.RandomState(2).randint(0, model.cfg.vocab_size, (2, 21))
    ref = hf_exit_logits(hf_model, tokens)
    positions = jnp.broadcast_to(jnp.arange(21), (2, 21))
    x = embed(model.params, jnp.asarray(tokens))
    ours, _ = our_exit_logits_by_layer(model, x, positions, KVCache.zeros(model.cfg, 2, 32))
    for e, (o, r) in enumerate(zip(ours, ref), start=1):
        np.testing.assert_allclose(o, r, atol=ATOL, rtol=0, err_msg=f"exit {e}")
    unscaled = dataclasses.replace(model, cfg=model.cfg.replace(rope_scaling=None))
    plain, _ = our_exit_logits_by_layer(unscaled, x, positions, KVCache.zeros(model.cfg, 2, 32))
    assert np.max(np.abs(plain[-1] - ref[-1])) > 100 * ATOL


@pytest.mark.parametrize("B,T", [(1, 1), (1, 2), (2, 3), (1, 9), (4, 8), (1, 33)])
def test_tied_head_blocks_match_transformers(hf_models, B, T):
    """The tied LM head on blocks of 2..32 rows (`E @ x^T` on CPU), on one row and on more
    rows (`x @ E^T`) gives transformers' logits, every row in its own place."""
    from hispec_jax.models import heads

    hf_model, path = hf_models["qwen3"]
    model = load_model(path)
    assert model.cfg.tie_word_embeddings
    h = np.random.RandomState(B * 100 + T).randn(B, T, model.cfg.hidden_size).astype(np.float32)
    with torch.no_grad():
        ref = hf_model.lm_head(hf_model.model.norm(torch.tensor(h))).numpy()
    ours = np.asarray(jax.jit(lambda h: exit_logits(model.params, {}, model.cfg, h,
                                                    model.cfg.num_layers))(h))
    assert ours.shape == ref.shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)
    block_form = (B, T) in {(1, 2), (2, 3), (1, 9), (4, 8)}  # the cases meant for `E @ x^T`
    assert (1 < B * T <= heads.EMBED_LHS_MAX_ROWS) == block_form


def test_attention_reads_the_shortest_span_holding_every_seen_slot():
    """`attention_spans` and the span `_over_used_slots` picks: the first one >= the most
    slots any query sees (padding, seen 0, never widens it)."""
    from hispec_jax.models import transformer

    assert transformer.attention_spans(640) == (128, 256, 384, 512, 640)
    assert transformer.attention_spans(2048) == tuple(range(256, 2049, 256))
    # 896 would leave 104 slots unread, less than a step of 128: no span of its own
    assert transformer.attention_spans(1000) == (128, 256, 384, 512, 640, 768, 1000)
    assert transformer.attention_spans(256) == (128, 256)
    assert transformer.attention_spans(192) == (192,)
    assert transformer.attention_spans(100) == (100,)
    span_read = jax.jit(lambda seen, keys: transformer._over_used_slots(
        lambda k, v, vis: jnp.asarray(k.shape[2]), seen, keys.shape[2], keys, keys,
        jnp.ones((1, 1, keys.shape[2]), bool)))
    keys = jnp.zeros((2, 1, 640, 4))
    for seen, span in (((1, 0), 128), ((128, 0), 128), ((129, 0), 256), ((0, 0), 128),
                       ((5, 300), 384), ((640, 3), 640), ((512, 513), 640)):
        assert int(span_read(jnp.asarray(seen)[:, None], keys)) == span, seen


@pytest.mark.parametrize("layout,batch", [("unrolled", 1), ("unrolled", 2), ("scan", 2)])
def test_attention_over_used_spans_matches_transformers(hf_models, layout, batch):
    """With a cache of 256 slots (spans 128 and 256), a 120-position block, AR steps across
    slot 128, and verify blocks whose context is exactly 128 slots and then 132 give
    transformers' logits: whichever span a pass reads, it sees every slot it should (a
    missed slot moves logits by O(1); over 120+ positions of this random model float32
    rounding alone reaches 2.4e-4, the same with every pass reading the whole cache)."""
    from hispec_jax.models.transformer import run_layers

    hf_model, path = hf_models["llama3"]
    model = load_model(path, layer_layout=layout)
    cfg, L = model.cfg, model.cfg.num_layers
    tokens = np.random.RandomState(9).randint(0, cfg.vocab_size, (batch, 140))
    with torch.no_grad():
        ref = hf_model(torch.tensor(tokens)).logits.numpy()
    cache = KVCache.zeros(cfg, batch, 256, per_layer=layout == "unrolled")
    logits = lambda x: np.asarray(exit_logits(model.params, {}, cfg, x, L))
    at = lambda start, n: jnp.broadcast_to(jnp.arange(start, start + n), (batch, n))
    x, cache = _run_layers_cached(model.params, cfg, embed(model.params, jnp.asarray(tokens[:, :120])),
                                  at(0, 120), cache, start=0, stop=L)
    np.testing.assert_allclose(logits(x), ref[:, :120], atol=ATOL_LONG, rtol=RTOL_LONG)
    for t in range(120, 132):  # one query at a time: seen 121 .. 132 slots
        x, cache = _run_layers_cached(model.params, cfg,
                                      embed(model.params, jnp.asarray(tokens[:, t:t + 1])),
                                      at(t, 1), cache, start=0, stop=L)
        np.testing.assert_allclose(logits(x)[:, 0], ref[:, t], atol=ATOL_LONG, rtol=RTOL_LONG,
                                   err_msg=f"position {t}")
    verify = jax.jit(functools.partial(run_layers, cfg=cfg, start=0, stop=L, split_context=True))
    for start in (128, 132):  # context of exactly one span, then past it
        x, _ = verify(model.params, x_BxTxD=embed(model.params, jnp.asarray(tokens[:, start:start + 8])),
                      positions_BxT=at(start, 8), cache=cache)
        np.testing.assert_allclose(logits(x), ref[:, start:start + 8], atol=ATOL_LONG, rtol=RTOL_LONG,
                                   err_msg=f"block at {start}")
