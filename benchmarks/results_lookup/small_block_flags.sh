#!/bin/bash
# small_block_products.py under XLA:CPU's other GEMM libraries (jax 0.10.2's flags): does any
# keep a product over 8-16 rows near one row's cost?
#
#   bash benchmarks/results_lookup/small_block_flags.sh > benchmarks/results_lookup/small_block_flags.txt
#
# default         YNNPACK runs every dot (`individual_dot`), the library's CPU default
# eigen           YNNPACK off: XLA's own (Eigen) dot emitter
# xnnpack         YNNPACK off, XNNPACK fusions of dots
# ynn fusions     YNNPACK also fuses dots with their elementwise neighbours
# onednn          YNNPACK off, oneDNN dots
set -e
cd "$(dirname "$0")/../.."
for flags in "" \
    "--xla_cpu_experimental_ynn_fusion_type=" \
    "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_experimental_xnn_fusion_type=dot" \
    "--xla_cpu_experimental_ynn_fusion_type=individual_dot,dot,eltwise" \
    "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_onednn=true"; do
  XLA_FLAGS="$flags" python benchmarks/results_lookup/small_block_products.py
  echo
done
