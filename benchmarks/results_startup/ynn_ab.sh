#!/bin/bash
# XLA:CPU with and without its YNNPACK fusions, side by side: hispec generate, 3 rounds,
# each a fresh process (the first of each fills the program cache: "stored"). Output:
# benchmarks/results_startup/ynn_ab.txt. The "on" rows (XLA_FLAGS "") need a checkout from
# before the library turned the fusions off (engine.COMPILER_OPTIONS["cpu"], 673f88c).
M="$(hispec pull smollm2-135m-instruct)"
cd /tmp
run() {  # label flags args...
  label=$1; flags=$2; shift 2
  XLA_FLAGS="$flags" hispec generate --json --max-new-tokens 128 --ignore-eos "$@" 2>/dev/null | python -c "
import sys,json
t=sys.stdin.read(); d=json.loads(t[t.find('{'):]); s=d.get('stats',d)
print('$label', s['program_source'], 'compile %.1f'%s['compile_seconds'], 'tok/s %.1f'%s['tokens_per_second'], flush=True)"
}
for rep in 1 2 3; do
for flags in "" "--xla_cpu_experimental_ynn_fusion_type="; do
  run "smol-lookup[$flags]" "$flags" --model $M --method lookup --chat "Repeat this sentence exactly: the quick brown fox jumps over the lazy dog near the river bank."
  run "shipped-hispec[$flags]" "$flags" --method hispec "The capital of France is"
  run "shipped-ar[$flags]" "$flags" --method ar "The capital of France is"
done; done
