"""XLA options the library compiles with, by platform, importable without JAX (the CLI sets
`XLA_FLAGS` from them before JAX starts: `cli.common.use_cpu_codegen`).

On CPU, XLA's YNNPACK fusions (dots, elementwise ops and reductions handed to the YNNPACK
library, on by default in jaxlib 0.10) are off (`PLATFORM_OPTIONS`): XLA:CPU loads an
executable with N of them in time quadratic in N (each looks its HLO instruction up by id:
15-22 s for a cached SmolLM2 lookup loop with 2,466 of them, 2.5 s without), and the
decoding loops run no faster with them, but in one case.

That case is a loop whose attention reads the whole cache, with no span branch
(`transformer.attention_spans` gives one span: capacities below 256, e.g. 128 and 192, a
short chat). There a decoding step's attention of one query (products and reductions,
`transformer._attend_single_query`) reads the layer it just updated inline, and XLA:CPU's
own reduction loops make the step much slower; YNNPACK's reductions do not
(docs/startup.md). The rounds program of such
a loop adds `ONE_SPAN_OPTIONS`: the reductions only (a few hundred fusions, a fast load);
not prompt lookup's, whose block passes gain nothing from them
(`compile_cache.rounds_options`). With span branches the reductions run as fast without
YNNPACK, and slower with it at large capacities (docs/startup.md).
"""

YNN_FUSION_TYPES = "xla_cpu_experimental_ynn_fusion_type"

PLATFORM_OPTIONS: dict[str, dict[str, str]] = {
    "cpu": {YNN_FUSION_TYPES: ""},
}

ONE_SPAN_OPTIONS: dict[str, dict[str, str]] = {
    "cpu": {YNN_FUSION_TYPES: "LIBRARY_FUSION_TYPE_REDUCE"},
}


def as_flags(options: dict[str, str]) -> str:
    """`options` as `XLA_FLAGS` text: `--name=value ...`."""
    return " ".join(f"--{name}={value}" for name, value in options.items())
