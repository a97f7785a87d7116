#!/bin/sh
# bench_serve.sh — kvd serving benchmarks with kvbench against a private daemon: decode
# throughput vs sessions, inter-token latency under arriving prompts, prefix-cache TTFT.
# Usage: tools/bench_serve.sh (B=build dir, THREADS=2, MODEL=path to override;
# KVD_BENCH_QUICK=1, from `make bench QUICK=1`: fewer sessions, shorter outputs, lower caps).
# Request counts are cut and every run is capped so the suite fits ~10 minutes on 2 cores
# (about 3 in quick mode); the output says where.
set -u
cd "$(dirname "$0")/.." || exit 1
WHO=bench_serve
. tools/bench_lib.sh

if [ $quick = 1 ]; then
	echo "kvd serving benchmarks: $(nproc) cores, kvd -t $THREADS [QUICK: fewer sessions, shorter"
	echo "  outputs, lower caps; indicative only]"
else
	echo "kvd serving benchmarks: $(nproc) cores, kvd -t $THREADS"
fi
status
if awk -v n="$(nproc)" '{ exit !($1 > n / 2) }' /proc/loadavg; then
	echo "  note: the machine is busy before we start: other processes will compete with kvd"
	echo "  for the cores, and the numbers below will be noisy"
fi
start_daemon
"$B/kvctl" --socket "$sock" info |
	sed -n 's/^\(model\|backend\|kv_blocks_total\|kv_block_tokens\) */  \1: /p'
note="  * hit its time cap: stopped by SIGINT, in-flight requests cancelled, their tokens counted"
echo

# ---------------------------------------------------------------------------
if [ $quick = 1 ]; then
	a_sessions="1 4 16" a_per=1 a_out=32 a_caps="15/20/30"
else
	a_sessions="1 4 16 64" a_per=2 a_out=128 a_caps="30/40/60/90"
fi
echo "(a) aggregate decode throughput vs concurrent sessions"
echo "    closed loop, 128-token prompts, $a_out output tokens, $a_per request(s) per session; runs"
echo "    capped at $a_caps s. decode tok/s = sessions x 1000 / ITL p50 (no prefill)"
for n in $a_sessions; do
	case $quick:$n in
	0:1) cap=30 ;; 0:4) cap=40 ;; 0:16) cap=60 ;; 0:*) cap=90 ;;
	1:1) cap=15 ;; 1:4) cap=20 ;; 1:*) cap=30 ;;
	esac
	run "a$n" $cap --clients $n --requests $((a_per * n)) --prompt-len 128 --output-len $a_out \
		--seed $((100 + n))
done
printf '\n  %8s %9s %12s %12s %12s %11s %11s %8s\n' sessions requests "output tok/s" \
	"decode tok/s" "TTFT p50 ms" "ITL p50 ms" "ITL p99 ms" "KV peak"
for n in $a_sessions; do
	printf '  %8s %9s %12s %12s %12s %11s %11s %8s\n' $n "$(get a$n requests)$(capped a$n)" \
		"$(fmt "$(get a$n output_tok_s)" %.1f)" "$(fmt "$(decode a$n)" %.1f)" \
		"$(ttft a$n ttft_p50_ms)" "$(fmt "$(get a$n itl_p50_ms)" %.2f)" \
		"$(fmt "$(get a$n itl_p99_ms)" %.2f)" "$(percent "$(get a$n kv_peak)")"
done
printf '\n  %-10s %14s %14s\n' "ratio" "output tok/s" "decode tok/s"
printf '  %-10s %14s %14s\n' "16 vs 1" "$(ratio "$(get a16 output_tok_s)" "$(get a1 output_tok_s)")" \
	"$(ratio "$(decode a16)" "$(decode a1)")"
if [ $quick = 0 ]; then
	printf '  %-10s %14s %14s\n' "64 vs 16" "$(ratio "$(get a64 output_tok_s)" "$(get a16 output_tok_s)")" \
		"$(ratio "$(decode a64)" "$(decode a16)")"
fi
ls "$dir"/a*.capped >/dev/null 2>&1 && echo "$note"
status
echo

# ---------------------------------------------------------------------------
rate=0.5
if [ $quick = 1 ]; then
	b_out=64 b_cap=20 b_cap_load=30
else
	b_out=256 b_cap=45 b_cap_load=60
fi
echo "(b) inter-token latency of 8 decoding sessions while 512-token prompts arrive"
echo "    8 clients, 32-token prompts, $b_out output tokens, one request each (capped at $b_cap s,"
echo "    $b_cap_load s under load); the load: a second kvbench, 2 clients, Poisson $rate prompts/s"
echo "    of 512-token prompts with 1 output token, stopped when the 8 decoders are done"
run b_alone $b_cap --clients 8 --requests 8 --prompt-len 32 --output-len $b_out --seed 200
"$KVBENCH" --socket "$sock" --json --clients 2 --rate $rate --duration 3600 --prompt-len 512 \
	--output-len 1 --seed 201 >"$dir/b_bg.json" 2>"$dir/b_bg.err" &
bg=$!
run b_load $b_cap_load --clients 8 --requests 8 --prompt-len 32 --output-len $b_out --seed 202
kill -TERM "$bg" 2>/dev/null	# it stops, cancels the prompt in flight and reports
wait "$bg"
bg=
sed 's/^/  b_bg: /' "$dir/b_bg.err" >&2
printf '\n  %-26s %11s %11s %10s %9s %12s\n' "" "ITL p50 ms" "ITL p99 ms" "p99/p50" "tok/s" \
	"TTFT p50 ms"
for c in "b_alone:8 decoders alone" "b_load:8 decoders + prompts"; do
	n=${c%%:*}
	printf '  %-26s %11s %11s %10s %9s %12s\n' "${c#*:}$(capped "$n")" \
		"$(fmt "$(get "$n" itl_p50_ms)" %.2f)" "$(fmt "$(get "$n" itl_p99_ms)" %.2f)" \
		"$(ratio "$(get "$n" itl_p99_ms)" "$(get "$n" itl_p50_ms)")" \
		"$(fmt "$(get "$n" output_tok_s)" %.1f)" "$(fmt "$(get "$n" ttft_p50_ms)" %.1f)"
done
printf '  %-26s %s done while the decoders ran, TTFT p50 %s ms, p99 %s ms\n' \
	"512-token prompts" "$(get b_bg requests)" "$(fmt "$(get b_bg ttft_p50_ms)" %.1f)" \
	"$(fmt "$(get b_bg ttft_p99_ms)" %.1f)"
printf '  %-26s %s\n' "ITL p99 load / alone" \
	"$(ratio "$(get b_load itl_p99_ms)" "$(get b_alone itl_p99_ms)")"
ls "$dir"/b*.capped >/dev/null 2>&1 && echo "$note"
stop_daemon
status
echo

# ---------------------------------------------------------------------------
if [ $quick = 1 ]; then
	c_n=8 c_out=8 c_cap_cold=20 c_cap_warm=15 c_cap_off=30
else
	c_n=32 c_out=16 c_cap_cold=50 c_cap_warm=40 c_cap_off=90
fi
echo "(c) TTFT of $c_n clients sharing a 512-token system prompt"
echo "    one request each, all at once: 512 shared + 64 own prompt tokens, $c_out output tokens;"
echo "    a fresh daemon per case; cold: nothing cached yet; warm: one request with the"
echo "    system prompt ran first; runs capped at $c_cap_cold (cold), $c_cap_warm (warm) and $c_cap_off s (disabled)"
c_opts="--clients $c_n --requests $c_n --prompt-len 576 --output-len $c_out --seed 300"
warm="--clients 1 --requests 1 --prompt-len 576 --output-len 1 --shared-prefix 512 --seed 300"
if "$KVD" --help 2>&1 | grep -q -- --no-prefix-cache; then
	on=
	off_opts="--shared-prefix 512"
	off_kvd=--no-prefix-cache
	off="kvd --no-prefix-cache"
else
	echo "    note: this kvd has no --no-prefix-cache yet. The cached cases run kvd --prefix-global;"
	echo "    'disabled' runs the same load with nothing shared (576 unique tokens per prompt),"
	echo "    which computes every prompt token as a disabled cache would."
	on=--prefix-global
	off_opts="--shared-prefix 0"
	off_kvd=--prefix-global
	off="nothing shared"
fi
start_daemon $on
run c_cold $c_cap_cold $c_opts --shared-prefix 512
stop_daemon
start_daemon $on
run c_warmup 30 $warm
run c_warm $c_cap_warm $c_opts --shared-prefix 512
stop_daemon
start_daemon $off_kvd
run c_off $c_cap_off $c_opts $off_opts
stop_daemon
printf '\n  %-32s %12s %12s %12s %9s\n' "" "TTFT p50 ms" "TTFT p99 ms" "prefix hits" "tok/s"
for c in "c_cold:prefix cache, cold" "c_warm:prefix cache, warm" "c_off:disabled ($off)"; do
	n=${c%%:*}
	printf '  %-32s %12s %12s %12s %9s\n' "${c#*:}$(capped "$n")" \
		"$(ttft "$n" ttft_p50_ms)" "$(ttft "$n" ttft_p99_ms)" \
		"$(percent "$(get "$n" prefix_hit_rate)")" "$(fmt "$(get "$n" output_tok_s)" %.1f)"
done
printf '  %-32s %12s\n' "TTFT p50 disabled / warm" \
	"$(ratio "$(get c_off ttft_p50_ms)" "$(get c_warm ttft_p50_ms)")"
printf '  %-32s %12s\n' "TTFT p50 disabled / cold" \
	"$(ratio "$(get c_off ttft_p50_ms)" "$(get c_cold ttft_p50_ms)")"
ls "$dir"/c*.capped >/dev/null 2>&1 && echo "$note"
status
