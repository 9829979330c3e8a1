"""Rounds over 8 rows of a `hispec serve --step-log` file, split by level 1's proposed tokens
against the decoding sequences: one-position rounds (every sequence proposed its one token)
and longer blocks; per class the round time, tokens per sequence and acceptance.

    python benchmarks/results_serving/step_log_blocks.py steps-default.jsonl
"""
import json, sys, numpy as np, collections
rows=[json.loads(l) for l in open(sys.argv[1])]
r8=[r for r in rows if r['rows']==8 and r['decoding']>0 and r['proposed']]
cls=collections.defaultdict(list)
for r in r8:
    extra = r['proposed'][0] - r['decoding']
    cls['block1' if extra <= 0 else 'longer'].append(r)
for k, g in cls.items():
    t=np.array([r['round_seconds'] for r in g]); tok=sum(r['tokens'] for r in g); dec=sum(r['decoding'] for r in g)
    prop=sum(r['proposed'][0] for r in g); acc=sum(r['accepted'][0] for r in g)
    print(f"{k}: {len(g)} rounds, mean {1000*t.mean():.1f} ms p50 {1000*np.median(t):.1f}, tokens/seq {tok/dec:.3f}, proposed/seq {prop/dec:.2f}, accepted/proposed {acc/max(prop,1):.3f}, with chunks {np.mean([bool(r['chunks']) for r in g])*100:.0f} %")
