"""`Engine.step` (one speculation round) on hand-built states, and the compile cache.

The model here has identity layers (every layer's output projections are zero), so the
layer-e hidden state of a token is its embedding at every depth and the KV cache never
influences an output: a state can be built by hand (tokens, counters, the draft level's
hidden-state ring) without running the model, and the model's greedy next token is a
fixed function `f(token)` that the tests compute directly.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hispec_jax import Model, ModelConfig, generate
from hispec_jax.decoding import engine as engine_lib
from hispec_jax.decoding import methods, slots
from hispec_jax.decoding.engine import Engine, Shapes, compile_cache
from hispec_jax.decoding.request import Request
from hispec_jax.decoding.sampling import SamplingParams, sequence_keys
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.params import init_params, with_layer_layout

L, VOCAB, CAPACITY, BLOCK = 4, 48, 64, 16


def make_request(batch: list[list[int]], batch_size: int, first_index: int, capacity: int,
                 max_new_tokens: int, eos_ids_E, sampling: SamplingParams) -> Request:
    """A `Request` as `Engine.init_state` takes it: prompts right-padded into
    [batch_size, capacity]; padding rows get max_new = 0 (finished from the start)."""
    tokens = np.zeros((batch_size, capacity), np.int32)
    lens, max_new = np.ones((batch_size,), np.int32), np.zeros((batch_size,), np.int32)
    for b, ids in enumerate(batch):
        tokens[b, :len(ids)], lens[b], max_new[b] = ids, len(ids), max_new_tokens
    return Request(tokens_BxS=jnp.asarray(tokens), prompt_lens_B=jnp.asarray(lens),
                   max_new_B=jnp.asarray(max_new), eos_ids_E=jnp.asarray(eos_ids_E),
                   sequence_keys_Bx2=sequence_keys(
                       sampling.seed, np.arange(first_index, first_index + batch_size)),
                   sampling=sampling.arrays())


def identity_layer_model(seed: int = 0) -> Model:
    cfg = ModelConfig(model_type="llama", vocab_size=VOCAB, hidden_size=16, intermediate_size=24,
                      num_layers=L, num_heads=2, num_kv_heads=1, head_dim=8,
                      max_position_embeddings=256)
    params = init_params(cfg, jax.random.PRNGKey(seed), init_std=0.5)
    params["layers"]["wo"] = jnp.zeros_like(params["layers"]["wo"])
    params["layers"]["w_down"] = jnp.zeros_like(params["layers"]["w_down"])
    return Model(cfg=cfg, params=params)


@pytest.fixture(scope="module")
def model():
    return identity_layer_model()


def next_token(model: Model, token: int) -> int:
    """The model's greedy choice after `token` (at any exit: layers are identities)."""
    h = model.params["embed"][token][None, None]
    return int(jnp.argmax(exit_logits(model.params, {}, model.cfg, h, L)[0, 0]))


def chain(model, token, n):
    out = []
    for _ in range(n):
        token = next_token(model, token)
        out.append(token)
    return out


def setup(model, method="layerskip", eos=(), max_new=20, **options):
    decoder = methods.make_method(model, method, **options)
    eos_ids = jnp.asarray(list(eos) or [-1], jnp.int32)
    engine = Engine.for_model(model, decoder.hierarchy,
                              Shapes(batch=1, capacity=CAPACITY, prompt_block=BLOCK,
                                     num_eos=int(eos_ids.shape[0])))
    req = make_request([[5, 7, 9]], 1, 0, CAPACITY, max_new, eos_ids, SamplingParams())
    state = engine.init_state(model.params, model.heads, req, engine.empty_cache(),
                              decoder.windows_array())
    return engine, req, state


def with_drafts(model, state, drafts):
    """The state after the draft level proposed `drafts` after the first emitted token:
    tokens written at positions p+1.., c_0 advanced, layer-e_0 states (embeddings) in the
    ring for the positions the first verifier will continue."""
    p = int(state.processed_BxK[0, 0])
    tokens = state.out.tokens_BxS.at[0, p + 1:p + 1 + len(drafts)].set(jnp.asarray(drafts))
    ring = state.hidden[0]
    W = ring.shape[1]
    for i in range(len(drafts)):
        ring = ring.at[0, (p + i) % W].set(model.params["embed"][tokens[0, p + i]])
    c = state.processed_BxK.at[0, 0].set(p + len(drafts))
    return state.replace(out=state.out.replace(tokens_BxS=tokens), processed_BxK=c,
                         hidden=(ring,) + state.hidden[1:])


def emitted(state):
    p, n = 3, int(state.out.num_new_B[0])
    return state.out.tokens_BxS[0, p:p + n].tolist()


def test_step_accept_all_drafts_then_verifies_in_the_same_round(model):
    engine, req, state = setup(model, draft_exit=1, draft_len=2)
    first = int(state.out.tokens_BxS[0, 3])
    state = engine.step(model.params, model.heads, req, state)
    c = state.counters
    # Nd + 1 = 3 draft steps, one verification, 3 tokens emitted after the first one.
    assert emitted(state) == [first] + chain(model, first, 3)
    assert state.processed_BxK[0].tolist() == [6, 6]
    assert c.actions_K.tolist() == [3, 1] and int(c.rounds) == 1
    assert int(c.layer_passes) == 3 * 1 + (L - 1)
    assert c.proposed_K.tolist() == [0, 3] and c.accepted_K.tolist() == [0, 3]


@pytest.mark.parametrize("wrong_at", [0, 1, 2])
def test_step_rejects_at_the_first_wrong_draft(model, wrong_at):
    engine, req, state = setup(model, draft_exit=1, draft_len=2)
    first = int(state.out.tokens_BxS[0, 3])
    truth = chain(model, first, 3)
    drafts = list(truth)
    drafts[wrong_at] = (truth[wrong_at] + 1) % VOCAB
    state = engine.step(model.params, model.heads, req, with_drafts(model, state, drafts))
    # The verifier keeps the drafts before the wrong one and replaces it with its own token;
    # every level rolls back to the corrected position.
    assert emitted(state) == [first] + truth[:wrong_at + 1]
    assert state.processed_BxK[0].tolist() == [4 + wrong_at] * 2
    assert state.counters.accepted_K.tolist() == [0, wrong_at]
    # A full input drafts nothing: the round's first draft step (unconditional) runs with
    # every row masked, so only the verifier's 3 positions x 3 layers count as work.
    assert state.counters.actions_K.tolist() == [1, 1]
    assert int(state.counters.layer_token_evals) == 3 * (L - 1)


def test_step_cuts_the_block_at_eos(model):
    first_engine, _, first_state = setup(model, draft_exit=1, draft_len=2)
    first = int(first_state.out.tokens_BxS[0, 3])
    truth = chain(model, first, 3)
    if truth[1] in (first, truth[0]):
        pytest.skip("the chain repeats before its second token")
    engine, req, state = setup(model, eos=(truth[1],), draft_exit=1, draft_len=2)
    state = engine.step(model.params, model.heads, req, state)
    assert emitted(state) == [first, truth[0], truth[1]]
    assert bool(state.out.done_B[0])
    assert int(state.counters.emitted) == 2


def test_step_hispec_intermediate_then_full_verification(model):
    engine, req, state = setup(model, "hispec", draft_exit=1, verify_exits=(2,), draft_len=1,
                               verify_window=2)
    first = int(state.out.tokens_BxS[0, 3])
    state = engine.step(model.params, model.heads, req, state)
    # Round 1: 2 drafts, the intermediate level accepts them (2 pending < window + 1 = 3).
    assert state.processed_BxK[0].tolist() == [5, 5, 3]
    assert int(state.out.num_new_B[0]) == 1
    state = engine.step(model.params, model.heads, req, state)
    # Round 2: 2 more drafts and their check; now 4 pending >= 3: the full model verifies.
    assert state.processed_BxK[0].tolist() == [7, 7, 7]
    assert emitted(state) == [first] + chain(model, first, 4)
    assert state.counters.actions_K.tolist() == [4, 2, 1]
    assert int(state.counters.rounds) == 2


def test_run_at_the_capacity_edge_equals_autoregressive():
    """The cache holds exactly prompt + budget + the method's lookahead: the last round's
    drafts and verification blocks end at the last slot and nothing is lost."""
    model = identity_layer_model(seed=3)
    random_model = dataclasses.replace(
        model, params=init_params(model.cfg, jax.random.PRNGKey(1), init_std=0.5))
    prompts = [[1, 2, 3, 4, 5], [6]]
    for m in (model, random_model):
        for method, opts in [("layerskip", dict(draft_exit=2, draft_len=3)),
                             ("hispec", dict(draft_exit=1, verify_exits=(2,), verify_window=3))]:
            lookahead = methods.make_method(m, method, **opts).lookahead()
            tight = 5 + 17 + lookahead
            ref = generate(m, prompts, method="ar", max_new_tokens=17, ignore_eos=True)
            got = generate(m, prompts, method=method, max_new_tokens=17, ignore_eos=True,
                           max_cache_len=tight, **opts)
            assert got.stats["cache_capacity"] == tight
            assert got.token_ids == ref.token_ids, method
            with pytest.raises(ValueError, match="exceeds the cache capacity"):
                generate(m, prompts, method=method, max_new_tokens=17, max_cache_len=tight - 1,
                         **opts)


def test_compiled_loop_reuse_never_crosses_models(model):
    """A loop compiled with larger window bounds is reused only for the same model
    architecture, parameter layout and shapes."""
    base = identity_layer_model(seed=1)
    cfg = dataclasses.replace(base.cfg, intermediate_size=32)  # another architecture
    other = Model(cfg=cfg, params=init_params(cfg, jax.random.PRNGKey(1), init_std=0.5))
    opts = dict(method="layerskip", draft_exit=1, max_new_tokens=8, max_cache_len=CAPACITY)
    big = generate(model, [[1, 2]], draft_len=3, **opts)
    assert big.stats["window_bounds"] == [3]
    # Another model must not run in that loop (the old cache looked at the method only).
    small_other = generate(other, [[1, 2]], draft_len=2, **opts)
    assert small_other.stats["window_bounds"] == [2] and small_other.stats["compile_count"] == 2
    # The same model with smaller windows does: no compilation, the larger bounds.
    small = generate(model, [[1, 2]], draft_len=2, **opts)
    assert small.stats["window_bounds"] == [3] and small.stats["compile_count"] == 0
    assert small.token_ids == generate(model, [[1, 2]], method="ar", max_new_tokens=8).token_ids


@pytest.mark.parametrize("layout", ["scan", "unrolled"])
def test_compiled_loop_never_copies_the_cache(model, layout, users_codegen):
    """KV entries are written in place: the optimized HLO of a HiSpec loop (draft steps and
    the top level under `lax.cond`, each running several layers) holds no copy of a cache
    buffer, in either layer layout."""
    m = dataclasses.replace(model, params=with_layer_layout(model.params, layout))
    decoder = methods.make_method(m, "hispec", draft_exit=2, verify_exits=(3,), draft_len=2)
    engine = Engine.for_model(m, decoder.hierarchy, Shapes(batch=2, capacity=96, prompt_block=16))
    text = engine.lower().compile().as_text()
    cache = engine.empty_cache()
    shapes = {tuple(x.shape) for x in jax.tree.leaves(cache)}
    assert len(shapes) == 1
    shape = ",".join(map(str, shapes.pop()))
    assert re.search(rf"f32\[{shape}\][^ ]* scatter\(|wrapped_scatter", text), "no cache write?"
    copies = re.findall(rf"= f32\[{shape}\][^ ]* copy\(", text)
    assert not copies, copies[:3]


def slot_engine(model, decoder) -> slots.SlotEngine:
    """The engine offline `generate` runs for one prompt of at most `BLOCK` positions."""
    return slots.SlotEngine(model, decoder, slots=1, capacity=CAPACITY, greedy=True,
                            eos_ids=(), prefill_chunk=BLOCK, empty_state=False)


def test_engine_is_the_compile_key(model):
    decoder = methods.make_method(model, "layerskip", draft_exit=1)
    shapes = Shapes(batch=1, capacity=CAPACITY, prompt_block=BLOCK)
    a = Engine.for_model(model, decoder.hierarchy, shapes)
    b = Engine.for_model(identity_layer_model(seed=5), decoder.hierarchy, shapes)
    assert a == b and hash(a) == hash(b), "same architecture, layout and shapes: one loop"
    c = Engine.for_model(dataclasses.replace(
        model, params=with_layer_layout(model.params, "unrolled")), decoder.hierarchy, shapes)
    assert c != a
    assert Engine.for_model(model, decoder.hierarchy, dataclasses.replace(shapes, batch=2)) != a
    engine_lib.clear_compiled()
    before = engine_lib.compilations
    slot_engine(model, decoder).compile_batch()
    assert engine_lib.compilations == before + 2, "the batch's insert and its rounds"
    slot_engine(identity_layer_model(seed=5), decoder).compile_batch()
    assert engine_lib.compilations == before + 2, "other weights, the same programs"
    engine_lib.clear_compiled()


def _scaled(scale, x):
    return x * scale


def test_compiled_programs_give_way_when_the_process_nears_its_mapping_limit(monkeypatch):
    """XLA:CPU's JIT holds 1,000-3,000 memory mappings per rounds loop; near
    `vm.max_map_count` LLVM aborts the process. Before a compilation the least recently used
    programs are dropped while the process holds more than `MAP_BUDGET` of its limit, and
    only then."""
    x = jax.ShapeDtypeStruct((4,), jnp.float32)
    make = lambda scale: compile_cache.program(_scaled, (scale,), (), (x,))
    engine_lib.clear_compiled()
    held = {"maps": 10}
    monkeypatch.setattr(compile_cache, "map_counts", lambda: (held["maps"], 100))
    programs = [make(1.0), make(2.0)]
    assert make(1.0) is programs[0]  # used again: scale 2 is now the least recently used
    assert engine_lib.make_room() == 0, "under the budget nothing is dropped"
    drops = iter([80, 60, 40])  # above MAP_BUDGET = 0.5 of 100 until two programs are gone
    monkeypatch.setattr(compile_cache, "map_counts", lambda: (next(drops, 40), 100))
    before = engine_lib.compilations
    third = make(3.0)
    assert engine_lib.compilations == before + 1 and len(compile_cache._PROGRAMS) == 1
    assert make(3.0) is third and engine_lib.compilations == before + 1
    assert make(1.0) is not programs[0], "dropped: compiled again"
    monkeypatch.setattr(compile_cache, "map_counts", lambda: None)  # not Linux: nothing to do
    assert engine_lib.make_room() == 0
    engine_lib.clear_compiled()


def test_decoding_loops_compile_with_the_platforms_compiler_options(model, monkeypatch):
    """`engine.COMPILER_OPTIONS[platform]` reaches XLA with every program's compilation (an
    option XLA rejects fails that compilation, naming the option); other platforms' options
    are not applied here."""
    decoder = methods.make_method(model, "layerskip", draft_exit=2)
    engine_lib.clear_compiled()
    bogus = {"xla_gpu_enable_command_buffer": "NOT_A_COMMAND"}
    monkeypatch.setattr(compile_cache, "COMPILER_OPTIONS", {"no-such-platform": bogus})
    assert engine_lib.compiler_options() == {}
    slot_engine(model, decoder).compile_batch()  # compiles: the options belong elsewhere
    engine_lib.clear_compiled()
    monkeypatch.setattr(compile_cache, "COMPILER_OPTIONS", {jax.default_backend(): bogus})
    with pytest.raises(Exception, match="xla_gpu_enable_command_buffer"):
        slot_engine(model, decoder).compile_batch()
    engine_lib.clear_compiled()


def test_rounds_over_one_attention_span_add_the_one_span_options(model, monkeypatch):
    """A rounds program of single-position drafts whose cache one attention span reads
    whole (capacity below 256 on CPU) compiles with `ONE_SPAN_OPTIONS` added (XLA:CPU's
    YNNPACK reductions); the batch's insert, the rounds over a cache read in spans and
    prompt lookup's rounds with the platform's options only."""
    base = {"xla_cpu_experimental_ynn_fusion_type": ""}
    one_span = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"}
    platform = jax.default_backend()
    monkeypatch.setattr(compile_cache, "COMPILER_OPTIONS", {platform: base})
    monkeypatch.setattr(compile_cache, "ONE_SPAN_OPTIONS", {platform: one_span})
    exits = methods.make_method(model, "layerskip", draft_exit=2).hierarchy
    lookup = methods.make_method(model, "lookup").hierarchy
    options = lambda fn, static: compile_cache._cache_entry(fn, static)["compiler_options"]
    for hierarchy, capacity, rounds_options in ((exits, CAPACITY, one_span), (exits, 512, base),
                                                (lookup, CAPACITY, base)):
        engine = Engine.for_model(model, hierarchy, Shapes(batch=1, capacity=capacity,
                                                           prompt_block=BLOCK))
        assert options(slots._insert_all, (engine, BLOCK)) == base
        assert options(slots._rounds_rows, (engine, 1, None)) == rounds_options, (hierarchy, capacity)
    assert compile_cache.compiler_options() == base


def test_flat_attention_output_barrier_changes_no_token(model):
    """`ModelConfig.flat_attention_output` (a GPU candidate: the o projection's input behind
    an optimization barrier) puts one barrier per layer into the loop, is part of the
    compile key, and leaves greedy output as it was."""
    flat = dataclasses.replace(model, cfg=model.cfg.replace(flat_attention_output=True))
    prompts = [[3, 5, 7], [11, 2]]
    run = lambda m: generate(m, prompts, method="layerskip", draft_exit=2, max_new_tokens=12,
                             ignore_eos=True).token_ids
    barriers = lambda text: len(re.findall(r"optimization_barrier", text))
    shapes = Shapes(batch=1, capacity=CAPACITY, prompt_block=BLOCK)
    engines = [Engine.for_model(m, methods.make_method(m, "ar").hierarchy, shapes)
               for m in (model, flat)]
    assert engines[0].program_key() != engines[1].program_key()
    assert barriers(engines[1].lower().as_text()) > barriers(engines[0].lower().as_text())
    assert run(flat) == run(model)
