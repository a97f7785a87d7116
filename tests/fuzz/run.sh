#!/bin/sh
# run.sh SECONDS BIN... — libFuzzer runs of each target for SECONDS, from the
# committed seeds; new inputs go to build/fuzz/work/<name>/, crashes to
# build/fuzz/crashes/<name>/. Prints executions per target; fails on a crash.
set -u
secs=$1
shift
out=build/fuzz
status=0
printf '%-12s %12s %10s %s\n' target executions exec/s result
for bin in "$@"; do
	name=$(basename "$bin" | sed 's/^fuzz_//')
	mkdir -p "$out/work/$name" "$out/crashes/$name"
	log=$out/$name.log
	"$bin" -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=4096 -timeout=30 \
		-artifact_prefix="$out/crashes/$name/" "$out/work/$name" "tests/fuzz/corpus/$name" \
		>"$log" 2>&1
	rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
	if [ $rc -eq 0 ]; then
		result=ok
	else
		result="CRASH (see $log, $out/crashes/$name/)"
		status=1
	fi
	printf '%-12s %12s %10s %s\n' "$name" "${execs:-?}" "${rate:-?}" "$result"
done
exit $status
