# tests/ — one cmocka program per tests/test_*.c, linked with the core
# library and libkvclient; `make test` runs them all.
TEST_SRCS := $(wildcard tests/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(B)/tests/%)
BENCH_SRCS := $(wildcard tests/bench_*.c)
BENCH_BINS := $(BENCH_SRCS:tests/%.c=$(B)/tests/%)

$(B)/tests/%: $(B)/tests/%.o $(CORE_LIB) $(B)/libkvclient.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) -lcmocka

# Shell tests run after the programs: test_install.sh installs into a scratch DESTDIR.
TEST_SCRIPTS := $(wildcard tests/test_*.sh)

test: all $(TEST_BINS)
	@sh tests/run.sh $(TEST_BINS) $(TEST_SCRIPTS)

bench: all $(BENCH_BINS)
	@sh tests/bench.sh $(BENCH_BINS)
