/* common.c — what kvctl, kvbench and kvtop share: option numbers, connecting to kvd, time, signals. */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include "shm/kvclient.h"
#include "tools/common.h"

#define SYSTEM_SOCKET	"/run/kvd/kvd.sock"	/* kvd.socket's, and root's default */

int tool_parse_u64(const char *who, const char *opt, const char *s, uint64_t lo, uint64_t hi,
		   uint64_t *out)
{
	char *end;
	int rc = 0;
	errno = 0;
	/* strtoull skips blanks and takes "-1" as ULLONG_MAX: only a digit may start it. */
	unsigned long long v = strtoull(s, &end, 0);
	if (!isdigit((unsigned char)*s) || *end)
		rc = -EINVAL;
	else if (errno == ERANGE || v < lo || v > hi)
		rc = -ERANGE;
	if (rc && who)
		fprintf(stderr, "%s: bad value '%s' for %s: expected an integer from %" PRIu64 " to %" PRIu64 "\n",
			who, s, opt, lo, hi);
	if (!rc)
		*out = v;
	return rc;
}

int tool_parse_double(const char *who, const char *opt, const char *s, double lo, double hi,
		      double *out)
{
	char *end;
	int rc = 0;
	errno = 0;
	double v = strtod(s, &end);
	if (isspace((unsigned char)*s) || end == s || *end)
		rc = -EINVAL;
	else if (errno == ERANGE || !(v >= lo && v <= hi))
		rc = -ERANGE;
	if (rc && who)
		fprintf(stderr, "%s: bad value '%s' for %s: expected a number from %g to %g\n", who, s, opt, lo, hi);
	if (!rc)
		*out = v;
	return rc;
}

/* "group NAME" of st, or "group GID" when it has no name. */
static const char *group_of(const struct stat *st, char *buf, size_t len)
{
	struct group *g = getgrgid(st->st_gid);
	if (g)
		snprintf(buf, len, "%s", g->gr_name);
	else
		snprintf(buf, len, "%u", (unsigned)st->st_gid);
	return buf;
}

/*
 * The system daemon's socket exists though path does not (a user's
 * default is under $XDG_RUNTIME_DIR): say how to reach it, and whether
 * this user may. 0 when there is no such socket.
 */
static int system_socket_hint(const char *path, char *buf, size_t len)
{
	struct stat st;
	char grp[64];
	if (!strcmp(path, SYSTEM_SOCKET) || stat(SYSTEM_SOCKET, &st) || !S_ISSOCK(st.st_mode))
		return 0;
	int n = snprintf(buf, len, "the system daemon listens on %s: set KVD_SOCKET=%s (or pass --socket %s)",
			 SYSTEM_SOCKET, SYSTEM_SOCKET, SYSTEM_SOCKET);
	/* (Truncation is harmless here: the hint is cut, never overrun.) */
	if (n >= 0 && (size_t)n < len && access(SYSTEM_SOCKET, W_OK))
		n = snprintf(buf + n, len - (size_t)n, "\n  membership of its group %s grants access "
			 "(usermod -aG %s USER, then log in again)", group_of(&st, grp, sizeof(grp)), grp);
	return 1;
}

/* What to do about err on path, or NULL when the reason says it all. */
static const char *connect_hint(const char *path, int err, char *buf, size_t len)
{
	struct stat st;
	char grp[64];
	switch (err) {
	case -ENOENT:
		if (system_socket_hint(path, buf, len))
			return buf;
		return "is kvd running? start it (systemctl start kvd.socket, or kvd --model FILE), "
		       "or pass --socket PATH (or set KVD_SOCKET) for one listening elsewhere";
	case -ECONNREFUSED:
		return "nothing listens there: kvd is not running and left its socket behind; start it again";
	case -EACCES:
	case -EPERM:
		if (!stat(path, &st) && S_ISSOCK(st.st_mode)) {
			group_of(&st, grp, sizeof(grp));
			if (snprintf(buf, len, "the socket is mode %04o, group %s: membership of group %s grants "
				 "access (usermod -aG %s USER, then log in again)",
				 (unsigned)(st.st_mode & 07777), grp, grp, grp) < 0)
				return NULL;
			return buf;
		}
		return "a directory on the way to the socket is not searchable for this user";
	case -ENAMETOOLONG:
		snprintf(buf, len, "a socket path holds at most %zu bytes",
			 sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
		return buf;
	case -EPROTO:
		return "the daemon speaks another ABI version: use a kvd and tools of the same release";
	case -ESHUTDOWN:
		return "the daemon is shutting down; try again once it is back";
	case -EMFILE:
		return "your uid holds max-uid-connections connections already, or the daemon is out of file\n  descriptors (its RLIMIT_NOFILE, LimitNOFILE= in kvd.service)";
	case -ECONNRESET:
	case -EPIPE:
		return "the daemon hung up during the handshake; its log says why";
	default:
		return NULL;
	}
}

void tool_connect_explain(const char *who, const char *path, int err)
{
	char def[sizeof(((struct sockaddr_un *)0)->sun_path)], hint[512];
	if (!path)
		path = kvc_default_socket(def, sizeof(def)) >= 0 ? def : "(the default socket)";
	const char *h = connect_hint(path, err, hint, sizeof(hint));
	fprintf(stderr, "%s: cannot connect to %s: %s%s%s\n", who, path, strerror(-err), h ? "\n  " : "",
		h ? h : "");
}

int tool_connect(struct kvc_conn **c, const char *path, const char *who)
{
	int err = kvc_connect(c, path);
	if (err && who)
		tool_connect_explain(who, path, err);
	return err;
}

const char *tool_conn_error(int err)
{
	return err == -ECONNRESET || err == -EPIPE ? "the daemon went away" :
	       err == -ESHUTDOWN ? "the daemon is shutting down" :
	       err == -ERESTART || err == -ESTALE ? kvc_strerror(err) : strerror(-err);
}

void tool_json_string(FILE *f, const char *s, size_t n)
{
	const uint8_t *p = (const uint8_t *)s;
	fputc('"', f);
	for (size_t i = 0; i < n;) {
		uint8_t b = p[i];
		if (b == '"' || b == '\\') {
			fprintf(f, "\\%c", b);
		} else if (b == '\n') {
			fputs("\\n", f);
		} else if (b == '\t') {
			fputs("\\t", f);
		} else if (b == '\r') {
			fputs("\\r", f);
		} else if (b < 0x20 || b == 0x7f) {
			fprintf(f, "\\u%04x", b);
		} else if (b >= 0x80) {
			size_t len = b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 :
				     b >= 0xf0 && b <= 0xf4 ? 4 : 0;
			size_t k = 1;
			while (len && k < len && i + k < n && (p[i + k] & 0xc0) == 0x80)
				k++;
			if (len && k == len) {
				fwrite(p + i, 1, len, f);
				i += len;
				continue;
			}
			fputs("\\ufffd", f);
		} else {
			fputc(b, f);
		}
		i++;
	}
	fputc('"', f);
}

char *tool_read_key(const char *who, const char *path)
{
	FILE *f = fopen(path, "re");
	if (!f) {
		fprintf(stderr, "%s: %s: %s\n", who, path, strerror(errno));
		return NULL;
	}
	char *line = NULL;
	size_t cap = 0;
	ssize_t n = getline(&line, &cap, f);
	fclose(f);
	while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' '))
		line[--n] = 0;
	if (n <= 0) {
		fprintf(stderr, "%s: %s: no key in its first line\n", who, path);
		free(line);
		return NULL;
	}
	return line;
}

int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The smallest rank k with k >= p% of n, without libm (kvctl links no -lm). */
double pct(const double *v, size_t n, double p)
{
	double want = p / 100.0 * (double)n;
	size_t k = (size_t)want;
	if ((double)k < want)
		k++;
	return n ? v[k ? k - 1 : 0] : NAN;
}

double tool_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void tool_sleep_s(double s)
{
	struct timespec ts = { .tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };
	nanosleep(&ts, NULL);
}

volatile sig_atomic_t tool_interrupted;

static void on_signal(int sig)
{
	(void)sig;
	tool_interrupted = 1;
}

void tool_catch_signals(const int *sigs)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	for (; *sigs; sigs++)
		sigaction(*sigs, &sa, NULL);
}
