"""Latency-optimal hierarchies (HSD, docs/algorithms.md): `tune` = measure -> model -> search
-> plan file.

    calibrate.py   one pass on calibration prompts: acceptance alpha(a, b) for every pair of
                   exits, every exit's choices along the continuations (the trace), and the
                   cost of each stage on this device (the engine's functions), reconciled
                   with two timed loops
    latency.py     the predictor (pure numpy): exact renewal formulas where they hold, else
                   the engine's round replayed on the trace
    search.py      exhaustive search over exits and windows -> ranked plans
    plan.py        `Plan` and the plan file (keyed by model, device and batch size)
    tune.py        calibrate + search + save (+ `--verify`: time the top plans); what
                   `hispec tune` and method="auto" call (`hispec_jax.generate` resolves
                   "auto" here: `api.py`, above the planner)
"""
