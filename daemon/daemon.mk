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
