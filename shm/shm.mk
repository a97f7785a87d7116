# shm/ — ring primitives shared by both sides, and libkvclient.
KVC_SRCS := $(wildcard shm/*.c)
KVC_OBJS := $(KVC_SRCS:%.c=$(B)/%.o)
KVC_SOVER := 2
KVC_VERSION := $(KVC_SOVER).2.0
KVC_HDRS := shm/kvclient.h shm/kvring.h

$(B)/libkvclient.so.$(KVC_SOVER): $(KVC_OBJS) shm/libkvclient.map
	$(CC) $(LDFLAGS) -shared -Wl,-soname,libkvclient.so.$(KVC_SOVER) \
		-Wl,--version-script=shm/libkvclient.map -o $@ $(KVC_OBJS) -pthread
$(B)/libkvclient.so: $(B)/libkvclient.so.$(KVC_SOVER)
	ln -sf libkvclient.so.$(KVC_SOVER) $@
$(B)/libkvclient.a: $(KVC_OBJS)
	@mkdir -p $(dir $@) && rm -f $@
	$(AR) rcs $@ $^

# The installed header layout, in the tree: a program includes <kvd/kvclient.h>
# with -I$(B)/include here as it does with pkg-config's flags after make install.
KVC_INC := $(B)/include
KVC_INC_HDRS := $(KVC_HDRS:shm/%=$(KVC_INC)/kvd/%) $(UAPI_HDRS:%=$(KVC_INC)/kvd/%)
$(KVC_INC)/kvd/%.h: shm/%.h
	@mkdir -p $(dir $@) && cp $< $@
$(KVC_INC)/kvd/uapi/%.h: uapi/%.h
	@mkdir -p $(dir $@) && cp $< $@

# pkg-config file with PREFIX baked in; rewritten only when its text changes,
# so a new PREFIX takes effect without touching anything else.
$(B)/kvclient.pc: FORCE
	@mkdir -p $(dir $@)
	@printf '%s\n' 'prefix=$(PREFIX)' 'exec_prefix=$${prefix}' 'libdir=$${exec_prefix}/lib' \
		'includedir=$${prefix}/include' '' 'Name: kvclient' \
		'Description: client library of the kvd local LLM inference daemon' \
		'Version: $(KVC_VERSION)' 'Cflags: -I$${includedir} -I$${includedir}/kvd' \
		'Libs: -L$${libdir} -lkvclient' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@ && echo "GEN $@"; fi

.PHONY: FORCE install-kvclient-pc
FORCE:

install-kvclient-pc: $(B)/kvclient.pc
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 0644 $(B)/kvclient.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/

all: $(B)/libkvclient.so $(B)/libkvclient.a $(B)/kvclient.pc
install: install-kvclient-pc
