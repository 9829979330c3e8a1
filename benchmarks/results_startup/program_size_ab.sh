#!/usr/bin/env bash
# Decode speed and warm compile_seconds of two library versions side by side: `hispec
# generate --json --max-new-tokens 64 --ignore-eos` in fresh processes, alternating
# BEFORE (a checkout, e.g. `git worktree add /tmp/before COMMIT`) and the working tree,
# 3 rounds; the shipped model, SmolLM2 and SmolLM2 --chat (docs/startup.md).
#   BEFORE=/tmp/before bash benchmarks/results_startup/program_size_ab.sh > OUT.txt
set -euo pipefail
M=${M:-$HOME/.cache/hispec/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf}
P="What is the capital of France?"
AFTER=$(git rev-parse --show-toplevel)
echo "# before $(git -C "$BEFORE" rev-parse --short HEAD), after $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes'), $(date -u +%FT%TZ), load $(cut -d' ' -f1 /proc/loadavg)"
for run in 1 2 3; do
  for tree in "$BEFORE" "$AFTER"; do
    for args in "" "--model $M" "--model $M --chat"; do
      # shellcheck disable=SC2086
      PYTHONPATH=$tree python -c "import sys; from hispec_jax.cli import main; sys.exit(main(sys.argv[1:]))" \
        generate --json --max-new-tokens 64 --ignore-eos $args "$P" 2>/dev/null | python -c "
import json, sys
s = json.load(sys.stdin)['stats']
print('run $run', 'before' if '$tree' == '$BEFORE' else 'after', 'SmolLM2' if '$args' else 'default_model',
      '--chat' if 'chat' in '$args' else '', s['method'], s['program_source'], 'capacity', s['cache_capacity'],
      'compile %.2f' % s['compile_seconds'], 'tok/s %.1f' % s['tokens_per_second'])"
    done
  done
done
