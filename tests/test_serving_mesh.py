"""`hispec serve --mesh data=2,model=4` on 8 fake CPU devices, driven by the `openai` client:
the slots split over "data" and the weights over "model" (`decoding/slots.py` on a mesh),
and every answer is the one a single device gives (greedy: AR's tokens; sampling with a
seed: offline `generate`'s draws with that seed). The server is its own process (XLA_FLAGS
must name the device count before JAX starts) running the shipped model's default plan,
compiling at first use (`--no-warmup`) to keep the module short."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

import hispec_jax
from hispec_jax.decoding import recommended

from conftest import free_port

openai = pytest.importorskip("openai")

HISPEC = "import sys; from hispec_jax.cli import main; sys.exit(main())"  # the `hispec` command
PROMPTS = ["Once upon a time", "The cat sat on the mat and", "Hello", "Why is the sky blue?",
           "In the beginning"]
BUDGETS = [9, 4, 6, 8, 5]


@pytest.fixture(scope="module")
def model():
    """The shipped model as the command line loads it (its default layer layout)."""
    return hispec_jax.load_model(hispec_jax.DEFAULT_MODEL_DIR)


@pytest.fixture(scope="module")
def mesh_server(tmp_path_factory):
    port = free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=(
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip())
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", HISPEC, "serve", "--mesh", "data=2,model=4", "--slots", "4",
             "--max-cache-len", "128", "--port", str(port), "--no-warmup"],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    try:
        while True:
            assert proc.poll() is None, f"hispec serve exited:\n{log.read_text()[-3000:]}"
            assert time.time() < deadline, f"hispec serve did not start:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def client(mesh_server):
    return openai.OpenAI(base_url=mesh_server + "/v1", api_key="unused", max_retries=0,
                         timeout=300)


def test_served_on_a_mesh_equals_one_device(model, client):
    """More requests than slots, at once, greedy: each gets AR's text on one device; then a
    sampled request with a seed gets offline `generate`'s draws (the default plan, one
    device) with that seed."""
    def ask(i):
        return client.completions.create(model="default_model", prompt=PROMPTS[i],
                                         max_tokens=BUDGETS[i], temperature=0)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        served = [r.choices[0].text for r in pool.map(ask, range(len(PROMPTS)))]
    offline = [hispec_jax.generate(model, p, method="ar", max_new_tokens=n).texts[0]
               for p, n in zip(PROMPTS, BUDGETS)]
    assert served == offline

    method, options, _ = recommended.default_plan(model)
    sampled = client.completions.create(model="default_model", prompt=PROMPTS[0], max_tokens=8,
                                        temperature=0.8, top_p=0.9, seed=7)
    reference = hispec_jax.generate(model, PROMPTS[0], method=method, max_new_tokens=8,
                                    temperature=0.8, top_p=0.9, seed=7, **options)
    assert sampled.choices[0].text == reference.texts[0]
