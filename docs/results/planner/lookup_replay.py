"""The lookup-under-exits replay (`latency.simulate_lookup`) against the engine on random
models, where exits disagree with the final layer (docs/planner.md §3).

    python docs/results/planner/lookup_replay.py > docs/results/planner/lookup_replay.txt

On the always-agree model and for lookup alone the replay is exact (tests/test_planner_lookup.py).
With disagreeing exits, an exit's choice after a token the full model will reject is read
off the continuation's context, so the counts can differ. Here: random 6-layer models
(the tests' tiny shapes: V 64, D 32, seeds 0-3), 8 random prompts of 8-24 tokens that repeat
a random 4-token phrase (so the n-gram lookup matches), 64 new tokens, batch 1, greedy,
lookup k = 4, under LayerSkip (2, 6; Nd 3) and HiSpec (1, 3, 6; Nd 2, Ni 4): the engine's
rounds and emitted tokens (`generate`) against the replay's. Deterministic (no timing).
"""

import jax
import numpy as np

from hispec_jax import Model, ModelConfig, generate
from hispec_jax.models.params import init_params
from hispec_jax.planner import calibrate, latency

NEW, K = 64, 4
SETTINGS = [((2, 6), (3,), dict(method="layerskip", draft_exit=2, draft_len=3)),
            ((1, 3, 6), (2, 4), dict(method="hispec", draft_exit=1, verify_exits=(3,),
                                     draft_len=2, verify_window=4))]


def random_model(seed):
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
                      num_layers=6, num_heads=4, num_kv_heads=2, head_dim=8,
                      max_position_embeddings=256)
    params = init_params(cfg, jax.random.PRNGKey(seed), init_std=0.3)
    return Model(cfg=cfg, params=params, generation_config={"eos_token_id": 3})


rng = np.random.RandomState(0)
prompts = []
for _ in range(8):
    phrase = rng.randint(4, 64, 4).tolist()
    prompts.append((phrase * 6)[:rng.randint(8, 25)])

print("| model seed | hierarchy | engine rounds | replay rounds | engine emitted | replay emitted "
      "| engine == AR |")
print("|---|---|---|---|---|---|---|")
for seed in range(4):
    model = random_model(seed)
    ar = generate(model, prompts, method="ar", max_new_tokens=NEW, ignore_eos=True, batch_size=1)
    sequences = [p + t for p, t in zip(ar.prompt_token_ids, ar.token_ids)]
    trace = calibrate.measure_lookup_trace(model, sequences, [len(p) for p in prompts])
    for exits, windows, options in SETTINGS:
        got = generate(model, prompts, max_new_tokens=NEW, ignore_eos=True, batch_size=1,
                       lookup=K, **options)
        run = latency.simulate_lookup(trace, K, exits, windows)
        print(f"| {seed} | {options['method']} {exits} | {got.stats['rounds']} | {run.rounds} "
              f"| {got.stats['emitted_in_loop']} | {run.emitted:.0f} "
              f"| {got.token_ids == ar.token_ids} |")
