#!/bin/sh
# bench.sh — run each benchmark program in turn, then the serving benchmarks; benchmarks
# print their own tables. Everything printed also goes to build/bench/results.txt
# (results-quick.txt with KVD_BENCH_QUICK=1, `make bench QUICK=1`), with how long each
# part took.
: "${KVD_MODEL:=models/SmolLM2-135M-Instruct.Q4_1.gguf}"
export KVD_MODEL
case ${KVD_BENCH_QUICK:-0} in
0 | "") KVD_BENCH_QUICK=0 out=build/bench/results.txt ;;
*) KVD_BENCH_QUICK=1 out=build/bench/results-quick.txt ;;
esac
export KVD_BENCH_QUICK
mkdir -p build/bench || exit 1
rcfile=$(mktemp) || exit 1

# part NAME CMD...: one part, its duration after it.
part() {
	name=$1
	shift
	echo "=== $name"
	t0=$(date +%s)
	"$@" || echo 1 >"$rcfile"
	echo "--- $name: $(($(date +%s) - t0)) s"
}

all() {
	t_all=$(date +%s)
	if [ "$KVD_BENCH_QUICK" = 1 ]; then
		echo "kvd benchmarks, QUICK (fewer runs, smaller sizes: indicative only, not results to compare)"
	else
		echo "kvd benchmarks"
	fi
	echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(git describe --always --dirty 2>/dev/null || echo "no git"), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
	for b in "$@"; do
		part "$(basename "$b")" "$b"
	done
	# The serving benchmarks run a real daemon with kvbench clients.
	if [ -x tools/bench_serve.sh ] && [ -x build/kvbench ]; then
		part "serving (tools/bench_serve.sh)" sh tools/bench_serve.sh
	fi
	if [ -x tools/bench_http.sh ] && [ -x build/kvhttp ] && [ -x build/kvload ]; then
		part "kvhttp vs the rings (tools/bench_http.sh)" sh tools/bench_http.sh
	fi
	echo "=== all parts: $(($(date +%s) - t_all)) s"
}

all "$@" 2>&1 | tee "$out"
echo "results: $out"
status=0
[ -s "$rcfile" ] && status=1
rm -f "$rcfile"
exit $status
