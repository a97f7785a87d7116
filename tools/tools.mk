# tools/ — command-line programs built on libkvclient.
TOOLS := $(patsubst tools/%.c,%,$(wildcard tools/kv*.c))
TOOL_BINS := $(TOOLS:%=$(B)/%) $(B)/kvhttp

# Each tool links what it uses, not the daemon's $(LDLIBS): no liburing,
# libsystemd or xxhash, none of the CUDA libraries, no RUNPATH into CUDA.
# kvctl and kvc_example need nothing beyond libkvclient and libc.
TOOLS_LDLIBS :=
$(B)/kvbench: TOOLS_LDLIBS += -lm -pthread

$(B)/kv%: $(B)/tools/kv%.o $(B)/libkvclient.a
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(filter %.a,$^) $(TOOLS_LDLIBS)

# kvc_example includes <kvd/kvclient.h>, as a program built against the installed tree does.
$(B)/tools/kvc_example.o: CPPFLAGS += -I$(KVC_INC)
$(B)/tools/kvc_example.o: $(KVC_INC_HDRS)

# kvc_example shows libkvclient alone; the others share tools/common.c.
$(B)/kvctl $(B)/kvbench $(B)/kvtop: $(B)/tools/common.o
$(B)/kvbench: $(B)/tools/bench_results.o
$(B)/kvctl: $(B)/tools/turn.o $(B)/tools/chat.o

# kvhttp, the OpenAI-compatible HTTP front: libmicrohttpd and jansson (Debian's), threads.
KVHTTP_OBJS := $(patsubst %.c,$(B)/%.o,$(wildcard tools/kvhttp/*.c))
# /metrics prints what kvtop --prometheus does (tools/snap.c), so it reads the pinned maps too.
$(B)/kvhttp: $(KVHTTP_OBJS) $(B)/tools/common.o $(B)/tools/snap.o $(B)/bpf/kvd_pin.o $(B)/libkvclient.a
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(filter %.a,$^) -lmicrohttpd -ljansson -lbpf -lm -pthread

# kvload, kvhttp's load generator (make bench): libcurl's multi interface and jansson.
# Built with the rest so that CI compiles it; not installed.
$(B)/kvload: $(B)/tools/loadgen/kvload.o $(B)/tools/common.o $(B)/libkvclient.a
	$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(filter %.a,$^) -lcurl -ljansson -lm

all: $(TOOL_BINS) $(B)/kvload

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib \
		$(DESTDIR)$(PREFIX)/include/kvd/uapi
	@# kvtop comes from the BPF tools when they are built.
	install -m 0755 $(sort $(B)/kvd $(filter-out $(B)/kvc_example,$(TOOL_BINS)) $(wildcard $(B)/kvtop)) \
		$(DESTDIR)$(PREFIX)/bin/
	install -m 0755 $(B)/libkvclient.so.$(KVC_SOVER) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libkvclient.so.$(KVC_SOVER) $(DESTDIR)$(PREFIX)/lib/libkvclient.so
	install -m 0644 $(B)/libkvclient.a $(DESTDIR)$(PREFIX)/lib/
	install -m 0644 $(KVC_HDRS) $(DESTDIR)$(PREFIX)/include/kvd/
	install -m 0644 $(UAPI_HDRS) $(DESTDIR)$(PREFIX)/include/kvd/uapi/
ifneq ($(CUDA_SO),)
	@# kvd finds it there from PREFIX/bin (../lib/kvd) or by the path compiled in.
	install -d $(DESTDIR)$(KVD_BACKEND_LIBDIR)
	install -m 0755 $(CUDA_SO) $(DESTDIR)$(KVD_BACKEND_LIBDIR)/
endif

# kvtop reads the pinned BPF maps and can load the programs itself (--attach).
$(B)/kvtop: $(BPF_LIB) $(B)/tools/snap.o
$(B)/kvtop: TOOLS_LDLIBS += -lm $(BPF_LIBS)
$(B)/tools/kvtop.o: $(B)/bpf/kvd.skel.h
