#!/bin/sh
# bundle.sh — what tests/gpu/check.sh needs on a GPU machine that has the CUDA toolkit but not
# kvd's build dependencies (liburing, libbpf, cmocka, ...): the CUDA build's binaries, stripped,
# and the shared libraries they load that are neither glibc's nor CUDA's, in one xz tarball of
# paths under build/; and the default model cut in parts of under 48 MiB, for machines that
# take files in pieces. On the GPU machine, from a checkout of the same commit:
#   cat build/gpu-model.part-* > models/SmolLM2-135M-Instruct.Q4_1.gguf   (or `make model`)
#   tar xJf build/gpu-bundle.tar.xz
#   LD_LIBRARY_PATH=$PWD/build/gpu-lib KVD_CHECK_PREBUILT=1 sh tests/gpu/check.sh
# Usage: sh tests/gpu/bundle.sh   (from the repository root; builds with CUDA=1 first)
set -eu
cd "$(dirname "$0")/../.."
model=${KVD_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
bins="build/kvd build/libkvd-cuda.so build/tests/test_cuda build/tests/test_cuda_golden
build/tests/bench_cuda"
make -j"$(nproc 2>/dev/null || echo 2)" CUDA=1 all build/tests/test_cuda \
	build/tests/test_cuda_golden build/tests/bench_cuda >/dev/null
stage=$(mktemp -d /tmp/kvd-bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/tests" "$stage/build/gpu-lib"
for f in $bins; do
	cp "$f" "$stage/$f"
	strip --strip-debug "$stage/$f"
	# What the loader resolves outside glibc and the CUDA toolkit travels with the binaries.
	ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
		grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|/libcu|/libnv|libkvd-cuda' |
		while read -r lib; do cp -L "$lib" "$stage/build/gpu-lib/"; done
done
tar -C "$stage" -cJf build/gpu-bundle.tar.xz build
echo "bundle: build/gpu-bundle.tar.xz ($(du -h build/gpu-bundle.tar.xz | cut -f1)): $(ls "$stage/build/gpu-lib" | tr '\n' ' ')"
if [ -f "$model" ]; then
	rm -f build/gpu-model.part-*
	split -b 45M "$model" build/gpu-model.part-
	echo "model: $(ls build/gpu-model.part-* | tr '\n' ' ')(sha256 $(sha256sum "$model" | cut -c1-16)...)"
fi
