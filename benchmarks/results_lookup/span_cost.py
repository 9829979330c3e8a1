"""Attention over the used cache slots only, against the whole capacity (SmolLM2-135M, CPU).

    python benchmarks/results_lookup/span_cost.py > benchmarks/results_lookup/span_cost.txt

`transformer._over_used_slots` reads the shortest cache prefix of `attention_spans(S)` that
holds every visible slot. This times the AR step, the verify pass over 8 positions (as
`out_major.py`) and a prefill chunk of 128 positions with 330 cached positions at S = 640
(what `generate` plans for a 272-337-token prompt and 64 new tokens) and S = 2048 (a server's
`max_cache_len`), each compiled twice in one process: with the spans, and with the one span
S (`attention_spans` patched while tracing: every pass reads the whole cache, as before).
Interleaved rounds, median per call; and the seconds each pass took to compile (every
span is a compiled branch).
"""

import time

from passes import ar_step, compiled_call, header, interleaved_ms, load, verify_pass

from hispec_jax import load_model
from hispec_jax.models import transformer
from hispec_jax.models.pull import pull

CONTEXT, CAPACITIES = 330, (640, 2048)
ROUNDS = 9


def main():
    path = str(pull("smollm2-135m-instruct"))
    model = load_model(path)
    cfg, params = model.cfg, model.params
    # (pass, its function's maker, T, calls per round); each variant traces new functions
    # (jit reuses the trace of a function it has seen, which would hide the patch)
    passes = (("AR step", ar_step, 1, 10), ("verify pass, T = 8", verify_pass, 8, 10),
              ("prefill chunk, T = 128", ar_step, 128, 2))
    spans = transformer.attention_spans
    calls, compile_s = {}, {}
    for variant, spans_of in (("whole cache", lambda S: (S,)), ("used spans", spans)):
        transformer.attention_spans = spans_of
        for name, make, T, _ in passes:
            for S in CAPACITIES:
                t0 = time.perf_counter()
                calls[name, S, variant] = compiled_call(make(cfg), cfg, params, T, CONTEXT, S)[0]
                compile_s[name, S, variant] = time.perf_counter() - t0
    transformer.attention_spans = spans
    repeats = {name: n for name, _, _, n in passes}
    ms_of, start_load = interleaved_ms(calls, ROUNDS, lambda key: repeats[key[0]])
    print(f"{header()} (rounds started at {start_load})")
    print(f"# {path.rsplit('/', 1)[-1]}, batch 1, {CONTEXT} cached positions; CPU default layout "
          f"(unrolled, out-major); median of {ROUNDS} interleaved rounds\n")
    print("| pass | S | whole cache, ms | used spans, ms | whole / used | compile s, whole | "
          "compile s, used |")
    print("|---|---|---|---|---|---|---|")
    for name, *_ in passes:
        for S in CAPACITIES:
            whole, used = ms_of[name, S, "whole cache"], ms_of[name, S, "used spans"]
            print(f"| {name} | {S} | {whole:.1f} | {used:.1f} | {whole / used:.2f} | "
                  f"{compile_s[name, S, 'whole cache']:.1f} | {compile_s[name, S, 'used spans']:.1f} |")
    print(f"\n# load at end {load()}")


if __name__ == "__main__":
    main()
