#!/bin/sh
# test_packaging.sh — one kvd binary for machines with and without CUDA: kvd and the tools link
# no CUDA library and carry no RUNPATH into CUDA; kvd finds libkvd-cuda.so beside itself or in
# ../lib/kvd, refuses a stale or broken one by name and then serves on the CPU, and fails
# clearly when --backend=cuda cannot be had. Run from the repository root after `make`.
set -u
B=${B:-build}
. "$(dirname "$0")/lib/harness.sh"

tmp=$(mktemp -d /tmp/kvd-packaging.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
model=${KVD_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
so=$B/libkvd-cuda.so

# ---- what the programs link ----
if have readelf; then
	for f in "$B/kvd" "$B/kvctl" "$B/kvtop" "$B/kvbench" "$B/kvhttp" "$B/kvc_example" "$B/libkvclient.so.2"; do
		[ -e "$f" ] || continue
		dyn=$(readelf -d "$f")
		needed=$(echo "$dyn" | grep NEEDED | grep -E 'libcuda|libcublas|libkvd-cuda' | tr -s ' ')
		runpath=$(echo "$dyn" | grep -E 'RUNPATH|RPATH' | grep -i cuda | tr -s ' ')
		if [ -z "$needed" ] && [ -z "$runpath" ]; then
			ok "$(basename "$f"): no CUDA library NEEDED, no RUNPATH into CUDA"
		else
			bad "$(basename "$f") links CUDA:$needed$runpath"
		fi
	done
else
	skipped "what the programs link: readelf is not installed (package binutils)"
fi

# kvd_run LOG ARGS...: a two-token generation from the default model; the status is kvd's.
kvd_run() {
	log=$1
	shift
	"$@" --config /dev/null --model "$model" --kv-blocks 64 -p "The capital of France is" -n 2 \
		>"$log" 2>&1
}
# The line that says which backend kvd took and why.
backend_line() { grep -E '^kvd: (cpu|cuda) backend: ' "$1"; }

if [ ! -r "$model" ]; then
	skipped "kvd's choice of backend: no model at $model (make model)"
	summary test_packaging
	exit
fi
if [ ! -e "$so" ]; then
	if kvd_run "$tmp/nocuda.log" "$B/kvd" && backend_line "$tmp/nocuda.log" | grep -q "built without CUDA"; then
		ok "kvd built without CUDA serves on the CPU: $(backend_line "$tmp/nocuda.log")"
	else
		cat "$tmp/nocuda.log"
		bad "kvd built without CUDA on the CPU"
	fi
	skipped "loading libkvd-cuda.so: $so was not built (CUDA=0, or no nvcc on PATH at build time)"
	summary test_packaging
	exit
fi

# ---- the object itself ----
# It names cudart and cuBLAS, the loader finds both from the object alone
# (through its RUNPATH, or the system's own directories where the toolkit
# lives there), and it exports the entry point and nothing else.
if have readelf && have nm && have ldd; then
	dyn=$(readelf -d "$so")
	exports=$(nm -D --defined-only "$so" | awk '$2 != "A" { print $3 }')
	resolved=$(env -u LD_LIBRARY_PATH ldd "$so" 2>&1)
	why=""
	for lib in libcudart libcublas; do
		echo "$dyn" | grep NEEDED | grep -q "$lib" || why="$why; does not name $lib"
		echo "$resolved" | grep "$lib" | grep -q "not found" && why="$why; $lib not found from the object"
	done
	[ "$exports" = "kvd_cuda_backend_v2@@KVD_CUDA_2" ] || why="$why; exports '$exports'"
	if [ -z "$why" ]; then
		runpath=$(echo "$dyn" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
		ok "libkvd-cuda.so finds cudart and cuBLAS (RUNPATH '${runpath:-none}') and exports $exports alone"
	else
		echo "$dyn" | grep -E 'NEEDED|RPATH|RUNPATH'
		echo "$resolved"
		bad "libkvd-cuda.so: not as expected${why}"
	fi
fi

# ---- found in the tree and in an installed layout ----
abs_so=$(cd "$B" && pwd -P)/libkvd-cuda.so
if kvd_run "$tmp/tree.log" "$B/kvd" && line=$(backend_line "$tmp/tree.log") &&
	! echo "$line" | grep -q "not loadable" && echo "$line" | grep -qF "$abs_so"; then
	# Without a device the object says so, in words apart from "not loadable".
	ok "build/kvd loads the object beside it: $line"
else
	cat "$tmp/tree.log"
	bad "build/kvd does not load $abs_so"
fi
mkdir -p "$tmp/root/usr/bin" "$tmp/root/usr/lib/kvd"
cp "$B/kvd" "$tmp/root/usr/bin/"
cp "$so" "$tmp/root/usr/lib/kvd/"
if kvd_run "$tmp/inst.log" "$tmp/root/usr/bin/kvd" &&
	backend_line "$tmp/inst.log" | grep -qF "($(cd "$tmp/root/usr/lib/kvd" && pwd -P)/libkvd-cuda.so"; then
	ok "an installed kvd loads PREFIX/lib/kvd/libkvd-cuda.so, wherever the tree is"
else
	cat "$tmp/inst.log"
	bad "an installed kvd does not find ../lib/kvd/libkvd-cuda.so"
fi

# ---- no object: the CPU, with the reason ----
mkdir -p "$tmp/empty"
want="cpu backend: auto, CUDA backend not loadable: no libkvd-cuda.so in $tmp/empty (KVD_BACKEND_DIR)"
if KVD_BACKEND_DIR=$tmp/empty kvd_run "$tmp/empty.log" "$B/kvd" && grep -qF "kvd: $want" "$tmp/empty.log" &&
	grep -q "decode 2 tokens" "$tmp/empty.log"; then
	ok "KVD_BACKEND_DIR without the object: served on the CPU, '$want'"
else
	cat "$tmp/empty.log"
	bad "KVD_BACKEND_DIR without the object"
fi
# A directory too long to name whole is not searched at all: cut, its path would name another
# one. Its first 511 characters are a real directory that holds the object, so a cut search loads it.
long=$tmp/long
while [ ${#long} -lt 520 ]; do long=$long/dddddddddddddddddddddddddddddd; done
cut=$(printf '%.511s' "$long")
cut=${cut%/}
if mkdir -p "$cut" && cp "$so" "$cut/"; then
	want="cpu backend: auto, CUDA backend not loadable: no libkvd-cuda.so in $(printf '%.64s' "$long")... (not searched: ${#long} characters, kvd searches up to 511) (KVD_BACKEND_DIR)"
	if KVD_BACKEND_DIR=$long kvd_run "$tmp/long.log" "$B/kvd" && grep -qF "kvd: $want" "$tmp/long.log"; then
		ok "an over-long KVD_BACKEND_DIR is not searched, and the log says why"
	else
		cat "$tmp/long.log"
		bad "an over-long KVD_BACKEND_DIR: wanted '$want'"
	fi
else
	bad "could not make $cut"
fi
# The same for a binary in a directory short enough to search, but too long for its ../lib/kvd.
far=$tmp/far
while [ ${#far} -lt 505 ]; do far=$far/d; done
cut=$(printf '%.496s' "$far")
if [ -e /usr/local/lib/kvd/libkvd-cuda.so ] || [ -e /usr/lib/kvd/libkvd-cuda.so ]; then
	skipped "a binary too deep for its ../lib/kvd: one is installed on this machine and would be found"
elif mkdir -p "$far" "$cut/../lib/kvd" && cp "$B/kvd" "$far/" && cp "$so" "$cut/../lib/kvd/"; then
	want="CUDA backend not loadable: no libkvd-cuda.so in $(printf '%.64s' "$far")...$(printf '%s' "$far" | tail -c 48), $(printf '%.64s' "$far")... (not searched: $((${#far} + 11)) characters, kvd searches up to 511), "
	if kvd_run "$tmp/far.log" "$far/kvd" && backend_line "$tmp/far.log" | grep -qF "$want"; then
		ok "a binary too deep for its ../lib/kvd does not search it, and the log says why"
	else
		cat "$tmp/far.log"
		bad "a binary too deep for its ../lib/kvd: wanted '$want'"
	fi
else
	bad "could not make $far"
fi
rm "$tmp/root/usr/lib/kvd/libkvd-cuda.so"
if [ -e /usr/local/lib/kvd/libkvd-cuda.so ] || [ -e /usr/lib/kvd/libkvd-cuda.so ]; then
	skipped "kvd moved away from its object: one is installed on this machine and would be found"
elif kvd_run "$tmp/moved.log" "$tmp/root/usr/bin/kvd" &&
	backend_line "$tmp/moved.log" | grep -qF "CUDA backend not loadable: no libkvd-cuda.so in $tmp/root/usr/bin, $tmp/root/usr/bin/../lib/kvd, "; then
	ok "kvd moved away from its object serves on the CPU and names the directories it searched"
else
	cat "$tmp/moved.log"
	bad "kvd moved away from its object"
fi
want="cuda backend: requested, but it cannot start: CUDA backend not loadable: no libkvd-cuda.so in $tmp/empty"
if ! KVD_BACKEND_DIR=$tmp/empty kvd_run "$tmp/req.log" "$B/kvd" --backend cuda &&
	grep -qF "kvd: $want" "$tmp/req.log"; then
	ok "--backend cuda without the object fails: '$want'"
else
	cat "$tmp/req.log"
	bad "--backend cuda without the object"
fi

# ---- objects kvd must refuse, each by name: a missing dependency, a stale entry point, a stale ABI ----
if have cc; then
	mkdir -p "$tmp/nodep" "$tmp/stale" "$tmp/abi"
	echo 'int kvd_missing_dep(void) { return 0; }' >"$tmp/dep.c"
	echo 'int kvd_missing_dep(void); int kvd_cuda_backend_v2(void) { return kvd_missing_dep(); }' >"$tmp/nodep.c"
	echo 'int kvd_cuda_backend_v1(void) { return 0; }' >"$tmp/stale.c"
	cat >"$tmp/abi.c" <<'EOF'
#include "kernels/backend.h"
static const struct kb_cuda_api api = { .abi = KB_CUDA_ABI + 1, .ops_size = sizeof(struct backend_ops) };
const struct kb_cuda_api *KB_CUDA_ENTRY(void) { return &api; }
EOF
	if cc -shared -fPIC -o "$tmp/libkvd-missing-dep.so" "$tmp/dep.c" &&
		cc -shared -fPIC -o "$tmp/nodep/libkvd-cuda.so" "$tmp/nodep.c" -L"$tmp" -lkvd-missing-dep &&
		cc -shared -fPIC -o "$tmp/stale/libkvd-cuda.so" "$tmp/stale.c" &&
		cc -shared -fPIC -I. -o "$tmp/abi/libkvd-cuda.so" "$tmp/abi.c"; then
		rm "$tmp/libkvd-missing-dep.so"
		for c in "nodep:$tmp/nodep/libkvd-cuda.so: libkvd-missing-dep.so: cannot open shared object file" \
			"stale:$tmp/stale/libkvd-cuda.so has no kvd_cuda_backend_v2: it was built for another version of kvd" \
			"abi:$tmp/abi/libkvd-cuda.so has backend ABI "; do
			d=${c%%:*}
			want="cpu backend: auto, CUDA backend not loadable: ${c#*:}"
			if KVD_BACKEND_DIR=$tmp/$d kvd_run "$tmp/$d.log" "$B/kvd" && grep -qF "kvd: $want" "$tmp/$d.log"; then
				ok "refused ($d), served on the CPU: $(backend_line "$tmp/$d.log")"
			else
				cat "$tmp/$d.log"
				bad "an object kvd must refuse ($d): wanted '$want'"
			fi
		done
	else
		bad "cc could not build the stand-in objects"
	fi
else
	skipped "objects kvd must refuse: cc is not installed"
fi

summary test_packaging
