#!/usr/bin/env bash
# The figures of docs/gguf.md and README.md's example runs, rerun; from the repository root:
#   bash docs/results/gguf/run.sh
# Writes docs/results/gguf/{pull_again,generate_smollm2,gguf_memory}.txt and
# docs/results/readme/generate_default.txt, each with the commit, date and load average.
set -uo pipefail
stamp() { echo "# commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg)"; }
G=docs/results/gguf
M=$(hispec pull smollm2-135m-instruct)
{ stamp; echo '$ time hispec pull smollm2-135m-instruct   # the file is already in the cache'
  { time hispec pull smollm2-135m-instruct; } 2>&1; stamp; } > $G/pull_again.txt 2>&1
{ stamp; echo '$ hispec generate --model "$M" --chat --max-new-tokens 64 "What is the capital of France?" "Give me three tips for staying healthy."'
  hispec generate --model "$M" --chat --max-new-tokens 64 "What is the capital of France?" \
    "Give me three tips for staying healthy." 2>&1; stamp; } > $G/generate_smollm2.txt
{ stamp; echo '$ hispec generate --method hispec --max-new-tokens 48 "User: What is the capital of France?\nAssistant:"'
  hispec generate --method hispec --max-new-tokens 48 "User: What is the capital of France?
Assistant:" 2>&1; stamp; } > docs/results/readme/generate_default.txt
{ stamp; echo '$ JAX_PLATFORMS=cpu python -m hispec_jax.bench gguf-memory'
  JAX_PLATFORMS=cpu python -m hispec_jax.bench gguf-memory 2>&1; stamp; } > $G/gguf_memory.txt
