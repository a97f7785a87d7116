#!/bin/sh
# test_layers.sh — the folders' include rules (ARCHITECTURE.md's layer
# table) hold: every #include "..." of a source file names a folder its
# layer may reach. A new arrow upwards, or sideways past a layer, fails here
# with the file and the line.
cd "$(dirname "$0")/.." || exit 1

# folder (its own files only, not sub-folders) | folders it may include from.
# daemon/log.h and daemon/probes.h are the daemon's leaf headers: every room may use them.
RULES='
uapi|uapi
shm|shm uapi
daemon/model|daemon/model kernels/backend.h daemon/log.h
daemon/tokenizer|daemon/tokenizer daemon/model daemon/log.h
daemon/engine|daemon/engine daemon/model daemon/tokenizer kernels/backend.h daemon/log.h daemon/probes.h
daemon/serve|daemon/serve daemon/engine daemon/model daemon/tokenizer kernels/backend.h shm uapi bpf/kvd_load.h bpf/kvd_pin.h daemon/log.h daemon/probes.h
daemon|daemon kernels/backend.h uapi shm bpf/kvd_load.h bpf/kvd_pin.h
kernels|kernels/backend.h
kernels/cpu|kernels/cpu kernels/backend.h
kernels/ref|kernels/ref kernels/backend.h
kernels/cuda|kernels/cuda kernels/backend.h
bpf|bpf uapi vmlinux.h kvd.skel.h bpf/kvd.skel.h
tools|tools shm/kvclient.h shm/kvring.h uapi bpf/kvd_load.h bpf/kvd_pin.h
'

# Whether include path $1 is allowed by the space-separated list $2: an
# entry that names a file allows that file, one that names a folder allows
# everything under it.
allowed() {
	for a in $2; do
		case "$1" in
		"$a" | "$a"/*) return 0 ;;
		esac
		# a bare name ("vmlinux.h") as generated headers are included
		[ "$1" = "$a" ] && return 0
	done
	return 1
}

echo "$RULES" | while IFS='|' read -r dir allow; do
	[ -n "$dir" ] || continue
	bad=0
	for f in "$dir"/*.c "$dir"/*.h "$dir"/*.cu "$dir"/*.cuh; do
		[ -f "$f" ] || continue
		grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" | while IFS= read -r line; do
			inc=$(printf '%s\n' "$line" | sed 's/.*include[[:space:]]*"\([^"]*\)".*/\1/')
			allowed "$inc" "$allow" && continue
			echo "FAIL $f:${line%%:*}: includes \"$inc\"; $dir/ may include only: $allow"
		done
	done
done > /tmp/kvd-layers.$$
n_bad=$(grep -c '^FAIL' /tmp/kvd-layers.$$)
cat /tmp/kvd-layers.$$
rm -f /tmp/kvd-layers.$$
n_dirs=$(echo "$RULES" | grep -c '|')
if [ "$n_bad" -ne 0 ]; then
	echo "test_layers: $((n_dirs)) folders checked, $n_bad includes break the layer rules"
	echo "test_layers: 0 passed, 1 failed"
	exit 1
fi
echo "test_layers: 1 passed, 0 failed"
