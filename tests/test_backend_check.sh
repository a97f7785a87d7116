#!/bin/sh
# test_backend_check.sh — a device backend is checked against the CPU before kvd uses it: on
# tests/cudasim's device (the CUDA backend's own code, run on the host) a sound backend passes;
# one with a kernel knocked out (KVD_CUDASIM_SKIP) or a model it cannot take makes
# backend = auto run on the CPU, with the very output the CPU backend gives, and backend = cuda
# refuse to start, naming what differed. Run from the repository root after `make test-build`.
set -u
B=${B:-build}
. "$(dirname "$0")/lib/harness.sh"

tmp=$(mktemp -d /tmp/kvd-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
model=${KVD_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
sim=$B/cudasim/kvd
prompt="The capital of France is"

if [ ! -x "$sim" ] || [ ! -r "$model" ]; then
	skipped "no $sim (make cudasim) or no model at $model (make model)"
	summary test_backend_check
	exit
fi

# gen OUT LOG KVD ARGS...: 8 greedy tokens of the prompt; the status is kvd's.
gen() {
	out=$1
	log=$2
	bin=$3
	shift 3
	"$bin" --config /dev/null --model "$model" --kv-blocks 64 -p "$prompt" -n 8 "$@" \
		>"$out" 2>"$log"
}

gen "$tmp/cpu.out" "$tmp/cpu.log" "$B/kvd" --backend cpu || bad "the CPU backend's generation"

# A sound device: checked, then used.
if gen "$tmp/ok.out" "$tmp/ok.log" "$sim" --backend cuda &&
	grep -q "cuda backend checked against the CPU" "$tmp/ok.log" &&
	grep -q ", 1 threads, cuda backend" "$tmp/ok.log"; then
	ok "a sound device passes and serves: $(grep -o 'checked against the CPU in.*' "$tmp/ok.log")"
else
	cat "$tmp/ok.log"
	bad "the simulated device's check or generation"
fi

# The norm kernel knocked out: layer 0's check names it.
if KVD_CUDASIM_SKIP=rmsnorm_kernel gen "$tmp/x.out" "$tmp/refuse.log" "$sim" --backend cuda; then
	bad "backend = cuda started on a device whose rmsnorm does nothing"
elif grep -q "check failed: rmsnorm (attn_norm) (layer 0, 3 rows) differs from the CPU backend" "$tmp/refuse.log" &&
	grep -q "Refusing to start" "$tmp/refuse.log"; then
	ok "backend = cuda refuses a broken rmsnorm, by name"
else
	cat "$tmp/refuse.log"
	bad "backend = cuda's refusal does not say why"
fi
if KVD_CUDASIM_SKIP=rmsnorm_kernel gen "$tmp/auto.out" "$tmp/auto.log" "$sim" &&
	grep -q "Running on the CPU instead" "$tmp/auto.log" &&
	grep -q "^kvd: cpu backend: auto, the cuda backend failed its check" "$tmp/auto.log" &&
	cmp -s "$tmp/auto.out" "$tmp/cpu.out"; then
	ok "backend = auto runs on the CPU instead, the CPU's output to the byte"
else
	cat "$tmp/auto.log"
	bad "backend = auto with a broken device"
fi

# Attention merged into nothing: layer 0 has no attention, the prompt's distributions catch it.
if KVD_CUDASIM_SKIP=attn_merge gen "$tmp/x.out" "$tmp/att.log" "$sim" --backend cuda; then
	bad "backend = cuda started on a device whose attention output is never written"
elif grep -q "next-token distributions of a .*-token prompt and 4 decode steps differ" "$tmp/att.log"; then
	ok "a broken attention is caught by the prompt's distributions: $(grep -o 'KL divergence mean [^;]*' "$tmp/att.log")"
else
	cat "$tmp/att.log"
	bad "a broken attention passed or failed without saying why"
fi

# A model whose head size the CUDA attention does not take (16): auto falls back, saying so.
tiny=tests/golden/arch/llama-q4_0.gguf
if "$sim" --config /dev/null --model "$tiny" -p hi -n 2 >/dev/null 2>"$tmp/tiny.log" &&
	grep -q "does not take this model's shapes). Running on the CPU instead" "$tmp/tiny.log"; then
	ok "a model the device cannot run falls back to the CPU: $(grep -o 'cuda: attention takes.*' "$tmp/tiny.log")"
else
	cat "$tmp/tiny.log"
	bad "a model with head size 16 on the CUDA backend"
fi

# no-backend-check: the device is used unchecked, and the log says so.
if KVD_CUDASIM_SKIP=rmsnorm_kernel gen "$tmp/x.out" "$tmp/nocheck.log" "$sim" --backend cuda --no-backend-check &&
	grep -q "not checked against the CPU (no-backend-check)" "$tmp/nocheck.log"; then
	ok "no-backend-check starts the device unchecked and says so"
else
	cat "$tmp/nocheck.log"
	bad "no-backend-check"
fi
# kvd's KLD harness on the CUDA backend: one chunk against an F32 base file, within 1.1x the CPU's.
if sh tests/lib/kld_vs_cpu.sh "$sim" 1 >"$tmp/kld.log" 2>&1; then
	ok "$(grep '^kld:' "$tmp/kld.log")"
else
	cat "$tmp/kld.log"
	bad "kvd --perplexity --backend cuda --kl-divergence against the CPU's"
fi
summary test_backend_check
