"""XLA options the library compiles with, by platform, importable without JAX (the CLI sets
`XLA_FLAGS` from them before JAX starts: `cli.common.use_cpu_codegen`).

On CPU, XLA's YNNPACK fusions (dots and their neighbours handed to the YNNPACK library, on
by default in jaxlib 0.10) are off: XLA:CPU loads an executable with N of them in time
quadratic in N (each looks its HLO instruction up by id: 15-22 s for a cached SmolLM2
lookup loop, 2.5 s without), and with the out-major projections the library used then, the
decoding loops ran 1.5-2.4x faster without them. With today's canonical projection order
that speed finding is reversed for the shipped model (AR 1.8x, HiSpec 1.4x faster with
them; prompt lookup equal): whether to turn them back on, trading start time for speed, is
open (BENCHMARKS.md, docs/startup.md).
"""

PLATFORM_OPTIONS: dict[str, dict[str, str]] = {
    "cpu": {"xla_cpu_experimental_ynn_fusion_type": ""},
}


def as_flags(options: dict[str, str]) -> str:
    """`options` as `XLA_FLAGS` text: `--name=value ...`."""
    return " ".join(f"--{name}={value}" for name, value in options.items())
