#!/usr/bin/env bash
# docs/gguf.md's and README.md's SmolLM2 runs, rerun; from the repository root:
#   bash docs/results/gguf/run.sh
# Writes docs/results/gguf/{pull_again,generate_smollm2}.txt, each with the commit, date and
# load average. (gguf_memory.txt beside them was written by the gguf-memory study of commit
# 2e340ab: `git show 2e340ab:hispec_jax/bench/studies/gguf_memory.py`.)
set -uo pipefail
stamp() { echo "# commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg)"; }
G=docs/results/gguf
M=$(hispec pull smollm2-135m-instruct)
{ stamp; echo '$ time hispec pull smollm2-135m-instruct   # the file is already in the cache'
  { time hispec pull smollm2-135m-instruct; } 2>&1; stamp; } > $G/pull_again.txt 2>&1
{ stamp; echo '$ hispec generate --model "$M" --chat --max-new-tokens 64 "What is the capital of France?" "Give me three tips for staying healthy."'
  hispec generate --model "$M" --chat --max-new-tokens 64 "What is the capital of France?" \
    "Give me three tips for staying healthy." 2>&1; stamp; } > $G/generate_smollm2.txt
