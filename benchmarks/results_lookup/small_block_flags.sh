#!/bin/bash
# small_block_products.py (3 of its forms, T = 1-16, 5 rounds) under XLA:CPU's other GEMM
# libraries (jax 0.10.2's flags): does any keep a product over 8-16 rows near one row's cost?
#
#   bash benchmarks/results_lookup/small_block_flags.sh > benchmarks/results_lookup/small_block_flags.txt
#
#   ''                                   YNNPACK runs every dot (`individual_dot`): the default
#   ynn_fusion_type=                     YNNPACK off: XLA's own (Eigen) dot emitter
#   ... xnn_fusion_type=dot              YNNPACK off, XNNPACK fusions of dots
#   ynn_fusion_type=individual_dot,dot,eltwise   YNNPACK also fuses dots with elementwise ops
#   ... use_onednn=true                  YNNPACK off, oneDNN asked for
set -e
cd "$(dirname "$0")/../.."
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"
for flags in "" \
    "--xla_cpu_experimental_ynn_fusion_type=" \
    "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_experimental_xnn_fusion_type=dot" \
    "--xla_cpu_experimental_ynn_fusion_type=individual_dot,dot,eltwise" \
    "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_use_onednn=true"; do
  echo "=== XLA_FLAGS='$flags'"
  XLA_FLAGS="$flags" python -c "
import runpy
g = runpy.run_path('benchmarks/results_lookup/small_block_products.py', run_name='x')
g['FORMS'] = {k: g['FORMS'][k] for k in ('io dot', 'oi lib', 'oi rows')}
g['main'].__globals__.update(FORMS=g['FORMS'], TS=(1, 4, 8, 16), ROUNDS=5)
g['main']()
" 2>&1 | grep -v "^#"
done
