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
ONP="--config.data_source=on_policy --config.on_policy_prompts=640 \
  --config.on_policy_new_tokens=256 --config.on_policy_batch=64 --config.head_rank=0"
case "$1" in
  # (a) sampled (temperature 1) vs greedy (onpol_full in commands.sh) continuations, full heads
  onpol_sampled) heads onpol_sampled $ONP --config.on_policy_sampling=sampled \
                   --config.on_policy_temperature=1.0 ;;
  # (b) on-policy greedy data + SwiGLU adapter heads before the shared LM head
  onpol_ad704s) heads onpol_ad704s $ONP --config.head_adapter_width=704 --config.head_projection=shared ;;
  onpol_ad256s) heads onpol_ad256s $ONP --config.head_adapter_width=256 --config.head_projection=shared ;;
  *) echo "unknown run $1"; exit 2 ;;
esac
