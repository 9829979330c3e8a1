"""How long a fresh process takes to get a runnable decoding loop, with and without the
program cache (`decoding/program_cache.py`), XLA's persistent cache warm in both
(docs/startup.md).

    python benchmarks/results_startup/program_cache_engine.py [--method ar] [--reps 2]

The engine is built as `decoding.generate.decode` builds it (shipped model, one prompt,
64 new tokens). Two filling processes first: one compiles `Engine.compiled()` without the
program cache (`compile_cache.PROGRAM_CACHE = None`: XLA's cache gets the traced loop), one
with it in a directory of its own (the program cache gets the exported loop, XLA's cache
its wrapper). Then fresh processes alternate: "jit" = trace + lower + XLA cache hit,
"program cache" = read + wrap + XLA cache hit. Each process checks that its loop's tokens equal the "jit" reference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(mode: str, method: str, program_dir: str, reference: str) -> None:
    import jax
    import numpy as np

    from hispec_jax.decoding import engine as engine_lib
    from hispec_jax.decoding import generate as gen
    from hispec_jax.decoding import methods as methods_lib
    from hispec_jax.decoding.sampling import SamplingParams
    from hispec_jax.models.model import load_model
    import hispec_jax

    model = load_model(hispec_jax.DEFAULT_MODEL_DIR)
    sampling = SamplingParams()
    decoder = methods_lib.make_method(model, method, greedy=True)
    prompt_ids = gen.prompt_token_ids(model, ["The capital of France is"])
    block, capacity = gen.plan_shapes(len(prompt_ids[0]), 64, decoder.lookahead(),
                                      model.cfg.max_position_embeddings, None)
    eos_ids_E = jax.numpy.asarray(list(gen.stop_token_ids(model)) or [-1], jax.numpy.int32)
    shapes = engine_lib.Shapes(batch=1, capacity=capacity, prompt_block=block,
                               num_eos=int(eos_ids_E.shape[0]))
    engine = engine_lib.Engine.for_model(model, decoder.hierarchy, shapes, sampling.greedy)
    t0 = time.perf_counter()
    if mode == "jit":  # the loop traced and lowered in this process
        engine_lib.compile_cache.PROGRAM_CACHE = None
    else:
        engine_lib.compile_cache.PROGRAM_CACHE = program_dir
    executable, _ = engine.compiled()
    source = engine.program_source()
    seconds = time.perf_counter() - t0
    req = gen.make_request(prompt_ids, 1, 0, capacity, 64, eos_ids_E, sampling)
    out, _, _ = executable(model.params, model.heads, req, engine.empty_cache(),
                           decoder.windows_array())
    tokens = np.asarray(out.tokens_BxS).tolist()
    if mode == "jit" and not os.path.exists(reference):
        with open(reference, "w") as f:
            json.dump(tokens, f)
    with open(reference) as f:
        same = json.load(f) == tokens
    print("ENGINE_JSON " + json.dumps({"mode": mode, "source": source, "seconds": seconds,
                                       "same_tokens": same, "key_chars": len(engine.program_key())}),
          flush=True)


def run(mode, method, cache_dir, program_dir, reference) -> dict:
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PLATFORMS="cpu")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", mode, "--method", method,
                           "--program-dir", program_dir, "--reference", reference],
                          capture_output=True, text=True, env=env)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("ENGINE_JSON ")]
    if not lines:
        sys.exit(f"{mode}: no result\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("ENGINE_JSON "):])
    result["process_seconds"] = time.perf_counter() - t0
    result["load_average"] = os.getloadavg()[0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", default=None)
    parser.add_argument("--method", default="ar")
    parser.add_argument("--program-dir", default=None)
    parser.add_argument("--reference", default=None)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.method, args.program_dir, args.reference)
        return
    print(f"method {args.method}; load average at start {os.getloadavg()[0]:.1f} "
          f"({os.cpu_count()} CPUs)", flush=True)
    with tempfile.TemporaryDirectory(prefix="program-cache-") as tmp:
        cache_dir, program_dir = os.path.join(tmp, "xla"), os.path.join(tmp, "programs")
        reference = os.path.join(tmp, "tokens.json")
        plan = [("fill", "jit"), ("fill", "cache")] + [
            ("fresh", mode) for _ in range(args.reps) for mode in ("jit", "cache")]
        for phase, mode in plan:
            r = run(mode, args.method, cache_dir, program_dir, reference)
            print(f"{phase:5} {mode:5}: executable in {r['seconds']:6.2f} s (source "
                  f"{r['source']}), process {r['process_seconds']:5.1f} s, tokens equal "
                  f"{r['same_tokens']}, load {r['load_average']:.1f}", flush=True)


if __name__ == "__main__":
    main()
