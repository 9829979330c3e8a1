"""`hispec serve` with its defaults: the model's default plan, warm-up before readiness
(/health 503 "loading", then 200 and nothing compiles at the first requests), and /metrics
counting what the responses say. Shipped model, small shapes."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request

import pytest

import hispec_jax
from hispec_jax import cli

from conftest import serving, shipped_model_scanned

pytest.importorskip("uvicorn")  # the servers below
parser = pytest.importorskip("prometheus_client.parser")

PLAN_REASON = ("the model's recommended plan (recommended_plan.json): hispec exits 4,12,24, "
               "windows 3,6")


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _post(url: str, body: dict) -> dict | str:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        text = r.read().decode()
    return json.loads(text) if not body.get("stream") else text


def _health(url: str) -> tuple[int, dict]:
    status, text = _get(url + "/health")
    return status, json.loads(text)


def _metrics(url: str) -> dict[str, float]:
    """{"name{label=value,...}": value} of every sample of a scrape."""
    status, text = _get(url + "/metrics")
    assert status == 200
    samples = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


class _LogLines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def served():
    """(url, /health answers until ready, the server's log lines): the default plan,
    warm-up on."""
    from hispec_jax.serving import server as server_lib

    model = shipped_model_scanned()
    lines = _LogLines()
    logging.getLogger("hispec.serve").addHandler(lines)
    logging.getLogger("hispec.serve").setLevel(logging.INFO)
    app = server_lib.build_app(model, slots=2, max_cache_len=64)
    with serving(app) as url:
        deadline, seen = time.time() + 900, []
        while True:
            assert time.time() < deadline, "the server did not become ready"
            try:
                status, body = _health(url)
            except OSError:  # not listening yet
                time.sleep(0.05)
                continue
            seen.append((status, body))
            if status == 200:
                break
            if len(seen) == 1:  # /metrics answers while the engine thread is busy compiling
                seen.append((_get(url + "/metrics")[0], {"scrape": True}))
            time.sleep(0.2)
        while any(e["rows_to_compile"] for e in _health(url)[1]["engines"].values()):
            time.sleep(0.2)  # the rounds loops over fewer slots compile after readiness
        logging.getLogger("hispec.serve").removeHandler(lines)
        yield url, seen, lines.lines


def test_health_is_loading_until_the_warm_up_ends_and_names_the_plan(served):
    url, seen, lines = served
    assert lines[0] == (f"plan: hispec exits 4,12,24 windows 3,6 ({PLAN_REASON}); warming up "
                        "(compiling every program) before taking requests")
    assert lines[1].startswith("warm-up compiled ") and lines[1].endswith("; ready")
    status, loading = seen[0]
    assert status == 503 and loading["status"] == "loading"
    assert seen[1] == (200, {"scrape": True})
    assert all(s == 503 for s, _ in seen[2:-1])
    status, ok = seen[-1]
    assert status == 200 and ok["status"] == "ok"
    for body in (loading, ok):
        assert body["method"] == "hispec" and body["reason"] == PLAN_REASON
        assert body["plan"] == "hispec exits 4,12,24 windows 3,6"
    assert ok["warmup_compiles"] > 0 and ok["warmup_seconds"] > 0
    # ready with the loop over both slots; the loop over slot 0 alone compiles afterwards
    assert ok["engines"]["greedy"]["rows_compiled"] in ([2], [1, 2])
    assert _health(url)[1]["engines"]["greedy"]["rows_compiled"] == [1, 2]
    assert sum("rounds loop over 1 of 2 slots" in line for line in lines) == 2


def test_after_readiness_the_first_requests_compile_nothing(served):
    url = served[0]
    before = _health(url)[1]["compiles"]
    _post(url + "/v1/chat/completions", {
        "model": "default_model", "max_tokens": 5, "temperature": 0,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    _post(url + "/v1/completions", {"model": "default_model", "prompt": "Once upon a time " * 5,
                                    "max_tokens": 4, "temperature": 0.7, "seed": 3})
    assert _health(url)[1]["compiles"] == before


def test_metrics_count_what_the_responses_say(served):
    url = served[0]
    before = _metrics(url)
    a = _post(url + "/v1/completions", {"model": "default_model", "prompt": "The cat sat on the",
                                        "max_tokens": 7, "temperature": 0})
    b = _post(url + "/v1/chat/completions", {
        "model": "default_model", "max_tokens": 6, "temperature": 0,
        "messages": [{"role": "user", "content": "Hello there"}]})
    stream = _post(url + "/v1/completions", {
        "model": "default_model", "prompt": "One two three four", "max_tokens": 5,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    c = json.loads([e for e in stream.split("\n\n") if e.startswith("data: {")][-1][6:])
    after = _metrics(url)
    grew = lambda name: after.get(name, 0) - before.get(name, 0)  # noqa: E731
    usages = [r["usage"] for r in (a, b, c)]
    assert grew("hispec:prompt_tokens_total{}") == sum(u["prompt_tokens"] for u in usages)
    assert grew("hispec:generation_tokens_total{}") == sum(u["completion_tokens"]
                                                           for u in usages)
    reasons = [r["choices"][0]["finish_reason"] for r in (a, b)] + ["length"]
    for reason in ("stop", "length"):
        assert grew(f"hispec:request_success_total{{finished_reason={reason}}}") == \
            reasons.count(reason)
    assert grew("hispec:time_to_first_token_seconds_count{}") == 3
    assert grew("hispec:inter_token_latency_seconds_count{}") == sum(
        u["completion_tokens"] - 1 for u in usages)
    assert after["hispec:num_requests_running{}"] == after["hispec:num_requests_waiting{}"] == 0
    # speculation: the greedy engine's hispec levels (drafts of exit 4 checked by exit 12,
    # exit 12's checked by the final layer)
    for level, drafter in ((1, "exit4"), (2, "exit12")):
        key = f"{{drafter={drafter},engine=greedy,level={level}}}"
        proposed = grew(f"hispec:spec_decode_num_draft_tokens_total{key}")
        accepted = grew(f"hispec:spec_decode_num_accepted_tokens_total{key}")
        assert proposed > 0 and 0 <= accepted <= proposed
        assert after[f"hispec:spec_decode_acceptance_rate{key}"] == pytest.approx(
            after[f"hispec:spec_decode_num_accepted_tokens_total{key}"]
            / after[f"hispec:spec_decode_num_draft_tokens_total{key}"])
    assert grew("hispec:spec_decode_num_rounds_total{engine=greedy}") > 0
    assert after["hispec:spec_decode_tokens_per_round{engine=greedy}"] >= 1.0


@pytest.mark.parametrize("argv,message", [
    (["serve", "--lookup", "0"], "--lookup 0"),
    (["chat", "--lookup", "65"], "--lookup 65"),
    (["serve", "--method", "ar", "--lookup", "4"], "--lookup 4"),
    (["chat", "--method", "sv", "--lookup", "4"], "--lookup 4"),
    (["chat", "--max-ngram", "3"], "--max-ngram 3"),  # the default plan has no lookup drafter
    (["serve", "--method", "lookup", "--max-ngram", "0"], "--max-ngram 0"),
    (["serve", "--method", "lookup", "--draft-exit", "3"], "--draft-exit 3"),
])
def test_lookup_flags_out_of_range_or_with_the_wrong_method_fail_with_one_line(
        argv, message, capsys):
    from hispec_jax.decoding import engine

    compiled = engine.compilations
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hispec: error: ") and message in err and err.count("\n") == 1
    assert engine.compilations == compiled


def test_a_model_without_a_recommended_plan_is_served_with_prompt_lookup(tmp_path, caplog):
    import jax

    from hispec_jax import Model, ModelConfig, save_model
    from hispec_jax.decoding import options, recommended
    from hispec_jax.models.params import init_params
    from hispec_jax.serving import server as server_lib

    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8,
                      max_position_embeddings=128)
    save_model(Model(cfg=cfg, params=init_params(cfg, jax.random.PRNGKey(0)),
                     generation_config={"eos_token_id": 3}), tmp_path / "tiny")
    model = hispec_jax.load_model(tmp_path / "tiny")
    with caplog.at_level("INFO", logger="hispec.serve"):
        app = server_lib.build_app(model, slots=1, max_cache_len=64, warmup=False)
    reason = recommended.default_plan(model)[2]
    assert reason.startswith("the model has no recommended plan")
    assert app.state.plan == {"method": "lookup", "reason": reason, "plan":
                              f"lookup k={options.DEFAULT_LOOKUP} "
                              f"ngram<={options.DEFAULT_MAX_NGRAM}", "cross_request": False,
                              "spec": {"method": "lookup", "lookup": options.DEFAULT_LOOKUP,
                                       "max_ngram": options.DEFAULT_MAX_NGRAM}}
    assert (f"plan: {app.state.plan['plan']} ({reason}); drafts from earlier requests: off"
            in caplog.text)
