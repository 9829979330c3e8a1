"""Latency-optimal hierarchies (HSD, SPEC.md section 5): `tune` = measure -> model -> search
-> plan file.

    calibrate.py   one pass on calibration prompts: acceptance alpha(a, b) for every pair of
                   exits, and the cost of each stage on this device (the engine's functions)
    latency.py     the expected-latency model of the engine's hierarchies (pure numpy) over
                   measured `decoding.costs.Costs`: exact renewal formulas for batch 1, an
                   engine-faithful i.i.d. simulator
    search.py      exhaustive search over exits and windows -> ranked plans
    plan.py        `Plan` and the plan file (keyed by model, device and batch size)
    tune.py        calibrate + search + save; what `hispec tune` and method="auto" call
                   (`hispec_jax.generate` resolves "auto" here: `api.py`, above the planner)
"""
