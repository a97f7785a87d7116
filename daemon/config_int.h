/* config_int.h — the option table's types, shared by config.c (parsing) and config_opts.c (the table, --help, kvd(8)). */
#ifndef KVD_CONFIG_INT_H
#define KVD_CONFIG_INT_H

#include <stddef.h>
#include <stdint.h>

enum cfg_type {
	CT_STR,		/* const char * */
	CT_U32,		/* uint32_t in [lo, hi] */
	CT_POW2,	/* uint32_t in [lo, hi], a power of two */
	CT_INT,		/* int in [lo, hi] */
	CT_F32,		/* float in [lo, hi] */
	CT_U64,		/* uint64_t, any */
	CT_SIZE,	/* uint64_t bytes with K/M/G suffix; 0 allowed when lo == 0 */
	CT_BOOL,	/* int 0/1; a flag without value on the command line */
	CT_ENUM,	/* int, one of names[] mapped to vals[] */
};

#define F_CLI	(1u << 0)	/* command line only */
#define F_LIVE	(1u << 1)	/* SIGHUP applies a new value without a restart */

/*
 * Where an option shows in --help and the man page's OPTIONS (in table
 * order within a section; the table's order is also --print-config's).
 */
enum cfg_section { SEC_CONFIG, SEC_DAEMON, SEC_MODEL, SEC_GEN, SEC_PPL, SEC_HIDDEN, SEC_LAST };

struct cfg_opt {
	const char *name;	/* long option and file key */
	int short_opt;
	uint8_t type;		/* enum cfg_type */
	uint8_t flags;
	uint8_t sec;		/* enum cfg_section */
	size_t off;		/* in struct kvd_options */
	double lo, hi;
	const char *const *names;	/* CT_ENUM, NULL-terminated */
	const int *vals;
	const char *arg;	/* the value's name in --help and the man page; NULL for a flag */
	const char *help;	/* --help: its lines, split by \n */
	const char *man;	/* the man page's paragraph, in roff */
};

/* Every option, in --print-config's order; config_n_opts <= CONFIG_MAX_OPTS. */
extern const struct cfg_opt config_opts[];
extern const size_t config_n_opts;

#endif
