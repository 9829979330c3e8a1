"""Is the prefill of extract's long prompts faster in other chunk sizes? (SmolLM2-135M, CPU)

    python benchmarks/results_lookup/prefill_chunk_sizes.py > benchmarks/results_lookup/prefill_chunk_sizes.txt

The whole prefill (`prefill.prefill`, all layers, batch 1, capacity 576) of prompts of
172, 304 and 412 tokens (extract's shortest, middle and longest with 8 prompts) in full
chunks of T = 64, 128 (the library's `generate.PREFILL_CHUNK`) and 256 positions, each
ending in small chunks of T / 4 as the library does. Interleaved rounds, median per call.
"""

from passes import compiled_prefill, header, interleaved_ms, load

from hispec_jax import load_model
from hispec_jax.models.pull import pull

LENGTHS, CHUNKS, CAPACITY, ROUNDS = (172, 304, 412), (64, 128, 256), 576, 5


def main():
    model = load_model(str(pull("smollm2-135m-instruct")))
    calls = {(n, T): compiled_prefill(model.cfg, model.params, n, T, CAPACITY)
             for n in LENGTHS for T in CHUNKS}
    ms, start_load = interleaved_ms(calls, ROUNDS, lambda key: 1)
    print(f"{header()} (rounds started at {start_load})")
    print(f"# SmolLM2-135M-Instruct, batch 1, capacity {CAPACITY}; median of {ROUNDS} "
          "interleaved rounds\n")
    print("| prompt tokens | " + " | ".join(f"T = {T}, ms" for T in CHUNKS) + " |")
    print("|---|" + "---|" * len(CHUNKS))
    for n in LENGTHS:
        print(f"| {n} | " + " | ".join(f"{ms[n, T]:.0f}" for T in CHUNKS) + " |")
    print(f"\n# load at end {load()}")


if __name__ == "__main__":
    main()
