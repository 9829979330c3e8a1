#!/bin/bash
# Issue 31, items 2-3 and 6: the exact commands of docs/early_exit_recipes.md's "Trained exit
# heads" section and docs/smollm2_early_exit.md's section 8 (run from the repository root; they
# ran on the shared 2-core CPU machine under nice -n 5, load average 8-14).
run() {  # NAME STEPS [overrides]: heads at exits 3, 6 of the shipped default model
  NAME=$1; STEPS=$2; shift 2
  nice -n 5 hispec train-heads --config train_heads_default \
    --config.model_path=hispec_jax/default_model --config.model_dtype=float32 \
    --config.output_dir=/tmp/h31/heads_$NAME --config.head_layers=3,6 \
    --config.loss=ce --config.seq_len=256 --config.batch_size=8 --config.total_steps=$STEPS \
    --config.num_epochs=0 --config.max_train_docs=1000 --config.eval_rows=64 \
    --config.learning_rate=1e-3 --config.warmup_steps=10 --config.end_lr_fraction=0.1 \
    --config.feature_cache=True --config.cache_dtype=float32 --config.cache_max_gb=4 \
    --config.cache_dir=/tmp/h31/feature_cache --config.workdir=/tmp/h31/work_$NAME \
    --config.resume=False --config.checkpoint_every=100000 --config.eval_every=0 \
    --config.progress_bar=False "$@"
}
C="--config.max_train_docs=200 --config.eval_every=300"
run full 300 $C --config.head_rank=0
run r64 300 $C --config.head_rank=64
run ad256s 300 $C --config.head_rank=0 --config.head_adapter_width=256 --config.head_projection=shared
run ad704s 300 $C --config.head_rank=0 --config.head_adapter_width=704 --config.head_projection=shared
run onpol_full 300 --config.eval_every=300 --config.head_rank=0 --config.data_source=on_policy \
   --config.on_policy_prompts=640 --config.on_policy_new_tokens=256 --config.on_policy_batch=64
for n in full r64 ad256s ad704s onpol_full; do
  python -m hispec_jax.bench decode-agreement --model /tmp/h31/heads_$n --exits 3,6 --prompts 16 \
    --max-new-tokens 64 --out benchmarks/results_exit_heads/decode_$n.json
done
python -m hispec_jax.bench decode-agreement --model hispec_jax/default_model --exits 3,6 \
  --prompts 16 --max-new-tokens 64 --out benchmarks/results_exit_heads/decode_shared.json

# SmolLM2-135M-Instruct: a SwiGLU adapter (Fa = 1536) before the frozen shared LM head at exit 15
hispec convert "$(hispec pull smollm2-135m-instruct)" /tmp/h31/smol/hf
smol() {  # NAME FEATURE_CACHE [overrides]: the adapter at exit 15, 120 steps x 4 x 256 tokens
  NAME=$1; CACHE=$2; shift 2
  nice -n 5 hispec train-heads --config train_heads_default \
    --config.model_path=/tmp/h31/smol/hf --config.model_dtype=float32 \
    --config.output_dir=/tmp/h31/smol/heads_$NAME --config.head_layers=15 \
    --config.loss=ce --config.seq_len=256 --config.batch_size=4 --config.total_steps=120 \
    --config.num_epochs=0 --config.eval_rows=16 \
    --config.learning_rate=1e-3 --config.warmup_steps=5 --config.end_lr_fraction=0.1 \
    --config.feature_cache=True --config.cache_dtype=float32 --config.cache_max_gb=4 \
    --config.cache_dir=/tmp/h31/smol/$CACHE --config.workdir=/tmp/h31/smol/work_$NAME \
    --config.resume=False --config.checkpoint_every=100000 --config.eval_every=40 \
    --config.progress_bar=False --config.head_rank=0 --config.head_adapter_width=1536 \
    --config.head_projection=shared "$@"
}
smol ad1536s feature_cache --config.max_train_docs=400
# The same adapter trained on SmolLM2's own greedy continuations (on-policy), same budget,
# 2026-11-26 (log: smollm2_train_ad1536s_onpol.log)
smol ad1536s_onpol feature_cache_onpol --config.data_source=on_policy \
  --config.on_policy_prompts=512 --config.on_policy_new_tokens=192 --config.on_policy_batch=32
for n in ad1536s ad1536s_onpol; do
  python -m hispec_jax.bench decode-agreement --model /tmp/h31/smol/heads_$n --exits 15 --prompts 8 \
    --max-new-tokens 48 --batch-size 8 --out benchmarks/results_exit_heads/smollm2_decode_$n.json
done
# The same adapter, off-policy (ShareGPT text), three times the data and steps: 1,200
# training conversations, 360 steps x 4 x 256 = 369k tokens (2026-11-26; log
# smollm2_train_ad1536s_x3.log, metrics smollm2_train_ad1536s_x3.metrics.jsonl)
smol ad1536s_x3 feature_cache_x3 --config.max_train_docs=1200 --config.total_steps=360
python -m hispec_jax.bench decode-agreement --model /tmp/h31/smol/heads_ad1536s_x3 --exits 15 --prompts 8 \
  --max-new-tokens 48 --batch-size 8 --out benchmarks/results_exit_heads/smollm2_decode_ad1536s_x3.json
