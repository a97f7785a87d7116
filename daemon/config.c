/* config.c — kvd.conf and getopt over the option table (config_opts.c): parsing, precedence, --print-config, SIGHUP reload. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "bpf/kvd_pin.h"
#include "daemon/config.h"
#include "daemon/config_int.h"
#include "daemon/log.h"
#include "kernels/backend.h"

#define MAX_LINE 4096
#define MAX_FILE (1 << 20)
#ifndef KVD_DATADIR
#define KVD_DATADIR "/usr/local/share/kvd"	/* daemon.mk passes $(PREFIX)/share/kvd */
#endif

const char config_datadir[] = KVD_DATADIR;


static void *field(const struct kvd_options *o, const struct cfg_opt *t)
{
	return (char *)o + t->off;
}

static int find_opt(const char *name, size_t len)
{
	for (size_t i = 0; i < config_n_opts; i++)
		if (strlen(config_opts[i].name) == len && !memcmp(config_opts[i].name, name, len))
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
	o->n_predict = 128;
	o->kv_block_tokens = 16;
	o->kv_type = KB_F16;
	o->log_level = LOG_NOTICE;
	o->bpf = KVD_BPF_AUTO;
	o->backend = KB_BACKEND_AUTO;
	o->srv = (struct server_config){
		.socket_gid = (gid_t)-1, .max_sessions = 16, .max_slots = 8, .max_tokens = 8192,
		.max_inflight = 256, .max_uid_conns = 64, .max_uid_sessions = 64, .max_uid_inflight = 1024,
		.max_uid_arena = 1ull << 30, .sq_entries = 64, .cq_entries = 256, .arena_bytes = 1 << 20,
		.max_arena_bytes = 64 << 20, .max_batch_rows = 32, .drain_timeout_ms = 5000,
		.state_records = 1024, .resume_timeout_s = 600,
	};
	sampler_params_default(&o->sp);
	/* model stays NULL: finish() looks for the default one once nothing names another. */
}

/* dir/name into out; -ENAMETOOLONG when it does not fit. */
static int join(char *out, size_t len, const char *dir, int dir_len, const char *name)
{
	int n = snprintf(out, len, "%.*s/%s", dir_len, dir, name);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* Whether dir is kvd's source tree: an installed /usr/bin/kvd must not take /usr for one. */
static int is_source_tree(const char *dir)
{
	char path[CONFIG_PATH_MAX];
	struct stat st;
	return !join(path, sizeof(path), dir, -1, "Makefile") && !stat(path, &st) &&
	       S_ISREG(st.st_mode) && !join(path, sizeof(path), dir, -1, "daemon/main.c") &&
	       !stat(path, &st) && S_ISREG(st.st_mode);
}

/*
 * models/ in the source tree kvd was built in: the nearest of its binary's
 * three closest ancestors that is one, with or without models/ yet (the
 * message then names where `make model` puts it); -ENOENT outside one.
 */
static int source_models(char *out, size_t len)
{
	char dir[CONFIG_PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", dir, sizeof(dir) - 1);
	if (n <= 0)
		return -ENOENT;
	dir[n] = 0;
	char *slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return -ENOENT;
	*slash = 0;	/* the binary's folder: build/ */
	for (int up = 0; up < 3 && (slash = strrchr(dir, '/')) && slash != dir; up++) {
		*slash = 0;
		if (is_source_tree(dir))
			return join(out, len, dir, -1, "models");
	}
	return -ENOENT;
}

int config_model_places(char (*places)[CONFIG_PATH_MAX])
{
	char dir[CONFIG_PATH_MAX];
	int n = 0;
	/* systemd may list several state directories, ':'-separated; the model is in the first. */
	const char *state = getenv("STATE_DIRECTORY");
	size_t sl = state ? strcspn(state, ":") : 0;
	if (sl && !join(dir, sizeof(dir), state, (int)sl, "models") &&
	    !join(places[n], CONFIG_PATH_MAX, dir, -1, CONFIG_MODEL_FILE))
		n++;
	else if (!sl)
		join(places[n++], CONFIG_PATH_MAX, "/var/lib/kvd/models", -1, CONFIG_MODEL_FILE);
	if (!join(dir, sizeof(dir), config_datadir, -1, "models") &&
	    !join(places[n], CONFIG_PATH_MAX, dir, -1, CONFIG_MODEL_FILE))
		n++;
	if (!source_models(dir, sizeof(dir)) && !join(places[n], CONFIG_PATH_MAX, dir, -1, CONFIG_MODEL_FILE))
		n++;
	return n;
}

/* No model named: the first place holding the default one, else NULL and the list of places tried. */
static int find_model(struct kvd_options *o)
{
	char places[CONFIG_MODEL_PLACES][CONFIG_PATH_MAX];
	int n = config_model_places(places), mi = find_opt("model", 5);
	for (int i = 0; i < n; i++) {
		struct stat st;
		if (!stat(places[i], &st) && S_ISREG(st.st_mode)) {
			free(o->owned[mi]);
			if (!(o->owned[mi] = strdup(places[i])))
				return -ENOMEM;
			o->model = o->owned[mi];
			return 0;
		}
	}
	size_t len = 0;
	for (int i = 0; i < n; i++)
		len += strlen(places[i]) + 2;
	free(o->model_tried);
	if (!(o->model_tried = malloc(len + 1)))
		return -ENOMEM;
	o->model_tried[0] = 0;
	for (int i = 0; i < n; i++)
		strcat(strcat(o->model_tried, i ? ", " : ""), places[i]);
	return 0;
}

/* Store a copy of s as option i's value, from src. */
static int set_owned(struct kvd_options *o, int i, const char *s, size_t len, char *err,
		     size_t errlen, const char *where)
{
	char *copy = strndup(s, len);
	if (!copy)
		return -ENOMEM;
	char desc[160];
	if (parse_value(o, &config_opts[i], copy)) {
		describe(&config_opts[i], desc, sizeof(desc));
		log_errf(err, errlen, 0, "%s: bad value '%s' for %s: expected %s", where, copy,
		       config_opts[i].name, desc);
		free(copy);
		return -EINVAL;
	}
	if (config_opts[i].type == CT_STR) {
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
		if (config_opts[i].flags & F_CLI) {
			log_errf(err, errlen, 0, "%s: %s can only be given on the command line", where,
			       config_opts[i].name);
			return -EINVAL;
		}
		if (o->origin[i].src == CONFIG_SRC_FILE) {
			log_errf(err, errlen, 0, "%s: %s is already set on line %u", where, config_opts[i].name,
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
	struct option longopts[CONFIG_MAX_OPTS + 1];
	char shorts[64] = ":";
	size_t ns = 1;
	for (size_t i = 0; i < config_n_opts; i++) {
		int arg = config_opts[i].type == CT_BOOL ? no_argument : required_argument;
		longopts[i] = (struct option){ config_opts[i].name, arg, NULL, 256 + (int)i };
		if (config_opts[i].short_opt) {
			shorts[ns++] = (char)config_opts[i].short_opt;
			if (arg == required_argument)
				shorts[ns++] = ':';
		}
	}
	shorts[ns] = 0;
	memset(&longopts[config_n_opts], 0, sizeof(longopts[config_n_opts]));
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
				log_errf(err, errlen, 0, "option --%s takes no value", config_opts[optopt - 256].name);
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
			for (size_t k = 0; k < config_n_opts; k++)
				if (config_opts[k].short_opt == c)
					i = (int)k;
		if (i < 0)
			continue;
		if (pre && strcmp(config_opts[i].name, "config") && strcmp(config_opts[i].name, "help") &&
		    strcmp(config_opts[i].name, "help-man"))
			continue;
		const char *val = config_opts[i].type == CT_BOOL ? "yes" : optarg;
		if (parse_value(o, &config_opts[i], val)) {
			char desc[160];
			if (pre)
				continue;
			describe(&config_opts[i], desc, sizeof(desc));
			log_errf(err, errlen, 0, "bad value '%s' for --%s: expected %s", val, config_opts[i].name, desc);
			return -EINVAL;
		}
		if (config_opts[i].type == CT_STR) {
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

/*
 * --perplexity's options go together: a chunk size only the command line
 * sets (a daemon's ctx in the file is no chunk size), and one mode at a time.
 */
static int finish_perplexity(struct kvd_options *o, char *err, size_t errlen)
{
	if (o->origin[find_opt("ctx", 3)].src == CONFIG_SRC_CMDLINE)
		o->ppl_ctx = o->ctx;
	if (o->kld && !o->kld_base)
		return log_errf(err, errlen, -EINVAL, "--kl-divergence needs --kl-divergence-base FILE, "
				"the file of log-probabilities to compare with");
	if (o->kld_base && !o->kld && !o->perplexity)
		return log_errf(err, errlen, -EINVAL, "--kl-divergence-base FILE needs --perplexity FILE "
				"(to write it) or --kl-divergence (to read it)");
	if ((o->perplexity || o->kld) && (o->prompt || o->info))
		return log_errf(err, errlen, -EINVAL, "--%s and --%s are two modes: give one",
				o->perplexity ? "perplexity" : "kl-divergence", o->prompt ? "prompt" : "info");
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
	if (o->instance && !*o->instance)
		o->instance = NULL;	/* `instance =`: the default, named after the socket */
	if (o->instance && !kvd_pin_instance_valid(o->instance)) {
		log_errf(err, errlen, 0, "instance: '%s' is not a name: 1 to %d of letters, digits, "
			 "'_', '.' and '-', not starting with '.'", o->instance, KVD_PIN_INSTANCE_MAX);
		return -EINVAL;
	}
	int rc = finish_perplexity(o, err, errlen);
	if (rc)
		return rc;
	/* The reference quantizes no activation: an f32 cache, unless kv-type was set. */
	if (o->backend == KB_BACKEND_REF && o->origin[find_opt("kv-type", 7)].src == CONFIG_SRC_DEFAULT)
		o->kv_type = KB_F32;
	if (!o->model) {
		rc = find_model(o);
		if (rc)
			return log_errf(err, errlen, rc, "cannot look for the model: %s", strerror(-rc));
	}
#ifndef KVD_HAVE_CUDA
	if (o->backend == KB_BACKEND_CUDA) {
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
	free(o->model_tried);
	o->model_tried = NULL;
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
	for (size_t i = 0; i < config_n_opts; i++) {
		const struct cfg_opt *t = &config_opts[i];
		if (t->flags & F_CLI)
			continue;
		format_value(o, t, val, sizeof(val));
		format_origin(o, i, from, sizeof(from));
		if (!strcmp(t->name, "socket") && !o->srv.socket_path)
			snprintf(val, sizeof(val), "%s", config_default_socket(sock, sizeof(sock)));
		if (!strcmp(t->name, "model") && !o->model) {
			fprintf(f, "# %-20s   (none found; looked in %s)  # %s\n", t->name,
				o->model_tried ? o->model_tried : "?", from);
			continue;
		}
		if (!strcmp(t->name, "socket-group") && !o->socket_group) {
			fprintf(f, "# %-20s   (unset: the daemon's own group)  # %s\n", t->name, from);
			continue;
		}
		if (!strcmp(t->name, "instance") && !o->instance) {
			fprintf(f, "# %-20s   (unset: named after the socket)  # %s\n", t->name, from);
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
	for (size_t i = 0; i < config_n_opts; i++) {
		const struct cfg_opt *t = &config_opts[i];
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
