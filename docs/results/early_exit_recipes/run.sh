#!/usr/bin/env bash
# The six 25-step recipe runs of docs/early_exit_recipes.md ("The comparison").
# Usage, from the repository root:
#   CANDIDATE=DIR bash docs/results/early_exit_recipes/run.sh [NAME ...]
# CANDIDATE: the stage-1 24-layer candidate (what configs/pretrain_gpu.py writes; the
# project's copy is hispec-24l, see its PROVENANCE.md). NAME: any of the six below
# (default: all but init100). init100 evaluates the candidate on the 100 batches of the
# shipped model's own evaluation (docs/default_model.md). Each run's training_summary.json is copied to
# docs/results/early_exit_recipes/NAME.json, with a NAME.log of its output.
set -euo pipefail
: "${CANDIDATE:?set CANDIDATE to the stage-1 model directory}"
RES=docs/results/early_exit_recipes
SCRATCH=${SCRATCH:-$HOME/.cache/hispec_jax/recipes}
BASE=(--config configs/finetune_default.py --no-progress --config.init_from="$CANDIDATE"
  --config.num_steps=25 --config.time_budget_s=0 --config.optim.warmup_steps=5
  --config.eval_batches=20 --config.checkpoint_every=0 --config.resume=False
  --config.exit_layers= --config.curriculum=none --config.layer_dropout_max=0)
declare -A RECIPE=(
  [init]="--config.num_steps=0"
  [init100]="--config.num_steps=0 --config.eval_batches=100"
  [linear_ce]="--config.exit_weights=linear --config.distill_weight=0"
  [uniform_ce]="--config.exit_weights=uniform --config.distill_weight=0"
  [uniform_kl]="--config.exit_weights=uniform --config.distill_weight=1"
  [uniform_kl_rot_drop]="--config.exit_weights=uniform --config.distill_weight=1 --config.curriculum=rotational --config.curriculum_rotation=2 --config.layer_dropout_max=0.1"
  [focus_kl]="--config.exit_weights=uniform --config.distill_weight=1 --config.exit_layers=3,6,12"
)
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(init linear_ce uniform_ce uniform_kl uniform_kl_rot_drop focus_kl)
for n in "${names[@]}"; do
  d=$SCRATCH/$n
  { echo "# $n, commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg)"
    nice -n 10 hispec pretrain "${BASE[@]}" --config.work_dir="$d" --config.out_dir="$d/model" ${RECIPE[$n]}
    echo "# done $(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg)"; } > "$RES/$n.log" 2>&1
  cp "$d/model/training_summary.json" "$RES/$n.json"
done
