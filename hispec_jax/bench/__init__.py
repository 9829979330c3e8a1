"""Benchmarks. `hispec bench` runs the suite; `hispec bench-tool TOOL` runs one tool
(`tools.py` lists them; `python -m hispec_jax.bench TOOL` is the same command).

    the suite      run.py (BenchConfig, run_bench), suite.py (methods timed in interleaved
                   rounds, outputs checked against AR), sweeps.py, hf_baselines.py
                   (transformers on the same weights), report.py, plots.py
    tools          ar_vs_transformers.py (ar), side_by_side.py (engine), oracle.py,
                   roofline.py + accelerator.py, seed_methods.py, auto.py,
                   loop_memory.py (memory), duplicates.py
    studies/       one-off measurements whose results are recorded (studies/__init__.py)
    args.py        argument types and the one-line-error parser every tool uses
"""
