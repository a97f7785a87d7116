#!/bin/sh
# deps.sh — install kvd's build and test dependencies: Debian's packages, then the test data fetched from PyPI.
# Idempotent: prints nothing and touches nothing when all are there.
#
# The test data is llama.cpp's tokenizer test vocabularies, extracted from
# the pinned llama-cpp-python sdist into build/vocab (tests/vocab/fetch.sh;
# tests/test_vocab.c reads them there). It is fetched as the user running
# this, not through sudo, so that build/ stays theirs.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
pkgs="build-essential pkg-config liburing-dev libbpf-dev clang llvm bpftool
libelf-dev zlib1g-dev libcmocka-dev libsystemd-dev systemtap-sdt-dev
libxxhash-dev libmicrohttpd-dev libjansson-dev libcurl4-openssl-dev python3 python3-pip python3-venv python3-jinja2 cmake unzip gnuplot-nox valgrind systemd procps linux-perf libclang-rt-dev"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
		missing="$missing $p"
done
if [ -n "$missing" ]; then
	if [ "$(id -u)" -ne 0 ]; then
		SUDO=sudo
	else
		SUDO=
	fi
	echo "deps: installing$missing"
	export DEBIAN_FRONTEND=noninteractive
	$SUDO apt-get update -qq
	# shellcheck disable=SC2086
	$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
sh "$root/tests/vocab/fetch.sh" "$root/build"
