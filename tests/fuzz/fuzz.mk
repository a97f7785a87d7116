# tests/fuzz/ — every tests/fuzz/fuzz_<name>.c is a libFuzzer target with its
# seed corpus in tests/fuzz/corpus/<name>/. Two builds of each:
#   $(B)/fuzz/replay_<name>  plain $(CC) (+ SANITIZE flags) with replay.c's main:
#                            `make test` feeds it every committed corpus file;
#   $(B)/lf/fuzz_<name>      clang -fsanitize=fuzzer,address,undefined over its
#                            own CPU-only build of the core: `make fuzz
#                            FUZZ_SECONDS=N` runs each target N seconds;
#                            `make test` links them (fuzz-build-if-able).
FUZZ_SRCS   := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_NAMES  := $(FUZZ_SRCS:tests/fuzz/fuzz_%.c=%)
FUZZ_REPLAY := $(FUZZ_NAMES:%=$(B)/fuzz/replay_%)
FUZZ_BINS   := $(FUZZ_NAMES:%=$(B)/lf/fuzz_%)
FUZZ_SECONDS ?= 60
FUZZ_CC     ?= clang
FUZZ_CFLAGS := -std=gnu11 -g -O1 -fno-omit-frame-pointer -pthread -D_GNU_SOURCE -fPIC \
	-ffp-contract=off -fsanitize=address,undefined -fno-sanitize-recover=undefined \
	-Wno-gnu-variable-sized-type-not-at-end
# The core's systemd and BPF loader calls (service.c, obs.c) link as in kvd.
FUZZ_LDLIBS := -lm -pthread -lxxhash -luring -lsystemd $(BPF_LIBS)
# The compute kernels (GCC target pragmas clang does not take, and no parser
# in them) are linked from the ordinary build, uninstrumented; all but
# kernels/backend.c, the backend chooser: built here without KVD_HAVE_CUDA,
# it keeps these builds CPU-only where nvcc made the ordinary one call
# backend_cuda_create() (which lives in the CUDA objects).
# The harness's model and pool come from tests/lib/fixture.c.
FUZZ_LF_SRCS := $(DAEMON_SRCS) $(KVC_SRCS) tests/lib/fixture.c kernels/backend.c
FUZZ_CORE   := $(patsubst %.c,$(B)/lf/%.o,$(FUZZ_LF_SRCS)) \
	$(patsubst %.c,$(B)/%.o,$(filter-out kernels/backend.c,$(KERNELS_SRCS))) $(BPF_LIB)
# Kept between runs: without this make deletes them as intermediates and
# every `make fuzz` compiles the whole core again.
.SECONDARY: $(FUZZ_CORE) $(FUZZ_SRCS:%.c=$(B)/lf/%.o)

# tests/lib's archive (its rule is in tests/tests.mk, read after this file).
$(B)/fuzz/replay_%: $(B)/tests/fuzz/fuzz_%.o $(B)/tests/fuzz/replay.o $(B)/tests/libtestlib.a $(CORE_LIB) \
		$(B)/libkvclient.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(B)/lf/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -I. -MMD -MP $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

$(B)/lf/fuzz_%: $(B)/lf/tests/fuzz/fuzz_%.o $(FUZZ_CORE)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $^ $(FUZZ_LDLIBS)

.PHONY: fuzz fuzz-replay fuzz-build fuzz-build-if-able
fuzz: $(FUZZ_BINS)
	@sh tests/fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_BINS)

fuzz-build: $(FUZZ_BINS)
	@:

# `make test` links the libFuzzer builds too, so that they cannot rot; where
# $(FUZZ_CC) has no libFuzzer (make deps installs clang's), it says so and
# goes on: the replay builds compile and run the same targets.
FUZZ_PROBE := printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' | \
	$(FUZZ_CC) -fsanitize=fuzzer -x c -o /dev/null - >/dev/null 2>&1
fuzz-build-if-able:
	@if $(FUZZ_PROBE); then $(MAKE) --no-print-directory fuzz-build; \
	else echo "fuzz: $(FUZZ_CC) cannot link -fsanitize=fuzzer (make deps): only the replay builds of the targets are made"; fi

fuzz-replay: $(FUZZ_REPLAY)
	@sh tests/fuzz/replay.sh $(FUZZ_REPLAY)
