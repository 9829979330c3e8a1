"""One process, interleaved: SmolLM2's 8-row round (8 slots busy, `SlotEngine.generate(1)`)
of AR, of lookup k=2 and of lookup k=16 with the gate (what serve runs). Lookup's rounds are
split by their layer evaluations: at the minimum (240 = 30 layers x 8 rows: every sequence
a one-position pass) or above (a longer block); the one-position rounds are compared with
AR's at the same attention span (the batch's furthest position // 128: a round reads the
cache up to the span that holds it, so a method whose sequences are further along pays
for longer spans).

    python benchmarks/results_lookup/block1_round_cost.py "$(hispec pull smollm2-135m-instruct)"
"""
import sys, time
import numpy as np
import hispec_jax
from hispec_jax.serving import server as server_lib, slots as slots_lib

M = sys.argv[1]
model = hispec_jax.load_model(M)
variants = {"ar": ("ar", {}), "lookup k=2": ("lookup", {"lookup": 2}), "lookup k=16": ("lookup", {})}
rng = np.random.RandomState(0)
prompts = [tuple(rng.randint(100, 5000, 100).tolist()) for _ in range(8)]
engines = {}
for name, (method, opts) in variants.items():
    eng = server_lib.build_engines(model, method, slots=8, max_cache_len=640, **opts)[True]
    for s in range(8):
        eng.admit(s, slots_lib.SlotRequest(prompts[s], 400, hispec_jax.SamplingParams()))
    eng.prefill(); eng.generate(1)
    engines[name] = eng
times = {n: [] for n in variants}; toks = {n: [] for n in variants}; evals = {n: [] for n in variants}
last = {n: int(e.counters().layer_token_evals) for n, e in engines.items()}
made = {n: [0] * 8 for n in variants}; span = {n: [] for n in variants}
for i in range(200):
    for n, eng in engines.items():
        span[n].append((100 + max(made[n])) // 128)
        t0 = time.perf_counter(); u = eng.generate(1)
        for x in u: made[n][x.slot] += len(x.new_token_ids)
        times[n].append(time.perf_counter() - t0); toks[n].append(sum(len(x.new_token_ids) for x in u))
        now = int(eng.counters().layer_token_evals); evals[n].append(now - last[n]); last[n] = now
for n in variants:
    t = np.array(times[n][10:]); k = np.array(toks[n][10:])
    e = np.array(evals[n][10:]); one = e == e.min()
    print(f"  {n}: evals per round min {e.min()}, rounds at the min {one.mean()*100:.0f} % p50 {1000*np.median(t[one]):.1f} ms, others p50 {1000*np.median(t[~one]) if (~one).any() else 0:.1f} ms")
    sp = np.array(span[n][10:])
    print("   by span (index: p50 ms, rounds at the min):", {int(b): (round(1000*float(np.median(t[one & (sp == b)])), 1), int((one & (sp == b)).sum())) for b in np.unique(sp) if (one & (sp == b)).any()})
    print(f"{n}: round p50 {1000*np.median(t):.1f} ms (p10 {1000*np.percentile(t,10):.1f}), tokens/round {k.mean():.2f}, tokens/s {k.sum()/t.sum():.1f}", flush=True)
