#!/usr/bin/env bash
# `hispec generate` twice per method with an empty hispec cache: the first run compiles the
# loop and stores it in $HISPEC_CACHE/jax (cli/common.py::use_compilation_cache), the second
# loads it. The compile seconds `generate` reports include tracing and lowering, which JAX's
# persistent cache does not skip.
#   bash benchmarks/results_lookup/compile_cache.sh > benchmarks/results_lookup/compile_cache.txt
set -euo pipefail
model="$(hispec pull smollm2-135m-instruct)"
cache="$(mktemp -d)"
trap 'rm -rf "$cache"' EXIT
echo "# $(git rev-parse --short HEAD); $(date -u '+%Y-%m-%d %H:%M UTC'); $(uptime)"
for method in ar lookup; do
  for run in 1 2; do
    echo "## $method, run $run"
    HISPEC_CACHE="$cache" hispec generate --model "$model" --max-new-tokens 8 --method "$method" \
      "The capital of France is" 2>&1 | grep "^\[$method\]"
  done
done
echo "# $(du -sh "$cache/jax" | cut -f1) in the cache; $(uptime)"
