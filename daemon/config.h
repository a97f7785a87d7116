/* config.h — kvd's options: one table read from /etc/kvd/kvd.conf and the command line, printed as --help and kvd(8)'s list. */
#ifndef KVD_CONFIG_H
#define KVD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "bpf/kvd_load.h"
#include "daemon/engine/sampler.h"
#include "daemon/serve/server_config.h"
#include "kernels/backend.h"

#define CONFIG_DEFAULT_PATH "/etc/kvd/kvd.conf"
#define CONFIG_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"	/* what `make model` fetches */
#define CONFIG_MODEL_PLACES 3	/* state directory, data directory, the build's source tree */
#define CONFIG_PATH_MAX 4096
#define CONFIG_MAX_OPTS 64	/* entries of the option table, with room to grow */

/* Where an option's value came from, for --print-config and reload messages. */
enum config_src { CONFIG_SRC_DEFAULT, CONFIG_SRC_FILE, CONFIG_SRC_ENV, CONFIG_SRC_CMDLINE };

struct config_origin {
	uint8_t src;		/* enum config_src */
	uint32_t line;		/* in the file, for CONFIG_SRC_FILE */
};

struct kvd_options {
	/* modes and in-process generation: command line only */
	const char *config_path;	/* NULL: $KVD_CONFIG, else CONFIG_DEFAULT_PATH */
	int print_config;
	int help;
	int help_man;			/* hidden: the man page's option list */
	int info;
	const char *prompt;
	const char *system;
	int chat;
	int n_predict;
	struct sampler_params sp;
	const char *perplexity;		/* --perplexity: the text file */
	uint32_t chunks;		/* 0: all */
	const char *kld_base;		/* --kl-divergence-base: written, or read with kld */
	int kld;
	uint32_t ppl_ctx;		/* --ctx as the command line gave it, else 0: --perplexity's chunk */
	/* the daemon: file and command line */
	const char *model;		/* NULL: no model named, and none found at model_tried */
	const char *chat_template;	/* a built-in template's name; NULL: the model's */
	uint32_t threads;		/* 0: every core */
	uint32_t ctx;			/* 0: the model's */
	uint64_t kv_mem;		/* 0: see kv_blocks */
	uint32_t kv_blocks;		/* 0: room for 64k tokens */
	uint32_t kv_block_tokens;
	int kv_type;			/* KB_F16, KB_F32, KB_Q8_0 */
	int kv_prefault;		/* commit the pool's pages at start (kvpool_prefault()) */
	int log_level;			/* LOG_ERR .. LOG_DEBUG */
	int bpf;			/* enum kvd_bpf_mode */
	const char *instance;		/* names the BPF pin directory; NULL: after the socket (bpf/kvd_pin.h) */
	int backend;			/* enum kb_kind */
	int no_backend_check;		/* a device backend starts unchecked against the CPU */
	const char *socket_group;	/* NULL: the daemon's own group */
	struct server_config srv;	/* socket, limits, prefix sharing; socket_gid from socket_group */

	/* bookkeeping */
	const char *file_used;		/* the file that was read, NULL if none */
	struct config_origin origin[CONFIG_MAX_OPTS];	/* by table index */
	char *owned[CONFIG_MAX_OPTS];	/* strings copied out of the file */
	char *file_name;		/* copy of file_used */
	char *model_tried;		/* the default model's places, ", "-separated, when none held it */
	int argc;			/* kept for config_reload */
	char **argv;
};

/*
 * The places the default model is looked for, in order, into places
 * (CONFIG_MODEL_PLACES, each CONFIG_PATH_MAX): $STATE_DIRECTORY/models (systemd's
 * StateDirectory=; /var/lib/kvd/models without it), config_datadir/models
 * (where `make install` puts the model), then models/ in the source tree the
 * running kvd was built in (the nearest of its binary's ancestors holding
 * kvd's Makefile and daemon/main.c: build/kvd, build/asan/kvd; none for an
 * installed /usr/bin/kvd), each followed by
 * CONFIG_MODEL_FILE. Never the current directory: kvd finds the same model
 * wherever it is started. Returns how many were written.
 */
int config_model_places(char (*places)[CONFIG_PATH_MAX]);
/* The install prefix's data directory, $(PREFIX)/share/kvd, as the build was told it. */
extern const char config_datadir[];

/*
 * Defaults, then the file (--config PATH, else $KVD_CONFIG, else
 * /etc/kvd/kvd.conf, which may be missing), then $KVD_MODEL, then the
 * command line, each overriding the one before. When none of them names a
 * model, the first of config_model_places() holding one is the model; when
 * none does, model is NULL and model_tried lists them. Returns 0, or -EINVAL/-errno with a one-line message in err
 * that names the file and line or the option at fault. config_free() after,
 * either way.
 */
int config_load(struct kvd_options *o, int argc, char **argv, char *err, size_t errlen);
void config_free(struct kvd_options *o);

/* The parts of config_load, for tests and the fuzzer. */
void config_defaults(struct kvd_options *o);
/* name: the file name used in messages. Returns 0 or -EINVAL with err set. */
int config_parse_text(struct kvd_options *o, const char *name, const char *text, size_t len,
		      char *err, size_t errlen);

/* --help: usage and every option, from the table. */
void config_usage(FILE *f);
/*
 * --help-man: the OPTIONS section of kvd(8) in roff, from the same table
 * (from ".SH OPTIONS" up to the next .SH); tests/test_config.c checks
 * tools/man/kvd.8 against it.
 */
void config_man(FILE *f);

/* --print-config: every daemon option as `key = value  # source`. */
void config_print(const struct kvd_options *o, FILE *f);

/*
 * SIGHUP: load the file and command line again into a fresh set, copy the
 * values that can change live into o and live (the server's limits), and
 * log each change and each value that needs a restart. Returns the number of
 * values applied, or -errno when the new configuration is invalid (then
 * nothing changes).
 */
int config_reload(struct kvd_options *o, struct server_config *live);

/* The default socket: $RUNTIME_DIRECTORY/kvd.sock under systemd, /run/kvd/kvd.sock as
 * root, else $XDG_RUNTIME_DIR/kvd.sock. Written into buf. */
const char *config_default_socket(char *buf, size_t len);

#endif
