#!/bin/bash
# Back on the 2-core development CPU: the GPU runs' models (each assembled from its
# choice.json's parts plus the shipped model's config and tokenizer) against the shipped v3,
# on the shipped teacher-forced evaluation and in decoding. Usage, from the repo root:
#   NAME=DIR PART=eval|decode bash benchmarks/results_on_policy_v3/cpu_eval.sh
#   NEW=DIR PART=wall|plan bash benchmarks/results_on_policy_v3/cpu_eval.sh
# (NAME: new = the greedy run, its outputs here; sampled = sampled/; v3 = the shipped model)
set -u
R=benchmarks/results_on_policy_v3
NEW=${NEW:-/tmp/op/model}
V3=${V3:-hispec_jax/default_model}
NAME=${NAME:-new}
case $NAME in new) M=$NEW; D=$R ;; sampled) M=${SAMPLED:-/tmp/ops/model}; D=$R/sampled ;;
  v3) M=$V3; D=$R/v3 ;; esac
mkdir -p $D
# wall and plan: 8 held-out prompts x 64 tokens, greedy, batch 1, interleaved rounds
COMMON=(--datasets sharegpt --prompts 8 --max-new-tokens 64 --rounds ${ROUNDS:-3}
  --batch-sizes none --no-transformers --no-seed-methods --no-agreement)
case ${PART:-eval} in
eval)  # 1. teacher-forced: the first 100 held-out batches (as v3's eval100.json)
  hispec pretrain --no-progress --config configs/finetune_default.py --config.init_from=$M \
    --config.num_steps=0 --config.eval_batches=100 --config.resume=False \
    --config.work_dir=/tmp/op/eval_$NAME --config.out_dir=/tmp/op/eval_$NAME/model \
    > $D/eval100.log 2>&1
  cp /tmp/op/eval_$NAME/model/training_summary.json $D/eval100.json ;;
decode)  # 2. acceptance in decoding (LayerSkip, draft length 1) at exits 3, 6, 9, 12, 16,
  # and how repetitive AR's continuations are (seq-rep-4)
  python -m hispec_jax.bench decode-agreement --model $M --exits 3,6,9,12,16 --prompts 16 \
    --max-new-tokens 64 --out $D/decode.json > $D/decode.log 2>&1 ;;
wall)  # 3. wall time and work per token, one model after the other (as v3's wall.sh)
  uptime > $R/wall_new.uptime
  # (the new model's exits agree more: shallower exits and longer drafts than v3's sweep)
  hispec bench --model "$NEW" "${COMMON[@]}" --draft-exits 3,6,9 --draft-lens 4,6,8 \
    --grid-exits 3,6,9,12 --out-dir $R/wall_new > $R/wall_new.log 2>&1
  uptime >> $R/wall_new.uptime; uptime > $R/wall_v3.uptime
  # v3: its recommended plans (LayerSkip 9, 3 drafts; HiSpec 9 -> 16, windows 2, 4)
  hispec bench --model "$V3" "${COMMON[@]}" --draft-exits 9 --draft-lens 3 --grid-exits none \
    --tuned 9,16,2,4 --out-dir $R/wall_v3 > $R/wall_v3.log 2>&1
  uptime >> $R/wall_v3.uptime ;;
plan)  # 4. (after 3 and work_sweep.py) the plans picked by work per token, timed beside the
  # wall sweep's fastest: NEW's recommended_plan.json holds HiSpec 4 -> 12 (3, 6) and
  # LayerSkip 5 (6 drafts), "hispec defaults" and "layerskip d=5 n=6" in the report; "hispec
  # tuned" is the wall sweep's 6 -> 12 (3, 6). ROUNDS=5 OUT_NAME=plan_new5: the same, 5 rounds
  # (the 3-round run's AR was slow).
  O=${OUT_NAME:-plan_new}
  uptime > $R/$O.uptime
  hispec bench --model "$NEW" "${COMMON[@]}" --draft-exits 5,6 --draft-lens 6 --grid-exits none \
    --tuned 6,12,3,6 --out-dir $R/$O > $R/$O.log 2>&1
  uptime >> $R/$O.uptime ;;
esac
