#!/bin/bash
# Issue 31, session 3: the missing comparisons of docs/early_exit_recipes.md (on-policy
# sampled vs greedy continuations; on-policy + adapter heads; on-policy continued
# pretraining). Same budget and settings as commands.sh's runs (300 steps x 8 x 256, CE,
# lr 1e-3, exits 3, 6 of the shipped model). Run from the repository root on the shared
# 2-core CPU machine under nice -n 10; each run NAME keeps its outputs in
# benchmarks/results_exit_heads/NAME/ (command.txt, metrics.jsonl, decode.json, work.json).
set -e
R=benchmarks/results_exit_heads
heads() {  # NAME [overrides]: heads at exits 3, 6 of the shipped default model, then decoding
  NAME=$1; shift
  mkdir -p $R/$NAME
  CMD=(nice -n 10 hispec train-heads --config train_heads_default \
    --config.model_path=hispec_jax/default_model --config.model_dtype=float32 \
    --config.output_dir=/tmp/h31/heads_$NAME --config.head_layers=3,6 \
    --config.loss=ce --config.seq_len=256 --config.batch_size=8 --config.total_steps=300 \
    --config.num_epochs=0 --config.max_train_docs=1000 --config.eval_rows=64 \
    --config.learning_rate=1e-3 --config.warmup_steps=10 --config.end_lr_fraction=0.1 \
    --config.feature_cache=True --config.cache_dtype=float32 --config.cache_max_gb=4 \
    --config.cache_dir=/tmp/h31/feature_cache --config.workdir=/tmp/h31/work_$NAME \
    --config.resume=False --config.checkpoint_every=100000 --config.eval_every=300 \
    --config.progress_bar=False "$@")
  echo "${CMD[*]}" > $R/$NAME/command.txt; uptime > $R/$NAME/uptime_train.txt
  "${CMD[@]}" 2>&1 | grep -v "Token indices" > $R/$NAME/train.log
  cp /tmp/h31/work_$NAME/metrics.jsonl $R/$NAME/metrics.jsonl
  decode $NAME /tmp/h31/heads_$NAME
}
decode() {  # NAME MODEL_DIR: acceptance in decoding at exits 3, 6 (LayerSkip, draft length 1)
  uptime > $R/$1/uptime_decode.txt
  CMD=(nice -n 10 python -m hispec_jax.bench decode-agreement --model $2 --exits 3,6
       --prompts 16 --max-new-tokens 64 --out $R/$1/decode.json)
  echo "${CMD[*]}" >> $R/$1/command.txt
  "${CMD[@]}" > $R/$1/decode.log 2>&1
}
cpt() {  # NAME [overrides]: continued pretraining of the shipped model (its own recipe,
  # configs/finetune_default.py: uniform KL, rotational curriculum, layer dropout 0.1), a
  # token-exact budget of 16 steps x 4 x 512 = 32,768 tokens, then decoding and work
  NAME=$1; shift
  mkdir -p $R/$NAME
  CMD=(nice -n 10 hispec pretrain --no-progress --config configs/finetune_default.py
       --config.init_from=hispec_jax/default_model --config.num_steps=16
       --config.time_budget_s=0 --config.optim.warmup_steps=5 --config.eval_batches=20
       --config.checkpoint_every=0 --config.resume=False --config.save_dtype=float32
       --config.data.token_cache_dir=/tmp/h31/feature_cache
       --config.work_dir=/tmp/h31/cpt_$NAME --config.out_dir=/tmp/h31/cpt_$NAME/model "$@")
  echo "${CMD[*]}" > $R/$NAME/command.txt; uptime > $R/$NAME/uptime_train.txt
  "${CMD[@]}" 2>&1 | grep -v "Token indices" > $R/$NAME/train.log
  cp /tmp/h31/cpt_$NAME/model/training_summary.json $R/$NAME/
  [ "$NAME" = cpt_init ] && return  # the shipped model itself: decode_shared.json, shipped/
  cp /tmp/h31/cpt_$NAME/metrics.jsonl $R/$NAME/
  # the shipped model's recommended plan (hispec 8 -> 12, layerskip 9), so that work.json's
  # "hispec" and "layerskip" rows run the same plans on every model
  cp hispec_jax/default_model/recommended_plan.json /tmp/h31/cpt_$NAME/model/
  decode $NAME /tmp/h31/cpt_$NAME/model
  work $NAME /tmp/h31/cpt_$NAME/model
}
work() {  # NAME MODEL_DIR: work per token of every method at its defaults
  CMD=(nice -n 10 hispec bench-tool work --model $2 --out $R/$1/work.json)
  echo "${CMD[*]}" >> $R/$1/command.txt
  "${CMD[@]}" > $R/$1/work.log 2>&1
}
ONP="--config.data_source=on_policy --config.on_policy_prompts=640 \
  --config.on_policy_new_tokens=256 --config.on_policy_batch=64 --config.head_rank=0"
case "$1" in
  # (a) sampled (temperature 1) vs greedy (onpol_full in commands.sh) continuations, full heads
  onpol_sampled) heads onpol_sampled $ONP --config.on_policy_sampling=sampled \
                   --config.on_policy_temperature=1.0 ;;
  # (b) on-policy greedy data + SwiGLU adapter heads before the shared LM head
  onpol_ad704s) heads onpol_ad704s $ONP --config.head_adapter_width=704 --config.head_projection=shared ;;
  onpol_ad256s) heads onpol_ad256s $ONP --config.head_adapter_width=256 --config.head_projection=shared ;;
  # (c) continued pretraining: ShareGPT text (off-policy) vs the model's own greedy
  # continuations of 640 ShareGPT training prompts (the same as onpol_full's data)
  cpt_init) cpt cpt_init --config.num_steps=0 ;;   # the evaluation of the shipped model itself
  cpt_offpol) cpt cpt_offpol ;;
  cpt_onpol) cpt cpt_onpol --config.data.source=on_policy --config.data.on_policy_prompts=640 ;;
  cpt_onpol_sampled) cpt cpt_onpol_sampled --config.data.source=on_policy \
                       --config.data.on_policy_prompts=640 --config.data.on_policy_sampling=sampled ;;
  shipped_work) mkdir -p $R/shipped; work shipped hispec_jax/default_model ;;
  *) echo "unknown run $1"; exit 2 ;;
esac
