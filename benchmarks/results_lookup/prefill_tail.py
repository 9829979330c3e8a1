"""The prefill of the task prompts with small last chunks, against whole chunks only
(SmolLM2-135M, CPU).

    python benchmarks/results_lookup/prefill_tail.py > benchmarks/results_lookup/prefill_tail.txt

`prefill.prefill` runs full chunks of T = 128 positions and ends in at most `MAX_SMALL`
small chunks of T / 4 (`chunk_counts`); with `MAX_SMALL = 0` (patched while tracing) every
chunk is full, as before that change. Both variants of the whole prefill, jitted, for the
lengths of the summarize / extract task prompts (217-337 tokens) and two shorter ones, at
the capacity `generate` plans for them with 64 new tokens and lookup's lookahead; cache
spans as the library has them. Interleaved rounds, median per call.
"""

from passes import compiled_prefill, header, interleaved_ms, load

from hispec_jax import load_model
from hispec_jax.decoding import prefill as prefill_lib
from hispec_jax.decoding.generate import plan_shapes
from hispec_jax.models.pull import pull

LENGTHS = (60, 140, 217, 272, 332, 337)
NEW, LOOKAHEAD, ROUNDS, CALLS = 64, 9, 7, 2


def compiled_prefill_planned(cfg, params, length: int):
    """The prefill call at the chunk and capacity `generate` plans for `length`."""
    T, S = plan_shapes(length, NEW, LOOKAHEAD, cfg.max_position_embeddings, None)
    return compiled_prefill(cfg, params, length, T, S), T, S


def main():
    path = str(pull("smollm2-135m-instruct"))
    model = load_model(path)
    cfg, params = model.cfg, model.params
    calls, shapes = {}, {}
    max_small = prefill_lib.MAX_SMALL
    for variant, small in (("whole chunks", 0), ("small last chunks", max_small)):
        prefill_lib.MAX_SMALL = small
        for n in LENGTHS:
            calls[n, variant], *shapes[n] = compiled_prefill_planned(cfg, params, n)
    prefill_lib.MAX_SMALL = max_small
    ms_of, start_load = interleaved_ms(calls, ROUNDS, lambda key: CALLS)
    print(f"{header()} (rounds started at {start_load})")
    print(f"# {path.rsplit('/', 1)[-1]}, batch 1; CPU default layout (unrolled, out-major); "
          f"median of {ROUNDS} interleaved rounds of {CALLS} calls\n")
    print("| prompt tokens | T | S | positions, whole chunks | positions, small last chunks "
          "| whole chunks, ms | small last chunks, ms | whole / small |")
    print("|---|---|---|---|---|---|---|---|")
    for n in LENGTHS:
        T, S = shapes[n]
        t = prefill_lib.small_chunk(T)
        full, small = (int(c) for c in prefill_lib.chunk_counts(n, T))
        whole_ms, small_ms = ms_of[n, "whole chunks"], ms_of[n, "small last chunks"]
        print(f"| {n} | {T} | {S} | {-(-n // T) * T} | {full * T + small * t} | {whole_ms:.0f} "
              f"| {small_ms:.0f} | {whole_ms / small_ms:.2f} |")
    print(f"\n# load at end {load()}")


if __name__ == "__main__":
    main()
