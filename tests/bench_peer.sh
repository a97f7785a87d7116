#!/bin/sh
# bench_peer.sh — kvd and llama.cpp side by side on one model, 2 threads, interleaved runs, medians and ratios.
#
# Five figures, each measured the same way on both engines, llama.cpp's
# tools (built by tests/peer/build.sh from the pinned llama-cpp-python sdist)
# against kvd's own benchmarks:
#   prefill pp512, decode tg128   llama-bench -p 512 -n 128 -r 5  vs  tests/bench_engine (5 runs)
#   aggregate decode, 16 streams  llama-batched-bench -npp 128 -ntg 128 -npl 16  vs  tests/bench_batch 16
#   serving, 16 clients 128/128   llama-server -np 16 + tests/peer/loadgen.py  vs  kvd + kvbench
#   mean KLD vs the F32 model     llama-perplexity --kl-divergence  vs  kvd --kl-divergence, one base
# Run i of a figure runs both engines back to back, llama.cpp first in odd runs
# and kvd first in even ones, so drifting load hits both alike; the table holds
# the medians (KLD is deterministic: one run each). Decode is also set against
# its roofline, the DRAM read bandwidth (tests/peer/membw) over the model's
# tensor bytes (tests/peer/gguf_bytes.py). Every command runs under timeout(1).
#
#   B=build PEER_BIN=DIR BENCH_PEER_QUICK=0|1 sh tests/bench_peer.sh   (make bench-peer [QUICK=1])
#
# Without PEER_BIN it builds the tools once (make peer) and fails if that fails.
# Writes the table to $B/bench/peer.txt (peer-quick.txt), each run's output to
# $B/bench/peer-raw/ (peer-quick-raw/).
set -u
cd "$(dirname "$0")/.." || exit 1
B=${B:-build}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
TEXT=${TEXT:-/usr/share/common-licenses/GPL-3}
THREADS=2
case ${BENCH_PEER_QUICK:-${QUICK:-0}} in
0 | "") quick=0 runs=5 reqs=2 name=peer ;;
*) quick=1 runs=3 reqs=1 name=peer-quick ;;
esac
out=$B/bench/$name.txt
raw=$B/bench/$name-raw
dir=$(mktemp -d) || exit 1
srv_pid=
t_start=$(date +%s)

cleanup() {
	stop_server
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
	echo "bench_peer: $*" >&2
	exit 1
}

# stop_server: the llama-server or kvd this script started, if one runs.
stop_server() {
	if [ -n "$srv_pid" ]; then
		kill -TERM "$srv_pid" 2>/dev/null
		wait "$srv_pid" 2>/dev/null
		srv_pid=
	fi
}

# peer_bin: $PEER_BIN, or the tools built once under $B/peer; dies when the build fails.
peer_bin() {
	if [ -n "${PEER_BIN:-}" ]; then
		[ -d "$PEER_BIN" ] || die "PEER_BIN=$PEER_BIN is not a directory"
		return 0
	fi
	[ -f "$B/peer/stamp" ] || echo "building llama.cpp's tools once under $B/peer (make peer:" \
		"about 15 minutes on 2 cores)" >&2
	sh tests/peer/build.sh "$B" >"$dir/peer-build.out" ||
		die "the llama.cpp build failed (sh tests/peer/build.sh $B); see $B/peer/*.log"
	PEER_BIN=$(tail -1 "$dir/peer-build.out")
}

# have TOOL...: true when every tool is there; else says which figure is skipped.
have() {
	for t in "$@"; do
		[ -x "$t" ] && continue
		echo "  skipped: $t is missing"
		return 1
	done
}

# ---- what the machine and the peer are ----

# peer_version: llama-cpp-python's version and the llama.cpp commit it vendors (its .git index).
peer_version() {
	pdir=$(dirname "$PEER_BIN")
	stamp=$(cut -d' ' -f1-3 "$pdir/stamp" 2>/dev/null)
	tarball=$(ls "$pdir"/dl/llama_cpp_python-*.tar.gz 2>/dev/null | head -1)
	commit=
	if [ -n "$tarball" ] && command -v git >/dev/null 2>&1; then
		top=$(basename "$tarball" .tar.gz)
		mkdir -p "$dir/sdist" &&
			tar -xzf "$tarball" -C "$dir/sdist" "$top/.git/index" "$top/.git/HEAD" 2>/dev/null &&
			mkdir -p "$dir/sdist/$top/.git/objects" "$dir/sdist/$top/.git/refs" &&
			commit=$(git --git-dir="$dir/sdist/$top/.git" --work-tree="$dir/sdist" \
				ls-files -s vendor/llama.cpp 2>/dev/null | cut -d' ' -f2)
	fi
	[ -n "$stamp" ] || stamp="tools in $PEER_BIN, not stamped by build.sh; sdist ${top:-unknown}"
	echo "$stamp, vendored llama.cpp ${commit:-commit unknown (no git, or no sdist beside the tools)}" |
		sed 's/llama.cpp \([0-9a-f]\{40\}\)/ggml-org\/llama.cpp@\1/'
}

header() {
	cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
	flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
		grep -xE 'avx2|fma|avx512f|avx512_vnni|avx_vnni|avx512_bf16' | tr '\n' ' ')
	l3=$(lscpu 2>/dev/null | sed -n "s/^L3 cache:[[:space:]]*\([^(]*[^ (]\).*/\1/p")
	if [ $quick = 1 ]; then
		echo "kvd vs llama.cpp, QUICK (medians of $runs, shorter runs: indicative only)"
	else
		echo "kvd vs llama.cpp (medians of $runs interleaved runs)"
	fi
	echo "$(date -u '+%Y-%m-%d %H:%M UTC'), kvd $(git describe --always --dirty 2>/dev/null || echo "no git")"
	echo "cpu: ${cpu:-unknown}, $(nproc) cores, L3 ${l3:-?}, ${flags:-no AVX2}"
	echo "peer: $(peer_version)"
	echo "model: $MODEL, $THREADS threads for both engines"
	echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
	if awk -v n="$(nproc)" '{ exit !($1 > n / 2) }' /proc/loadavg; then
		echo "note: the machine is busy: other processes compete for the cores, the figures are noisy"
	fi
}

# ---- runs and their figures ----

# bounded LOG LIMIT CMD...: CMD under timeout(1), stdout into LOG and stderr into LOG.err;
# its status, with a line saying why when it failed.
bounded() {
	log=$1
	lim=$2
	shift 2
	timeout -k 10 "$lim" "$@" >"$log" 2>"$log.err"
	rc=$?
	[ $rc -eq 0 ] || echo 1 >"$rcfile"
	if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
		echo "  $(basename "$log") timed out after $lim s: no more runs of $cur_fig on $cur_eng"
		: >"$raw/$cur_fig.$cur_eng.capped"
	elif [ $rc -ne 0 ]; then
		echo "  $(basename "$log") failed (status $rc); the end of its output ($log.err):"
		tail -5 "$log.err" | sed 's/^/    /'
	fi
	return $rc
}

# jget FILE FIELD [REGEX]: FIELD's number in the JSON lines of FILE that match REGEX.
jget() {
	sed -n "/${3:-.}/s/.*\"$2\": *\([-0-9.e+]*\).*/\1/p" "$1" | head -1
}

# record FIGURE ENGINE VALUE: one run's value (nothing when the run gave none).
record() {
	case $3 in
	"" | *[!0-9.e+-]*) echo "  no $1 figure from $2 in this run" ;;
	*) echo "$3" >>"$raw/$1.$2" ;;
	esac
}

# median FIGURE ENGINE: the median of the recorded runs ("" when none).
median() {
	[ -s "$raw/$1.$2" ] || return 0
	sort -g "$raw/$1.$2" | awk '{ v[NR] = $1 }
		END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# one FIGURE ENGINE RUN: run RUN of FIGURE on ENGINE (FIGURE_ENGINE), unless one timed out before:
# on a machine that slow, more runs would only take longer.
one() {
	cur_fig=$1
	cur_eng=$2
	[ -e "$raw/$1.$2.capped" ] || "$1_$2" "$3"
}

# interleave FIGURE: runs 1..$runs of FIGURE, both engines each time, the order alternating.
interleave() {
	i=1
	while [ $i -le $runs ]; do
		if [ $((i % 2)) = 1 ]; then
			one "$1" llama $i
			one "$1" kvd $i
		else
			one "$1" kvd $i
			one "$1" llama $i
		fi
		i=$((i + 1))
	done
}

# samples FILE REGEX: the median of the "samples_ts" list on the line of FILE matching REGEX.
samples() {
	sed -n "/$2/s/.*\"samples_ts\": *\[\([^]]*\)\].*/\1/p" "$1" | head -1 | tr ',' '\n' |
		sort -g | awk 'NF { v[++n] = $1 }
		END { if (n) print n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }'
}

# As bench_engine: $pp_reps repetitions of each test (its median), after a warm-up unless quick.
pptg_llama() {
	f=$raw/pptg-$1-llama.cpp
	bounded "$f" 300 "$PEER_BIN/llama-bench" -m "$MODEL" -p 512 -n 128 -t $THREADS -r $pp_reps \
		$pp_warm -o jsonl || return 0
	record pp512 llama "$(samples "$f" '"n_prompt": 512, "n_gen": 0,')"
	record tg128 llama "$(samples "$f" '"n_prompt": 0, "n_gen": 128,')"
}

# bench_engine: pp512, then tg128 from an empty cache; the median of 5 runs after a warm-up
# one (quick: one run).
pptg_kvd() {
	f=$raw/pptg-$1-kvd
	bounded "$f" 300 env KVD_BENCH_QUICK=$quick KVD_MODEL="$MODEL" "$B/tests/bench_engine" || return 0
	record pp512 kvd "$(awk -F'|' '/\(pp512\)/ { print $3 + 0 }' "$f")"
	record tg128 kvd "$(awk -F'|' '/\(tg128\)/ { print $3 + 0 }' "$f")"
}

batch_llama() {
	f=$raw/batch16-$1-llama.cpp
	bounded "$f" 300 "$PEER_BIN/llama-batched-bench" -m "$MODEL" -c 4096 -b 2048 -ub 512 \
		-npp 128 -ntg $ntg -npl 16 -t $THREADS --output-format jsonl || return 0
	# Its table goes through llama.cpp's log, stdout or stderr by build: look in both.
	cat "$f" "$f.err" | grep '"speed_tg"' >"$f.jsonl"
	record batch16 llama "$(jget "$f.jsonl" speed_tg)"
}

# bench_batch 16: 16 sequences of 128-token prompts, then steps decoding all 16 at once.
batch_kvd() {
	f=$raw/batch16-$1-kvd
	bounded "$f" 300 env KVD_BENCH_QUICK=$quick KVD_BENCH_THREADS=$THREADS KVD_MODEL="$MODEL" \
		"$B/tests/bench_batch" 16 || return 0
	record batch16 kvd "$(awk -F'|' '$2 + 0 == 16 { print $3 + 0 }' "$f")"
}

# free_port: a TCP port nobody listens on now.
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

serve_llama() {
	f=$raw/serve16-$1-llama.cpp
	port=$(free_port)
	timeout -k 10 600 "$PEER_BIN/llama-server" -m "$MODEL" -np 16 -c 4096 -t $THREADS \
		--host 127.0.0.1 --port "$port" --no-webui >"$f.server" 2>&1 &
	srv_pid=$!
	if ! python3 tests/peer/loadgen.py --port "$port" --wait 120; then
		echo "  llama-server did not come up (no more runs of it); the end of its log ($f.server):"
		tail -5 "$f.server" | sed 's/^/    /'
		echo 1 >"$rcfile"
		: >"$raw/serve.llama.capped"
		stop_server
		return 0
	fi
	bounded "$f" 240 python3 tests/peer/loadgen.py --port "$port" --clients 16 --requests $reqs \
		--prompt-len 128 --output-len 128 --text "$TEXT" &&
		record serve16 llama "$(jget "$f" output_tok_s)"
	stop_server
}

serve_kvd() {
	f=$raw/serve16-$1-kvd
	sock=$dir/kvd.sock
	rm -f "$sock"
	timeout -k 10 600 "$B/kvd" --model "$MODEL" --socket "$sock" -t $THREADS >"$f.server" 2>&1 &
	srv_pid=$!
	n=0
	until "$B/kvctl" --socket "$sock" info >/dev/null 2>&1; do
		n=$((n + 1))
		if [ $n -gt 600 ] || ! kill -0 "$srv_pid" 2>/dev/null; then
			echo "  kvd did not come up (no more runs of it); the end of its log ($f.server):"
			tail -5 "$f.server" | sed 's/^/    /'
			echo 1 >"$rcfile"
			: >"$raw/serve.kvd.capped"
			stop_server
			return 0
		fi
		sleep 0.2
	done
	# A short warm-up request, as loadgen.py sends llama-server one.
	bounded "$f.warmup" 120 "$B/kvbench" --socket "$sock" --json --clients 1 --requests 1 \
		--prompt-len 128 --output-len 8 --seed 1 &&
		bounded "$f" 240 "$B/kvbench" --socket "$sock" --json --clients 16 \
			--requests $((16 * reqs)) --prompt-len 128 --output-len 128 --seed $((100 + $1)) &&
		record serve16 kvd "$(sed -n 's/.*"output_tok_s":\([-0-9.e+]*\)[,}].*/\1/p' "$f")"
	stop_server
}

# kld: llama-perplexity writes the base from the F32 model once (cached beside the build), then
# both engines score the model against it. Deterministic at a fixed thread count: one run each.
kld() {
	f32=$B/peer/smol-f32.gguf
	base=$B/peer/f32.kld
	mkdir -p "$B/peer" || return 0
	if [ ! -s "$base" ] || [ -n "$(find -H "$MODEL" "$PEER_BIN/llama-perplexity" -newer "$base")" ]; then
		rm -f "$base"
		echo "  writing the F32 base $base (once)"
		cur_fig=kld cur_eng=llama
		bounded "$raw/kld-quantize" 300 "$PEER_BIN/llama-quantize" --allow-requantize "$MODEL" \
			"$f32" F32 || return 0
		bounded "$raw/kld-base" 900 "$PEER_BIN/llama-perplexity" -m "$f32" -f "$TEXT" -c 512 \
			--chunks 4 -t $THREADS --kl-divergence-base "$base" ||
			{ rm -f "$base"; return 0; }
	fi
	cur_fig=kld cur_eng=llama
	bounded "$raw/kld-llama.cpp" 300 "$PEER_BIN/llama-perplexity" -m "$MODEL" -c 512 -t $THREADS \
		--kl-divergence-base "$base" --kl-divergence &&
		record kld llama "$(awk '/^Mean +KLD:/ { print $3; exit }' "$raw/kld-llama.cpp")"
	cur_fig=kld cur_eng=kvd
	bounded "$raw/kld-kvd" 300 "$B/kvd" --model "$MODEL" -t $THREADS --kl-divergence-base "$base" \
		--kl-divergence && record kld kvd "$(awk '/^Mean +KLD:/ { print $3; exit }' "$raw/kld-kvd")"
}

# roofline: the DRAM read bandwidth and the model's tensor bytes, for the decode table.
roofline() {
	cur_fig=membw cur_eng=probe
	bounded "$raw/membw" 120 "$B/tests/peer/membw" $membw_mib $THREADS $membw_passes || return 0
	bw=$(sed -n 's/^read_GBps //p' "$raw/membw")
	wbytes=$(python3 tests/peer/gguf_bytes.py "$MODEL" | sed -n 's/^tensor_bytes //p')
	sed -n 's/^DRAM/  DRAM/p' "$raw/membw"
	echo "  $MODEL: $wbytes bytes of tensors, all read once per decoded token"
}

# ---- the table ----

# runs FIGURE ENGINE: how many runs gave FIGURE, with "*" when one of its group timed out.
runs_of() {
	n=$(cat "$raw/$1.$2" 2>/dev/null | wc -l)
	[ -e "$raw/$3.$2.capped" ] && n="$n*"
	echo "$n"
}

# row LABEL FIGURE GROUP TARGET-OP TARGET FORMAT: medians, kvd/llama.cpp and whether it meets
# the target; GROUP is the runs' name (one), for their time-outs.
row() {
	l=$(median "$2" llama)
	k=$(median "$2" kvd)
	awk -v lab="$1" -v l="$l" -v k="$k" -v op="$4" -v t="$5" -v fmt="$6" \
		-v n="$(runs_of "$2" llama "$3")/$(runs_of "$2" kvd "$3")" 'BEGIN {
		r = (l != "" && k != "" && l > 0) ? k / l : ""
		met = r == "" ? "-" : (op == ">=" ? (r >= t ? "yes" : "no") : (r <= t ? "yes" : "no"))
		printf "| %-38s | %10s | %10s | %13s | %8s | %-3s | %5s |\n", lab,
			l == "" ? "-" : sprintf(fmt, l), k == "" ? "-" : sprintf(fmt, k),
			r == "" ? "-" : sprintf("%.2fx", r), op " " t "x", met, n }'
}

table() {
	echo "| figure (median)                        |  llama.cpp |        kvd | kvd/llama.cpp |   target | met |  runs |"
	echo "|----------------------------------------|------------|------------|---------------|----------|-----|-------|"
	row "prefill pp512, tok/s" pp512 pptg ">=" 3 %.1f
	row "decode tg128, 1 stream, tok/s" tg128 pptg ">=" 1.35 %.1f
	row "aggregate decode, 16 streams, tok/s" batch16 batch ">=" 5 %.1f
	row "serving 16 clients 128/128, out tok/s" serve16 serve ">=" 5 %.1f
	row "mean KLD vs F32 (lower is better)" kld kld "<=" 1.10 %.6f
	if [ -n "${bw:-}" ] && [ -n "${wbytes:-}" ]; then
		awk -v bw="$bw" -v w="$wbytes" -v l="$(median tg128 llama)" -v k="$(median tg128 kvd)" 'BEGIN {
			roof = bw * 1e9 / w
			printf "decode roofline: %.2f GB/s DRAM read / %.1f MB of weights per token = %.1f tok/s;", bw, w / 1e6, roof
			printf " tg128 llama.cpp %s, kvd %s of it\n", l == "" ? "-" : sprintf("%.0f%%", 100 * l / roof),
				k == "" ? "-" : sprintf("%.0f%%", 100 * k / roof) }'
		echo "  (above 100%: part of the weights stays in the ${l3:-} L3 between tokens, or the probe saw a loaded machine)"
	fi
	echo "runs: llama.cpp/kvd runs that gave a figure (*: one timed out, the rest skipped). pp512/tg128:"
	echo "  each run the median of $pp_reps repetition(s)$([ $quick = 1 ] || echo " after a warm-up"), llama-bench -r $pp_reps vs bench_engine;"
	echo "  16 streams: llama-batched-bench S_TG over $ntg steps vs"
	echo "  bench_batch 16 ($kvd_steps steps, median of its $kvd_batch_runs); serving: $reqs request(s) per client;"
	echo "  KV memory: llama.cpp clears its cache when it makes it; bench_engine and bench_batch commit"
	echo "  kvd's pool before timing to match; the kvd daemon commits pages as blocks are first written"
	echo "  (unless --kv-prefault);"
	echo "  KLD: $TEXT, 4 chunks of 512, base from the F32 model via llama-perplexity"
}

# ---- all of it ----

status() {
	echo "  [$(($(date +%s) - t_start)) s so far; load average $(cut -d' ' -f1-3 /proc/loadavg)]"
}

all() {
	header
	echo
	echo "=== decode roofline: DRAM read bandwidth ($THREADS threads) and the model's bytes"
	have "$B/tests/peer/membw" && roofline
	echo "=== prefill pp512 and decode tg128: llama-bench vs bench_engine, $runs runs"
	have "$PEER_BIN/llama-bench" "$B/tests/bench_engine" && interleave pptg
	status
	echo "=== aggregate decode, 16 streams of 128-token contexts: llama-batched-bench vs bench_batch, $runs runs"
	have "$PEER_BIN/llama-batched-bench" "$B/tests/bench_batch" && interleave batch
	status
	echo "=== serving, 16 clients, 128-token prompts, 128 out: llama-server + loadgen.py vs kvd + kvbench, $runs runs"
	have "$PEER_BIN/llama-server" "$B/kvd" "$B/kvctl" "$B/kvbench" && interleave serve
	status
	echo "=== mean KLD of the model vs its F32 version: llama-perplexity vs kvd --kl-divergence"
	have "$PEER_BIN/llama-quantize" "$PEER_BIN/llama-perplexity" "$B/kvd" && kld
	status
	echo
	table
	echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); all parts: $(($(date +%s) - t_start)) s"
}

if [ $quick = 1 ]; then
	ntg=16 kvd_steps=16 kvd_batch_runs=1 membw_mib=512 membw_passes=9 pp_reps=1 pp_warm=--no-warmup
else
	ntg=128 kvd_steps=64 kvd_batch_runs=3 membw_mib=1024 membw_passes=15 pp_reps=5 pp_warm=
fi
[ -f "$MODEL" ] || die "$MODEL is missing (make model)"
peer_bin
rm -rf "$raw"
mkdir -p "$raw" || exit 1
rcfile=$dir/failed
all 2>&1 | tee "$out"
echo "table: $out; every run's output: $raw/"
[ -s "$rcfile" ] && exit 1
exit 0
