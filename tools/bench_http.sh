#!/bin/sh
# bench_http.sh — what kvhttp costs: 16 streaming chat clients through kvhttp (kvload) against the
# same load straight on the rings (kvbench), one daemon, runs interleaved, medians.
# Usage: tools/bench_http.sh (B=build dir, THREADS=2, MODEL=path, RUNS=5 pairs;
# KVD_BENCH_QUICK=1: 2 pairs, shorter outputs).
#
# The same load both ways: 16 clients, closed loop, prompts of the same length (kvload's chat
# messages are sized so that the template's tokens come to ~128; kvbench is then given the mean
# kvhttp reported), 128 output tokens with end-of-text ignored, greedy, nothing shared between
# prompts (kvload's cached_tokens is printed to show it). kvhttp's figures include everything on
# its path: HTTP, JSON, the chat template and tokenization in kvd, detokenization, SSE.
set -u
cd "$(dirname "$0")/.." || exit 1
WHO=bench_http
B=${B:-build}
NEED="$B/kvhttp $B/kvload"
. tools/bench_lib.sh

clients=16
words=57	# two messages of 57 words: 128 prompt tokens with SmolLM2's template
if [ $quick = 1 ]; then
	runs=${RUNS:-2} out=32
else
	runs=${RUNS:-5} out=128
fi
reqs=$((2 * clients))

echo "kvhttp vs the rings: $(nproc) cores, kvd -t $THREADS, $clients streaming clients, closed loop,"
echo "  $reqs requests a run, $out output tokens, $runs interleaved pairs of runs, medians$([ $quick = 1 ] && echo " [QUICK: indicative only]")"
status
start_daemon
"$B/kvhttp" --listen 127.0.0.1:0 --socket "$sock" >"$dir/http.log" 2>&1 &
bg=$!
wait_up "$bg" kvhttp "$dir/http.log" grep -q "serving on" "$dir/http.log"
url="http://$(sed -n 's/^kvhttp: serving on //p' "$dir/http.log")"

# load NAME [kvload options]: one kvload run, its JSON in $dir/NAME.json.
load() {
	name=$1
	shift
	if ! timeout -s INT -k 30 600 "$B/kvload" --url "$url" --json "$@" >"$dir/$name.json" \
		2>"$dir/$name.err"; then
		echo "$WHO: kvload $* failed:" >&2
		cat "$dir/$name.err" >&2
		tail -5 "$dir/kvd.log" "$dir/http.log" >&2
		exit 1
	fi
}

# Warm-up, both ways; it also measures the prompt length kvbench is to use.
load w_http --clients $clients --requests $clients --output-len 8 --words $words --seed 1
plen=$(awk -v p="$(get w_http prompt_len)" 'BEGIN { printf "%d\n", p + 0.5 }')
run w_ring 120 --clients $clients --requests $clients --prompt-len "$plen" --output-len 8 --seed 1
k=1
while [ $k -le "$runs" ]; do
	# Fresh seeds each run: no run finds an earlier one's prompts in the prefix cache.
	load "h$k" --clients $clients --requests $reqs --output-len $out --words $words --seed $((100 + k))
	run "r$k" 600 --clients $clients --requests $reqs --prompt-len "$plen" --output-len $out \
		--seed $((100 + k))
	# One client alone: TTFT without queueing behind other prompts, kvhttp's own latency.
	load "s$k" --clients 1 --requests $clients --output-len 8 --words $words --seed $((300 + k))
	run "q$k" 300 --clients 1 --requests $clients --prompt-len "$plen" --output-len 8 --seed $((300 + k))
	k=$((k + 1))
done

# median PREFIX FIELD: the median over runs PREFIX1..PREFIXruns.
median() {
	k=1
	while [ $k -le "$runs" ]; do
		get "$1$k" "$2"
		k=$((k + 1))
	done | sort -g | awk '{ v[NR] = $1 }
		END { if (NR % 2) printf "%.4f\n", v[(NR + 1) / 2]; else if (NR) printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo
echo "  prompt tokens: $(fmt "$(median h prompt_len)" %.1f) (kvhttp, mean of the chat template's), $plen (kvbench);"
echo "  prompt tokens kvhttp found cached, all runs: $(k=1; while [ $k -le "$runs" ]; do get h$k cached_tokens; k=$((k + 1)); done | awk '{ s += $1 } END { print s + 0 }')"
# table RINGS HTTP FIELDS...: one row per "field:label:format", rings vs kvhttp and the difference.
table() {
	r=$1
	h=$2
	shift 2
	for f in "$@"; do
		key=${f%%:*}
		rest=${f#*:}
		a=$(median "$r" "${key}")
		b=$(median "$h" "${key}")
		if [ "$key" = output_tok_s ]; then
			cost=$(awk -v a="$a" -v b="$b" 'BEGIN { if (a > 0) printf "%+.1f %%\n", (b - a) / a * 100 }')
		else
			cost=$(awk -v a="$a" -v b="$b" 'BEGIN { if (a != "" && b != "") printf "%+.2f ms\n", b - a }')
		fi
		printf '  %-26s %15s %15s %14s\n' "${rest%%:*}" "$(fmt "$a" "${rest#*:}")" "$(fmt "$b" "${rest#*:}")" \
			"${cost:--}"
	done
}
printf '\n  %-26s %15s %15s %14s\n' "median of $runs runs" "rings (kvbench)" "kvhttp (kvload)" "kvhttp's cost"
table r h "output_tok_s:$clients clients, output tok/s:%.1f" "ttft_p50_ms:$clients clients, TTFT p50 ms:%.2f" \
	"ttft_p99_ms:$clients clients, TTFT p99 ms:%.2f" "itl_p50_ms:$clients clients, ITL p50 ms:%.2f" \
	"itl_p99_ms:$clients clients, ITL p99 ms:%.2f"
table q s "ttft_p50_ms:1 client, TTFT p50 ms:%.2f" "ttft_p99_ms:1 client, TTFT p99 ms:%.2f" \
	"itl_p50_ms:1 client, ITL p50 ms:%.2f"
echo
echo "  each run ($clients-client tok/s and TTFT p50 ms, 1-client TTFT p50 ms), rings | kvhttp:"
k=1
while [ $k -le "$runs" ]; do
	printf '    %d: %8s %8s %7s | %8s %8s %7s\n' $k "$(fmt "$(get r$k output_tok_s)" %.1f)" \
		"$(fmt "$(get r$k ttft_p50_ms)" %.1f)" "$(fmt "$(get q$k ttft_p50_ms)" %.2f)" \
		"$(fmt "$(get h$k output_tok_s)" %.1f)" "$(fmt "$(get h$k ttft_p50_ms)" %.1f)" \
		"$(fmt "$(get s$k ttft_p50_ms)" %.2f)"
	k=$((k + 1))
done
status
