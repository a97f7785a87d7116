# kernels/ — compute backends. The CPU and reference backends are always built; the CUDA
# backend, as $(B)/libkvd-cuda.so, when nvcc is available (CUDA=auto) or
# demanded (CUDA=1).
# kernels/cuda/*.c holds the CUDA backend's launch planning in plain C: always
# built, so its unit tests run on machines without nvcc too.
KERNELS_SRCS := $(wildcard kernels/*.c kernels/cpu/*.c kernels/ref/*.c kernels/cuda/*.c)
KERNELS_OBJS := $(KERNELS_SRCS:%.c=$(B)/%.o)

CUDA_SRCS := $(wildcard kernels/cuda/*.cu)
# Where `make install` puts libkvd-cuda.so, and the last place kvd looks for it.
KVD_BACKEND_LIBDIR ?= $(PREFIX)/lib/kvd
$(B)/kernels/backend.o: CPPFLAGS += -DKVD_BACKEND_LIBDIR='"$(KVD_BACKEND_LIBDIR)"'
ifeq ($(HAVE_NVCC),1)
ifneq ($(CUDA_SRCS),)
NVCCFLAGS ?= -O2 -std=c++17 -Xcompiler -fPIC -Xcompiler -Wall -lineinfo \
	-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90
CUDA_OBJS := $(CUDA_SRCS:%.cu=$(B)/%.o)
CPPFLAGS += -DKVD_HAVE_CUDA=1
# The directory that holds the toolkit's libcudart.so, looked for beside the
# nvcc that builds (through any symlink): lib64, the targets/ tree, or lib.
# Where none holds it (a distribution's toolkit in the linker's own
# directories), nothing is added and the default search finds it.
comma := ,
NVCC_ROOT := $(abspath $(dir $(realpath $(shell command -v $(NVCC))))..)
CUDA_LIBDIR ?= $(firstword $(foreach d,$(NVCC_ROOT)/lib64 \
	$(NVCC_ROOT)/targets/x86_64-linux/lib $(NVCC_ROOT)/lib,$(if $(wildcard $(d)/libcudart.so),$(d))))
CUDA_LIBPATH := $(if $(CUDA_LIBDIR),-L$(CUDA_LIBDIR) -Wl$(comma)-rpath$(comma)$(CUDA_LIBDIR))
# The CUDA backend is a shared object that kvd dlopens (kernels/backend.c):
# only it links cuBLAS and the CUDA runtime and carries a RUNPATH to them, so
# kvd itself starts on machines without CUDA. It takes its own hidden copies
# of the plain-C helpers it calls and exports the entry point alone.
CUDA_SO := $(B)/libkvd-cuda.so
$(CUDA_SO): $(CUDA_OBJS) $(B)/kernels/cuda/plan.o $(B)/kernels/types.o kernels/cuda/libkvd-cuda.map
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libkvd-cuda.so -Wl,--no-undefined \
		-Wl,--version-script=kernels/cuda/libkvd-cuda.map -o $@ $(filter %.o,$^) \
		$(CUDA_LIBPATH) -lcublas -lcudart -lstdc++ -lm -pthread
# A program that links it rather than loading it (the CUDA tests, in
# $(B)/tests/) names it even though it calls nothing in it directly: the
# loader then finds the entry point in the process.
CUDA_SO_LINK := -Wl,--push-state,--no-as-needed $(CUDA_SO) -Wl,--pop-state -Wl,-rpath,'$$ORIGIN/..'
all: $(CUDA_SO)
endif
endif
LDLIBS += -ldl

$(B)/kernels/cuda/%.o: kernels/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -I. -MMD -MP -c -o $@ $<

# The CPU kernels are the hot path: let the compiler unroll and vectorise them.
$(B)/kernels/cpu/%.o: CFLAGS += -O3
# The reference backend too: without -ffast-math that changes no sum's order.
$(B)/kernels/ref/%.o: CFLAGS += -O3
