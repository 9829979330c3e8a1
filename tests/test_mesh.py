"""Sharding over a device mesh (`models/sharding.py`, `decoding/mesh.py`).

The decoding cases run on 8 fake CPU devices in their own process (`mesh_cases.py`: the
device count must be set before JAX starts): AR, LayerSkip, HiSpec greedy and HiSpec
sampling with a fixed seed give the same tokens sharded and unsharded, on data x model
meshes 2x4, 4x2, 8x1 and 1x8, with a batch of 3 (padded for every data axis, never
dropped) and 2 KV heads (fewer than the model axis of 4 and 8: replicated there); and
HiSpec (greedy and sampling) with trained exit heads that carry draft vocabularies, on 2x4;
a draft model (greedy and sampling), offline and in serving's slots, on 2x4.
Greedy methods sharded give unsharded AR's tokens. The rule
table's partition specs are checked here on abstract meshes at 8B/70B shapes.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from jax.sharding import AbstractMesh, AxisType, PartitionSpec as P

from hispec_jax.models import mesh_spec, sharding
from hispec_jax.models.params import param_specs
from hispec_jax.models.presets import load_preset

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def decoded():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(TESTS.parent), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.run([sys.executable, str(TESTS / "mesh_cases.py")], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# mesh_cases.CASES, flattened (not imported: importing it would give this process 8 devices)
CASE_IDS = [(mesh, layout, method) for mesh, layout, methods in [
    ("data=2,model=4", "unrolled", ["ar", "layerskip", "hispec", "hispec_sampling"]),
    ("data=4,model=2", "scan", ["hispec", "hispec_sampling"]),
    ("data=8", "unrolled", ["ar"]),
    ("model=8", "unrolled", ["layerskip"]),
    ("data=4,model=2", "unrolled, fused", ["ar"]),
    # mesh_cases.VOCAB_CASES: exit heads with draft vocabularies
    ("data=2,model=4", "unrolled, draft vocabularies",
     ["hispec", "hispec_sampling"]),
    # mesh_cases.SLOT_CASES: serving's slot engine on the mesh
    ("data=2,model=4", "slots", ["hispec", "hispec_sampling"]),
    # mesh_cases.DRAFT_CASES: a draft model under the final layer, offline and in the slots
    ("data=2,model=4", "draft model", ["draft"]),
    ("data=2,model=4", "draft model, slots", ["draft"]),
    ("data=2,model=4", "draft model", ["draft_sampling"]),
    ("data=2,model=4", "draft model, slots", ["draft_sampling"])] for method in methods]


@pytest.mark.parametrize("mesh,layout,method", CASE_IDS,
                         ids=[f"{m}-{l}-{k}" for m, l, k in CASE_IDS])
def test_sharded_tokens_equal_unsharded(decoded, mesh, layout, method):
    assert decoded["devices"] == 8
    case = next(r for r in decoded["results"]
                if (r["mesh"], r["layout"], r["method"]) == (mesh, layout, method))
    assert len(case["sharded"]) == 3  # the padded batch rows are dropped, no prompt is
    assert all(len(t) == 8 for t in case["sharded"])
    assert case["sharded"] == case["reference"]
    assert case["stats_mesh"] == f"{mesh_spec.mesh_text(mesh_spec.parse_mesh(mesh))} (8 cpu devices)"


def test_cases_table_matches_driver(decoded):
    assert [(r["mesh"], r["layout"], r["method"]) for r in decoded["results"]] == CASE_IDS


def test_driver_shards_by_the_rules(decoded):
    specs = decoded["specs"]
    assert specs["wq"] == str(P(None, None, "model"))    # 8 query heads over model=4
    assert specs["wk"] == str(P())                       # 2 KV heads on model=4: replicated
    assert specs["w_down"] == str(P(None, "model"))      # MLP width
    assert specs["lm_head"] == str(P(None, "model"))     # vocabulary
    assert specs["draft wq"] == str(P(None, "model"))    # the draft's 4 query heads too
    assert specs["head 1 proj"] == str(P(None, "model"))          # K = 40 columns over 4
    assert specs["head 2 proj_up"] == str(P())                     # K = 30: replicated
    assert specs["head 1 vocab"] == specs["head 2 vocab"] == str(P())  # ids on every device
    assert specs["cache data=2,model=4"] == str(P(None, "data"))            # KV replicated
    assert specs["cache data=4,model=2"] == str(P(None, "data", "model"))   # KV sharded
    # fused projections on model=2: q/k/v grouped per kv head over the 2 kv heads, gate/up
    # over the MLP width
    assert specs["fused wqkv model=2"] == str(P(None, "model"))
    assert specs["fused w_gate_up model=2"] == str(P(None, None, "model"))


def _abstract_mesh(data, model):
    return AbstractMesh((data, model), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


@pytest.mark.parametrize("preset,model_axis,kv", [("llama3_8b", 8, "model"),
                                                   ("llama3_8b", 16, None),
                                                   ("llama2_70b", 8, "model")])
def test_rule_table_at_full_size(preset, model_axis, kv):
    cfg = load_preset(preset)
    mesh = _abstract_mesh(2, model_axis)
    specs = jax.tree.map(lambda s: sharding.partition_spec(s.axes, s.shape, mesh),
                         param_specs(cfg), is_leaf=lambda x: hasattr(x, "axes"))
    layers = specs["layers"]
    q_heads_split = cfg.num_heads % model_axis == 0
    assert layers["wq"] == P(None, None, "model" if q_heads_split else None)
    assert layers["wk"] == layers["wv"] == (P(None, None, kv) if kv else P())
    assert layers["wo"] == P(None, "model")
    assert layers["w_gate"] == layers["w_up"] == P(None, None, "model")
    assert layers["attn_norm"] == P()
    assert specs["embed"] == P("model") and specs["lm_head"] == P(None, "model")
    cache = sharding.partition_spec(sharding.CACHE_AXES, (cfg.num_layers, 4, cfg.num_kv_heads,
                                                          4096, cfg.head_dim), mesh)
    assert cache == (P(None, "data", kv) if kv else P(None, "data"))


def test_suffix_axes():
    assert sharding.suffix_axes("tokens_BxS", 2) == ("batch", None)
    assert sharding.suffix_axes("done_B", 1) == ("batch",)
    assert sharding.suffix_axes("sequence_keys_Bx2", 2) == ("batch", None)
    assert sharding.suffix_axes("eos_ids_E", 1) == (None,)
    assert sharding.suffix_axes("actions_K", 1) == (None,)
    assert sharding.suffix_axes("temperature", 0) == ()
    assert sharding.suffix_axes("rounds", 0) == ()


def test_an_axis_is_used_once_and_only_when_it_divides():
    mesh = _abstract_mesh(2, 4)
    assert sharding.partition_spec(("vocab", "mlp"), (128, 128), mesh) == P("model")
    assert sharding.partition_spec(("vocab", "embed"), (97, 64), mesh) == P()
    assert sharding.partition_spec(("batch", "seq", "embed"), (3, 1, 64), mesh) == P()
    assert sharding.partition_spec(("batch", "seq", "embed"), (4, 1, 64), mesh) == P("data")


def test_no_mesh_no_constraint():
    x = jax.numpy.ones((2, 3, 4))
    assert sharding.constrain(x, sharding.HIDDEN_AXES) is x


@pytest.mark.parametrize("text,expected", [
    ("data=2,model=4", {"data": 2, "model": 4}),
    ("model=8", {"data": 1, "model": 8}),
    (" data = 8 ", {"data": 8, "model": 1}),
])
def test_parse_mesh(text, expected):
    assert mesh_spec.parse_mesh(text) == expected
    assert mesh_spec.parse_mesh(mesh_spec.mesh_text(expected)) == expected


@pytest.mark.parametrize("text,message", [
    ("", "expected AXIS=SIZE"),
    ("data2", "'data2' is not AXIS=SIZE"),
    ("batch=2", "unknown axis 'batch'"),
    ("data=2,data=4", "'data' is given twice"),
    ("model=0", "integer >= 1, got '0'"),
    ("model=x", "integer >= 1, got 'x'"),
    ("model=-2", "integer >= 1, got '-2'"),
])
def test_parse_mesh_rejects(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        mesh_spec.parse_mesh(text)


def test_make_mesh_needs_the_device_count():
    n = jax.device_count()
    with pytest.raises(ValueError, match=rf"mesh 'data=2,model=4': needs 8 devices .* but {n} cpu "
                                         r"device"):
        sharding.make_mesh("data=2,model=4")
    mesh = sharding.make_mesh({"model": n})
    assert dict(mesh.shape) == {"data": 1, "model": n}
