# bpf/ — eBPF programs on kvd's USDT probes (CO-RE) and their loader. The
# kernel's types (vmlinux.h) and the libbpf skeleton are generated here at
# build time; nothing in this folder needs a GPU.
CLANG    ?= clang
BPFTOOL  ?= bpftool
BTF_VMLINUX ?= /sys/kernel/btf/vmlinux
BPF_ARCH := $(shell uname -m | sed -e 's/x86_64/x86/' -e 's/aarch64/arm64/' -e 's/ppc64le/powerpc/' -e 's/s390x/s390/')
BPF_MULTIARCH := $(shell $(CC) -print-multiarch 2>/dev/null)
BPF_LIBS := -lbpf -lelf -lz
BPF_LIB  := $(B)/libkvdbpf.a

# The kernel's BTF, as C. CO-RE relocates field offsets at load time, so the
# kernel the object runs on may differ from the one that built it.
$(B)/bpf/vmlinux.h:
	@mkdir -p $(dir $@)
	@test -r $(BTF_VMLINUX) || { echo "bpf: $(BTF_VMLINUX) is missing: set BTF_VMLINUX to a kernel image or BTF file with BTF"; exit 1; }
	$(BPFTOOL) btf dump file $(BTF_VMLINUX) format c > $@.tmp && mv $@.tmp $@

$(B)/bpf/kvd.bpf.o: bpf/kvd.bpf.c uapi/kvd_metrics.h $(B)/bpf/vmlinux.h
	@mkdir -p $(dir $@)
	$(CLANG) -target bpf -g -O2 -D__TARGET_ARCH_$(BPF_ARCH) -I. -I$(B)/bpf \
		$(if $(BPF_MULTIARCH),-I/usr/include/$(BPF_MULTIARCH)) -Wall -Werror -c -o $@ $<

$(B)/bpf/kvd.skel.h: $(B)/bpf/kvd.bpf.o
	$(BPFTOOL) gen skeleton $< name kvd_skel > $@.tmp && mv $@.tmp $@

$(B)/bpf/kvd_load.o: CPPFLAGS += -I$(B)
$(B)/bpf/kvd_load.o: $(B)/bpf/kvd.skel.h

$(BPF_LIB): $(B)/bpf/kvd_load.o $(B)/bpf/kvd_pin.o
	@mkdir -p $(dir $@) && rm -f $@
	$(AR) rcs $@ $^

all: $(BPF_LIB)

# Tests and benchmarks that read the maps or load the programs.
BPF_TESTS := $(B)/tests/test_bpf $(B)/tests/bench_bpf
$(BPF_TESTS): $(BPF_LIB)
$(BPF_TESTS): LDLIBS += $(BPF_LIBS)
