#!/usr/bin/env bash
# `hispec generate --json` in fresh processes, $RUNS runs each (default 3): the shipped model's default plan
# and SmolLM2-135M's (its default: lookup), on the raw prompt and with `--chat` (the template
# makes the prompt 64-position prefill chunks and a larger cache: a larger loop); prints each run's program_source and
# compile_seconds (docs/startup.md). The first run of a new library version stores the
# loop; the later runs load it.
#   RUNS=6 bash benchmarks/results_startup/generate_compile_seconds.sh > OUT.txt
set -euo pipefail
M=${M:-$HOME/.cache/hispec/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf}
P="What is the capital of France?"
echo "# hispec generate --json, fresh processes, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD), load $(cut -d' ' -f1 /proc/loadavg)"
for run in $(seq "${RUNS:-3}"); do
  for args in "" "--model $M" "--model $M --chat"; do
    # shellcheck disable=SC2086
    hispec generate --json $args "$P" 2>/dev/null | python -c "
import json, os, sys
s = json.load(sys.stdin)['stats']
print('run $run', 'SmolLM2' if '$args' else 'default_model', '--chat' if 'chat' in '$args' else '',
      s['method'], s['program_source'], 'capacity', s['cache_capacity'], 'prompt_block', s['prompt_block'],
      'compile_seconds %.2f' % s['compile_seconds'])"
  done
done
echo "# load at end $(cut -d' ' -f1 /proc/loadavg)"
