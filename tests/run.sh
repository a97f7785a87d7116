#!/bin/sh
# run.sh — run each cmocka test program, show its summary, fail if any failed.
# Tests run from the repository root; KVD_MODEL names the model they load.
: "${KVD_MODEL:=models/SmolLM2-135M-Instruct.Q4_1.gguf}"
export KVD_MODEL
# A configuration file installed on this machine must not change what the tests run.
: "${KVD_CONFIG:=/dev/null}"
export KVD_CONFIG
passed=0
failed=0
failed_names=""
# Each program's wall time is printed after it, so a slow CI run shows where
# its minutes went (a figure to read, never a limit).
for t in "$@"; do
	name=$(basename "$t")
	# The CUDA suites run twice: on the device (or skipped) and on tests/cudasim.
	case $t in */cudasim/*) name="cudasim/$name" ;; esac
	echo "=== $name"
	start=$(date +%s)
	if "$t"; then
		passed=$((passed + 1))
		verdict=passed
	else
		failed=$((failed + 1))
		failed_names="$failed_names $name"
		verdict=FAILED
	fi
	echo "=== $name: $verdict in $(($(date +%s) - start)) s"
done
echo
echo "test programs: $passed passed, $failed failed"
if [ "$failed" -ne 0 ]; then
	echo "failed:$failed_names"
	exit 1
fi
