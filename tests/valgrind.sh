#!/bin/sh
# valgrind.sh — the unit suite under valgrind: each program (a fuzz replay
# build gets its committed corpus) must run with no memory error and no leak.
# valgrind has no AVX-512: the kernels take their AVX2 path.
: "${KVD_MODEL:=models/SmolLM2-135M-Instruct.Q4_1.gguf}"
KVD_CPU_ISA=avx2
export KVD_MODEL KVD_CPU_ISA
if ! command -v valgrind >/dev/null 2>&1; then
	echo "valgrind: not installed (make deps)"
	exit 1
fi
failed=""
for t in "$@"; do
	name=$(basename "$t")
	case $name in
	replay_*) args="tests/fuzz/corpus/${name#replay_}" ;;
	*) args="" ;;
	esac
	echo "=== valgrind $name"
	# shellcheck disable=SC2086
	if ! valgrind -q --error-exitcode=99 --leak-check=full --show-leak-kinds=definite,possible \
		--errors-for-leak-kinds=definite,possible "$t" $args >/dev/null; then
		failed="$failed $name"
	fi
done
if [ -n "$failed" ]; then
	echo "valgrind failed:$failed"
	exit 1
fi
echo "valgrind: $# programs clean"
