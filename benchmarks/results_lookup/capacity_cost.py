"""What the cache's unused slots cost a decoding pass on SmolLM2-135M (CPU).

    python benchmarks/results_lookup/capacity_cost.py > benchmarks/results_lookup/capacity_cost.txt

Every attention of the library reads the whole cache capacity S and masks the slots past the
sequence; `generate` plans S from the prompt's power-of-two bucket (a 272-337-token task
prompt gets S = 576-640 with 64 new tokens). This times the AR step and the verify pass over
8 positions (as `out_major.py`) with the same 330 cached positions at S = 384, 512, 640, 1024
and 2048, interleaved in one process (median per call): the cost of attending over slots
nobody can see, i.e. what attention over the used part of the cache only would save.
"""

from passes import ar_step, compiled_call, header, interleaved_ms, load, verify_pass

from hispec_jax import load_model
from hispec_jax.models.pull import pull

CONTEXT, CAPACITIES = 330, (384, 512, 640, 1024, 2048)
ROUNDS, CALLS = 9, 3


def main():
    path = str(pull("smollm2-135m-instruct"))
    model = load_model(path)
    cfg, params = model.cfg, model.params
    passes = (("AR step", ar_step(cfg), 1), ("verify pass, T = 8", verify_pass(cfg), 8))
    calls = {(name, S): compiled_call(f, cfg, params, T, CONTEXT, S)[0]
             for name, f, T in passes for S in CAPACITIES}
    ms_of, start_load = interleaved_ms(calls, ROUNDS, lambda key: CALLS)
    print(f"{header()} (rounds started at {start_load})")
    print(f"# {path.rsplit('/', 1)[-1]}, batch 1, {CONTEXT} cached positions; CPU default layout "
          f"(unrolled, out-major); median of {ROUNDS} interleaved rounds of {CALLS} calls\n")
    print("| pass | " + " | ".join(f"S = {S}" for S in CAPACITIES) + " |")
    print("|---|" + "---|" * len(CAPACITIES))
    for name, *_ in passes:
        ms = [ms_of[name, S] for S in CAPACITIES]
        print(f"| {name}, ms | " + " | ".join(f"{m:.1f}" for m in ms) + " |")
        print(f"| {name}, x S = {CAPACITIES[0]} | "
              + " | ".join(f"{m / ms[0]:.2f}" for m in ms) + " |")
    print(f"\n# load at end {load()}")


if __name__ == "__main__":
    main()
