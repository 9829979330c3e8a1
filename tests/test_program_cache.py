"""The cross-process program cache (`decoding/program_cache.py`): a cached program computes
what the traced one does, any change of key, shapes or versions misses, and a bad entry or
directory costs a warning and a normal compile, never an error."""

import logging
import pickle

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hispec_jax.decoding import program_cache


@flax.struct.dataclass
class State:
    x_B: jax.Array
    n: jax.Array


def step(state: State, w_BxD, y_B):
    """A loop with a custom pytree in and out, like the engine's."""
    def body(s):
        return State(x_B=s.x_B + jnp.sum(w_BxD, axis=1) * y_B, n=s.n + 1)
    return jax.lax.while_loop(lambda s: s.n < 3, body, state), jnp.max(w_BxD)


def arguments(batch=4):
    return (State(x_B=jnp.arange(batch, dtype=jnp.float32), n=jnp.zeros((), jnp.int32)),
            jnp.ones((batch, 3), jnp.float32), jnp.full((batch,), 2.0, jnp.float32))


def compile_step(tmp_path, key="step", batch=4, new_process=True):
    """`step` through the program cache; `new_process`: as a new process would (JAX's
    in-memory caches cleared first, so nothing compiled before in this one is reused)."""
    if new_process:
        jax.clear_caches()
    return program_cache.compile_cached(jax.jit(step, donate_argnums=(0,)),
                                        jax.eval_shape(lambda: arguments(batch)), key=key,
                                        directory=tmp_path)


def entries(directory):
    return sorted(directory.glob("*" + program_cache.SUFFIX))


def test_round_trip_gives_the_same_outputs_and_donates(tmp_path):
    expected = jax.jit(step)(*arguments())
    first = compile_step(tmp_path)
    second = compile_step(tmp_path)  # a later process: read, not traced
    assert (first.source, second.source) == ("stored", "cache")
    assert len(entries(tmp_path)) == 1
    shapes = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), tree)
    assert shapes(second.out_info) == shapes(jax.eval_shape(step, *arguments()))
    for program in (first, second):
        args = arguments()
        out = program(*args)
        assert jax.tree.structure(out) == jax.tree.structure(expected)
        jax.tree.map(np.testing.assert_array_equal, out, expected)
        assert args[0].x_B.is_deleted()  # the donated state backs the output


XLA_CACHE_SCRIPT = """
import sys, jax, numpy as np
sys.path.insert(0, sys.argv[2])
from test_program_cache import arguments, compile_step, step
from pathlib import Path
if sys.argv[3] == "fill":  # JAX's persistent cache gets the program, the program cache not
    jax.jit(step, donate_argnums=(0,)).lower(*jax.eval_shape(arguments)).compile()
program = compile_step(Path(sys.argv[1]), key="in-xla-cache", new_process=False)
jax.tree.map(np.testing.assert_array_equal, program(*arguments()), jax.jit(step)(*arguments()))
print("RESULT", program.source, jax.config.jax_enable_compilation_cache)
"""


def test_a_program_in_xlas_cache_is_stored_runnable(tmp_path):
    """XLA:CPU cannot serialize again an executable loaded from JAX's persistent cache:
    the program cache compiles the program it stores anew, so the stored copy runs in the
    next process; one compiled earlier in the same process is not stored."""
    import os
    import subprocess
    import sys

    def run(mode):
        env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla"),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
        proc = subprocess.run([sys.executable, "-c", XLA_CACHE_SCRIPT, str(tmp_path / "p"),
                               os.path.dirname(__file__), mode], env=env, capture_output=True,
                              text=True, timeout=600)
        line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
        assert line, proc.stderr[-3000:]
        return line[0].split()[1:]

    run("fill")  # the XLA cache holds `step`; in-process, it was compiled before: not stored
    assert not entries(tmp_path / "p")
    assert run("fill") == ["jit", "True"]  # loaded from XLA's cache first: still not stored
    assert run("") == ["stored", "True"]  # compiled anew, though XLA's cache holds it
    assert run("") == ["cache", "True"]  # and the stored copy runs


def test_another_key_or_shape_misses(tmp_path):
    assert compile_step(tmp_path).source == "stored"
    assert compile_step(tmp_path, key="other").source == "stored"
    assert compile_step(tmp_path, batch=8).source == "stored"
    assert len(entries(tmp_path)) == 3
    assert compile_step(tmp_path, batch=8).source == "cache"


def test_the_key_holds_library_versions_and_options():
    args = jax.eval_shape(arguments)
    text = program_cache.entry_key("k", args)
    assert f"jax={jax.__version__}" in text
    assert program_cache.library_fingerprint() in text
    assert text != program_cache.entry_key("k", args, {"xla_cpu_enable_fast_math": False})


def test_a_key_with_an_object_address_is_not_cached(tmp_path):
    program = compile_step(tmp_path, key=f"{object()!r}")
    assert program.source == "jit" and not entries(tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "flip", "stale"])
def test_a_bad_entry_warns_once_and_compiles_again(tmp_path, caplog, damage):
    compile_step(tmp_path)
    (path,) = entries(tmp_path)
    blob = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(blob[:len(blob) // 2])
    elif damage == "flip":
        path.write_bytes(blob[:-10] + bytes(b ^ 0xFF for b in blob[-10:]))
    else:  # checksum right, contents from another version of the library
        import hashlib

        body = pickle.dumps((program_cache.entry_key("step", jax.eval_shape(arguments)),
                             {"no_such_field": 1}))
        path.write_bytes(program_cache.MAGIC + hashlib.sha256(body).digest() + body)
    with caplog.at_level(logging.WARNING, logger="hispec.program_cache"):
        program = compile_step(tmp_path)
    assert program.source == "stored"
    warnings = [r for r in caplog.records if r.name == "hispec.program_cache"]
    assert len(warnings) == 1
    assert ("stale" if damage == "stale" else "corrupted") in warnings[0].getMessage()
    jax.tree.map(np.testing.assert_array_equal, program(*arguments()), jax.jit(step)(*arguments()))
    assert compile_step(tmp_path).source == "cache"  # rewritten whole


def test_an_unwritable_directory_warns_and_starts_normally(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="hispec.program_cache"):
        first = compile_step(blocker / "programs")
        second = compile_step(blocker / "programs")
    assert (first.source, second.source) == ("jit", "jit")
    warnings = [r for r in caplog.records if r.name == "hispec.program_cache"]
    assert len(warnings) == 1 and "cannot write" in warnings[0].getMessage()
    jax.tree.map(np.testing.assert_array_equal, second(*arguments()), jax.jit(step)(*arguments()))


def test_hispec_compilation_cache_0_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.setenv("HISPEC_CACHE", str(tmp_path))
    assert program_cache.default_directory() == tmp_path / "programs"
    monkeypatch.setenv("HISPEC_COMPILATION_CACHE", "0")
    assert program_cache.default_directory() is None
    program = program_cache.compile_cached(jax.jit(step), jax.eval_shape(arguments), key="step")
    assert program.source == "jit" and not list(tmp_path.rglob("*" + program_cache.SUFFIX))


def test_a_program_that_cannot_be_serialized_compiles_the_normal_way(tmp_path, caplog):
    def with_callback(x):
        jax.experimental.io_callback(lambda v: None, None, x, ordered=True)
        return x + 1

    import jax.experimental  # noqa: F401  (io_callback)

    with caplog.at_level(logging.WARNING, logger="hispec.program_cache"):
        program = program_cache.compile_cached(
            jax.jit(with_callback), (jax.ShapeDtypeStruct((2,), jnp.float32),), key="cb",
            directory=tmp_path)
    assert program.source == "jit" and not entries(tmp_path)
    assert any("does not serialize" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(program(jnp.ones(2)), 2 * np.ones(2))


MESH_SCRIPT = """
import json, sys, jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from hispec_jax.decoding import program_cache
mesh = jax.make_mesh((2,), ("data",))
s = NamedSharding(mesh, P("data"))
def f(x, c):
    return x * 2 + c.sum(), c + 1
jitted = jax.jit(f, in_shardings=(s, s), out_shardings=(s, s), donate_argnums=(1,))
structs = (jax.ShapeDtypeStruct((4, 3), jnp.float32),) * 2
rows = []
for _ in range(2):
    program = program_cache.compile_cached(jitted, structs, key="f", mesh=mesh,
                                           directory=sys.argv[1])
    x, c = (jax.device_put(jnp.arange(12.0).reshape(4, 3), s), jax.device_put(jnp.ones((4, 3)), s))
    out = program(x, c)
    rows.append({"source": program.source, "spec": str(out[0].sharding.spec),
                 "donated": c.is_deleted(), "out": np.asarray(out[0]).tolist()})
# An unsharded program in the same 2-device process runs on one device when loaded.
for _ in range(2):
    program = program_cache.compile_cached(jax.jit(lambda x: x + 1), structs[:1], key="g",
                                           directory=sys.argv[1])
    rows.append({"source": program.source, "out": np.asarray(program(jnp.ones((4, 3)))).tolist()})
print("RESULT " + json.dumps(rows))
"""


def test_a_sharded_program_keeps_its_shardings_and_donation(tmp_path):
    """On 2 fake CPU devices (its own process: the device count is fixed at JAX's start);
    an unsharded program there loads onto one device, as it was compiled."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                          + " --xla_force_host_platform_device_count=2").strip())
    proc = subprocess.run([sys.executable, "-c", MESH_SCRIPT, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert line, proc.stderr[-3000:]
    rows = json.loads(line[0][len("RESULT "):])
    assert [r["source"] for r in rows] == ["stored", "cache"] * 2
    expected = (np.arange(12.0).reshape(4, 3) * 2 + 12).tolist()
    for r in rows[:2]:
        assert r["out"] == expected and r["donated"] and "data" in r["spec"]
    assert rows[2]["out"] == rows[3]["out"] == (2 * np.ones((4, 3))).tolist()
    assert "donated buffers were not usable" not in proc.stderr


ENGINE_SCRIPT = """
import json, sys
import jax, jax.numpy as jnp
from hispec_jax import Model, ModelConfig, generate
from hispec_jax.decoding.engine import compile_cache
from hispec_jax.models.params import init_params
compile_cache.PROGRAM_CACHE = sys.argv[1]
cfg = ModelConfig(model_type="llama", vocab_size=48, hidden_size=16, intermediate_size=24,
                  num_layers=4, num_heads=2, num_kv_heads=1, head_dim=8,
                  max_position_embeddings=256)
model = Model(cfg=cfg, params=init_params(cfg, jax.random.PRNGKey(0), init_std=0.5))
rows = []
for method, options in [("ar", {}), ("layerskip", {"draft_exit": 1})]:
    result = generate(model, [[1, 2, 3], [4, 5]], method=method, max_new_tokens=12, **options)
    rows.append({"method": method, "tokens": result.token_ids,
                 "source": result.stats["program_source"],
                 "count": result.stats["compile_count"],
                 "keys": [e.engine.program_key() for e in compile_cache._PROGRAMS.values()
                          if e.engine is not None]})
print("RESULT " + json.dumps(rows))
"""


def run_engine_script(directory, **env):
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", ENGINE_SCRIPT, str(directory)],
                          env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=900)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert line, proc.stderr[-3000:]
    return json.loads(line[0][len("RESULT "):])


def test_engines_read_their_loops_in_a_later_process(tmp_path):
    """Two processes decode the same requests: the first stores each loop's programs, the
    second loads them (no tracing, no compiling) and gives the same tokens; the engines' keys
    are equal across processes and hold no object address."""
    first = run_engine_script(tmp_path)
    second = run_engine_script(tmp_path)
    assert [r["source"] for r in first] == ["stored", "stored"]
    assert [r["source"] for r in second] == ["cache", "cache"]
    assert len(entries(tmp_path)) == 4  # each method's insert of the batch and its rounds
    for a, b in zip(first, second):
        assert a["tokens"] == b["tokens"] and a["count"] == b["count"] == 2
        assert a["keys"] == b["keys"] and " at 0x" not in "".join(a["keys"])
    off = run_engine_script(tmp_path, HISPEC_COMPILATION_CACHE="0")
    assert [r["source"] for r in off] == ["jit", "jit"]  # off, whatever the directory
    assert [r["tokens"] for r in off] == [r["tokens"] for r in first]


def test_an_engine_key_is_its_repr_and_the_trace_settings():
    from hispec_jax import Model, ModelConfig
    from hispec_jax.decoding import methods
    from hispec_jax.decoding.engine import Engine, Shapes
    from hispec_jax.models.params import init_params

    cfg = ModelConfig(model_type="llama", vocab_size=48, hidden_size=16, intermediate_size=24,
                      num_layers=4, num_heads=2, num_kv_heads=1, head_dim=8,
                      max_position_embeddings=256)
    model = Model(cfg=cfg, params=init_params(cfg, jax.random.PRNGKey(0)))
    for method in ("ar", "hispec", "lookup"):
        engine = Engine.for_model(model, methods.make_method(model, method).hierarchy,
                                  Shapes(batch=1, capacity=64, prompt_block=16))
        key = engine.program_key()
        assert key.startswith(repr(engine)) and " at 0x" not in key
        assert "flat_attention_output=False" in key and "sharding_rules=" in key
