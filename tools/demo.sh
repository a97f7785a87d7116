#!/bin/sh
# demo.sh — start kvd on a private socket, generate through it with kvctl, stop it.
# Usage: demo.sh [PROMPT]. Exit status is kvctl's.
set -u
B=${B:-build}
prompt=${1:-The capital of France is}
dir=$(mktemp -d)
sock="$dir/kvd.sock"
"$B/kvd" --socket "$sock" --kv-mem 256M &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
i=0
until "$B/kvctl" --socket "$sock" info >/dev/null 2>&1; do
	i=$((i + 1))
	if [ $i -gt 100 ] || ! kill -0 $pid 2>/dev/null; then
		echo "demo: kvd did not come up" >&2
		exit 1
	fi
	sleep 0.1
done
"$B/kvctl" --socket "$sock" generate -n 64 "$prompt"
