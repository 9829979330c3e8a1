"""`hispec serve` end to end: the official `openai` client (and raw HTTP for the corner
cases) against a server this module starts on localhost, with the shipped default model.
Requests are short (a few tokens) so the module stays quick."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

import hispec_jax

from conftest import free_port, serving, shipped_model_scanned

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")  # the servers below

METHOD = "layerskip"
HISPEC = "import sys; from hispec_jax.cli import main; sys.exit(main())"  # the `hispec` command
PROMPTS = ["Once upon a time", "The cat sat on the mat and", "Hello", "Why is the sky blue?"]


@pytest.fixture(scope="module")
def model():
    return shipped_model_scanned()


@pytest.fixture(scope="module")
def server(model):
    from hispec_jax.serving import server as server_lib

    app = server_lib.build_app(model, METHOD, slots=3, max_cache_len=128, warmup=False)
    with serving(app) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=120)


def _post(url: str, body) -> tuple[int, dict | str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if text.startswith("{") else text)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read().decode())


def _offline(model, prompt, n, **kw):
    return hispec_jax.generate(model, prompt, method=METHOD, max_new_tokens=n, **kw).texts[0]


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["default_model"]
    health = _get(server + "/health")
    assert health["status"] == "ok" and health["method"] == METHOD
    assert health["engines"]["greedy"]["slots"] == 3


def test_concurrent_greedy_completions_equal_offline_generate(model, client):
    """More requests than slots, at once: each gets exactly its offline text and usage."""
    budgets = [6, 3, 5, 4, 6, 2]
    prompts = (PROMPTS * 2)[:len(budgets)]

    def ask(i):
        return client.completions.create(model="default_model", prompt=prompts[i],
                                         max_tokens=budgets[i], temperature=0)

    with ThreadPoolExecutor(len(budgets)) as pool:
        results = list(pool.map(ask, range(len(budgets))))
    for p, n, r in zip(prompts, budgets, results):
        assert r.choices[0].text == _offline(model, p, n)
        assert r.choices[0].finish_reason == "length"
        ids = model.tokenizer(p)["input_ids"]
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), n)
        assert r.usage.total_tokens == len(ids) + n


def test_chat_stream_with_usage_equals_the_non_streamed_answer(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    whole = client.chat.completions.create(model="default_model", messages=messages,
                                           max_completion_tokens=6, temperature=0)
    chunks = list(client.chat.completions.create(
        model="default_model", messages=messages, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage == whole.usage


def test_raw_stream_ends_with_done(server):
    req = urllib.request.Request(server + "/v1/completions", data=json.dumps(
        {"model": "default_model", "prompt": "Hello", "max_tokens": 3, "temperature": 0,
         "stream": True}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.read().decode().split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_stop_string_cuts_the_text(model, client):
    full = _offline(model, PROMPTS[0], 10)
    stop = full[len(full) // 2:len(full) // 2 + 3]
    r = client.completions.create(model="default_model", prompt=PROMPTS[0], max_tokens=10,
                                  temperature=0, stop=[stop, "never-seen"])
    assert r.choices[0].text == full[:full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="default_model", prompt=PROMPTS[0], max_tokens=10, temperature=0, stop=stop,
        stream=True))
    assert streamed == r.choices[0].text


def test_a_stream_sends_a_chunk_per_delivery_even_with_its_text_held_back(model, client):
    # text that could start a stop string waits (here until the end: the stop never
    # completes), but every delivery of tokens still sends a chunk, its text "" meanwhile
    full = _offline(model, PROMPTS[0], 10)
    held = full[len(full) // 3:] + "never-seen"
    chunks = list(client.completions.create(
        model="default_model", prompt=PROMPTS[0], max_tokens=10, temperature=0, stop=held,
        stream=True, stream_options={"include_usage": True}))
    deliveries = [c for c in chunks if c.choices and c.choices[0].finish_reason is None]
    assert any(c.choices[0].text == "" for c in deliveries)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    # one round a step: a delivery per round, at least one token each
    assert 1 <= len(deliveries) <= chunks[-1].usage.completion_tokens == 10


def test_sampling_with_a_seed_is_offline_generate_with_that_seed(model, client):
    r = client.completions.create(model="default_model", prompt=PROMPTS[1], max_tokens=5,
                                  temperature=0.8, top_p=0.9, seed=7, extra_body={"top_k": 40})
    assert r.choices[0].text == _offline(model, PROMPTS[1], 5, temperature=0.8, top_p=0.9,
                                         top_k=40, seed=7)


LONG = "word " * 200
BAD = [  # (endpoint, body, status, the parameter the error names or a word of its message)
    ("completions", b"{not json", 400, "JSON"),
    ("completions", {"model": "default_model", "prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
    ("completions", {"model": "default_model", "prompt": "x", "max_tokens": -5}, 400, "max_tokens"),
    ("completions", {"model": "default_model", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"model": "default_model", "prompt": "x", "max_tokens": 10 ** 9}, 400,
     "max_tokens"),
    ("completions", {"model": "default_model", "prompt": "x", "max_tokens": "5"}, 400,
     "max_tokens"),
    ("completions", {"model": "default_model", "prompt": LONG, "max_tokens": 1}, 400, "prompt"),
    ("completions", {"model": "default_model", "prompt": "x", "n": 2}, 400, "n"),
    ("completions", {"model": "default_model", "prompt": "x", "logprobs": 2}, 400, "logprobs"),
    ("completions", {"model": "default_model", "prompt": "x", "echo": True}, 400, "echo"),
    ("completions", {"model": "default_model", "prompt": [1, 99999]}, 400, "prompt"),
    ("completions", {"model": "default_model", "prompt": ""}, 400, "prompt"),
    ("completions", {"model": "default_model", "prompt": ["a", "b"]}, 400, "prompt"),
    ("completions", {"model": "default_model", "prompt": "x", "temperature": -1}, 400,
     "temperature"),
    ("completions", {"model": "default_model", "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("completions", {"model": "default_model", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]},
     400, "stop"),
    ("completions", {"model": "default_model", "prompt": "x", "stream_options":
                     {"include_usage": True}}, 400, "stream_options"),
    ("completions", {"model": "gpt-4o", "prompt": "x"}, 404, "model"),
    ("completions", {"prompt": "x"}, 400, "model"),
    ("chat/completions", {"model": "default_model", "messages": []}, 400, "messages"),
    ("chat/completions", {"model": "default_model", "messages": [{"role": "user"}]}, 400,
     "messages.0.content"),
    ("chat/completions", {"model": "default_model", "messages": [
        {"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    ("chat/completions", {"model": "default_model", "messages": [
        {"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400, "tools"),
    ("chat/completions", {"model": "default_model", "messages": [
        {"role": "user", "content": "x"}], "max_tokens": 2, "max_completion_tokens": 2}, 400,
     "max_completion_tokens"),
    ("chat/completions", {"model": "default_model", "messages": [
        {"role": "user", "content": "x"}], "presence_penalty": 1.0}, 400, "presence_penalty"),
    ("chat/completions", {"model": "default_model", "messages": [
        {"role": "user", "content": LONG}]}, 400, "messages"),
    ("nope", {"model": "default_model"}, 404, "/v1/nope"),
    # llama.cpp's tools/server/tests/unit/test_chat_completion.py invalid message lists
    ("chat/completions", {"model": "default_model", "messages": None}, 400, "messages"),
    ("chat/completions", {"model": "default_model", "messages": "string"}, 400, "messages"),
    ("chat/completions", {"model": "default_model", "messages": [123]}, 400, "messages.0"),
    ("chat/completions", {"model": "default_model", "messages": [{}]}, 400, "messages.0"),
    ("chat/completions", {"model": "default_model", "messages": [{"role": 123}]}, 400,
     "messages.0"),
    ("chat/completions", {"model": "default_model", "messages": [
        {"role": "system", "content": 123}]}, 400, "messages.0.content"),
    ("chat/completions", {"model": "default_model", "messages": [
        {"role": "system", "content": "test"}, {}]}, 400, "messages.1"),
    ("chat/completions", {"model": "default_model", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages.0.content"),
]


@pytest.mark.parametrize("endpoint,body,status,named", BAD,
                         ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)])
def test_bad_requests_get_openai_style_errors(server, endpoint, body, status, named):
    code, reply = _post(f"{server}/v1/{endpoint}", body)
    assert code == status, reply
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert named in (error["param"] or "") or named in error["message"], error


def test_the_server_keeps_serving_after_bad_requests(model, server, client):
    for _, body, _, _ in BAD[:5]:
        _post(server + "/v1/completions", body)
    r = client.completions.create(model="default_model", prompt="Hello", max_tokens=2,
                                  temperature=0)
    assert r.choices[0].text == _offline(model, "Hello", 2)
    assert _get(server + "/health")["status"] == "ok"


def test_a_client_that_disconnects_mid_stream_frees_its_slot(server):
    before = _get(server + "/health")["finished"].get("cancelled", 0)
    req = urllib.request.Request(server + "/v1/completions", data=json.dumps(
        {"model": "default_model", "prompt": "Once upon a time", "max_tokens": 100,
         "temperature": 0, "stream": True}).encode(), headers={"Content-Type": "application/json"})
    r = urllib.request.urlopen(req, timeout=120)
    assert r.readline().startswith(b"data: ")
    r.close()  # hang up mid-stream
    deadline = time.time() + 30
    while True:
        health = _get(server + "/health")
        if health["finished"].get("cancelled", 0) > before:
            break
        assert time.time() < deadline, health
        time.sleep(0.1)
    assert health["engines"]["greedy"]["busy"] == 0


def test_sigterm_stops_the_server_cleanly():
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-c", HISPEC, "serve", "--port", str(port),
                             "--max-cache-len", "64", "--slots", "1", "--method", "ar",
                             "--no-warmup"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if _get(f"http://127.0.0.1:{port}/health")["status"] == "ok":
                    break
            except OSError:
                pass
            assert time.time() < deadline
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "Shutting down" in out
    assert "plan: ar (--method given)" in out
