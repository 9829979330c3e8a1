#!/bin/bash
# Alternating fresh processes of two trees, both with XLA:CPU's YNNPACK fusions off and
# canonical weights (today's defaults; 0c0c8fe's were YNNPACK on and out-major weights):
#   bash benchmarks/results_engine/same_options_ab.sh BEFORE_TREE AFTER_TREE SMOLLM2 METHOD ORDER...
# e.g. ... ../before . "$(hispec pull smollm2-135m-instruct)" ar after before before after after before
BEFORE=$1 AFTER=$2 MODEL=$3 METHOD=$4; shift 4
HERE=$(cd "$(dirname "$0")" && pwd)
for t in "$@"; do
  if [ "$t" = after ]; then T=$AFTER; else T=$BEFORE; fi
  echo "$t $(date -u +%H:%M:%S) $(cd "$T" && PYTHONPATH=$PWD XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= \
    python "$HERE/same_options_ab.py" "$MODEL" "$METHOD" 2>/dev/null | grep '^{')"
done
