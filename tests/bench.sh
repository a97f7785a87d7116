#!/bin/sh
# bench.sh — run each benchmark program in turn; benchmarks print their own tables.
: "${KVD_MODEL:=models/SmolLM2-135M-Instruct.Q4_1.gguf}"
export KVD_MODEL
status=0
for b in "$@"; do
	echo "=== $(basename "$b")"
	"$b" || status=1
done
# The serving benchmarks run a real daemon with kvbench clients.
if [ -x tools/bench_serve.sh ] && [ -x build/kvbench ]; then
	echo "=== serving (tools/bench_serve.sh)"
	sh tools/bench_serve.sh || status=1
fi
exit $status
