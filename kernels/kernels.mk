# kernels/ — compute backends. The CPU backend is always built; the CUDA
# backend when nvcc is available (CUDA=auto) or demanded (CUDA=1).
# kernels/cuda/*.c holds the CUDA backend's launch planning in plain C: always
# built, so its unit tests run on machines without nvcc too.
KERNELS_SRCS := $(wildcard kernels/*.c kernels/cpu/*.c kernels/cuda/*.c)
KERNELS_OBJS := $(KERNELS_SRCS:%.c=$(B)/%.o)

CUDA_SRCS := $(wildcard kernels/cuda/*.cu)
ifeq ($(HAVE_NVCC),1)
ifneq ($(CUDA_SRCS),)
NVCCFLAGS ?= -O2 -std=c++17 -Xcompiler -fPIC -Xcompiler -Wall -lineinfo \
	-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90
CUDA_OBJS := $(CUDA_SRCS:%.cu=$(B)/%.o)
KERNELS_OBJS += $(CUDA_OBJS)
CPPFLAGS += -DKVD_HAVE_CUDA=1
CUDA_LIBDIR ?= $(dir $(shell command -v $(NVCC)))../lib64
LDLIBS += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublas -lcudart -lstdc++
endif
endif

$(B)/kernels/cuda/%.o: kernels/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -I. -MMD -MP -c -o $@ $<

# The CPU kernels are the hot path: let the compiler unroll and vectorise them.
$(B)/kernels/cpu/%.o: CFLAGS += -O3
