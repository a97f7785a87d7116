#!/bin/sh
# kld_vs_cpu.sh — kvd's KLD harness on the CUDA backend against the CPU backend's, the way
# llama-perplexity judges a quantisation: an F32 base file written by the ref backend (weights
# dequantized to f32, every sum in f64) over the GPL's text, then `--kl-divergence` against it on
# the CPU and on the CUDA backend; the CUDA backend's mean KLD must be within 1.1x the CPU's.
# Usage: sh tests/lib/kld_vs_cpu.sh KVD_WITH_CUDA [CHUNKS] (from the repository root; the
# ref and CPU runs use $B/kvd). Prints both figures; exits 1 when the CUDA backend's is over.
set -u
B=${B:-build}
cuda_kvd=$1
chunks=${2:-4}
model=${KVD_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
text=/usr/share/common-licenses/GPL-3
tmp=$(mktemp -d /tmp/kvd-kld.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
run() {
	"$@" --config /dev/null --model "$model" --perplexity "$text" --ctx 256 --chunks "$chunks" \
		--kl-divergence-base "$tmp/base.kld"
}
mean() { sed -n 's/^Mean    KLD: *\([0-9.e+-]*\).*/\1/p' "$1"; }
same() { sed -n 's/^Same top p: *\([0-9.]*\).*/\1/p' "$1"; }
if ! run "$B/kvd" --backend ref >"$tmp/ref.log" 2>&1; then
	cat "$tmp/ref.log"
	echo "kld: the ref backend's base file failed"
	exit 1
fi
for b in cpu cuda; do
	bin=$B/kvd
	[ "$b" = cuda ] && bin=$cuda_kvd
	if ! run "$bin" --backend "$b" --kl-divergence >"$tmp/$b.log" 2>&1 || [ -z "$(mean "$tmp/$b.log")" ]; then
		cat "$tmp/$b.log"
		echo "kld: the $b backend's --kl-divergence run failed"
		exit 1
	fi
done
c=$(mean "$tmp/cpu.log")
g=$(mean "$tmp/cuda.log")
echo "kld: $chunks chunks of 256 tokens against the ref backend's F32 base: mean KLD cpu $c, cuda $g (limit $(awk "BEGIN { print $c * 1.1 }")); same top p cpu $(same "$tmp/cpu.log") %, cuda $(same "$tmp/cuda.log") %"
awk "BEGIN { exit !($g <= $c * 1.1) }"
