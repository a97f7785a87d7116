#!/bin/sh
# check.sh — the GPU check in one go: build with CUDA, the CUDA kernels against the CPU, the
# default model against the CPU and against llama.cpp's F32 distributions, kvd's own check of
# the device and the KLD harness on it, kvd's loading of libkvd-cuda.so, compute-sanitizer
# memcheck on a short generation, and the benchmark table.
# Meant for one GPU and under 8 minutes; every step has its own time limit. A failure of the
# correctness steps is printed as such at the end and stops the benchmark: figures of a backend
# whose output is wrong are no figures.
# Usage: sh tests/gpu/check.sh   (from anywhere; KVD_MODEL names the model)
#        KVD_CHECK_PREBUILT=1 sh tests/gpu/check.sh   (binaries already in build/, e.g. a bundle
#        from tests/gpu/bundle.sh on a machine without the build's libraries)
set -u
cd "$(dirname "$0")/../.." || exit 1
: "${KVD_MODEL:=models/SmolLM2-135M-Instruct.Q4_1.gguf}"
export KVD_MODEL
jobs=$(nproc 2>/dev/null || echo 2)
status=0
failed=""
t_start=$(date +%s)

step() {
	echo
	echo "=== $1 ($(($(date +%s) - t_start)) s)"
}

# run LIMIT NAME CMD...: a failure or a timeout marks the check failed, the next step still runs.
run() {
	limit=$1
	name=$2
	shift 2
	timeout -k 10 "$limit" "$@"
	rc=$?
	if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
		echo "check: $name: timed out after ${limit}s"
		fail "$name (timed out)"
	elif [ "$rc" -ne 0 ]; then
		echo "check: $name: failed ($rc)"
		fail "$name"
	fi
}
fail() {
	status=1
	failed="$failed; $1"
}

step "build (CUDA=1)"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "${KVD_CHECK_PREBUILT:-0}" = 1 ]; then
	echo "prebuilt: $(ls build/kvd build/libkvd-cuda.so build/tests/test_cuda build/tests/test_cuda_golden build/tests/bench_cuda 2>&1 | tr '\n' ' ')"
elif ! make -j"$jobs" CUDA=1 all build/tests/test_cuda build/tests/test_cuda_golden \
	build/tests/test_devmem build/tests/bench_cuda >/dev/null; then
	echo "check: build failed"
	exit 1
fi
if [ ! -f "$KVD_MODEL" ]; then
	echo "check: no model at $KVD_MODEL (run \`make model\` first)"
	exit 1
fi

# A GPU check that silently skips is no check: no usable device fails it.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
step "CUDA kernels against the CPU"
run 120 test_cuda sh -c 'build/tests/test_cuda >"$1" 2>&1; rc=$?; cat "$1"; exit $rc' sh "$log"
if grep -q "skipped: no CUDA device" "$log" || grep -q "FAILED" "$log"; then
	echo "check: test_cuda did not pass on a device"
	fail "test_cuda on the device"
fi
# The weight types, ops and rope/attention parameters of issue 17 must each
# have met the device and the CPU, not been passed over because one lacked them.
missing=""
for t in " 6" " 7" "10" "11" "13" "20" "23"; do
	grep -q "^matmul type $t n 37: rel err" "$log" || missing="$missing; matmul type $t"
done
for pat in "^add_bias: .*against the CPU" "^scale: .*against the CPU" \
	"^softcap: .*against the CPU" "^geglu: .*against the CPU" \
	"^rope freq factors, neox 0: .*against the CPU" "^rope linear 1/4, neox 1: .*against the CPU" \
	"^rope yarn 1/4, neox 1: .*against the CPU" "^rope attn_factor, neox 0: .*against the CPU" \
	"softcap 0.5 window 0: rel err" "softcap 0 window 100: rel err" "softcap 0.5 window 1000: rel err"; do
	grep -q "$pat" "$log" || missing="$missing; $pat"
done
grep -q "the CPU lacks soft-cap or window" "$log" && missing="$missing; attention soft-cap/window against the CPU"
grep -q "not compared, the CPU does not decode it" "$log" && missing="$missing; a weight type the CPU does not decode"
if [ -n "$missing" ]; then
	echo "check: test_cuda left unchecked on the device:${missing#; }"
	fail "test_cuda coverage"
fi
step "the default model against the CPU (teacher-forced greedy) and against llama.cpp's F32"
run 240 test_cuda_golden sh -c 'build/tests/test_cuda_golden >"$1" 2>&1; rc=$?; cat "$1"; exit $rc' sh "$log"
if grep -q "skipped: no CUDA device" "$log" || grep -q "FAILED" "$log"; then
	echo "check: test_cuda_golden did not pass on a device"
	fail "test_cuda_golden on the device"
fi

step "kvd checks the device against the CPU before it generates"
run 120 backend-check sh -c 'build/kvd --config /dev/null --backend cuda --kv-blocks 64 \
	-p "The capital of France is" -n 16 >"$1" 2>&1; rc=$?; cat "$1"; exit $rc' sh "$log"
if ! grep -q "cuda backend checked against the CPU" "$log"; then
	echo "check: kvd --backend cuda did not pass its check of the device"
	fail "kvd's backend check"
fi

step "the KLD harness on the device: kvd --perplexity --backend cuda against an F32 base file"
run 240 kld sh tests/lib/kld_vs_cpu.sh build/kvd 4

step "kvd loads libkvd-cuda.so and takes the device"
run 120 test_packaging sh -c 'sh tests/test_packaging.sh >"$1" 2>&1; rc=$?; cat "$1"; exit $rc' sh "$log"
if ! grep -q "loads the object beside it: kvd: cuda backend: auto" "$log"; then
	echo "check: build/kvd did not take the device through build/libkvd-cuda.so"
	fail "libkvd-cuda.so loading"
fi

step "compute-sanitizer memcheck on a short generation"
cs=$(command -v compute-sanitizer || true)
for c in "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/compute-sanitizer" \
	/usr/local/cuda/compute-sanitizer/compute-sanitizer; do
	[ -z "$cs" ] && [ -x "$c" ] && cs=$c
done
if [ -n "$cs" ]; then
	run 150 memcheck "$cs" --tool memcheck --leak-check full --error-exitcode 3 \
		build/kvd --config /dev/null --backend=cuda --no-backend-check --kv-blocks 64 \
		-p "The capital of France is" -n 8
else
	echo "check: compute-sanitizer not found: memcheck skipped"
fi

step "benchmark table"
if [ "$status" -ne 0 ]; then
	echo "check: no benchmark: the device's output is not right (${failed#; })"
else
	run 200 bench_cuda build/tests/bench_cuda
fi

echo
if [ "$status" -eq 0 ]; then
	echo "check: passed in $(($(date +%s) - t_start)) s"
else
	echo "################################################################"
	echo "check: FAILED in $(($(date +%s) - t_start)) s: ${failed#; }"
	echo "################################################################"
fi
exit "$status"
