#!/bin/sh
# build.sh — builds llama.cpp's tools from the pinned llama-cpp-python sdist, once, under build/peer.
#
# The peer engine for side-by-side figures (make bench-peer) and for the
# accuracy reference data (tests/golden/gen_kld.py) is llama.cpp itself, at
# the version llama-cpp-python 0.3.36 vendors: the one tarball on PyPI that
# the reference data already pins (tests/peer/sdist.sh: fetched with pip
# from PyPI, checked against its sha256), built for this CPU (GGML_NATIVE)
# without network features. A finished build leaves build/peer/stamp and is not redone.
#
#   sh tests/peer/build.sh [BUILD_DIR]      (default: build)
#
# Prints the directory that holds the binaries on its last line.
set -eu

. "$(dirname "$0")/sdist.sh"
TOOLS="llama-bench llama-batched-bench llama-server llama-perplexity llama-quantize"

B=${1:-build}
P=$B/peer
stamp=$P/stamp
want="llama-cpp-python $SDIST_VERSION $SDIST_SHA256 $TOOLS"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
	echo "$P/bin"
	exit 0
fi
for tool in cmake c++ python3; do
	command -v $tool >/dev/null 2>&1 || { echo "build.sh: $tool is needed (make deps)" >&2; exit 1; }
done

tarball=$(sdist_fetch "$P/dl")

rm -rf "$P/src" "$P/cmake" "$P/bin"
mkdir -p "$P/src"
tar -xzf "$tarball" -C "$P/src" --strip-components=3 "$SDIST_LLAMA"
cmake -S "$P/src" -B "$P/cmake" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
	-DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_CUDA=OFF >"$P/cmake.log" 2>&1 || {
	tail -20 "$P/cmake.log" >&2
	exit 1
}
cmake --build "$P/cmake" -j"$(nproc)" --target $TOOLS >"$P/build.log" 2>&1 || {
	tail -30 "$P/build.log" >&2
	exit 1
}
mkdir -p "$P/bin"
for t in $TOOLS; do
	cp "$P/cmake/bin/$t" "$P/bin/$t"
done
echo "$want" >"$stamp"
echo "$P/bin"
