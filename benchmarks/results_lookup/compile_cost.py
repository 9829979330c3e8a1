"""What `generate`'s compiled loops cost to compile with the attention spans, against reading
the whole cache (SmolLM2-135M, CPU).

    python benchmarks/results_lookup/compile_cost.py > benchmarks/results_lookup/compile_cost.txt

Every span of `transformer.attention_spans` is a compiled branch of every layer's attention
(`_over_used_slots`). This compiles AR's and lookup's loops for the first summarize prompt
(272 tokens, `--chat`, 64 new tokens: S = 640) with the spans, and with the one span S
(`attention_spans` patched while tracing), the compiled loops and JAX's traces dropped
before each: `stats["compile_seconds"]` of the first call. One process, no persistent
compilation cache.
"""

import jax
from passes import header, load

import hispec_jax
from hispec_jax.bench import tasks
from hispec_jax.decoding import engine
from hispec_jax.models import transformer
from hispec_jax.models.pull import pull

METHODS = {"ar": dict(method="ar"), "lookup": dict(method="lookup", lookup=8)}


def main():
    path = str(pull("smollm2-135m-instruct"))
    model = hispec_jax.load_model(path)
    prompt = tasks.task_prompts(model, "summarize", 1, 512, True)[0]
    spans = transformer.attention_spans
    rows = []
    for variant, spans_of in (("whole cache", lambda S: (S,)), ("used spans", spans)):
        transformer.attention_spans = spans_of
        for name, options in METHODS.items():
            engine.clear_compiled()
            jax.clear_caches()
            stats = hispec_jax.generate(model, [prompt], max_new_tokens=64, **options).stats
            rows.append((variant, name, stats["compile_seconds"]))
    transformer.attention_spans = spans
    print(header())
    print(f"# {path.rsplit('/', 1)[-1]}, batch 1, a {len(prompt)}-token prompt, 64 new tokens\n")
    print("| attention | method | compile s |")
    print("|---|---|---|")
    for variant, name, seconds in rows:
        print(f"| {variant} | {name} | {seconds:.1f} |")
    print(f"\n# load at end {load()}")


if __name__ == "__main__":
    main()
