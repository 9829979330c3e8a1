"""Sharded vs unsharded decoding on 8 fake CPU devices, run as its own process by
test_mesh.py (XLA_FLAGS must be set before JAX starts; the test process already has one
device). Prints one JSON object: per case the tokens unsharded and sharded, plus the
shardings the rule table gave the arrays. A greedy method's unsharded reference is AR's
tokens (greedy speculation gives AR's output: tests/test_engine.py and the others), so only
AR and the sampling cases decode unsharded: fewer loops to compile.

    python tests/mesh_cases.py
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

from hispec_jax.decoding.generate import generate  # noqa: E402
from hispec_jax.models import sharding  # noqa: E402
from hispec_jax.models.config import ModelConfig  # noqa: E402
from hispec_jax.models.kv_cache import KVCache  # noqa: E402
from hispec_jax.models.model import Model  # noqa: E402
from hispec_jax.models.params import (head_specs, init_from_specs, init_params,  # noqa: E402
                                      with_layer_layout)

# 8 query heads, 2 KV heads (GQA): on model=4 or 8 the KV heads are replicated, on model=2
# sharded. Vocabulary and MLP width divide 8. Three layers: exits 1 and 2 below the last.
CFG = ModelConfig(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=128,
                  num_layers=3, num_heads=8, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6,
                  max_position_embeddings=256, tie_word_embeddings=False, dtype="float32")
PROMPTS = [[1, 5, 7, 9], [3, 4], [8, 9, 10, 11, 12]]  # 3 sequences: uneven for data=2, 4, 8
MAX_NEW = 8

METHODS = {
    "ar": dict(method="ar"),
    "layerskip": dict(method="layerskip", draft_exit=1, draft_len=2),
    "hispec": dict(method="hispec", draft_exit=1, verify_exits=(2,), draft_len=2,
                   verify_window=2),
    "hispec_sampling": dict(method="hispec", draft_exit=1, verify_exits=(2,), temperature=0.8,
                            top_k=20, seed=7),
}

# (mesh, layer layout, methods): every method on the GQA mesh with an uneven batch, the
# rest spread so each compiles a few loops only.
CASES = [
    ("data=2,model=4", "unrolled", ["ar", "layerskip", "hispec", "hispec_sampling"]),
    ("data=4,model=2", "scan", ["hispec", "hispec_sampling"]),
    ("data=8", "unrolled", ["ar"]),
    ("model=8", "unrolled", ["layerskip"]),
    # fused projections (`params.fuse_layer`): the fused weights shard over the kv heads
    ("data=4,model=2", "unrolled, fused", ["ar"]),
]
# Trained exit heads with draft vocabularies (K < V columns, `vocab` ids), sharded by the
# same rules: a full head at exit 1 whose K = 40 columns divide model=4 and a rank-16 head
# at exit 2 whose K = 30 do not (its columns are replicated there).
# (LayerSkip's draft level is HiSpec's: HiSpec covers it, with both heads.)
VOCAB_CASES = [("data=2,model=4", ["hispec", "hispec_sampling"])]
VOCAB_LAYOUT = "unrolled, draft vocabularies"


# The slot engine (hispec serve, chat, generate_stream) on data=2,model=4: 4 slots, the
# prompts entering one by one as slots free up, each with its offline sequence index.
SLOT_CASES = ["hispec", "hispec_sampling"]

# A draft model (`engine/draft_model.py`; one layer, 4 query heads and 2 KV heads) under
# the final layer, sharded by the same rules as its target, offline and in the slots.
DRAFT_CFG = CFG.replace(num_layers=1, hidden_size=32, intermediate_size=64, num_heads=4)
DRAFT_METHODS = {
    "draft": dict(method="draft", draft_k=3),
    "draft_sampling": dict(method="draft", draft_k=3, temperature=0.8, top_k=20, seed=7),
}
DRAFT_CASES = [("data=2,model=4", ["draft", "draft_sampling"])]


def slots_tokens(model, name: str, mesh_text: str) -> list[list[int]]:
    from hispec_jax.decoding import methods as methods_lib
    from hispec_jax.decoding.sampling import SamplingParams
    from hispec_jax.models.model import place_on_mesh
    from hispec_jax.decoding.slots import SlotEngine, SlotRequest

    opts = dict({**METHODS, **DRAFT_METHODS}[name])
    method = opts.pop("method")
    sampling = SamplingParams(**{k: opts.pop(k) for k in ("temperature", "top_k", "seed")
                                 if k in opts})
    model = place_on_mesh(model, sharding.make_mesh(mesh_text))
    decoder = methods_lib.make_method(model, method, greedy=sampling.greedy, **opts)
    engine = SlotEngine(model, decoder, slots=4, capacity=64, greedy=sampling.greedy,
                        eos_ids=())
    owner = {0: 0, 3: 1, 1: 2}  # slot: prompt (both halves of "data" busy)
    got = {i: [] for i in owner.values()}
    engine.insert(0, SlotRequest(tuple(PROMPTS[0]), MAX_NEW, sampling, sequence_index=0))
    for u in engine.generate(1):  # the others enter while slot 0 decodes
        got[owner[u.slot]] += u.new_token_ids
    for slot in (3, 1):
        engine.admit(slot, SlotRequest(tuple(PROMPTS[owner[slot]]), MAX_NEW, sampling,
                                       sequence_index=owner[slot]))
    engine.prefill()
    while any(engine.busy):
        for u in engine.generate(2):
            got[owner[u.slot]] += u.new_token_ids
    return [got[i] for i in range(len(PROMPTS))]


def heads_with_draft_vocabularies() -> dict:
    heads = {}
    for exit_layer, rank, size, seed in ((1, None, 40, 1), (2, 16, 30, 2)):
        head = init_from_specs(head_specs(CFG, rank, size), jax.random.key(seed),
                               jax.numpy.float32, init_std=0.3)
        ids = jax.random.choice(jax.random.key(10 + seed), CFG.vocab_size, (size,),
                                replace=False)
        heads[str(exit_layer)] = {**head, "vocab": jax.numpy.sort(ids).astype("int32")}
    return heads


def main() -> int:
    params = init_params(CFG, jax.random.key(0), init_std=0.3)
    models = {layout: Model(cfg=CFG, params=with_layer_layout(params, layout))
              for layout in ("unrolled", "scan")}
    models["unrolled, fused"] = Model(cfg=CFG, params=with_layer_layout(params, "unrolled",
                                                                        fused=True))

    def unsharded(model, name):
        return generate(model, PROMPTS, max_new_tokens=MAX_NEW, ignore_eos=True,
                        **METHODS[name]).token_ids

    ar = unsharded(models["unrolled"], "ar")
    reference = {name: ar if "temperature" not in opts else unsharded(models["unrolled"], name)
                 for name, opts in METHODS.items()}
    results = []
    for mesh_text, layout, names in CASES:
        mesh = sharding.make_mesh(mesh_text)
        for name in names:
            r = generate(models[layout], PROMPTS, max_new_tokens=MAX_NEW, ignore_eos=True,
                         mesh=mesh, **METHODS[name])
            results.append({"mesh": mesh_text, "layout": layout, "method": name,
                            "reference": reference[name], "sharded": r.token_ids,
                            "stats_mesh": r.stats.get("mesh"),
                            "compile_seconds": r.stats["compile_seconds"]})
    vocab_model = Model(cfg=CFG, params=models["unrolled"].params,
                        heads=heads_with_draft_vocabularies())
    for mesh_text, names in VOCAB_CASES:
        mesh = sharding.make_mesh(mesh_text)
        for name in names:
            ref = ar if "temperature" not in METHODS[name] else unsharded(vocab_model, name)
            r = generate(vocab_model, PROMPTS, max_new_tokens=MAX_NEW, ignore_eos=True,
                         mesh=mesh, **METHODS[name])
            results.append({"mesh": mesh_text, "layout": VOCAB_LAYOUT, "method": name,
                            "reference": ref, "sharded": r.token_ids,
                            "stats_mesh": r.stats.get("mesh"),
                            "compile_seconds": r.stats["compile_seconds"]})
    for name in SLOT_CASES:  # serving's slot engine on the mesh (`decoding/slots.py`)
        results.append({"mesh": "data=2,model=4", "layout": "slots", "method": name,
                        "reference": reference[name],
                        "sharded": slots_tokens(models["unrolled"], name, "data=2,model=4"),
                        "stats_mesh": "data=2,model=4 (8 cpu devices)"})
    draft = Model(cfg=DRAFT_CFG, params=with_layer_layout(
        init_params(DRAFT_CFG, jax.random.key(1), init_std=0.3), "unrolled"))
    with_draft = models["unrolled"].with_draft(draft)
    for mesh_text, names in DRAFT_CASES:
        mesh = sharding.make_mesh(mesh_text)
        for name in names:
            opts = DRAFT_METHODS[name]
            ref = ar if "temperature" not in opts else generate(
                with_draft, PROMPTS, max_new_tokens=MAX_NEW, ignore_eos=True, **opts).token_ids
            r = generate(with_draft, PROMPTS, max_new_tokens=MAX_NEW, ignore_eos=True,
                         mesh=mesh, **opts)
            results.append({"mesh": mesh_text, "layout": "draft model", "method": name,
                            "reference": ref, "sharded": r.token_ids,
                            "stats_mesh": r.stats.get("mesh"),
                            "compile_seconds": r.stats["compile_seconds"]})
            results.append({"mesh": mesh_text, "layout": "draft model, slots", "method": name,
                            "reference": ref,
                            "sharded": slots_tokens(with_draft, name, mesh_text),
                            "stats_mesh": f"{mesh_text} (8 cpu devices)"})
    mesh = sharding.make_mesh("data=2,model=4")
    placed_heads = sharding.heads_shardings(CFG, vocab_model.heads, mesh)
    specs_heads = {f"head {e} {k}": str(placed_heads[e][k].spec)
                   for e in placed_heads for k in placed_heads[e]}
    placed = sharding.param_shardings(CFG, models["scan"].params, mesh)
    specs = {name: str(placed["layers"][name].spec) for name in ("wq", "wk", "w_down")}
    specs["lm_head"] = str(placed["lm_head"].spec)
    placed_fused = sharding.param_shardings(CFG, models["unrolled, fused"].params,
                                            sharding.make_mesh("data=4,model=2"))
    for name in ("wqkv", "w_gate_up"):
        specs[f"fused {name} model=2"] = str(placed_fused["layers"][0][name].spec)
    specs.update(specs_heads)
    placed_draft = sharding.param_shardings(CFG, with_draft.params, mesh)["draft"].params
    specs["draft wq"] = str(placed_draft["layers"][0]["wq"].spec)
    for mesh_text in ("data=2,model=4", "data=4,model=2"):
        cache = KVCache.zeros(CFG, batch=4, capacity=32)
        specs[f"cache {mesh_text}"] = str(
            sharding.cache_shardings(cache, sharding.make_mesh(mesh_text)).k.spec)
    print(json.dumps({"results": results, "specs": specs, "devices": jax.device_count()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
