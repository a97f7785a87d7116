# shm/ — ring primitives shared by both sides, and libkvclient.
KVC_SRCS := $(wildcard shm/*.c)
KVC_OBJS := $(KVC_SRCS:%.c=$(B)/%.o)
KVC_SOVER := 1
KVC_HDRS := shm/kvclient.h shm/kvring.h

$(B)/libkvclient.so.$(KVC_SOVER): $(KVC_OBJS) shm/libkvclient.map
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libkvclient.so.$(KVC_SOVER) \
		-Wl,--version-script=shm/libkvclient.map -o $@ $(KVC_OBJS) -pthread
$(B)/libkvclient.so: $(B)/libkvclient.so.$(KVC_SOVER)
	ln -sf libkvclient.so.$(KVC_SOVER) $@
$(B)/libkvclient.a: $(KVC_OBJS)
	@mkdir -p $(dir $@) && rm -f $@
	$(AR) rcs $@ $^

all: $(B)/libkvclient.so $(B)/libkvclient.a
