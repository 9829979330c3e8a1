"""Benchmarks. `hispec bench` runs the suite; `hispec bench-tool TOOL` runs one tool
(`tools.py` lists them; `python -m hispec_jax.bench TOOL` is the same command).

    the suite      run.py (BenchConfig, run_bench), suite.py (methods timed in interleaved
                   rounds, outputs checked against AR), sweeps.py, hf_baselines.py
                   (transformers on the same weights), report.py, plots.py
    tools          compare.py (methods side by side), oracle.py (the always-agree model),
                   accelerator.py + roofline.py, serve_load.py (serve), tasks.py (the task
                   mix, also `hispec bench --tasks`), work.py (work per token)
    args.py        argument types and the one-line-error parser every tool uses
"""
