# tests/cudasim/ — the CUDA backend's own sources (kernels/cuda/*.cu) compiled by the
# host's C++ compiler against a simulated runtime (tests/cudasim/include), as
# $(CUDASIM)/libkvd-cuda.so; beside it a kvd that finds it there and the CUDA
# suites linked with it. Neither nvcc nor a GPU is needed, so `make test` runs
# every CUDA kernel's real code on every machine (tests/cudasim/README.md).
CUDASIM := $(B)/cudasim
CUDASIM_CC_SRCS := $(filter-out tests/cudasim/test_%.cc,$(wildcard tests/cudasim/*.cc))
CUDASIM_OBJS := $(CUDA_SRCS:%.cu=$(CUDASIM)/%.o) $(CUDASIM_CC_SRCS:%.cc=$(CUDASIM)/%.o)
CUDASIM_SO := $(CUDASIM)/libkvd-cuda.so
CUDASIM_CXXFLAGS := -std=c++17 -O2 -g -march=native -fPIC -pthread -Wall -Wextra -Wno-unknown-pragmas \
	-ffp-contract=off -Itests/cudasim/include -I. -MMD -MP
ifeq ($(WERROR),1)
CUDASIM_CXXFLAGS += -Werror
endif
ifeq ($(SANITIZE),1)
CUDASIM_CXXFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif

$(CUDASIM)/kernels/cuda/%.o: kernels/cuda/%.cu $(B)/.config tests/cudasim/cudasim.mk
	@mkdir -p $(dir $@)
	$(CXX) -x c++ $(CUDASIM_CXXFLAGS) -c -o $@ $<
$(CUDASIM)/tests/cudasim/%.o: tests/cudasim/%.cc $(B)/.config tests/cudasim/cudasim.mk
	@mkdir -p $(dir $@)
	$(CXX) $(CUDASIM_CXXFLAGS) -c -o $@ $<

# Like libkvd-cuda.so (kernels.mk): the entry point is its one export.
$(CUDASIM_SO): $(CUDASIM_OBJS) $(B)/kernels/cuda/plan.o $(B)/kernels/types.o kernels/cuda/libkvd-cuda.map
	$(CXX) $(LDFLAGS) -shared -Wl,-soname,libkvd-cuda.so -Wl,--no-undefined \
		-Wl,--version-script=kernels/cuda/libkvd-cuda.map -o $@ $(filter %.o,$^) -lm -pthread

# What loads the CUDA backend is compiled again with KVD_HAVE_CUDA, whatever
# this build's nvcc: the backend loader and the option check that refuses
# backend = cuda without it; the programs below link these objects ahead of
# the core library, whose own copies are then never pulled in.
CUDASIM_HAVE_OBJS := $(CUDASIM)/c/kernels/backend.o $(CUDASIM)/c/daemon/config.o
$(CUDASIM)/c/%.o: %.c $(B)/.config
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -DKVD_HAVE_CUDA=1 $(CFLAGS) -c -o $@ $<
$(CUDASIM)/c/kernels/backend.o: CPPFLAGS += -DKVD_BACKEND_LIBDIR='"$(KVD_BACKEND_LIBDIR)"'
$(CUDASIM)/c/daemon/config.o: CPPFLAGS += -DKVD_DATADIR='"$(KVD_DATADIR)"'
$(CUDASIM)/c/daemon/config.o: $(B)/datadir.stamp

# A kvd whose CUDA device is the simulation: it finds $(CUDASIM_SO) beside itself.
$(CUDASIM)/kvd: $(B)/daemon/main.o $(CUDASIM_HAVE_OBJS) $(CORE_LIB) $(BPF_LIB) | $(CUDASIM_SO)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS) $(BPF_LIBS)

# The CUDA suites against the simulation, linked with it as the others are with libkvd-cuda.so.
CUDASIM_TEST_BINS := $(CUDASIM)/tests/test_cuda $(CUDASIM)/tests/test_cuda_golden
$(CUDASIM_TEST_BINS): $(CUDASIM)/tests/%: $(CUDASIM)/c/tests/%.o $(CUDASIM_HAVE_OBJS) $(TESTLIB) \
		$(CORE_LIB) $(B)/libkvclient.a | $(CUDASIM_SO)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS) -lcmocka \
		-Wl,--push-state,--no-as-needed $(CUDASIM_SO) -Wl,--pop-state -Wl,-rpath,'$$ORIGIN/..'

# The simulation's own suite links its runtime directly, not through the backend's object.
$(CUDASIM)/tests/test_cudasim: $(CUDASIM)/tests/cudasim/test_cudasim.o \
		$(CUDASIM_CC_SRCS:%.cc=$(CUDASIM)/%.o)
	$(CXX) $(LDFLAGS) -o $@ $^ -lcmocka -pthread
CUDASIM_TEST_BINS += $(CUDASIM)/tests/test_cudasim

.PHONY: cudasim
cudasim: $(CUDASIM_SO) $(CUDASIM)/kvd $(CUDASIM_TEST_BINS)
