/* config.c — one option table for kvd.conf, getopt, --help and kvd(8): parsing, precedence, --print-config, SIGHUP reload. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "daemon/config.h"
#include "daemon/log.h"
#include "kernels/backend.h"

#define MAX_LINE 4096
#define MAX_FILE (1 << 20)

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
enum cfg_section { SEC_CONFIG, SEC_DAEMON, SEC_MODEL, SEC_GEN, SEC_HIDDEN, SEC_LAST };

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

static const char *const levels[] = { "emerg", "alert", "crit", "err", "warning", "notice",
				      "info", "debug", NULL };
static const int level_vals[] = { 0, 1, 2, 3, 4, 5, 6, 7 };
static const char *const kv_types[] = { "f16", "f32", "q8_0", NULL };
static const int kv_type_vals[] = { KB_F16, KB_F32, KB_Q8_0 };
static const char *const bpf_modes[] = { "auto", "on", "off", NULL };
static const int bpf_vals[] = { CONFIG_BPF_AUTO, CONFIG_BPF_ON, CONFIG_BPF_OFF };
static const char *const backends[] = { "auto", "cpu", "cuda", NULL };
static const int backend_vals[] = { CONFIG_BACKEND_AUTO, CONFIG_BACKEND_CPU, CONFIG_BACKEND_CUDA };

#define O(f) .off = offsetof(struct kvd_options, f)
#define S(f) .off = offsetof(struct kvd_options, srv.f)
#define RANGE(l, h) .lo = l, .hi = h
#define ENUM(n, v) .names = n, .vals = v

static const struct cfg_opt table[] = {
	/* modes and in-process generation */
	{ "config", 0, CT_STR, F_CLI, SEC_CONFIG, O(config_path), .arg = "PATH",
	  .help = "configuration file (default $KVD_CONFIG or " CONFIG_DEFAULT_PATH ")",
	  .man = "Read\n.I PATH\ninstead of\n.B $KVD_CONFIG\nor\n.IR /etc/kvd/kvd.conf .\n"
		 "A file named this way must exist; the default file may be missing." },
	{ "print-config", 0, CT_BOOL, F_CLI, SEC_CONFIG, O(print_config),
	  .help = "print each option's value and where it came from, and exit",
	  .man = "Print each option as\n.IB key \" = \" value\n"
		 "followed by its source (default, the file and line, environment, command\n"
		 "line) and whether SIGHUP can change it, then exit." },
	{ "help", 'h', CT_BOOL, F_CLI, SEC_CONFIG, O(help),
	  .help = "print this list and exit",
	  .man = "Print the options and exit." },
	{ "help-man", 0, CT_BOOL, F_CLI, SEC_HIDDEN, O(help_man),
	  .help = "the OPTIONS section of kvd(8) in roff, from this table" },
	{ "info", 0, CT_BOOL, F_CLI, SEC_GEN, O(info),
	  .help = "print the model's metadata and exit",
	  .man = "Print the model's metadata and exit." },
	{ "prompt", 'p', CT_STR, F_CLI, SEC_GEN, O(prompt), .arg = "TEXT",
	  .help = "generate a continuation of TEXT and exit",
	  .man = "Generate a continuation of\n.I TEXT\nand exit." },
	{ "system", 0, CT_STR, F_CLI, SEC_GEN, O(system), .arg = "TEXT",
	  .help = "system message for --chat",
	  .man = "A system message for\n.BR \\-\\-chat ." },
	{ "chat", 0, CT_BOOL, F_CLI, SEC_GEN, O(chat),
	  .help = "wrap the prompt in the model's chat template",
	  .man = "Wrap the prompt in the model's chat template." },
	{ "n-predict", 'n', CT_INT, F_CLI, SEC_GEN, O(n_predict), RANGE(0, 1 << 20), .arg = "N",
	  .help = "tokens to generate (default 128)",
	  .man = "Tokens to generate (default 128)." },
	{ "temp", 0, CT_F32, F_CLI, SEC_GEN, O(sp.temperature), RANGE(0, 100), .arg = "T",
	  .help = "temperature (default 0: greedy)",
	  .man = "Sampling temperature (default 0: greedy)." },
	{ "top-k", 0, CT_U32, F_CLI, SEC_GEN, O(sp.top_k), RANGE(0, 1 << 24), .arg = "K",
	  .help = "keep the K most likely tokens (0: off)",
	  .man = "Keep the\n.I K\nmost likely tokens (0: off)." },
	{ "top-p", 0, CT_F32, F_CLI, SEC_GEN, O(sp.top_p), RANGE(0, 1), .arg = "P",
	  .help = "nucleus sampling mass (1: off)",
	  .man = "Nucleus sampling: keep the most likely tokens up to probability mass\n.I P\n(1: off)." },
	{ "min-p", 0, CT_F32, F_CLI, SEC_GEN, O(sp.min_p), RANGE(0, 1), .arg = "P",
	  .help = "drop tokens below P x the top probability (0: off)",
	  .man = "Drop tokens below\n.I P\ntimes the top probability (0: off)." },
	{ "repeat-penalty", 0, CT_F32, F_CLI, SEC_GEN, O(sp.repeat_penalty), RANGE(0, 100),
	  .arg = "R", .help = "penalise the last 64 tokens (1: off)",
	  .man = "Penalise the last 64 tokens by\n.I R\n(1: off)." },
	{ "seed", 0, CT_U64, F_CLI, SEC_GEN, O(sp.seed), .arg = "S",
	  .help = "sampler seed (default 0)",
	  .man = "Sampler seed (default 0); the same seed and prompt give the same text." },
	/* the model, compute and the KV pool */
	{ "model", 'm', CT_STR, 0, SEC_MODEL, O(model), .arg = "PATH",
	  .help = "GGUF model (default $KVD_MODEL or " CONFIG_DEFAULT_MODEL ",\n"
		  "under $STATE_DIRECTORY when systemd sets it)",
	  .man = "The GGUF model. Default\n.I models/SmolLM2\\-135M\\-Instruct.Q4_1.gguf\n(under\n"
		 ".B $STATE_DIRECTORY\nwhen systemd sets it, i.e.\n.I /var/lib/kvd/models/\n"
		 "for kvd.service)." },
	{ "backend", 0, CT_ENUM, 0, SEC_DAEMON, O(backend), ENUM(backends, backend_vals), .arg = "B",
	  .help = "auto (CUDA when a device is present), cpu, cuda",
	  .man = ".B auto\n(CUDA when a device is present, else the CPU),\n.B cpu\nor\n.BR cuda .\n"
		 "A kvd built without the CUDA backend refuses\n.BR cuda ." },
	{ "threads", 't', CT_U32, 0, SEC_MODEL, O(threads), RANGE(0, 1024), .arg = "N",
	  .help = "compute threads (default 0: all cores)",
	  .man = "Compute threads (default 0: one per core)." },
	{ "ctx", 0, CT_U32, 0, SEC_MODEL, O(ctx), RANGE(0, 1 << 24), .arg = "N",
	  .help = "context length (default 0: the model's)",
	  .man = "Context length (default 0: the model's)." },
	{ "kv-mem", 0, CT_SIZE, 0, SEC_MODEL, O(kv_mem), .arg = "BYTES",
	  .help = "KV-cache pool size (suffix K, M, G; default: 64k tokens)",
	  .man = "KV pool size, with an optional K, M or G suffix (default: room for 65536 tokens)." },
	{ "kv-blocks", 0, CT_U32, 0, SEC_MODEL, O(kv_blocks), RANGE(0, 1u << 30), .arg = "N",
	  .help = "KV-cache pool size in blocks (instead of --kv-mem)",
	  .man = "KV pool size in blocks, instead of\n.BR \\-\\-kv\\-mem ." },
	{ "kv-block-tokens", 0, CT_POW2, 0, SEC_MODEL, O(kv_block_tokens), RANGE(1, 1024),
	  .arg = "N", .help = "tokens per KV block, a power of two (default 16)",
	  .man = "Tokens per block, a power of two (default 16)." },
	{ "kv-type", 0, CT_ENUM, 0, SEC_MODEL, O(kv_type), ENUM(kv_types, kv_type_vals), .arg = "T",
	  .help = "K/V element type: f16 (default), f32, q8_0",
	  .man = "K/V element type:\n.B f16\n(default),\n.B f32\nor\n.BR q8_0 ." },
	{ "prefix-global", 0, CT_BOOL, 0, SEC_MODEL, S(prefix_global),
	  .help = "share cached prompt prefixes across users (default: per uid)",
	  .man = "Share cached prompt prefixes between users (default: per uid, so one user\n"
		 "cannot learn another's prompts by timing)." },
	{ "no-prefix-cache", 0, CT_BOOL, F_LIVE, SEC_DAEMON, S(no_prefix_cache),
	  .help = "never reuse cached prompt prefixes",
	  .man = "Never reuse cached prompt prefixes." },
	/* the service */
	{ "socket", 0, CT_STR, 0, SEC_DAEMON, S(socket_path), .arg = "PATH",
	  .help = "endpoint (default $RUNTIME_DIRECTORY/kvd.sock under systemd,\n"
		  "/run/kvd/kvd.sock as root, else $XDG_RUNTIME_DIR/kvd.sock);\n"
		  "a socket passed by systemd (kvd.socket) takes precedence",
	  .man = "The socket to bind. Default:\n.I $RUNTIME_DIRECTORY/kvd.sock\nwhen systemd sets\n"
		 ".B RUNTIME_DIRECTORY\n(kvd.service does),\n.I /run/kvd/kvd.sock\nas root, else\n"
		 ".IR $XDG_RUNTIME_DIR/kvd.sock .\nA socket passed by systemd (socket activation,\n"
		 ".BR sd_listen_fds (3))\nis used instead, and is left in place on exit." },
	{ "socket-group", 0, CT_STR, 0, SEC_DAEMON, O(socket_group), .arg = "NAME",
	  .help = "group that may connect (the socket is mode 0660)",
	  .man = "Give a socket kvd binds itself to group\n.IR NAME ." },
	{ "log-level", 0, CT_ENUM, F_LIVE, SEC_DAEMON, O(log_level), ENUM(levels, level_vals),
	  .arg = "L", .help = "err, warning, notice (default), info, debug",
	  .man = ".BR err \", \" warning \", \" notice \" (default), \" info \" or \" debug ." },
	{ "bpf", 0, CT_ENUM, 0, SEC_DAEMON, O(bpf), ENUM(bpf_modes, bpf_vals), .arg = "MODE",
	  .help = "metrics programs on the USDT probes: auto (default: load\n"
		  "when CAP_BPF is held), on (failure is fatal), off",
	  .man = "BPF observability on the daemon's USDT probes:\n.B auto\n"
		 "loads the programs when CAP_BPF is held,\n.B on\nmakes a failure to load fatal,\n"
		 ".B off\nnever loads them. See\n.BR kvtop (8)." },
	{ "drain-timeout", 0, CT_U32, F_LIVE, SEC_DAEMON, S(drain_timeout_ms), RANGE(0, 3600000),
	  .arg = "MS", .help = "on SIGTERM, finish in-flight work for at most MS (default 5000)",
	  .man = "On SIGTERM or SIGINT, finish requests in flight for at most\n.I MS\n"
		 "milliseconds (default 5000)." },
	{ "max-sessions", 0, CT_U32, F_LIVE, SEC_DAEMON, S(max_sessions), RANGE(1, SRV_MAX_SESSIONS),
	  .arg = "N", .help = "sessions per connection (default 16)",
	  .man = "Sessions per connection (1\\(en64, default 16)." },
	{ "max-slots", 0, CT_U32, 0, SEC_DAEMON, S(max_slots), RANGE(1, SRV_MAX_SLOTS), .arg = "N",
	  .help = "sequence slots per session (default 8)",
	  .man = "Sequence slots per session (1\\(en64, default 8)." },
	{ "max-tokens", 0, CT_U32, F_LIVE, SEC_DAEMON, S(max_tokens), RANGE(1, 1 << 24), .arg = "N",
	  .help = "prompt plus generated tokens per request (default 8192)",
	  .man = "Prompt plus generated tokens of one request (default 8192)." },
	{ "max-inflight", 0, CT_U32, F_LIVE, SEC_DAEMON, S(max_inflight), RANGE(1, 1 << 20),
	  .arg = "N", .help = "requests in flight per connection (default 256)",
	  .man = "Requests in flight per connection (default 256)." },
	{ "max-uid-sessions", 0, CT_U32, F_LIVE, SEC_DAEMON, S(max_uid_sessions), RANGE(1, 1 << 20),
	  .arg = "N", .help = "sessions of all connections of one uid (default 64)",
	  .man = "Sessions over all connections of one uid (default 64)." },
	{ "max-uid-inflight", 0, CT_U32, F_LIVE, SEC_DAEMON, S(max_uid_inflight), RANGE(1, 1 << 24),
	  .arg = "N", .help = "requests in flight of all connections of one uid\n(default 1024)",
	  .man = "Requests in flight over all connections of one uid (default 1024)." },
	{ "max-uid-arena", 0, CT_SIZE, F_LIVE, SEC_DAEMON, S(max_uid_arena), RANGE(1, 0),
	  .arg = "BYTES", .help = "session arena bytes of all connections of one uid\n(default 1G)",
	  .man = "Session arena bytes over all connections of one uid, with an optional K,\n"
		 "M or G suffix (default 1G)." },
	{ "max-batch-tokens", 0, CT_U32, 0, SEC_DAEMON, S(max_batch_rows), RANGE(1, 1 << 16),
	  .arg = "N", .help = "rows per engine step (default 32: every decoder\n"
			      "waits for a step's prefill rows, ~2 ms each on a\n"
			      "2-core CPU, so short steps keep token gaps even)",
	  .man = "Rows (prefill positions plus decodes) in one engine step (default 32)." },
	{ "kv-quota", 0, CT_U32, F_LIVE, SEC_DAEMON, S(kv_quota), RANGE(0, 1u << 30), .arg = "BLOCKS",
	  .help = "KV blocks one uid may hold (default 0: no quota)",
	  .man = "KV blocks one uid may hold; a uid over it preempts its own newest sequence\n"
		 "or waits (default 0: no quota)." },
};
#define N_OPTS (sizeof(table) / sizeof(table[0]))
_Static_assert(N_OPTS <= CONFIG_MAX_OPTS, "raise CONFIG_MAX_OPTS");

static void *field(const struct kvd_options *o, const struct cfg_opt *t)
{
	return (char *)o + t->off;
}

static int find_opt(const char *name, size_t len)
{
	for (size_t i = 0; i < N_OPTS; i++)
		if (strlen(table[i].name) == len && !memcmp(table[i].name, name, len))
			return (int)i;
	return -1;
}

/* What a value of t looks like, for error messages. */
static void describe(const struct cfg_opt *t, char *buf, size_t len)
{
	switch (t->type) {
	case CT_STR:
		snprintf(buf, len, "a non-empty string");
		break;
	case CT_U32:
	case CT_INT:
		snprintf(buf, len, "an integer from %.0f to %.0f", t->lo, t->hi);
		break;
	case CT_POW2:
		snprintf(buf, len, "a power of two from %.0f to %.0f", t->lo, t->hi);
		break;
	case CT_F32:
		snprintf(buf, len, "a number from %g to %g", t->lo, t->hi);
		break;
	case CT_U64:
		snprintf(buf, len, "an integer from 0 to 18446744073709551615");
		break;
	case CT_SIZE:
		snprintf(buf, len, "a size in bytes with an optional K, M or G suffix%s",
			 t->lo == 0 ? " (0: automatic)" : ", above 0");
		break;
	case CT_BOOL:
		snprintf(buf, len, "yes or no");
		break;
	case CT_ENUM: {
		size_t at = 0;
		at += (size_t)snprintf(buf, len, "one of");
		for (int i = 0; t->names[i] && at < len; i++)
			at += (size_t)snprintf(buf + at, len - at, "%s %s", i ? "," : "", t->names[i]);
		break;
	}
	}
}

static int parse_u64(const char *s, uint64_t *out, const char **end)
{
	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	char *e;
	unsigned long long v = strtoull(s, &e, 10);
	if (errno)
		return -EINVAL;
	*out = v;
	*end = e;
	return 0;
}

/* Parse s as a value of t into o (strings are stored as given; the caller owns them). */
static int parse_value(struct kvd_options *o, const struct cfg_opt *t, const char *s)
{
	void *p = field(o, t);
	uint64_t u;
	const char *end;
	switch (t->type) {
	case CT_STR:
		if (!*s)
			return -EINVAL;
		*(const char **)p = s;
		return 0;
	case CT_U32:
	case CT_POW2:
	case CT_INT:
		if (parse_u64(s, &u, &end) || *end || u < t->lo || u > t->hi)
			return -EINVAL;
		if (t->type == CT_POW2 && (u & (u - 1)))
			return -EINVAL;
		if (t->type == CT_INT)
			*(int *)p = (int)u;
		else
			*(uint32_t *)p = (uint32_t)u;
		return 0;
	case CT_F32: {
		char *e;
		errno = 0;
		double v = strtod(s, &e);
		if (errno || e == s || *e || !(v >= t->lo && v <= t->hi))
			return -EINVAL;
		*(float *)p = (float)v;
		return 0;
	}
	case CT_U64:
		if (parse_u64(s, &u, &end) || *end)
			return -EINVAL;
		*(uint64_t *)p = u;
		return 0;
	case CT_SIZE: {
		if (parse_u64(s, &u, &end))
			return -EINVAL;
		uint64_t mul = 1;
		if (*end == 'K' || *end == 'k')
			mul = 1ull << 10;
		else if (*end == 'M' || *end == 'm')
			mul = 1ull << 20;
		else if (*end == 'G' || *end == 'g')
			mul = 1ull << 30;
		if (mul != 1)
			end++;
		if (*end || u > UINT64_MAX / mul || (u == 0 && t->lo > 0))
			return -EINVAL;
		*(uint64_t *)p = u * mul;
		return 0;
	}
	case CT_BOOL:
		if (!strcmp(s, "yes") || !strcmp(s, "true") || !strcmp(s, "on") || !strcmp(s, "1"))
			*(int *)p = 1;
		else if (!strcmp(s, "no") || !strcmp(s, "false") || !strcmp(s, "off") || !strcmp(s, "0"))
			*(int *)p = 0;
		else
			return -EINVAL;
		return 0;
	case CT_ENUM:
		for (int i = 0; t->names[i]; i++)
			if (!strcmp(s, t->names[i])) {
				*(int *)p = t->vals[i];
				return 0;
			}
		return -EINVAL;
	}
	return -EINVAL;
}

/* The value of t in o as text (the form the file takes). */
static void format_value(const struct kvd_options *o, const struct cfg_opt *t, char *buf, size_t len)
{
	const void *p = field(o, t);
	switch (t->type) {
	case CT_STR: {
		const char *s = *(const char *const *)p;
		snprintf(buf, len, "%s", s ? s : "");
		break;
	}
	case CT_U32:
	case CT_POW2:
		snprintf(buf, len, "%u", *(const uint32_t *)p);
		break;
	case CT_INT:
		snprintf(buf, len, "%d", *(const int *)p);
		break;
	case CT_F32:
		snprintf(buf, len, "%g", (double)*(const float *)p);
		break;
	case CT_U64:
		snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)p);
		break;
	case CT_SIZE: {
		uint64_t v = *(const uint64_t *)p;
		if (v && !(v & ((1ull << 30) - 1)))
			snprintf(buf, len, "%lluG", (unsigned long long)(v >> 30));
		else if (v && !(v & ((1ull << 20) - 1)))
			snprintf(buf, len, "%lluM", (unsigned long long)(v >> 20));
		else if (v && !(v & ((1ull << 10) - 1)))
			snprintf(buf, len, "%lluK", (unsigned long long)(v >> 10));
		else
			snprintf(buf, len, "%llu", (unsigned long long)v);
		break;
	}
	case CT_BOOL:
		snprintf(buf, len, "%s", *(const int *)p ? "yes" : "no");
		break;
	case CT_ENUM:
		snprintf(buf, len, "?");
		for (int i = 0; t->names[i]; i++)
			if (t->vals[i] == *(const int *)p)
				snprintf(buf, len, "%s", t->names[i]);
		break;
	}
}

static int same_value(const struct kvd_options *a, const struct kvd_options *b, const struct cfg_opt *t)
{
	char x[512], y[512];
	format_value(a, t, x, sizeof(x));
	format_value(b, t, y, sizeof(y));
	return !strcmp(x, y);
}

static size_t value_size(const struct cfg_opt *t)
{
	switch (t->type) {
	case CT_STR: return sizeof(const char *);
	case CT_U32: case CT_POW2: return sizeof(uint32_t);
	case CT_F32: return sizeof(float);
	case CT_U64: case CT_SIZE: return sizeof(uint64_t);
	default: return sizeof(int);
	}
}

void config_defaults(struct kvd_options *o)
{
	memset(o, 0, sizeof(*o));
	o->model = CONFIG_DEFAULT_MODEL;
	o->n_predict = 128;
	o->kv_block_tokens = 16;
	o->kv_type = KB_F16;
	o->log_level = LOG_NOTICE;
	o->bpf = CONFIG_BPF_AUTO;
	o->backend = CONFIG_BACKEND_AUTO;
	o->srv = (struct server_config){
		.socket_gid = (gid_t)-1, .max_sessions = 16, .max_slots = 8, .max_tokens = 8192,
		.max_inflight = 256, .max_uid_sessions = 64, .max_uid_inflight = 1024,
		.max_uid_arena = 1ull << 30, .sq_entries = 64, .cq_entries = 256, .arena_bytes = 1 << 20,
		.max_arena_bytes = 64 << 20, .max_batch_rows = 32, .drain_timeout_ms = 5000,
	};
	sampler_params_default(&o->sp);
	/* Under systemd the model lives in the unit's StateDirectory. */
	const char *state = getenv("STATE_DIRECTORY");
	int mi = find_opt("model", 5);
	if (state && *state && !strchr(state, ':') &&
	    asprintf(&o->owned[mi], "%s/%s", state, CONFIG_DEFAULT_MODEL) > 0)
		o->model = o->owned[mi];
}

/* Store a copy of s as option i's value, from src. */
static int set_owned(struct kvd_options *o, int i, const char *s, size_t len, char *err,
		     size_t errlen, const char *where)
{
	char *copy = strndup(s, len);
	if (!copy)
		return -ENOMEM;
	char desc[160];
	if (parse_value(o, &table[i], copy)) {
		describe(&table[i], desc, sizeof(desc));
		log_errf(err, errlen, 0, "%s: bad value '%s' for %s: expected %s", where, copy,
		       table[i].name, desc);
		free(copy);
		return -EINVAL;
	}
	if (table[i].type == CT_STR) {
		free(o->owned[i]);
		o->owned[i] = copy;
	} else {
		free(copy);
	}
	return 0;
}

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\r';
}

int config_parse_text(struct kvd_options *o, const char *name, const char *text, size_t len,
		      char *err, size_t errlen)
{
	uint32_t lineno = 0;
	size_t pos = 0;
	char where[300];
	while (pos < len) {
		const char *line = text + pos;
		const char *nl = memchr(line, '\n', len - pos);
		size_t n = nl ? (size_t)(nl - line) : len - pos;
		pos += n + (nl ? 1 : 0);
		lineno++;
		snprintf(where, sizeof(where), "%s:%u", name, lineno);
		if (n > MAX_LINE) {
			log_errf(err, errlen, 0, "%s: line longer than %d bytes", where, MAX_LINE);
			return -EINVAL;
		}
		if (memchr(line, '\0', n)) {
			log_errf(err, errlen, 0, "%s: NUL byte in the line", where);
			return -EINVAL;
		}
		while (n && is_space(*line))
			line++, n--;
		while (n && is_space(line[n - 1]))
			n--;
		if (!n || *line == '#' || *line == ';')
			continue;
		const char *eq = memchr(line, '=', n);
		if (!eq) {
			log_errf(err, errlen, 0, "%s: expected 'key = value', got '%.*s'", where,
			       (int)(n > 60 ? 60 : n), line);
			return -EINVAL;
		}
		size_t kl = (size_t)(eq - line);
		while (kl && is_space(line[kl - 1]))
			kl--;
		const char *val = eq + 1;
		size_t vl = n - (size_t)(val - line);
		while (vl && is_space(*val))
			val++, vl--;
		if (!kl) {
			log_errf(err, errlen, 0, "%s: a key is missing before '='", where);
			return -EINVAL;
		}
		int i = find_opt(line, kl);
		if (i < 0) {
			log_errf(err, errlen, 0, "%s: unknown key '%.*s'", where, (int)(kl > 60 ? 60 : kl), line);
			return -EINVAL;
		}
		if (table[i].flags & F_CLI) {
			log_errf(err, errlen, 0, "%s: %s can only be given on the command line", where,
			       table[i].name);
			return -EINVAL;
		}
		if (o->origin[i].src == CONFIG_SRC_FILE) {
			log_errf(err, errlen, 0, "%s: %s is already set on line %u", where, table[i].name,
			       o->origin[i].line);
			return -EINVAL;
		}
		int rc = set_owned(o, i, val, vl, err, errlen, where);
		if (rc)
			return rc;
		o->origin[i] = (struct config_origin){ CONFIG_SRC_FILE, lineno };
	}
	return 0;
}

/* Read path into o; a missing file is fine unless must_exist. */
static int parse_file(struct kvd_options *o, const char *path, int must_exist, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT && !must_exist)
			return 0;
		int rc = -errno;
		log_errf(err, errlen, 0, "cannot read %s: %s", path, strerror(-rc));
		return rc;
	}
	char *buf = malloc(MAX_FILE + 1);
	size_t len = 0;
	ssize_t r = 0;
	while (buf && len <= MAX_FILE && (r = read(fd, buf + len, MAX_FILE + 1 - len)) > 0)
		len += (size_t)r;
	int rc = 0;
	if (!buf)
		rc = -ENOMEM;
	else if (r < 0) {
		rc = -errno;
		log_errf(err, errlen, 0, "cannot read %s: %s", path, strerror(-rc));
	} else if (len > MAX_FILE) {
		rc = -EFBIG;
		log_errf(err, errlen, 0, "%s: larger than %d bytes", path, MAX_FILE);
	}
	close(fd);
	if (!rc) {
		free(o->file_name);
		o->file_name = strdup(path);
		o->file_used = o->file_name;
		rc = config_parse_text(o, path, buf, len, err, errlen);
	}
	free(buf);
	return rc;
}

/*
 * One pass of getopt over the table. pre: only look for --config and
 * --help, say nothing about errors (the second pass will).
 */
static int parse_args(struct kvd_options *o, int argc, char **argv, int pre, char *err, size_t errlen)
{
	struct option longopts[N_OPTS + 1];
	char shorts[64] = ":";
	size_t ns = 1;
	for (size_t i = 0; i < N_OPTS; i++) {
		int arg = table[i].type == CT_BOOL ? no_argument : required_argument;
		longopts[i] = (struct option){ table[i].name, arg, NULL, 256 + (int)i };
		if (table[i].short_opt) {
			shorts[ns++] = (char)table[i].short_opt;
			if (arg == required_argument)
				shorts[ns++] = ':';
		}
	}
	shorts[ns] = 0;
	memset(&longopts[N_OPTS], 0, sizeof(longopts[N_OPTS]));
	opterr = 0;
	optind = 0;	/* glibc: start afresh, so a reload can parse argv again */
	int c, li;
	while ((c = getopt_long(argc, argv, shorts, longopts, &li)) != -1) {
		if (c == '?' || c == ':') {
			if (pre)
				continue;
			const char *arg = argv[optind - 1];
			if (c == ':')
				log_errf(err, errlen, 0, "option %s needs a value", arg);
			else if (optopt >= 256)
				log_errf(err, errlen, 0, "option --%s takes no value", table[optopt - 256].name);
			else if (optopt && optopt < 256 && strncmp(arg, "--", 2))
				log_errf(err, errlen, 0, "unknown option '-%c'", optopt);
			else
				log_errf(err, errlen, 0, "unknown option '%s'", arg);
			return -EINVAL;
		}
		int i = -1;
		if (c >= 256)
			i = c - 256;
		else
			for (size_t k = 0; k < N_OPTS; k++)
				if (table[k].short_opt == c)
					i = (int)k;
		if (i < 0)
			continue;
		if (pre && strcmp(table[i].name, "config") && strcmp(table[i].name, "help") &&
		    strcmp(table[i].name, "help-man"))
			continue;
		const char *val = table[i].type == CT_BOOL ? "yes" : optarg;
		if (parse_value(o, &table[i], val)) {
			char desc[160];
			if (pre)
				continue;
			describe(&table[i], desc, sizeof(desc));
			log_errf(err, errlen, 0, "bad value '%s' for --%s: expected %s", val, table[i].name, desc);
			return -EINVAL;
		}
		if (table[i].type == CT_STR) {
			free(o->owned[i]);	/* argv outlives o: no copy */
			o->owned[i] = NULL;
		}
		o->origin[i] = (struct config_origin){ CONFIG_SRC_CMDLINE, 0 };
	}
	if (!pre && optind < argc) {
		log_errf(err, errlen, 0, "unexpected argument '%s'", argv[optind]);
		return -EINVAL;
	}
	return 0;
}

/* Checks that need more than one value or the system's databases. */
static int finish(struct kvd_options *o, char *err, size_t errlen)
{
	if (o->socket_group) {
		struct group *g = getgrnam(o->socket_group);
		if (!g) {
			log_errf(err, errlen, 0, "socket-group: unknown group '%s'", o->socket_group);
			return -EINVAL;
		}
		o->srv.socket_gid = g->gr_gid;
	}
#ifndef KVD_HAVE_CUDA
	if (o->backend == CONFIG_BACKEND_CUDA) {
		log_errf(err, errlen, 0, "backend = cuda: this kvd was built without the CUDA backend "
		       "(build with CUDA=1 where nvcc is installed), use auto or cpu");
		return -EINVAL;
	}
#endif
	return 0;
}

int config_load(struct kvd_options *o, int argc, char **argv, char *err, size_t errlen)
{
	config_defaults(o);
	o->argc = argc;
	o->argv = argv;
	int rc = parse_args(o, argc, argv, 1, err, errlen);
	if (rc || o->help || o->help_man)
		return rc;
	const char *env = getenv("KVD_CONFIG");
	const char *path = o->config_path ? o->config_path : env && *env ? env : NULL;
	/* Only the default file may be missing; one the user names must be there. */
	if ((rc = parse_file(o, path ? path : CONFIG_DEFAULT_PATH, path != NULL, err, errlen)))
		return rc;
	const char *model = getenv("KVD_MODEL");
	int mi = find_opt("model", 5);
	if (model && *model) {
		free(o->owned[mi]);
		o->owned[mi] = NULL;
		o->model = model;
		o->origin[mi] = (struct config_origin){ CONFIG_SRC_ENV, 0 };
	}
	if ((rc = parse_args(o, argc, argv, 0, err, errlen)))
		return rc;
	return finish(o, err, errlen);
}

void config_free(struct kvd_options *o)
{
	for (size_t i = 0; i < CONFIG_MAX_OPTS; i++) {
		free(o->owned[i]);
		o->owned[i] = NULL;
	}
	free(o->file_name);
	o->file_name = NULL;
	o->file_used = NULL;
}

const char *config_default_socket(char *buf, size_t len)
{
	const char *rt = getenv("RUNTIME_DIRECTORY");
	if (rt && *rt && !strchr(rt, ':')) {
		snprintf(buf, len, "%s/kvd.sock", rt);
		return buf;
	}
	if (geteuid() == 0)
		return "/run/kvd/kvd.sock";
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (xdg && *xdg)
		snprintf(buf, len, "%s/kvd.sock", xdg);
	else
		snprintf(buf, len, "/run/user/%u/kvd.sock", (unsigned)getuid());
	return buf;
}

static void format_origin(const struct kvd_options *o, size_t i, char *buf, size_t len)
{
	switch (o->origin[i].src) {
	case CONFIG_SRC_FILE:
		snprintf(buf, len, "%s:%u", o->file_used ? o->file_used : "?", o->origin[i].line);
		break;
	case CONFIG_SRC_ENV:
		snprintf(buf, len, "environment KVD_MODEL");
		break;
	case CONFIG_SRC_CMDLINE:
		snprintf(buf, len, "command line");
		break;
	default:
		snprintf(buf, len, "default");
	}
}

void config_print(const struct kvd_options *o, FILE *f)
{
	char val[512], from[320], line[600], sock[256];
	fprintf(f, "# kvd configuration: %s\n",
		o->file_used ? o->file_used : "no file read (defaults and command line)");
	for (size_t i = 0; i < N_OPTS; i++) {
		const struct cfg_opt *t = &table[i];
		if (t->flags & F_CLI)
			continue;
		format_value(o, t, val, sizeof(val));
		format_origin(o, i, from, sizeof(from));
		if (!strcmp(t->name, "socket") && !o->srv.socket_path)
			snprintf(val, sizeof(val), "%s", config_default_socket(sock, sizeof(sock)));
		if (!strcmp(t->name, "socket-group") && !o->socket_group) {
			fprintf(f, "# %-20s   (unset: the daemon's own group)  # %s\n", t->name, from);
			continue;
		}
		snprintf(line, sizeof(line), "%s = %s", t->name, val);
		fprintf(f, "%-44s # %s%s\n", line, from, t->flags & F_LIVE ? ", reloadable" : "");
	}
}

int config_reload(struct kvd_options *o, struct server_config *live)
{
	struct kvd_options n;
	char err[512], a[512], b[512], from[320];
	int rc = config_load(&n, o->argc, o->argv, err, sizeof(err));
	if (rc) {
		log_msg(LOG_ERR, "reload: %s; the running configuration stays", err);
		config_free(&n);
		return rc;
	}
	int applied = 0, kept = 0;
	for (size_t i = 0; i < N_OPTS; i++) {
		const struct cfg_opt *t = &table[i];
		if ((t->flags & F_CLI) || same_value(o, &n, t))
			continue;
		format_value(o, t, a, sizeof(a));
		format_value(&n, t, b, sizeof(b));
		format_origin(&n, i, from, sizeof(from));
		if (!(t->flags & F_LIVE)) {
			log_msg(LOG_WARNING, "reload: %s = %s (%s) needs a restart; still %s", t->name,
				b, from, a);
			kept++;
			continue;
		}
		memcpy(field(o, t), field(&n, t), value_size(t));
		o->origin[i] = n.origin[i];
		log_msg(LOG_NOTICE, "reload: %s %s -> %s (%s)", t->name, a, b, from);
		applied++;
		size_t s0 = offsetof(struct kvd_options, srv);
		if (t->off >= s0 && t->off < s0 + sizeof(o->srv))
			memcpy((char *)live + (t->off - s0), field(o, t), value_size(t));
	}
	log_set_level(o->log_level);
	if (!applied && !kept)
		log_msg(LOG_NOTICE, "reload: %s: nothing changed",
			n.file_used ? n.file_used : "no configuration file");
	config_free(&n);
	return applied;
}

/* ---- the option list, for --help and kvd(8) ---- */

static const struct {
	const char *help;	/* --help's heading; NULL: none */
	const char *man;	/* the man page's .SS title */
	const char *note;	/* --help's lines after the section, or NULL */
} sections[SEC_LAST] = {
	[SEC_CONFIG] = { NULL, "Configuration", NULL },
	[SEC_DAEMON] = { "daemon:", "Daemon",
			 "  SIGHUP re-reads the file: log-level, the max-* limits, kv-quota, drain-timeout\n"
			 "  and no-prefix-cache change live; the rest is logged as needing a restart.\n" },
	[SEC_MODEL] = { "model and KV cache:", "Model and KV cache", NULL },
	[SEC_GEN] = { "in-process generation (command line only):",
		      "In-process generation (command line only)", NULL },
};

#define HELP_COL 26	/* where --help's descriptions start */

static void usage_option(const struct cfg_opt *t, FILE *f)
{
	char flag[64];
	int n = snprintf(flag, sizeof(flag), "--%s%s%s", t->name, t->arg ? " " : "",
			 t->arg ? t->arg : "");
	if (t->short_opt)
		fprintf(f, "  -%c, %s", t->short_opt, flag);
	else
		fprintf(f, "      %s", flag);
	/* A name too long for the column gets one space; a description always follows. */
	fprintf(f, "%*s", n + 6 < HELP_COL ? HELP_COL - 6 - n : 1, "");
	for (const char *l = t->help; *l;) {
		const char *nl = strchr(l, '\n');
		int len = nl ? (int)(nl - l) : (int)strlen(l);
		fprintf(f, "%s%.*s\n", l == t->help ? "" : "                          ", len, l);
		l += len + (nl != NULL);
	}
}

void config_usage(FILE *f)
{
	fprintf(f,
		"usage: kvd [--model PATH] [daemon options]      serve clients on a socket\n"
		"       kvd [--model PATH] --prompt TEXT [options]  generate in-process and exit\n"
		"       kvd [--model PATH] --info\n"
		"       kvd [options] --print-config                 show the effective configuration\n"
		"\n"
		"Every daemon option can also be set in the configuration file as\n"
		"`name = value` (see kvd.conf(5)); the command line wins over the file.\n");
	for (int sec = 0; sec < SEC_HIDDEN; sec++) {
		if (sections[sec].help)
			fprintf(f, "\n%s\n", sections[sec].help);
		for (size_t i = 0; i < N_OPTS; i++)
			if (table[i].sec == sec)
				usage_option(&table[i], f);
		if (sections[sec].note)
			fputs(sections[sec].note, f);
	}
}

/* s with roff's hyphen escaped, as option names are set in a man page. */
static void man_name(FILE *f, const char *s)
{
	for (; *s; s++)
		fprintf(f, *s == '-' ? "\\-" : "%c", *s);
}

static void man_option(const struct cfg_opt *t, FILE *f)
{
	/* .B/.BR for a flag, .BI for one with a value: roman commas, italic value names. */
	fprintf(f, ".TP\n.B%s ", t->arg ? "I" : t->short_opt ? "R" : "");
	if (t->short_opt)
		fprintf(f, "\\-%c \", \" ", t->short_opt);
	fputs("\\-\\-", f);
	man_name(f, t->name);
	if (t->arg)
		fprintf(f, " \" %s\"", t->arg);
	fprintf(f, "\n%s\n", t->man);
}

void config_man(FILE *f)
{
	fputs(".SH OPTIONS\n", f);
	for (int sec = 0; sec < SEC_HIDDEN; sec++) {
		fprintf(f, ".SS %s\n", sections[sec].man);
		for (size_t i = 0; i < N_OPTS; i++)
			if (table[i].sec == sec)
				man_option(&table[i], f);
	}
}
