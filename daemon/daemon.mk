# daemon/ — the kvd daemon, in rooms: model/, tokenizer/, engine/, serve/ and
# the top (main, config, log). Everything but main.c also goes into a static
# core library that the tests and benchmarks link.
DAEMON_SRCS := $(filter-out daemon/main.c,$(wildcard daemon/*.c daemon/*/*.c))
DAEMON_OBJS := $(DAEMON_SRCS:%.c=$(B)/%.o)
CORE_LIB    := $(B)/libkvdcore.a

$(CORE_LIB): $(DAEMON_OBJS) $(KERNELS_OBJS)
	@mkdir -p $(dir $@) && rm -f $@
	$(AR) rcs $@ $^

$(B)/kvd: $(B)/daemon/main.o $(CORE_LIB) $(BPF_LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(BPF_LIBS)

all: $(B)/kvd

# The default model's search path names the install prefix's data directory;
# config.o is rebuilt when that changes (the stamp is rewritten only then).
KVD_DATADIR ?= $(PREFIX)/share/kvd
$(B)/daemon/config.o: CPPFLAGS += -DKVD_DATADIR='"$(KVD_DATADIR)"'
$(B)/daemon/config.o: $(B)/datadir.stamp
$(B)/datadir.stamp: FORCE
	@mkdir -p $(dir $@)
	@echo '$(KVD_DATADIR)' > $@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
