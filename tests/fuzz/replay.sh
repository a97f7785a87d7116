#!/bin/sh
# replay.sh — run each fuzz target's replay build over its committed corpus
# (tests/fuzz/corpus/<name>/, which holds the seeds and every crash found).
failed=""
for bin in "$@"; do
	name=$(basename "$bin" | sed 's/^replay_//')
	dir=tests/fuzz/corpus/$name
	if [ ! -d "$dir" ]; then
		echo "fuzz replay: $name has no corpus in $dir"
		failed="$failed $name"
		continue
	fi
	if ! "$bin" "$dir"; then
		failed="$failed $name"
	fi
done
if [ -n "$failed" ]; then
	echo "fuzz replay failed:$failed"
	exit 1
fi
