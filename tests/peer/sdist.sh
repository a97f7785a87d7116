# sdist.sh — the pinned llama-cpp-python sdist (llama.cpp's source and test data): its version, sha256 and fetch; sourced, not run.
#
# tests/peer/build.sh builds llama.cpp's tools from it and tests/vocab/fetch.sh
# extracts llama.cpp's tokenizer test vocabularies from it; both keep the one
# tarball in BUILD_DIR/peer/dl, so it is downloaded once for both.

SDIST_VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# The tarball's top folder, and llama.cpp's inside it.
SDIST_TOP=llama_cpp_python-$SDIST_VERSION
SDIST_LLAMA=$SDIST_TOP/vendor/llama.cpp

# sdist_fetch DL_DIR: leave DL_DIR/llama_cpp_python-VERSION.tar.gz there with
# the pinned sha256, downloading it from PyPI with pip when it is missing or
# different; prints its path. Returns nonzero (with a message) on failure.
sdist_fetch() {
	_dl=$1
	_tarball=$_dl/$SDIST_TOP.tar.gz
	mkdir -p "$_dl"
	if [ ! -f "$_tarball" ] || ! echo "$SDIST_SHA256  $_tarball" | sha256sum -c --quiet - 2>/dev/null; then
		rm -f "$_tarball"
		# pip prepares an sdist's metadata: without the build backend
		# installed it needs an isolated build environment (from PyPI too).
		python3 -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
			"llama-cpp-python==$SDIST_VERSION" -d "$_dl" >/dev/null 2>&1 ||
			python3 -m pip download --quiet --no-deps --no-binary :all: \
				"llama-cpp-python==$SDIST_VERSION" -d "$_dl" >&2 || {
			echo "sdist.sh: pip could not download llama-cpp-python==$SDIST_VERSION" >&2
			return 1
		}
	fi
	echo "$SDIST_SHA256  $_tarball" | sha256sum -c --quiet - || {
		echo "sdist.sh: $_tarball does not have the pinned sha256" >&2
		return 1
	}
	echo "$_tarball"
}
