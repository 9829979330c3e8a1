"""Exit-head training over a device mesh (`train_heads/mesh.py`, `train(..., mesh=)`,
`hispec train-heads --mesh`).

The runs take four fake CPU devices, so they run in their own process
(`train_mesh_cases.py`): the loss curve of 8 steps on data=2,model=2 equals one device's
within float tolerance, with the feature cache and without it (the frozen base run in every
step, sharded); a run stopped after 4 steps on data=2,model=2 and resumed on model=4 ends
where the unbroken run ends; the stopped run's sharded orbax checkpoint restores onto
data=4 and data=2,model=2 with identical values and each mesh's shardings; and
`hispec train-heads` as two processes x two fake devices trains as one process on 2x2
(test_multihost.py's helpers). The same for
`hispec pretrain --small --mesh` (`pretrain_mesh_cases.py`): 6 steps on data=2,model=2 equal
one device's, and a run cut after one step on data=2,model=2 and resumed on model=4 ends
with the unbroken run's losses and weights. The flag checks run in this process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hispec_jax.cli import main
from hispec_jax.train_heads.train import METRICS_FILENAME as METRICS

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(TESTS.parent), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    root = tmp_path_factory.mktemp("train_mesh")
    proc = subprocess.run([sys.executable, str(TESTS / "train_mesh_cases.py"), str(root)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "root": root}


@pytest.mark.parametrize("curve", ["mesh_2x2", "mesh_2x2_tokens"])
def test_loss_curve_on_2x2_equals_one_device(runs, curve):
    assert len(runs[curve]) == len(runs["one"]) == 8
    np.testing.assert_allclose(runs[curve], runs["one"], rtol=2e-5)
    assert runs["one"][0] != runs["one"][-1]  # the heads did train
    for exit_layer, metrics in runs["eval_one"].items():
        np.testing.assert_allclose(runs["eval_mesh"][exit_layer]["kl"], metrics["kl"], rtol=2e-5)


def test_stopped_run_resumed_on_another_mesh_ends_where_the_unbroken_run_ends(runs):
    assert runs["stopped_at"] == runs["resumed_start"] == 4
    resumed = [runs["resumed"][str(s)] for s in range(4, 8)]
    np.testing.assert_allclose(resumed, runs["mesh_2x2"][4:], rtol=2e-5)
    assert runs["heads_gap"] < 1e-5


def test_checkpoint_restores_onto_another_mesh(runs):
    restore = runs["restore"]
    assert restore["equal"]
    assert restore["meshes"] == ["{'data': 2, 'model': 2}", "{'data': 4, 'model': 1}"]
    # the heads' vocabulary columns split over "model" on data=2,model=2; all replicated
    # on data=4 (no model axis)
    assert "data=2,model=2: P(None, 'model')" in restore["specs"]
    assert "data=4: P()" in restore["specs"] and len(restore["specs"]) == 3


def test_batch_not_divided_by_the_data_axis_is_refused(runs):
    assert "batch_size=3 is not a multiple of the mesh's data axis (2)" in runs["batch_error"]


@pytest.mark.multihost
def test_train_heads_on_two_processes_equals_one(runs):
    """`hispec train-heads` as two processes x two fake devices (gloo, a coordinator on
    localhost) trains as train_mesh_cases' one process on data=2,model=2: same settings,
    the same loss curve; process 0 alone writes the metrics and the heads."""
    from test_multihost import env_with, free_port, run_together

    root = runs["root"]
    work = root / "two_processes"
    overrides = {"model_path": root / "model", "workdir": work, "output_dir": work / "out",
                 "progress_bar": False, "total_steps": 8, "warmup_steps": 2, "batch_size": 4,
                 "checkpoint_every": 2, "eval_every": 4, "async_checkpoint": False}
    address = f"127.0.0.1:{free_port()}"
    commands = [[sys.executable, "-m", "hispec_jax.cli", "train-heads", "--config",
                 "train_heads_small", "--mesh", "data=2,model=2",
                 "--coordinator-address", address, "--num-processes", "2", "--process-id", str(i),
                 f"--config.cache_dir={root / f'cache_{i}'}",
                 *(f"--config.{k}={v}" for k, v in overrides.items())] for i in range(2)]
    leader, follower = run_together(commands, env_with(2))
    lines = [json.loads(line) for line in (work / METRICS).read_text().splitlines()]
    losses = [r["loss"] for r in lines if r["event"] == "train"]
    np.testing.assert_allclose(losses, runs["mesh_2x2"], rtol=2e-5)
    assert "heads saved to" in leader.stdout and "heads saved to" not in follower.stdout
    assert (work / "out" / "exit_heads.safetensors").is_file()


@pytest.mark.parametrize("flags, message", [
    (["--mesh", "data=0"], "--mesh data=0: size of 'data' must be an integer >= 1"),
    (["--mesh", "data=2"], "--mesh data=2,model=1: needs 2 devices"),
    (["--process-id", "0"], "--process-id 0: needs --num-processes"),
    (["--coordinator-address", "h:1", "--num-processes", "2", "--process-id", "1"],
     "give --mesh data=D,model=M"),
])
def test_train_heads_flag_errors(capsys, tmp_path, flags, message):
    assert main(["train-heads", "--config", "train_heads_small", *flags,
                 f"--config.model_path={tmp_path}", f"--config.workdir={tmp_path / 'w'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hispec: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


# ----- hispec pretrain over a mesh (pretrain_mesh_cases.py) ----------------------------------

@pytest.fixture(scope="module")
def pretrain_runs(tmp_path_factory):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(TESTS.parent), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.run([sys.executable, str(TESTS / "pretrain_mesh_cases.py"),
                           str(tmp_path_factory.mktemp("pretrain_mesh"))],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_pretrain_loss_curve_on_2x2_equals_one_device(pretrain_runs):
    one, mesh = pretrain_runs["one"], pretrain_runs["mesh_2x2"]
    assert len(one) == len(mesh) == 6 and one[-1] < one[0]
    np.testing.assert_allclose(mesh, one, rtol=2e-5)
    np.testing.assert_allclose(*pretrain_runs["perplexity"], rtol=2e-5)


def test_pretrain_cut_on_2x2_and_resumed_on_model_4_ends_as_unbroken(pretrain_runs):
    assert pretrain_runs["cut_steps"] == 1 and pretrain_runs["resumed_steps"] == 5
    resumed = [pretrain_runs["resumed"][str(s)] for s in range(6)]
    np.testing.assert_allclose(resumed, pretrain_runs["mesh_2x2"], rtol=2e-5)
    assert pretrain_runs["params_gap"] < 1e-5
