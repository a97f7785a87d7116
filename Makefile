# kvd — one non-recursive Makefile; each folder adds its parts in a *.mk file.
# Everything is built out of tree into $(B)/.

B        ?= build
PREFIX   ?= /usr/local
DESTDIR  ?=
CC       ?= cc
NVCC     ?= nvcc
SANITIZE ?= 0
CUDA     ?= auto
WERROR   ?= 1
MODEL_DIR := models
MODEL    := $(MODEL_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf

CFLAGS   ?= -O2 -g
CFLAGS   += -std=gnu11 -Wall -Wextra -fPIC -pthread -D_GNU_SOURCE -ffp-contract=off
CPPFLAGS += -I. -MMD -MP
LDLIBS   += -lm -pthread -lxxhash -luring -lsystemd
ifeq ($(WERROR),1)
CFLAGS   += -Werror
endif
ifeq ($(SANITIZE),1)
CFLAGS   += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS  += -fsanitize=address,undefined
endif

# CUDA=auto builds the CUDA backend when nvcc is on PATH.
ifeq ($(CUDA),auto)
HAVE_NVCC := $(shell command -v $(NVCC) >/dev/null 2>&1 && echo 1 || echo 0)
else ifeq ($(CUDA),1)
HAVE_NVCC := 1
else
HAVE_NVCC := 0
endif

.PHONY: all test bench install clean deps model
all:

include uapi/uapi.mk
include kernels/kernels.mk
include bpf/bpf.mk
include daemon/daemon.mk
include shm/shm.mk
include tools/tools.mk
include tests/fuzz/fuzz.mk
include tests/tests.mk
include systemd/systemd.mk
include tools/man/man.mk

# What changes every object without changing a source: switching CUDA or the
# sanitizers in an existing build directory rebuilds it, instead of leaving
# objects of the other configuration behind (a kvd "built without CUDA"
# beside a freshly built libkvd-cuda.so).
BUILD_CONFIG := nvcc=$(HAVE_NVCC) sanitize=$(SANITIZE) werror=$(WERROR)
$(shell mkdir -p $(B) && { [ "$$(cat $(B)/.config 2>/dev/null)" = "$(BUILD_CONFIG)" ] || \
	echo "$(BUILD_CONFIG)" >$(B)/.config; })

$(B)/%.o: %.c $(B)/.config
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

deps:
	@sh tools/deps.sh

model: $(MODEL)
$(MODEL): tools/fetch-model.sh
	@sh tools/fetch-model.sh $(MODEL_DIR)
# The fetch script is idempotent and checks the file's sha256 itself.
.PHONY: $(MODEL)

# The model `make model` fetched goes where an installed kvd looks for it
# (KVD_DATADIR/models); without one, install says how to get it.
.PHONY: install-model
install: install-model
install-model:
	@if [ -f $(MODEL) ]; then \
		echo "install -m 0644 $(MODEL) $(DESTDIR)$(KVD_DATADIR)/models/"; \
		install -d $(DESTDIR)$(KVD_DATADIR)/models && \
		install -m 0644 $(MODEL) $(DESTDIR)$(KVD_DATADIR)/models/; \
	else \
		echo "no $(MODEL) to install: run make model first, or give kvd --model PATH"; \
	fi

clean:
	rm -rf $(B)

-include $(shell find $(B) -name '*.d' 2>/dev/null)

# Start the daemon, generate through it with kvctl, stop it.
.PHONY: demo
demo: all
	@sh tools/demo.sh
