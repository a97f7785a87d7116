#!/bin/sh
# fetch.sh — llama.cpp's tokenizer test vocabularies (models/ggml-vocab-*.gguf{,.inp,.out}) from the pinned llama-cpp-python sdist, into BUILD_DIR/vocab.
#
# tests/test_vocab.c runs kvd's tokenizer over every vector of these files.
# The sdist is the one tests/peer/build.sh builds llama.cpp from (pinned
# version and sha256 in tests/peer/sdist.sh, downloaded with pip from PyPI
# into BUILD_DIR/peer/dl once for both); only the files the test reads are
# extracted. `make deps` runs this. A finished extraction leaves
# BUILD_DIR/vocab/stamp and a second run prints nothing and does nothing.
#
#   sh tests/vocab/fetch.sh [BUILD_DIR]      (default: build)
set -eu
. "$(dirname "$0")/../peer/sdist.sh"

# Vocabularies kvd tokenizes (vectors and all), then ones it must refuse
# (the .gguf alone); tests/test_vocab.c lists the same.
WITH_VECTORS="gpt-2 mpt starcoder refact command-r llama-bpe qwen2 qwen35 falcon llama-spm phi-3"
REFUSED="bert-bge gemma-4 deepseek-llm deepseek-coder"

B=${1:-build}
V=$B/vocab
want="llama-cpp-python $SDIST_VERSION $SDIST_SHA256 $WITH_VECTORS / $REFUSED"
if [ -f "$V/stamp" ] && [ "$(cat "$V/stamp")" = "$want" ]; then
	exit 0
fi
command -v python3 >/dev/null 2>&1 || { echo "fetch.sh: python3 is needed (make deps)" >&2; exit 1; }

echo "vocab: llama.cpp's tokenizer test vocabularies from llama-cpp-python==$SDIST_VERSION"
tarball=$(sdist_fetch "$B/peer/dl")
members=""
for v in $WITH_VECTORS; do
	for ext in gguf gguf.inp gguf.out; do
		members="$members $SDIST_LLAMA/models/ggml-vocab-$v.$ext"
	done
done
for v in $REFUSED; do
	members="$members $SDIST_LLAMA/models/ggml-vocab-$v.gguf"
done
rm -rf "$V"
rm -rf "$V.tmp"
mkdir -p "$V.tmp"
# shellcheck disable=SC2086
tar -xzf "$tarball" -C "$V.tmp" --strip-components=4 $members
mv "$V.tmp" "$V"
echo "$want" >"$V/stamp"
echo "vocab: $(ls "$V" | grep -c '\.gguf$') vocabularies in $V"
