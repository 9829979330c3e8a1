"""What a lookup proposal of m tokens costs: the verify pass over T positions against the AR
step (SmolLM2-135M, CPU), the costs `ngram_replay.py` charges.

    python benchmarks/results_lookup/pass_costs.py > benchmarks/results_lookup/pass_costs.txt

The AR step and the verify pass (`passes.py`) over T = 2, 4, 8, 16 positions, batch 1, 330
cached positions at capacity 640, median of 9 interleaved rounds of 10 calls.
"""

from passes import ar_step, compiled_call, header, interleaved_ms, load, verify_pass

from hispec_jax import load_model
from hispec_jax.models.pull import pull

CONTEXT, CAPACITY, ROUNDS = 330, 640, 9


def main():
    model = load_model(str(pull("smollm2-135m-instruct")))
    cfg, params = model.cfg, model.params
    calls = {1: compiled_call(ar_step(cfg), cfg, params, 1, CONTEXT, CAPACITY)[0]}
    for T in (2, 4, 8, 16):
        calls[T] = compiled_call(verify_pass(cfg), cfg, params, T, CONTEXT, CAPACITY)[0]
    ms, start_load = interleaved_ms(calls, ROUNDS, lambda key: 10)
    print(f"{header()} (rounds started at {start_load})")
    print(f"# SmolLM2-135M-Instruct, batch 1, {CONTEXT} cached positions, capacity {CAPACITY}; "
          f"median of {ROUNDS} interleaved rounds\n")
    print("| pass | ms | x AR step |")
    print("|---|---|---|")
    for T, t in ms.items():
        name = "AR step (1 position)" if T == 1 else f"verify pass, T = {T}"
        print(f"| {name} | {t:.1f} | {t / ms[1]:.2f} |")
    print(f"\n# load at end {load()}")


if __name__ == "__main__":
    main()
