"""Weight-only int8 (`load_model(quantize="int8")`) on the shipped default model: where its
greedy output departs from the unquantized model's, and whether speculation on the int8
model stays exact against the int8 model's own AR.

    python benchmarks/results_accelerator/int8_departures.py [--dtype bfloat16] [--prompts 16]
        [--max-new-tokens 128] [--out FILE.json]

ShareGPT prompts (up to 256 tokens), one batch, EOS ignored. Prints, per prompt, the first
position where int8 AR departs from AR in the model's dtype (None: never), the mean number
of tokens before it, and per method (LayerSkip, HiSpec at their defaults) the departures
of the int8 model's output from the int8 model's AR (all None: exact).
"""

from __future__ import annotations

import argparse
import json
import time

import jax

from hispec_jax import DEFAULT_MODEL_DIR, datasets, load_model
from hispec_jax.bench import suite
from hispec_jax.decoding.generate import generate


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(DEFAULT_MODEL_DIR))
    p.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: the checkpoint's)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--out", default="int8_departures.json")
    a = p.parse_args()
    t0 = time.perf_counter()
    plain = load_model(a.model, dtype=a.dtype, layer_layout="unrolled")
    int8 = load_model(a.model, dtype=a.dtype, layer_layout="unrolled", quantize="int8")
    prompts = datasets.load_prompts("sharegpt", plain.tokenizer, a.prompts, max_prompt_tokens=256)
    specs = suite.default_specs(None)[1:3]  # LayerSkip, HiSpec

    def greedy(model, spec=None):
        return generate(model, prompts, method=spec.decoder(model) if spec else "ar",
                        max_new_tokens=a.max_new_tokens, batch_size=len(prompts),
                        ignore_eos=True).token_ids

    ar, ar8 = greedy(plain), greedy(int8)
    departs = [suite.first_departure(q, r) for q, r in zip(ar8, ar)]
    exact = {spec.name: [suite.first_departure(q, r) for q, r in zip(greedy(int8, spec), ar8)]
             for spec in specs}
    before = [d if d is not None else a.max_new_tokens for d in departs]
    result = {"device": suite.device_description(), "jax": jax.__version__, "model": a.model,
              "dtype": plain.cfg.dtype, "prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
              "int8_vs_plain_first_departure": departs,
              "departing": sum(d is not None for d in departs),
              "mean_tokens_before_departure": sum(before) / len(before),
              "int8_methods_vs_int8_ar": exact,
              "seconds": time.perf_counter() - t0}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"# {result['device']}; {a.model} in {plain.cfg.dtype}")
    print(f"int8 AR departs from AR on {result['departing']} / {len(prompts)} prompts; tokens "
          f"before the first departure, mean {result['mean_tokens_before_departure']:.1f} of "
          f"{a.max_new_tokens}; first departures {departs}")
    for name, d in exact.items():
        print(f"int8 {name} vs int8 AR: {sum(x is not None for x in d)} / {len(d)} depart")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
