"""What out-major layer projections save on SmolLM2-135M (CPU): the passes of a decoding loop,
canonical (`x @ w`, w [in, out]) against out-major (`w_T @ x^T`, w_T [out, in]) weights.

    python benchmarks/results_lookup/out_major.py > benchmarks/results_lookup/out_major.txt

XLA:CPU serves every dot of more than one row with YNNPACK's GEMM, which packs its right
operand on each call: as `x @ w` that is the whole weight matrix, every layer, every pass.
With the weight stored transposed and used as the left operand (`transformer.project`) it
is read as stored. This times, on SmolLM2-135M-Instruct (the pulled Q4_1 GGUF dequantized
to float32), batch 1, a cache of capacity 640 holding a 330-token context (a task prompt
with its reply under way), both weight orders in one process:

- the AR step: one position through all 30 layers with the in-place cache write, the head
  and the argmax (`run_layers_cached`, as the engine's AR loop);
- the verify pass of a lookup or LayerSkip round over T = 2, 4, 8 positions: all layers over
  the block from a read-only cache (`run_layers(split_context=True)`), the block's keys and
  values written after, the head and the argmax;
- a prefill chunk of 128 positions (`run_layers_cached`, as `decoding/prefill.py`).

Each variant is compiled first, then timed in interleaved rounds (median per call). Load
average at start and end: under load every ratio moves.
"""

from passes import ar_step, compiled_call, header, interleaved_ms, load, verify_pass

from hispec_jax import load_model
from hispec_jax.models.params import with_layer_layout
from hispec_jax.models.pull import pull

CAPACITY, CONTEXT, CHUNK = 640, 330, 128
BLOCK_TS = (2, 4, 8)
ROUNDS, CALLS = 9, 3


def main():
    path = str(pull("smollm2-135m-instruct"))
    model = load_model(path, out_major=True)
    cfg, L = model.cfg, model.cfg.num_layers
    orders = {"canonical": with_layer_layout(model.params, "unrolled", out_major=False),
              "out-major": model.params}

    verify, cached = verify_pass(cfg), ar_step(cfg)
    passes = [("AR step (1 position)", cached, 1, CONTEXT)]
    passes += [(f"verify pass, T = {T}", verify, T, CONTEXT) for T in BLOCK_TS]
    passes += [(f"prefill chunk, T = {CHUNK}", cached, CHUNK, CHUNK)]
    calls = {(name, order): compiled_call(f, cfg, params, T, start, CAPACITY)[0]
             for name, f, T, start in passes for order, params in orders.items()}
    ms, start_load = interleaved_ms(calls, ROUNDS,
                                   lambda key: 1 if "prefill" in key[0] else CALLS)
    print(f"{header()} (rounds started at {start_load})")
    print(f"# {path.rsplit('/', 1)[-1]}: {L} layers, D {cfg.hidden_size}, F "
          f"{cfg.intermediate_size}; batch 1; capacity {CAPACITY}, context {CONTEXT}; median of "
          f"{ROUNDS} interleaved rounds ({CALLS} calls per round, prefill 1)\n")
    ar = {o: ms[passes[0][0], o] for o in orders}
    print("| pass | canonical ms | out-major ms | out-major / canonical | canonical x AR step "
          "| out-major x AR step |")
    print("|---|---|---|---|---|---|")
    for name, *_ in passes:
        a, b = (ms[name, o] for o in orders)
        print(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.2f} | {a / ar['canonical']:.2f} "
              f"| {b / ar['out-major']:.2f} |")
    print(f"\n# load at end {load()}")


if __name__ == "__main__":
    main()
