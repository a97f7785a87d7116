# tests/ — one cmocka program per tests/test_*.c, linked with tests/lib/
# (daemon starter, raw client, fixture, reference generator), the core
# library and libkvclient; `make test` runs them all.
TEST_SRCS := $(wildcard tests/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(B)/tests/%)
BENCH_SRCS := $(wildcard tests/bench_*.c)
BENCH_BINS := $(BENCH_SRCS:tests/%.c=$(B)/tests/%)
# An archive: each program takes only the parts it calls.
TESTLIB_SRCS := $(wildcard tests/lib/*.c)
TESTLIB := $(B)/tests/libtestlib.a

$(TESTLIB): $(TESTLIB_SRCS:%.c=$(B)/%.o)
	@mkdir -p $(dir $@)
	rm -f $@
	$(AR) rcs $@ $^

include tests/cudasim/cudasim.mk

$(B)/tests/%: $(B)/tests/%.o $(TESTLIB) $(CORE_LIB) $(B)/libkvclient.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lcmocka
# The CUDA suites link the CUDA backend's object (kernels.mk) rather than search for it.
CUDA_TEST_BINS := $(patsubst %,$(B)/tests/%,test_cuda test_cuda_golden bench_cuda)
$(CUDA_TEST_BINS): | $(CUDA_SO)
$(CUDA_TEST_BINS): LDLIBS += $(CUDA_SO_LINK)

# `make test` runs the suites and the fuzz corpora (test-suites), then, unless
# TEST_EXTRA=0, once more with SANITIZE=1 (ASan + UBSan) in $(B)/asan with the
# daemon taken from there (KVD_BIN), and the unit suite under valgrind. The
# valgrind set is what runs in seconds natively (about 25 s under valgrind on
# 2 cores): the compute-bound suites (kernels, engine, golden, sampler
# statistics) would take many minutes and are covered by the ASan pass.
TEST_EXTRA ?= 1
VALGRIND_BINS := $(patsubst %,$(B)/tests/test_%,kvpool gguf tokenizer paged kvresume) $(FUZZ_REPLAY)

# The CUDA suites once more on the host simulation of a device (tests/cudasim),
# with the simulation's own suite, in the plain pass; the kernel suite again
# under ASan + UBSan, where every kernel's reads and writes of device
# buffers and shared memory are checked.
CUDASIM_RUN := $(if $(filter 1,$(SANITIZE)),$(CUDASIM)/tests/test_cuda,$(CUDASIM_TEST_BINS))

# Shell tests run after the programs, in the plain pass; the sanitizer pass
# runs test_http.sh alone, with kvd and kvhttp both from $(B)/asan (the others
# install, check the tree or package the plain build).
TEST_SCRIPTS := $(if $(filter 1,$(SANITIZE)),tests/test_http.sh,$(wildcard tests/test_*.sh))

# The plain pass also links the libFuzzer targets (tests/fuzz/fuzz.mk), so
# that `make fuzz` cannot rot unnoticed. What the suites need is built with
# TEST_JOBS jobs (all cores: CI calls plain `make test`, whose three
# builds, plain, libFuzzer and ASan, took over four minutes on two cores
# made one file at a time); the suites themselves run one after another.
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
.PHONY: test-suites test-build
test-suites:
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) test-build
	@sh tests/run.sh $(TEST_BINS) $(CUDASIM_RUN) $(TEST_SCRIPTS)
	@sh tests/fuzz/replay.sh $(FUZZ_REPLAY)

# The libFuzzer build links objects of the plain one: made after it, not beside it.
test-build: all $(TEST_BINS) $(FUZZ_REPLAY) $(CUDASIM_RUN) $(CUDASIM)/kvd
ifneq ($(SANITIZE),1)
	@$(MAKE) --no-print-directory fuzz-build-if-able
endif

test: test-suites
ifeq ($(TEST_EXTRA),1)
ifneq ($(SANITIZE),1)
	@echo "=== the suites again under ASan + UBSan ($(B)/asan; the CUDA code is compiled once, in the plain pass)"
	@KVD_BIN=$(B)/asan/kvd $(MAKE) --no-print-directory B=$(B)/asan SANITIZE=1 CUDA=0 TEST_EXTRA=0 test-suites
endif
	@sh tests/valgrind.sh $(VALGRIND_BINS)
endif

# `make bench QUICK=1`: every part with fewer runs and smaller sizes, in a few
# minutes; its results (build/bench/results-quick.txt) say they are quick.
QUICK ?= 0
bench: all $(BENCH_BINS)
	@KVD_BENCH_QUICK=$(QUICK) sh tests/bench.sh $(BENCH_BINS)

# `make peer`: llama.cpp's tools, built once under $(B)/peer from the pinned
# llama-cpp-python sdist (tests/peer/build.sh), for side-by-side figures and
# the accuracy reference data.
.PHONY: peer
peer:
	@sh tests/peer/build.sh $(B)

# `make bench-peer`: kvd and llama.cpp side by side on the default model, 2
# threads, interleaved runs (tests/bench_peer.sh); it builds the peer first
# (`make peer`) unless PEER_BIN names a directory of llama.cpp's tools.
# QUICK=1: medians of 3 and shorter runs. The DRAM probe gives the roofline.
PEER_BIN ?=
$(B)/tests/peer/membw: $(B)/tests/peer/membw.o
	$(CC) $(LDFLAGS) -o $@ $^ -pthread

.PHONY: bench-peer
bench-peer: all $(B)/tests/bench_engine $(B)/tests/bench_batch $(B)/tests/peer/membw
	@B=$(B) PEER_BIN=$(PEER_BIN) BENCH_PEER_QUICK=$(QUICK) sh tests/bench_peer.sh
