"""Several processes, one mesh (`hispec_jax.distributed`, `hispec_jax/cli/distributed.py`).

Two CPU processes with two fake devices each form a mesh of four over JAX's
multi-controller runtime (gloo collectives, a coordinator on localhost at a free port);
their output must be identical to one process on four fake devices: AR, prompt lookup and
HiSpec on data=2,model=2 (model axis inside a process, data across) and AR on model=4
(tensor parallel across the processes, where each process holds only part of the weights),
through the Python API (`multihost_cases.py`) and through `hispec generate`, which prints
on process 0 only; a follower that dies stops process 0 with JAX's error (within its
heartbeat timeout) instead of leaving it waiting. `hispec serve` as two processes (process
0 takes the requests, process 1 follows: `serving/follower.py`) answers AR, lookup and
HiSpec requests as one process on four devices, stops its follower when it stops, and is
stopped by a follower's death. Every subprocess has a timeout, so a failure fails instead
of hanging.
The flag checks (one-line errors, exit status 2, before JAX) run in this process.
"""

import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hispec_jax import distributed
from hispec_jax.cli import main

from conftest import free_port

pytestmark = pytest.mark.multihost

TESTS = Path(__file__).resolve().parent
TIMEOUT = 300  # seconds per subprocess (they take seconds; a hang fails here)
PROMPTS = ["the cat was", "hello world hello world"]  # multihost_cases.PROMPTS


def env_with(devices: int) -> dict:
    """This environment with the worktree on PYTHONPATH and `devices` fake CPU devices."""
    flags = os.environ.get("XLA_FLAGS", "")
    return {**os.environ, "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={devices}".strip(),
            "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
                                          ).rstrip(os.pathsep)}


def run_together(commands: list[list[str]], env: dict, timeout: int = TIMEOUT,
                 check: bool = True) -> list[subprocess.CompletedProcess]:
    """Runs the commands at once (the processes of one run); kills them all on a timeout or
    when one fails (its peers would wait for it). `check`: each must exit 0."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for c in commands]
    results = []
    try:
        for proc, command in zip(procs, commands):
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(command, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for r in results:
        assert not check or r.returncode == 0, r.stderr[-4000:]
    return results


def last_json(stdout: str) -> dict:
    """The JSON line of a process's stdout (gloo prints its connection lines there too)."""
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A 3-layer random model with a word-level tokenizer: 4 query heads, 2 KV heads. The
    tokenizer has a word for every id, so that a served text names its tokens."""
    import jax

    from conftest import WORDS, build_tokenizer
    from hispec_jax.models.config import ModelConfig
    from hispec_jax.models.model import Model, save_model
    from hispec_jax.models.params import init_params

    cfg = ModelConfig(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=128,
                      num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6,
                      max_position_embeddings=256, tie_word_embeddings=False, dtype="float32")
    path = tmp_path_factory.mktemp("multihost_model")
    save_model(Model(cfg=cfg, params=init_params(cfg, jax.random.key(0), init_std=0.3)), path)
    build_tokenizer(WORDS + [f"w{i}" for i in range(cfg.vocab_size - 3 - len(WORDS))]
                    ).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def api_runs(model_dir):
    """(one process on 4 devices, process 0 of 2 on 2 devices each, process 1's stdout)."""
    script = [sys.executable, str(TESTS / "multihost_cases.py"), model_dir]
    one = run_together([script], env_with(4))[0]
    address = f"127.0.0.1:{free_port()}"
    two = run_together([script + [address, "2", str(i)] for i in range(2)], env_with(2))
    return last_json(one.stdout), last_json(two[0].stdout), two[1].stdout


CASES = [("data=2,model=2", m) for m in ("ar", "lookup", "hispec")] + [("model=4", "ar")]


@pytest.mark.parametrize("mesh,method", CASES, ids=[f"{m}-{k}" for m, k in CASES])
def test_two_processes_decode_as_one(api_runs, mesh, method):
    one, two, _ = api_runs
    assert (one["devices"], one["local_devices"]) == (4, 4)
    assert (two["devices"], two["local_devices"]) == (4, 2)
    assert len(two[mesh][method]) == 2 and all(len(t) == 8 for t in two[mesh][method])
    assert two[mesh][method] == one[mesh][method]
    assert two[mesh][method] == one["data=2,model=2"]["ar"]  # greedy speculation is exact


def test_each_process_holds_its_shards_only_and_followers_get_the_work(api_runs):
    one, two, follower_stdout = api_runs
    # model=4 splits the weights across the processes: each holds about half (norms and
    # the 2 KV heads' projections, which 4 does not divide, are replicated)
    assert two["model=4"]["weights_held"] < 0.75
    assert one["model=4"]["weights_held"] == 1.0
    # and reads only those from the checkpoint (`lazy_weights`), each shard once
    assert two["model=4"]["weights_read"] == pytest.approx(two["model=4"]["weights_held"])
    assert one["model=4"]["weights_read"] == 1.0
    # data=2,model=2: the model axis inside each process, a whole replica per process
    assert two["data=2,model=2"]["weights_held"] == 1.0
    assert two["data=2,model=2"]["weights_read"] == 1.0
    assert last_json(follower_stdout) == {"follower_received_work": True}  # and no tokens


def test_cli_generate_two_processes_prints_on_process_0(model_dir, api_runs):
    args = [sys.executable, "-m", "hispec_jax.cli", "generate", "--model", model_dir,
            "--mesh", "data=2,model=2", "--method", "hispec", "--draft-exit", "1",
            "--verify-exits", "2", "--draft-len", "2", "--verify-window", "2",
            "--max-new-tokens", "8", "--ignore-eos", "--json",
            *PROMPTS]
    address = f"127.0.0.1:{free_port()}"
    two = run_together([args + ["--coordinator-address", address, "--num-processes", "2",
                                "--process-id", str(i)] for i in range(2)], env_with(2))
    leader = last_json(two[0].stdout)
    assert [o["token_ids"] for o in leader["outputs"]] == api_runs[0]["data=2,model=2"]["hispec"]
    assert leader["stats"]["mesh"] == "data=2,model=2 (4 cpu devices)"
    assert "{" not in two[1].stdout and "tokens/s" not in two[1].stderr  # process 0 prints


def test_a_dead_follower_stops_process_0_with_an_error_not_a_hang():
    address = f"127.0.0.1:{free_port()}"
    script = [sys.executable, str(TESTS / "multihost_follower_death.py"), address]
    procs = run_together([script + [str(i)] for i in range(2)], env_with(1), timeout=120,
                         check=False)
    (leader_out, leader_err), (follower_out, _) = [(p.stdout, p.stderr) for p in procs]
    assert "process 1 received {'step': 1}" in follower_out
    assert "process 0 received {'step': 1}" in leader_out
    assert "sent step 2" not in leader_out
    assert procs[0].returncode != 0
    assert "another task died" in leader_err or "heartbeat" in leader_err, leader_err[-3000:]


# `hispec serve` per method: the flags after the shared ones. AR warms up (the warm-up's
# calls go to the follower too); the others compile at first use, to keep the module short.
# Lookup also drafts from earlier requests (each process's store is fed by its own generate
# calls, the same in every process).
SERVED = {
    "ar": ["--method", "ar"],
    "lookup": ["--method", "lookup", "--lookup", "3", "--cross-request", "--no-warmup"],
    "hispec": ["--method", "hispec", "--draft-exit", "1", "--verify-exits", "2",
               "--draft-len", "2", "--verify-window", "2", "--no-warmup"],
}


@dataclasses.dataclass
class Served:
    method: str
    url: str
    procs: list[subprocess.Popen]
    logs: list[Path]

    def log(self, i: int) -> str:
        return self.logs[i].read_text()


@pytest.fixture(scope="module", params=list(SERVED))
def served(request, model_dir, tmp_path_factory):
    """`hispec serve` as two processes with two fake devices each (data=2,model=2, 2 slots:
    one per process), up and answering /health on process 0."""
    method, port, address = request.param, free_port(), f"127.0.0.1:{free_port()}"
    folder = tmp_path_factory.mktemp(f"serve_{method}")
    command = [sys.executable, "-m", "hispec_jax.cli", "serve", "--model", model_dir,
               "--mesh", "data=2,model=2", "--slots", "2", "--max-cache-len", "64",
               "--port", str(port), *SERVED[method], "--coordinator-address", address,
               "--num-processes", "2", "--heartbeat-timeout", "5"]
    logs = [folder / f"process_{i}.log" for i in range(2)]
    procs = []
    for i, log in enumerate(logs):
        with open(log, "w") as out:
            procs.append(subprocess.Popen(command + ["--process-id", str(i)], stdout=out,
                                          stderr=subprocess.STDOUT, env=env_with(2)))
    served = Served(method, f"http://127.0.0.1:{port}", procs, logs)
    deadline = time.time() + TIMEOUT
    try:
        while True:
            for i, proc in enumerate(procs):
                assert proc.poll() is None, f"process {i} exited:\n{served.log(i)[-3000:]}"
            assert time.time() < deadline, f"no /health:\n{served.log(0)[-3000:]}"
            try:
                with urllib.request.urlopen(served.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        yield served
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_served_by_two_processes_as_by_one(served, api_runs, model_dir):
    """Both prompts at once (a slot, a data shard, a process each), greedy: the texts of
    one process on four devices (offline `generate`); then a stop string ends a request
    early (its slot is cancelled in both processes) and the slots serve on. Only process
    0 opens the port."""
    from transformers import AutoTokenizer

    openai = pytest.importorskip("openai")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    expected = [tokenizer.decode(ids, skip_special_tokens=True)
                for ids in api_runs[0]["data=2,model=2"][served.method]]
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0,
                           timeout=TIMEOUT)
    name = client.models.list().data[0].id

    def ask(prompt, **options):
        return client.completions.create(model=name, prompt=prompt, max_tokens=8,
                                         temperature=0, extra_body={"ignore_eos": True},
                                         **options).choices[0]

    with ThreadPoolExecutor(2) as pool:
        assert [c.text for c in pool.map(ask, PROMPTS)] == expected
    stop = expected[1].split()[2]
    cut = ask(PROMPTS[1], stop=[stop])
    assert (cut.text, cut.finish_reason) == (expected[1][:expected[1].index(stop)], "stop")
    assert ask(PROMPTS[0]).text == expected[0]
    assert "Uvicorn running" in served.log(0) and "Uvicorn running" not in served.log(1)
    if served.method == "ar":  # its warm-up compiled the sampling engine too: a seeded
        # sample gets offline `generate`'s draws (one device, in this process)
        import hispec_jax

        sampling = dict(temperature=0.8, top_p=0.9, seed=7)
        reference = hispec_jax.generate(hispec_jax.load_model(model_dir), PROMPTS[0],
                                        method="ar", max_new_tokens=8, ignore_eos=True,
                                        **sampling)
        sampled = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=8,
                                            extra_body={"ignore_eos": True}, **sampling)
        assert sampled.choices[0].text == reference.texts[0]


def test_a_stopped_server_stops_its_follower_and_a_dead_follower_the_server(served):
    """SIGTERM to process 0: its engine thread sends "stop", and both processes exit 0.
    HiSpec's server instead loses its follower (killed): process 0 must exit with JAX's
    error naming the dead process within the heartbeat timeout (5 s), not hang."""
    leader, follower = served.procs
    if served.method != "hispec":
        leader.terminate()
        assert leader.wait(60) == 0, served.log(0)[-3000:]
        assert follower.wait(60) == 0, served.log(1)[-3000:]
        return
    follower.kill()
    follower.wait()
    assert leader.wait(60) != 0
    assert "another task died" in served.log(0), served.log(0)[-3000:]


def test_a_follower_given_other_settings_stops_before_loading(model_dir):
    """Process 1 started with other slots than process 0: it says so and exits 1 before
    loading anything (its programs would not match process 0's); process 0 is then ended
    by the lost follower (heartbeat timeout 5 s), not left waiting."""
    address, port = f"127.0.0.1:{free_port()}", free_port()
    command = [sys.executable, "-m", "hispec_jax.cli", "serve", "--model", model_dir,
               "--mesh", "data=2,model=2", "--max-cache-len", "64", "--method", "ar",
               "--no-warmup", "--port", str(port), "--coordinator-address", address,
               "--num-processes", "2", "--heartbeat-timeout", "5"]
    procs = run_together([command + ["--slots", slots, "--process-id", str(i)]
                          for i, slots in enumerate(["2", "4"])], env_with(2), timeout=120,
                         check=False)
    (leader_err, follower_err) = [p.stderr for p in procs]
    assert procs[1].returncode == 1, follower_err[-3000:]
    assert ("hispec: error: process 1 serves with slots=4 where process 0 has slots=2: give "
            "every process the same command") in follower_err
    assert "model " not in follower_err  # the startup line of a load
    assert procs[0].returncode != 0, leader_err[-3000:]


@pytest.mark.parametrize("flags, message", [
    (["--process-id", "1"], "--process-id 1: needs --num-processes"),
    (["--num-processes", "2", "--process-id", "2"], "--process-id 2: must be in 0..1"),
    (["--num-processes", "0", "--process-id", "0"], "--num-processes 0: must be an integer >= 1"),
    (["--coordinator-address", "localhost", "--num-processes", "2", "--process-id", "0"],
     "--coordinator-address localhost: must be HOST:PORT"),
    (["--coordinator-address", "h:99999", "--num-processes", "2", "--process-id", "0"],
     "--coordinator-address h:99999: must be HOST:PORT with a port in 1..65535"),
    (["--num-processes", "2"], "--num-processes: also give --coordinator-address and "
                               "--process-id"),
    (["--coordinator-address", "h:1234", "--num-processes", "2", "--process-id", "0"],
     "give --mesh data=D,model=M"),
    (["--distributed"], "--distributed: a run over several hosts decodes over a device mesh"),
])
def test_generate_flag_errors(capsys, flags, message):
    assert main(["generate", "--method", "ar", *flags, "hello"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hispec: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, message", [
    (["--coordinator-address", "h:1234", "--num-processes", "2", "--process-id", "0"],
     "give --mesh data=D,model=M"),
    (["--mesh", "data=2,model=2", "--distributed", "--measure-pass-cost"],
     "--measure-pass-cost: not on several hosts"),
    (["--heartbeat-timeout", "5"], "--heartbeat-timeout: only with the multi-host flags"),
    (["--mesh", "data=2", "--distributed", "--heartbeat-timeout", "0"],
     "--heartbeat-timeout 0: must be an integer >= 1"),
])
def test_serve_flag_errors(capsys, flags, message):
    assert main(["serve", "--method", "ar", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hispec: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, message", [
    (["--coordinator-address", "h:1234", "--num-processes", "2", "--process-id", "0"],
     "give --mesh data=D,model=M"),
    (["--mesh", "data=2", "--distributed"], "--no-transformers: give it on several hosts"),
    (["--mesh", "data=2", "--distributed", "--no-transformers"],
     "--sv-profile: on several hosts give an SV profile"),
    (["--tasks", "chat", "--distributed"], "--tasks: on one host only"),
])
def test_bench_flag_errors(capsys, flags, message):
    assert main(["bench", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hispec: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_check_arguments():
    distributed.check_arguments(None, None, None)  # detected (Cloud TPU)
    distributed.check_arguments("10.0.0.1:8476", 4, 3)
    distributed.check_arguments("[::1]:8476", 2, 0)
    with pytest.raises(distributed.ArgumentError) as e:
        distributed.check_arguments("10.0.0.1", 2, 0)
    assert e.value.argument == "coordinator_address"
    with pytest.raises(ValueError, match="process_id"):
        distributed.check_arguments(None, 2, -1)


def test_follower_messages_carry_requests_and_pass_costs_whole():
    """What `serving/follower.py` sends through JSON comes back equal: a request with its
    sampling settings, and the lookup gate's pass costs (NaN where not measured)."""
    import numpy as np

    from hispec_jax.decoding import gate
    from hispec_jax.decoding.sampling import SamplingParams
    from hispec_jax.serving import follower
    from hispec_jax.decoding.slots import SlotRequest

    request = SlotRequest((5, 6, 7), 9, SamplingParams(temperature=0.7, top_k=3, top_p=0.9,
                                                       seed=11), ignore_eos=True, min_tokens=2,
                          scope=1)
    assert follower.request_from_json(
        json.loads(json.dumps(follower.request_json(request)))) == request
    cost = gate.PassCost.of(12.5, 3.0, {(1, 2): 1.8, (4, 16): 2.5})
    back = follower.pass_cost_from_json(json.loads(json.dumps(follower.pass_cost_json(cost))))
    for a, b in zip((cost.fixed, cost.jump, cost.measured_RxT),
                    (back.fixed, back.jump, back.measured_RxT)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_broadcast_work_on_one_process():
    assert distributed.broadcast_work({"step": 3, "slots": [1, 2]}) == {"step": 3,
                                                                         "slots": [1, 2]}
