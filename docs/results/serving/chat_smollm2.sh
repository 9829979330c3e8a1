#!/usr/bin/env bash
# The `hispec chat` transcript of docs/serving.md, with stdin from a pipe (the first answer's
# time includes compiling the loops):
#   bash docs/results/serving/chat_smollm2.sh > docs/results/serving/chat_smollm2.txt 2>&1
set -euo pipefail
cd "$(dirname "$0")/../../.."
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD); load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
M=$(hispec pull smollm2-135m-instruct)
echo "\$ hispec chat --model \"\$(hispec pull smollm2-135m-instruct)\" --method hispec"
printf 'What is the capital of France?\n/reset\n/quit\n' | hispec chat --model "$M" --method hispec
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
