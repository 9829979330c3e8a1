"""What a prompt entering a slot costs the streams decoding beside it, per engine step.

A slot engine of 8 slots (capacity 640) on the model: 7 slots decode long answers while a
prompt of 3 chunks enters slot 7 over and over; one process, the kinds of step
interleaved, so they see the same contexts and the same machine:

    round        a round of the decoding slots alone (`generate(1)`)
    separate     a small chunk (t positions) as its own pass, then the round
                 (`prefill(1, small=True)`, `generate(1)`: how the scheduler runs chunks
                 where rounds cannot carry one)
    ride         the round with the small chunk riding its pass (`generate(1, ride=True)`)
    separate C   a full chunk (C positions) as its own pass, then the round
    ride C       the round with a full chunk riding it (`generate(1, ride=True,
                 small=False)`: where the scheduler's budget lets one ride)

Usage: python benchmarks/results_serving/ride_cost.py --model SMOLLM2.gguf [--method ar]
           [--prefill-chunk 64] [--repeats 12]
(--method default: the model's default plan, as `hispec serve` runs it.)
"""

import argparse
import pathlib
import platform
import time

import jax
import numpy as np

import hispec_jax
from hispec_jax.decoding import methods as methods_lib
from hispec_jax.serving import server
from hispec_jax.decoding import slots as slots_lib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--method", default="ar")
    ap.add_argument("--prefill-chunk", type=int, default=slots_lib.PREFILL_CHUNK)
    ap.add_argument("--repeats", type=int, default=12)
    args = ap.parse_args()
    model = hispec_jax.load_model(args.model)
    method, options, _ = server.choose_plan(
        model, None if args.method == "default" else args.method, {})
    decoder = methods_lib.make_method(model, method, greedy=True, **options)
    eng = slots_lib.SlotEngine(model, decoder, slots=8, capacity=640, greedy=True, eos_ids=(),
                               prefill_chunk=args.prefill_chunk, ride_prefill=True)
    t = eng._small_chunk
    print(f"# {platform.machine()}, {jax.devices()[0].device_kind}; plan "
          f"{server.describe(eng, method)}; chunks riding the rounds: {eng.rides}; small "
          f"chunk t = {t}, full chunk C = {eng.prefill_chunk}", flush=True)
    eng.prepare(rows=(8,))
    readme = pathlib.Path(__file__).resolve().parents[2] / "README.md"  # decoding slots' text
    ids = model.tokenizer(readme.read_text())["input_ids"]
    rng = np.random.RandomState(0)
    for slot in range(7):
        start = rng.randint(0, len(ids) - 100)
        eng.insert(slot, slots_lib.SlotRequest(tuple(ids[start:start + 60]), 520))
    C = eng.prefill_chunk
    prompts = {True: tuple(ids[1000:1000 + 3 * t]), False: tuple(ids[1000:1000 + 3 * C])}

    def run(kind):
        if kind == "round":
            t0 = time.perf_counter()
            eng.generate(1)
            jax.block_until_ready(eng.state.cache.k)
            return [time.perf_counter() - t0]
        small = not kind.endswith(" C")
        eng.admit(7, slots_lib.SlotRequest(prompts[small], 8))
        seconds = []
        while eng.prefilling:
            t0 = time.perf_counter()
            if kind.startswith("separate"):
                eng.prefill(1, small=small)
                eng.generate(1)
            else:
                eng.generate(1, ride=True, small=small)
            jax.block_until_ready(eng.state.cache.k)
            seconds.append(time.perf_counter() - t0)
        eng.cancel(7)
        return seconds

    kinds = {"round": [], "separate": [], "ride": [], "separate C": [], "ride C": []}
    for _ in range(2):  # compile, then once more unmeasured
        for kind in kinds:
            run(kind)
    for _ in range(args.repeats):
        for kind in kinds:
            kinds[kind] += run(kind)
    alone = np.median(kinds["round"])
    for kind, seconds in kinds.items():
        print(f"{kind:10s} {len(seconds):3d} steps, median {1e3 * np.median(seconds):6.1f} ms "
              f"({np.median(seconds) / alone:.2f}x a round alone)")


if __name__ == "__main__":
    main()
