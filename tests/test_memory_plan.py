"""`hispec plan-memory`: the decoding loop compiled ahead of time on abstract arrays for a
mesh (the command gives itself the CPU devices it needs before JAX starts), one device's
`memory_analysis()` beside the analytic weights + KV cache + overhead. Full-size numbers
(Llama-3-8B, Llama-2-70B) are in docs/memory_plans.md; here the tiny preset keeps it fast."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def plan(*argv) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "hispec_jax.cli", "plan-memory", "--config",
                           "tiny", "--max-len", "256", "--prompt-len", "16", "--dtype", "float32",
                           "--json", *argv], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def plans():
    return {"one": plan("--batch-size", "3"),
            "mesh": plan("--batch-size", "3", "--mesh", "data=2,model=2", "--method", "hispec")}


def test_plan_describes_the_loop(plans):
    d = plans["mesh"]["description"]
    assert (d["mesh"], d["devices"], d["platform"]) == ("data=2,model=2", 4, "cpu")
    assert (d["batch"], d["loop_batch"]) == (3, 4)  # padded to the data axis
    assert d["method"] == "hispec" and d["exits"][-1] == d["num_layers"] == 8
    assert plans["one"]["description"]["devices"] == 1


@pytest.mark.parametrize("which", ["one", "mesh"])
def test_compiled_arguments_match_the_analytic_count(plans, which):
    """XLA's per-device arguments are the weights' and cache's shards plus the request
    (tokens [B, S] and per-sequence scalars) and the rest of the loop state (the analytic
    overhead: rings, output tokens): the analytic count and the rule table agree with what
    the partitioned programs hold."""
    p = plans[which]
    B, S = p["description"]["loop_batch"], p["description"]["max_len"]
    request = B * S * 4 + 1024
    assert p["weights"] + p["kv_cache"] <= p["arguments"]
    assert p["arguments"] <= p["weights"] + p["kv_cache"] + p["overhead"] + request
    # the donated state (the cache, the output tokens, the rings) backs the state returned
    assert p["kv_cache"] <= p["aliased"] <= p["kv_cache"] + p["overhead"] + request


@pytest.mark.parametrize("which", ["one", "mesh"])
def test_compiled_total_holds_one_cache(plans, which):
    """The reported total holds the weights and one KV cache (the donated input cache and
    the output cache are one buffer), plus the request and XLA's temporaries."""
    p = plans[which]
    B, S = p["description"]["loop_batch"], p["description"]["max_len"]
    request = B * S * 4 + 1024
    assert p["weights"] + p["kv_cache"] <= p["compiled_total"]
    assert p["compiled_total"] <= (p["weights"] + p["kv_cache"] + p["overhead"] + 2 * request
                                   + p["temporaries"])
    assert p["compiled_total"] - p["temporaries"] < p["weights"] + 2 * p["kv_cache"]


def test_sharding_shrinks_each_devices_share(plans):
    one, mesh = plans["one"], plans["mesh"]
    # layers split over model=2 (the 259-token vocabulary does not divide: replicated)
    assert mesh["weights"] < 0.75 * one["weights"]
    # 4 sequences over data=2 and 2 KV heads over model=2 (one has 3 sequences, 4 devices)
    assert mesh["kv_cache"] == one["kv_cache"] // 3 * 4 // 4


def test_mesh_checked_before_jax():
    code = ("import sys\nfrom hispec_jax import cli\n"
            "rc = cli.main(['plan-memory', '--config', 'tiny', '--mesh', 'model=two'])\n"
            "print(rc, 'jax' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert proc.stdout.split() == ["2", "False"], proc.stderr
    assert "--mesh model=two: size of 'model' must be an integer >= 1, got 'two'" in proc.stderr


def test_compare_plans_every_loop_with_the_same_shapes():
    """`--compare`: greedy AR, LayerSkip, HiSpec, HiSpec adaptive, then sampling AR and
    HiSpec, each compiled for the same cache and batch."""
    rows = plan("--compare")
    assert [(r["name"], r["description"]["greedy"]) for r in rows] == [
        ("ar", True), ("layerskip", True), ("hispec", True), ("hispec adaptive", True),
        ("ar", False), ("hispec", False)]
    assert len({(r["description"]["max_len"], r["kv_cache"]) for r in rows}) == 1


def test_compare_leaves_out_method_and_sampling():
    from hispec_jax import cli

    for flag in (["--method", "hispec"], ["--sampling"]):
        assert cli.main(["plan-memory", "--config", "tiny", "--compare", *flag]) == 2


def test_plan_memory_compare_table_is_relative_to_ar_of_the_same_mode():
    from hispec_jax.decoding import memory_plan

    gib = 2**30

    def made(greedy, total):
        return memory_plan.MemoryPlan(
            description={"greedy": greedy}, weights=0, kv_cache=0, overhead=0, arguments=gib,
            outputs=0, aliased=0, temporaries=total - gib, compile_seconds=0.0)

    lines = memory_plan.comparison_lines([("ar", made(True, 2 * gib)),
                                          ("hispec", made(True, 3 * gib)),
                                          ("ar", made(False, 4 * gib)),
                                          ("hispec", made(False, 5 * gib))])
    assert lines[2] == "| ar | greedy | 1.000 | 0.000 | 1.0000 | 2.000 | +0.000% |"
    assert lines[3].endswith("| 3.000 | +50.000% |")
    assert lines[4].endswith("| 4.000 | +0.000% |")
    assert lines[5].endswith("| 5.000 | +25.000% |")
