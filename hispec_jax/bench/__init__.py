"""Benchmarks: the suite behind `hispec bench` (run.py) and the tools of `python -m
hispec_jax.bench TOOL` / `hispec bench-tool TOOL` (tools.py lists them)."""
