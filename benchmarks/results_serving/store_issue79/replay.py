"""Replay of greedy answers: at every round of a batch-1 walk, the own lookup's and the
store's proposals (the compiled search functions) and how many of their tokens the answer
keeps; policies choose between them; tokens per unit of pass cost (C(1,T) of the CPU's
default fit F=15.75, J=4.25, no gate). The store grows with each earlier request, in order."""
import json, sys, collections
import numpy as np, jax, jax.numpy as jnp
from hispec_jax.decoding.lookup import PromptLookup
from hispec_jax.decoding import suffix_store
lk = PromptLookup(16, 8)
F, J = 15.75, 4.25
cost = lambda m: (F + m + J * (m > 1)) / (F + 1)
data = json.load(open(sys.argv[1]))  # [{"prompt": [...], "output": [...]}]
R = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
store = suffix_store.SuffixStore(R)
import dataclasses
astuple = lambda p: (p.tokens_BxK, p.length_B, p.matched_B, p.ngram_B)
from hispec_jax.decoding.lookup import Proposal
own_f0 = jax.jit(lambda t, n, l: astuple(lk.propose(t, n, l)))
own_f = lambda *a: Proposal(*own_f0(*a))
st_f0 = jax.jit(lambda s, t, n, l: astuple(suffix_store.propose(lk, s, t, n, l)))
st_f = lambda *a: Proposal(*st_f0(*a))
rows = []  # per position: own (n, m, kept), store (n, m, kept)
for rec in data:
    p, o = rec["prompt"], rec["output"]
    seq = p + o
    S = len(seq) + 17
    pos = np.arange(len(p) - 1, len(seq) - 1)  # newest c: last prompt token .. before last out
    B = len(pos)
    toks = np.zeros((B, S), np.int32); toks[:, :len(seq)] = seq
    # only context <= c is visible: mask later positions with a value equal to no token
    for b, c in enumerate(pos):
        toks[b, c + 1:] = -7
    tj, cj, lim = jnp.asarray(toks), jnp.asarray(pos, jnp.int32), jnp.full((B,), 16, jnp.int32)
    own = Proposal(*map(np.asarray, astuple(own_f(tj, cj, lim))))
    tR, sR = store.host_arrays()
    arr = suffix_store.StoreArrays(tokens_R=jnp.asarray(tR), scope_R=jnp.asarray(sR),
                                   scope_B=jnp.zeros((B,), jnp.int32))
    st = Proposal(*map(np.asarray, astuple(st_f(arr, tj, cj, lim))))
    def kept(prop, b, c):
        if not bool(prop.matched_B[b]): return 0, 0, 0
        m = int(prop.length_B[b]); t = np.asarray(prop.tokens_BxK[b, :m]); truth = seq[c + 1:c + 1 + m]
        k = 0
        for x, y in zip(t, truth):
            if x != y: break
            k += 1
        return int(prop.ngram_B[b]), m, k
    recrows = []
    for b, c in enumerate(pos):
        recrows.append((kept(own, b, c), kept(st, b, c)))
    rows.append(recrows)
    store.add(0, p, o)

def walk(policy):
    tok = cst = 0.0; used = collections.Counter()
    for recrows in rows:
        i = 0
        while i < len(recrows):
            (on, om, ok), (sn, sm, sk) = recrows[i]
            src = policy(on, om, sn, sm)
            if src == "store": m, k = sm, sk
            elif src == "own" and om: m, k = om, ok
            else: m, k, src = 1, 0, "none"
            used[src] += 1
            if src == "store": used["store_prop"] += m; used["store_kept"] += k
            if src == "own": used["own_prop"] += m; used["own_kept"] += k
            adv = min(k + 1, len(recrows) - i)
            tok += adv; cst += cost(max(m, 1)); i += adv
    return tok / cst, used
pols = {
    "own only": lambda on, om, sn, sm: "own",
    "prefer_longer (now)": lambda on, om, sn, sm: "store" if sm and sn > on else "own",
    "store if own none": lambda on, om, sn, sm: "store" if sm and on == 0 else "own",
    "store if own none, n>=3": lambda on, om, sn, sm: "store" if sm and on == 0 and sn >= 3 else "own",
    "store if own none, n>=4": lambda on, om, sn, sm: "store" if sm and on == 0 and sn >= 4 else "own",
    "longer by 2": lambda on, om, sn, sm: "store" if sm and sn >= on + 2 else "own",
    "store n>=5 & longer": lambda on, om, sn, sm: "store" if sm and sn > on and sn >= 5 else "own",
    "oracle": None,
}
base = None
for name, pol in pols.items():
    if pol is None: continue
    r, used = walk(pol)
    base = base or r
    sp, sk = used["store_prop"], used["store_kept"]
    print(f"{name:28s} tokens/cost {r:.3f} x{r / base:.3f}  store rounds {used['store']} kept {sk}/{sp}"
          f" own rounds {used['own']} kept {used['own_kept']}/{used['own_prop']} none {used['none']}")
# acceptance by store n, own n when store is available
tab = collections.defaultdict(lambda: [0, 0, 0])
for recrows in rows:
    for (on, om, ok), (sn, sm, sk) in recrows:
        if sm:
            key = (min(on, 5), sn)
            tab[key][0] += 1; tab[key][1] += sk; tab[key][2] += sm
print("positions with a store match: (own n (5=5+), store n): count, store kept/proposed")
for key in sorted(tab):
    c, k, m = tab[key]
    print(key, c, f"{k}/{m}", f"{k / m:.2f}")
