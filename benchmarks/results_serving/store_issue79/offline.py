"""Offline A/B: per prompt, gated lookup without a store, then with a shared store
(batch 1, the store growing with every earlier prompt). Prints tokens/s, identical outputs,
per-source acceptance."""
import argparse, json, sys, time
import numpy as np
import hispec_jax
from hispec_jax.bench import tasks
from hispec_jax.decoding import suffix_store

ap = argparse.ArgumentParser()
ap.add_argument("--task", default="code")
ap.add_argument("--n", type=int, default=16)
ap.add_argument("--max-new", type=int, default=128)
ap.add_argument("--store-tokens", type=int, default=suffix_store.DEFAULT_STORE_TOKENS)
ap.add_argument("--variants", default="nostore,store")
args = ap.parse_args()
M = "/root/.cache/hispec/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
model = hispec_jax.load_model(M)
prompts = tasks.task_prompts(model, args.task, args.n, 400, chat=True)
variants = args.variants.split(",")
stores = {v: suffix_store.SuffixStore(args.store_tokens) for v in variants if v != "nostore"}
def run(v, p):
    return hispec_jax.generate(model, [p], max_new_tokens=args.max_new, chat=False,
                               max_cache_len=640, cross_request=stores.get(v, False))
# warm: compile
for v in variants:
    run(v, prompts[0] if v == "nostore" else [1, 2, 3])
for s in stores.values():  # restart empty
    s.__init__(args.store_tokens)
tot = {v: dict(sec=0.0, tok=0, prop=0, acc=0, sprop=0, sacc=0, smatch=0, match=0) for v in variants}
same = 0
for i, p in enumerate(prompts):
    outs = {}
    for v in (variants if i % 2 == 0 else variants[::-1]):
        r = run(v, p)
        lk = r.stats["lookup"]; fe = lk["from_earlier_requests"]
        t = tot[v]
        t["sec"] += r.stats["decode_seconds"]; t["tok"] += r.stats["new_tokens"]
        t["prop"] += lk["proposed"]; t["acc"] += lk["accepted"]; t["match"] += lk["matches"]
        t["sprop"] += fe["proposed"]; t["sacc"] += fe["accepted"]; t["smatch"] += fe["matches"]
        outs[v] = (r.token_ids[0], r.stats["decode_seconds"], r.stats["new_tokens"], fe)
    same += len({tuple(o[0]) for o in outs.values()}) == 1
    print(i, " ".join(f"{v}:{outs[v][2]}tok/{outs[v][1]:.2f}s fe={outs[v][3]['accepted']}/{outs[v][3]['proposed']}" for v in variants), flush=True)
base = tot[variants[0]]
for v, t in tot.items():
    tps = t["tok"] / t["sec"]
    own_p, own_a = t["prop"] - t["sprop"], t["acc"] - t["sacc"]
    print(f"{v}: {t['tok']} tok {t['sec']:.1f}s {tps:.1f} tok/s x{tps / (base['tok'] / base['sec']):.3f}; "
          f"own {own_a}/{own_p} ({own_a / max(own_p, 1):.2f}) matches {t['match'] - t['smatch']}; "
          f"store {t['sacc']}/{t['sprop']} ({t['sacc'] / max(t['sprop'], 1):.2f}) matches {t['smatch']}")
print("same outputs", same, "/", len(prompts))
