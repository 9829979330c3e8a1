"""What the LM head and a verify block cost for T = 1..10 positions on SmolLM2-135M (CPU).

    python benchmarks/results_lookup/head_block_cost.py > benchmarks/results_lookup/head_block_cost.txt

A prompt-lookup round that verifies k drafted tokens runs one pass over a block of T = k + 1
positions (or T = 1 without a match); its wall-clock gain trails its work saving by how much
more that pass costs than an AR step. This times, on SmolLM2-135M-Instruct (the pulled Q4_1
GGUF dequantized to float32; V = 49,152, D = 576, tied embeddings), batch 1:

1. The LM head alone, [T, D] hidden states -> [T, V] float32 logits, in several formulations
   (all exact float32 products; `max |diff|` is against the first):
   - `x @ E^T`: `einsum("BTD,VD->BTV", x, embed)`, the head before this change;
   - `E @ x^T`: `einsum("VD,BTD->VBT", embed, x)` (the [V, D] matrix as the large left operand,
     the [V, T] result transposed to [T, V]; an optimization barrier keeps XLA from folding
     the transpose back into `x @ E^T`);
   - `E @ x^T, 2-D`: the same as a 2-D dot and `.T`, which XLA does fold back (shown for that);
   - T gemvs: one matrix-vector product per position (unrolled);
   - 4 vocabulary chunks: `E` reshaped to [4, V/4, D] as a batched `E @ x^T`;
   - the untied layout ([D, V] `lm_head`, here a materialized `embed.T`): `x @ W` and `W^T @ x^T`.
2. The verify pass of `method="lookup"` as the engine runs it for a block of T positions:
   every layer over the block from a read-only cache (`run_layers(split_context=True)`),
   the block's keys/values written after, then the head and the argmax; with the head
   before (`x @ E^T`) and with the library's current `exit_logits`, and without a head (the
   layers alone). The AR step (`run_layers_cached` over one position + head) for reference.
3. The layers' weight matmuls over T rows as stored (`x @ W`, W [D, F]) against a
   transposed copy (`W^T @ x^T`): whether the layers' block cost has the head's cause.

Each variant is compiled in this process, then timed in interleaved rounds (median per call).
Batch 1, a cache of capacity 1024 holding a 300-token context. Load average is printed at
start and end: under load every ratio moves.
"""

import os
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
from passes import compiled_call

from hispec_jax import load_model
from hispec_jax.bench.suite import device_description
from hispec_jax.models.heads import exit_logits
from hispec_jax.models.transformer import embed, rms_norm, run_layers, run_layers_cached

HEAD_TS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 32)
BLOCK_TS = (1, 2, 3, 4, 5, 6, 7, 8, 9)
CAPACITY, CONTEXT = 1024, 300
HEAD_ROUNDS, BLOCK_ROUNDS, CALLS = 7, 7, 5
HI = jax.lax.Precision.HIGHEST
f32 = jnp.float32


def load_line():
    return tuple(round(x, 2) for x in os.getloadavg())


def x_Et(x, E):
    return jnp.einsum("BTD,VD->BTV", x, E, precision=HI, preferred_element_type=f32)


def E_xt(x, E):
    logits_VxBxT = jnp.einsum("VD,BTD->VBT", E, x, precision=HI, preferred_element_type=f32)
    return jax.lax.optimization_barrier(logits_VxBxT).transpose(1, 2, 0)


def E_xt_2d(x, E):
    B, T, D = x.shape
    return jnp.einsum("VD,ND->VN", E, x.reshape(B * T, D), precision=HI).T.reshape(B, T, -1)


def gemvs(x, E):
    return jnp.stack([jnp.einsum("BD,VD->BV", x[:, t], E, precision=HI)
                      for t in range(x.shape[1])], axis=1)


def vocab_chunks(x, E, n=4):
    V, D = E.shape
    out_NxVxBxT = jnp.einsum("NVD,BTD->NVBT", E.reshape(n, V // n, D), x, precision=HI)
    return jax.lax.optimization_barrier(out_NxVxBxT.reshape(V, *x.shape[:2])).transpose(1, 2, 0)


def x_W(x, W):
    return jnp.einsum("BTD,DV->BTV", x, W, precision=HI, preferred_element_type=f32)


def Wt_xt(x, W):
    logits_VxBxT = jnp.einsum("DV,BTD->VBT", W, x, precision=HI, preferred_element_type=f32)
    return jax.lax.optimization_barrier(logits_VxBxT).transpose(1, 2, 0)


def timed(variants, rounds):
    """{key: (callable, args)} -> {key: median ms per call}, interleaved rounds (+1 warm-up)."""
    times = {k: [] for k in variants}
    for r in range(rounds + 1):
        for k, (fn, args) in variants.items():
            jax.block_until_ready(fn(*args))
            t0 = time.perf_counter()
            for _ in range(CALLS):
                out = fn(*args)
            jax.block_until_ready(out)
            if r:
                times[k].append((time.perf_counter() - t0) / CALLS * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def head_table(E):
    W = jnp.asarray(np.asarray(E).T)  # a materialized [D, V] head, as an untied model has
    forms = {"x @ E^T (before)": (x_Et, E), "E @ x^T": (E_xt, E), "E @ x^T, 2-D": (E_xt_2d, E),
             "T gemvs": (gemvs, E), "4 vocabulary chunks": (vocab_chunks, E),
             "untied x @ W": (x_W, W), "untied W^T @ x^T": (Wt_xt, W)}
    rng = np.random.default_rng(0)
    variants, diffs = {}, {}
    for T in HEAD_TS:
        x = jnp.asarray(rng.standard_normal((1, T, E.shape[1]), np.float32))
        ref = None
        for name, (f, w) in forms.items():
            fn = jax.jit(f).lower(x, w).compile()
            out = np.asarray(fn(x, w))
            ref = out if ref is None else ref
            diffs[name] = max(diffs.get(name, 0.0), float(np.max(np.abs(out - ref))))
            variants[name, T] = (fn, (x, w))
    ms = timed(variants, HEAD_ROUNDS)
    print("\n## 1. LM head alone: ms per call (median), [1, T, 576] -> [1, T, 49152] float32\n")
    print("| formulation | " + " | ".join(f"T={T}" for T in HEAD_TS) + " | max abs diff |")
    print("|---|" + "---|" * (len(HEAD_TS) + 1))
    for name in forms:
        print(f"| {name} | " + " | ".join(f"{ms[name, T]:.1f}" for T in HEAD_TS)
              + f" | {diffs[name]:.1e} |")
    print("\nx T = 1 of the same formulation:\n")
    print("| formulation | " + " | ".join(f"T={T}" for T in HEAD_TS) + " |")
    print("|---|" + "---|" * len(HEAD_TS))
    for name in forms:
        print(f"| {name} | " + " | ".join(f"{ms[name, T] / ms[name, 1]:.2f}" for T in HEAD_TS) + " |")


def block_table(model):
    cfg, L, params = model.cfg, model.cfg.num_layers, model.params
    per_layer = isinstance(params["layers"], (tuple, list))  # unrolled layout: per-layer cache

    def verify_pass(head):
        def fn(params, tokens_BxT, positions_BxT, cache):
            h, kv = run_layers(params, cfg, embed(params, tokens_BxT), positions_BxT, cache, 0, L,
                               split_context=True)
            # as the engine writes after its switch: without the barrier XLA copies every
            # cache buffer before the writes (+45 ms at T = 1 here; the engine has none)
            positions, kv = jax.lax.optimization_barrier((positions_BxT, kv))
            cache = cache.write_block(0, positions, kv)
            if head is None:
                return h[..., 0], cache
            return jnp.argmax(head(params, h), -1).astype(jnp.int32), cache
        return fn

    def ar_step(params, tokens_BxT, positions_BxT, cache):
        h, cache = run_layers_cached(params, cfg, embed(params, tokens_BxT), positions_BxT,
                                     cache, 0, L)
        return jnp.argmax(exit_logits(params, {}, cfg, h, L), -1).astype(jnp.int32), cache

    before = lambda p, h: x_Et(rms_norm(h, p["final_norm"], cfg.rms_norm_eps), p["embed"])
    library = lambda p, h: exit_logits(p, {}, cfg, h, L)
    passes = {"layers + head x @ E^T (before)": verify_pass(before),
              "layers + head exit_logits (this checkout)": verify_pass(library),
              "layers only (no head)": verify_pass(None)}
    def stepper(f, T):
        """A call of pass `f` over T positions (`passes.compiled_call`: the cache is donated
        and carried, each call waits for its result), and its (no) arguments."""
        return compiled_call(f, cfg, params, T, CONTEXT, CAPACITY, per_layer=per_layer)[0], ()

    variants = {(name, T): stepper(f, T) for T in BLOCK_TS for name, f in passes.items()}
    variants["AR step", 1] = stepper(ar_step, 1)
    ms = timed(variants, BLOCK_ROUNDS)
    ar = ms["AR step", 1]
    print(f"\n## 2. Verify pass over T positions (all {L} layers, KV write, head, argmax): "
          f"ms per pass (median)\n")
    print(f"AR step (one position, run_layers_cached + head): {ar:.1f} ms\n")
    print("| pass | " + " | ".join(f"T={T}" for T in BLOCK_TS) + " |")
    print("|---|" + "---|" * len(BLOCK_TS))
    for name in passes:
        print(f"| {name} | " + " | ".join(f"{ms[name, T]:.1f}" for T in BLOCK_TS) + " |")
    for name in list(passes)[:2]:
        print(f"| {name}, x AR step | " + " | ".join(f"{ms[name, T] / ar:.2f}" for T in BLOCK_TS) + " |")


def layer_matmul_table(params, cfg):
    """Part 3: the layers' weight matmuls over T rows, `x @ W` (W [D, F] as stored) against
    `W^T @ x^T` with W^T stored transposed ([F, D], the layout the head's `E @ x^T` gets
    for free), chained through all 30 layers' MLP gate weights (30 x 3.5 MB)."""
    Ws = [lp["w_gate"] for lp in params["layers"]]
    WTs = [jnp.asarray(np.asarray(w).T) for w in Ws]
    D = cfg.hidden_size

    def x_W_chain(x, ws):
        for w in ws:
            x = x + jnp.einsum("BTD,DF->BTF", x, w, precision=HI)[..., :D]
        return x

    def Wt_xt_chain(x, wts):
        for wt in wts:
            y_FxBxT = jnp.einsum("FD,BTD->FBT", wt, x, precision=HI)
            x = x + jax.lax.optimization_barrier(y_FxBxT).transpose(1, 2, 0)[..., :D]
        return x

    Ts = (1, 2, 4, 8)
    rng = np.random.default_rng(0)
    variants = {}
    for T in Ts:
        x = jnp.asarray(rng.standard_normal((1, T, D), np.float32))
        variants["x @ W (as stored)", T] = (jax.jit(x_W_chain).lower(x, Ws).compile(), (x, Ws))
        variants["W^T @ x^T (W^T stored)", T] = (jax.jit(Wt_xt_chain).lower(x, WTs).compile(),
                                                 (x, WTs))
    ms = timed(variants, HEAD_ROUNDS)
    print(f"\n## 3. Layer weight matmuls: {len(Ws)} chained [1, T, {D}] x [{D}, "
          f"{Ws[0].shape[1]}] products (all layers' w_gate), ms per call (median)\n")
    print("| formulation | " + " | ".join(f"T={T}" for T in Ts) + " |")
    print("|---|" + "---|" * len(Ts))
    for name in ("x @ W (as stored)", "W^T @ x^T (W^T stored)"):
        print(f"| {name} | " + " | ".join(f"{ms[name, T]:.1f}" for T in Ts) + " |")


def main():
    path = subprocess.run(["hispec", "pull", "smollm2-135m-instruct"], capture_output=True,
                          text=True, check=True).stdout.strip()
    model = load_model(path)
    cfg = model.cfg
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    print(f"# {device_description()}; commit {commit}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load {load_line()}")
    print(f"# {os.path.basename(path)}: {cfg.num_layers} layers, D {cfg.hidden_size}, "
          f"V {cfg.vocab_size}, tied {cfg.tie_word_embeddings}; batch 1; capacity {CAPACITY}, "
          f"context {CONTEXT}; median of {HEAD_ROUNDS} / {BLOCK_ROUNDS} interleaved rounds "
          f"of {CALLS} calls")
    head_table(model.params["embed"])
    block_table(model)
    layer_matmul_table(model.params, cfg)
    print(f"\n# load at end {load_line()}")


if __name__ == "__main__":
    main()
