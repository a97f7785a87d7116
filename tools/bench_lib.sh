# bench_lib.sh — what tools/bench_serve.sh and tools/bench_http.sh share: a private daemon, kvbench runs
# with their JSON, and the figures' formatting. Sourced from the repository root with WHO (the
# script's name for its messages) and NEED (more programs it runs) set; B, THREADS, MODEL and
# KVD_BENCH_QUICK come from the environment.
B=${B:-build}
THREADS=${THREADS:-2}
KVD="$B/kvd"
KVBENCH="$B/kvbench"
for f in "$KVD" "$KVBENCH" "$B/kvctl" ${NEED:-}; do
	if [ ! -x "$f" ]; then
		echo "$WHO: $f is missing: make $f" >&2
		exit 1
	fi
done
dir=$(mktemp -d) || exit 1
sock="$dir/kvd.sock"
pid=
bg=
t_start=$(date +%s)
quick=0
case ${KVD_BENCH_QUICK:-0} in 0 | "") ;; *) quick=1 ;; esac

stop_daemon() {
	if [ -n "$pid" ]; then
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
		pid=
	fi
	rm -f "$sock"
}

cleanup() {
	if [ -n "$bg" ]; then
		kill -TERM "$bg" 2>/dev/null
		wait "$bg" 2>/dev/null
	fi
	stop_daemon
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_daemon [kvd options]: a fresh daemon, the default model, $THREADS threads.
start_daemon() {
	"$KVD" ${MODEL:+--model "$MODEL"} --socket "$sock" -t "$THREADS" "$@" >"$dir/kvd.log" 2>&1 &
	pid=$!
	wait_up "$pid" "kvd $*" "$dir/kvd.log" "$B/kvctl" --socket "$sock" info
}

# wait_up PID WHAT LOG CMD...: poll CMD until it succeeds; exit, with LOG, if PID dies or 30 s pass.
wait_up() {
	up_pid=$1
	up_what=$2
	up_log=$3
	shift 3
	i=0
	until "$@" >/dev/null 2>&1; do
		i=$((i + 1))
		if [ $i -gt 300 ] || ! kill -0 "$up_pid" 2>/dev/null; then
			echo "$WHO: $up_what did not come up:" >&2
			cat "$up_log" >&2
			exit 1
		fi
		sleep 0.1
	done
}

# run NAME CAP [kvbench options]: one kvbench run, its JSON in $dir/NAME.json. After CAP
# seconds it gets SIGINT: it cancels what is in flight and reports what it measured, the
# tokens of the cancelled requests included; capped() then marks the row.
run() {
	name=$1
	cap=$2
	shift 2
	timeout -s INT -k 30 "$cap" "$KVBENCH" --socket "$sock" --json "$@" \
		>"$dir/$name.json" 2>"$dir/$name.err"
	rc=$?
	if [ $rc -eq 124 ]; then
		echo "$cap" >"$dir/$name.capped"
	elif [ $rc -ne 0 ]; then
		echo "$WHO: kvbench $* failed (status $rc):" >&2
		if ! kill -0 "$pid" 2>/dev/null; then
			cat "$dir/$name.err" >&2
			echo "$WHO: kvd died; the end of its log:" >&2
			tail -20 "$dir/kvd.log" >&2
			exit 1
		fi
	fi
	sed "s/^/  $name: /" "$dir/$name.err" >&2	# what kvbench had to say
}

# capped NAME: "*" when run NAME hit its time cap.
capped() {
	if [ -e "$dir/$1.capped" ]; then echo "*"; fi
}

# ttft NAME FIELD: a TTFT in ms, or ">CAP" for a capped run that saw no first token.
ttft() {
	v=$(get "$1" "$2")
	if [ -z "$v" ] && [ -e "$dir/$1.capped" ]; then
		echo ">$(($(cat "$dir/$1.capped") * 1000))"
	else
		fmt "$v" %.1f
	fi
}

# get NAME FIELD: a number from run NAME's JSON ("" when missing or null).
get() {
	sed -n "s/.*\"$2\":\([-0-9.e+]*\)[,}].*/\1/p" "$dir/$1.json" 2>/dev/null
}

# fmt VALUE PRINTF-FORMAT: "-" for an empty value.
fmt() {
	awk -v v="$1" -v f="$2" 'BEGIN { if (v == "") print "-"; else printf f "\n", v }'
}

# percent FRACTION: "12.3%", or "-".
percent() {
	awk -v v="$1" 'BEGIN { if (v == "") print "-"; else printf "%.1f%%\n", v * 100 }'
}

# ratio A B: A / B as "1.23x", or "-".
ratio() {
	awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-";
		else printf "%.2fx\n", a / b }'
}

# decode NAME: sessions x 1000 / ITL p50, the decode rate without the prefill phases.
decode() {
	awk -v n="$(get "$1" clients)" -v i="$(get "$1" itl_p50_ms)" \
		'BEGIN { if (i != "" && i > 0) printf "%.1f\n", n * 1000 / i }'
}

status() {
	echo "  [$(($(date +%s) - t_start)) s so far; load average $(cut -d' ' -f1-3 /proc/loadavg)]"
}
