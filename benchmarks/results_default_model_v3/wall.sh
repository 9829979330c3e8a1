#!/bin/bash
# Wall time of default model v3 against AR, and v2's recommended plans on the same prompts,
# one after the other on the 2-core development VM (the same command as v2's recorded sweep,
# BENCHMARKS.md "The shipped model's recommended plan"). Usage, from the repo root:
#   V3=DIR V2=DIR bash benchmarks/results_default_model_v3/wall.sh
# (V2: `git show d94a4e2:hispec_jax/default_model/FILE` for each file of that directory.)
set -u
R=benchmarks/results_default_model_v3
COMMON=(--datasets sharegpt --prompts 8 --max-new-tokens 64 --rounds 3
  --batch-sizes none --no-transformers --no-seed-methods --no-agreement)
uptime > $R/wall_v3.uptime
# v3: LayerSkip at exits 6, 9, 12 (draft lengths 3, 4); HiSpec tuned on the (Ld, Li) grid
# of exits 6, 9, 12, 16 and then its windows (one round each), as `hispec bench` does
hispec bench --model "$V3" "${COMMON[@]}" --draft-exits 6,9,12 --draft-lens 3,4 \
  --grid-exits 6,9,12,16 --out-dir $R/wall_v3 > $R/wall_v3.log 2>&1
uptime >> $R/wall_v3.uptime; uptime > $R/wall_v2.uptime
# v2: its recommended plans (LayerSkip 9, 4 drafts; HiSpec 8 -> 12, windows 1, 2)
hispec bench --model "$V2" "${COMMON[@]}" --draft-exits 9 --draft-lens 4 --grid-exits none \
  --tuned 8,12,1,2 \
  --out-dir $R/wall_v2 > $R/wall_v2.log 2>&1
uptime >> $R/wall_v2.uptime
