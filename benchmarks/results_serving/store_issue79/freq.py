"""Replay: at every output position where the store matches (longest n >= 2, as
suffix_store.propose), the tokens the answer keeps of (a) the most recent occurrence's
continuation and (b) SuffixDecoding's most frequent continuation (a greedy walk: the most
frequent next token among the occurrences still in, ties to the most recent), both capped as
the lookup caps them (ngram_tokens(n), the entry's end)."""
import json, sys, collections
import numpy as np
from hispec_jax.decoding.lookup import PromptLookup
from hispec_jax.decoding.suffix_store import SENTINEL, MIN_STORE_NGRAM, SuffixStore
lk = PromptLookup(16, 8); N = 8
data = json.load(open(sys.argv[1]))
store = SuffixStore(16384)
tot = collections.Counter()
for rec in data:
    p, o = rec["prompt"], rec["output"]; seq = p + o
    st, _ = store.host_arrays(); st = st.tolist(); R = len(st)
    # index: n-gram tuple -> list of end positions (followed by a non-sentinel)
    idx = collections.defaultdict(list)
    for j in range(R - 1):
        if st[j + 1] == SENTINEL: continue
        for n in range(MIN_STORE_NGRAM, N + 1):
            if j - n + 1 < 0: break
            g = tuple(st[j - n + 1:j + 1])
            if SENTINEL in g: break
            idx[g].append(j)
    for c in range(len(p) - 1, len(seq) - 1):
        best = None
        for n in range(min(N, c + 1), MIN_STORE_NGRAM - 1, -1):
            g = tuple(seq[c - n + 1:c + 1])
            if g in idx: best = (n, idx[g]); break
        if best is None: continue
        n, ends = best; cap = int(lk.ngram_tokens(n)); truth = seq[c + 1:c + 1 + cap]
        def run(tokens):
            k = 0
            for x, y in zip(tokens, truth):
                if x != y: break
                k += 1
            return k
        j = max(ends); recent = []
        for t in st[j + 1:j + 1 + cap]:
            if t == SENTINEL: break
            recent.append(t)
        alive = list(ends); freq = []
        for step in range(1, cap + 1):
            nxt = collections.Counter(); last = {}
            for e in alive:
                if e + step < R and st[e + step] != SENTINEL:
                    nxt[st[e + step]] += 1; last[st[e + step]] = max(last.get(st[e + step], -1), e)
            if not nxt: break
            tok = max(nxt, key=lambda t: (nxt[t], last[t]))
            freq.append(tok); alive = [e for e in alive if e + step < R and st[e + step] == tok]
        key = "n>=5" if n >= 5 else f"n={n}"
        for name, toks in (("recent", recent), ("frequent", freq)):
            tot[(key, name, "kept")] += run(toks); tot[(key, name, "prop")] += len(toks)
            tot[("all", name, "kept")] += run(toks); tot[("all", name, "prop")] += len(toks)
        tot[(key, "count")] += 1; tot[("all", "count")] += 1
        tot[(key, "multi")] += len(ends) > 1
    store.add(0, p, o)
for key in ("n=2", "n=3", "n=4", "n>=5", "all"):
    print(key, "positions", tot[(key, "count")], "with >1 occurrence", tot[(key, "multi")],
          "recent kept/prop", f"{tot[(key, 'recent', 'kept')]}/{tot[(key, 'recent', 'prop')]}",
          "frequent kept/prop", f"{tot[(key, 'frequent', 'kept')]}/{tot[(key, 'frequent', 'prop')]}")
