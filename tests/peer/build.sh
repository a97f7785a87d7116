#!/bin/sh
# build.sh — builds llama.cpp's tools from the pinned llama-cpp-python sdist, once, under build/peer.
#
# The peer engine for side-by-side figures (make bench-peer) and for the
# accuracy reference data (tests/golden/gen_kld.py) is llama.cpp itself, at
# the version llama-cpp-python 0.3.36 vendors: the one tarball on PyPI that
# the reference data already pins. It is fetched with pip from PyPI, checked
# against its sha256, and built for this CPU (GGML_NATIVE) without network
# features. A finished build leaves build/peer/stamp and is not redone.
#
#   sh tests/peer/build.sh [BUILD_DIR]      (default: build)
#
# Prints the directory that holds the binaries on its last line.
set -eu

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
TOOLS="llama-bench llama-batched-bench llama-server llama-perplexity llama-quantize"

B=${1:-build}
P=$B/peer
stamp=$P/stamp
want="llama-cpp-python $VERSION $SHA256 $TOOLS"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
	echo "$P/bin"
	exit 0
fi
for tool in cmake c++ python3; do
	command -v $tool >/dev/null 2>&1 || { echo "build.sh: $tool is needed (make deps)" >&2; exit 1; }
done

mkdir -p "$P/dl"
tarball=$P/dl/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$tarball" ] || ! echo "$SHA256  $tarball" | sha256sum -c --quiet - 2>/dev/null; then
	rm -f "$tarball"
	python3 -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
		"llama-cpp-python==$VERSION" -d "$P/dl" 2>/dev/null ||
		python3 -m pip download --quiet --no-deps --no-binary :all: \
			"llama-cpp-python==$VERSION" -d "$P/dl"
fi
echo "$SHA256  $tarball" | sha256sum -c --quiet - || {
	echo "build.sh: $tarball does not have the pinned sha256" >&2
	exit 1
}

rm -rf "$P/src" "$P/cmake" "$P/bin"
mkdir -p "$P/src"
tar -xzf "$tarball" -C "$P/src" --strip-components=3 "llama_cpp_python-$VERSION/vendor/llama.cpp"
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
