"""XLA options the library compiles with, by platform, importable without JAX (the CLI sets
`XLA_FLAGS` from them before JAX starts: `cli.common.use_cpu_codegen`).

On CPU, XLA's YNNPACK fusions (dots and their neighbours handed to the YNNPACK library, on
by default in jaxlib 0.10) are off: on the 2-core CPU of BENCHMARKS.md the decoding loops
run 1.5-2.4x faster without them (shipped model: ar 57-70 -> 90-97 tok/s, hispec 82-88 ->
155-202; SmolLM2 lookup 15-17 -> 18), and XLA:CPU loads an executable with N of them in
time quadratic in N (each looks its HLO instruction up by id): 15-22 s for a cached
SmolLM2 lookup loop, 5-6 s without (docs/startup.md).
"""

PLATFORM_OPTIONS: dict[str, dict[str, str]] = {
    "cpu": {"xla_cpu_experimental_ynn_fusion_type": ""},
}


def as_flags(options: dict[str, str]) -> str:
    """`options` as `XLA_FLAGS` text: `--name=value ...`."""
    return " ".join(f"--{name}={value}" for name, value in options.items())
