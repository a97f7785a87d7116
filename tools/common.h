/* common.h — what the tools share: option numbers, connecting to kvd, time, percentiles, signals. */
#ifndef KVD_TOOLS_COMMON_H
#define KVD_TOOLS_COMMON_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct kvc_conn;

/* Exit statuses of every tool. */
#define TOOL_EXIT_RUNTIME	1
#define TOOL_EXIT_USAGE		2
#define TOOL_EXIT_SHUTDOWN	3	/* kvctl: the daemon is shutting down (a drain ended the request) */

/*
 * s, as a whole, an unsigned integer (decimal, 0x hex, or octal after a 0)
 * from lo to hi: 0 and *out. -EINVAL when it is not one (empty, a sign,
 * text after the digits), -ERANGE when it lies outside [lo, hi]; then, if
 * who is not NULL, "who: bad value 's' for opt: expected an integer from
 * lo to hi" on stderr. *out is left alone on failure.
 */
int tool_parse_u64(const char *who, const char *opt, const char *s, uint64_t lo, uint64_t hi,
		   uint64_t *out);

/* The same for a real number (strtod's syntax); NaN is outside every range. */
int tool_parse_double(const char *who, const char *opt, const char *s, double lo, double hi,
		      double *out);

/*
 * kvc_connect() to path (NULL: the library's default socket). On failure,
 * when who is not NULL, tool_connect_explain() says why on stderr.
 * Returns 0 and *c, or -errno.
 */
int tool_connect(struct kvc_conn **c, const char *path, const char *who);

/*
 * "who: cannot connect to PATH: REASON", then what to do about it: start
 * kvd, pass --socket, join the socket's group. err is kvc_connect()'s.
 */
void tool_connect_explain(const char *who, const char *path, int err);

/*
 * A lost connection's err as words: "the daemon went away" rather than
 * "Connection reset by peer"; a restart's -ERESTART and -ESTALE in kvd's
 * terms (kvc_strerror()), not glibc's ("Interrupted system call should be
 * restarted").
 */
const char *tool_conn_error(int err);

/* Print s[0, n) as a JSON string, quotes included; bytes that are not valid UTF-8 become U+FFFD. */
void tool_json_string(FILE *f, const char *s, size_t n);

/*
 * The API key in the first line of path, trailing spaces and line ending
 * dropped, in a new string; NULL, said on stderr as "who: path: ...", when
 * the file cannot be read or its first line is empty.
 */
char *tool_read_key(const char *who, const char *path);

/* qsort order of doubles. */
int cmp_double(const void *a, const void *b);

/* Nearest-rank percentile p (0..100] of sorted v (n,); NAN when n is 0. */
double pct(const double *v, size_t n, double p);

/* CLOCK_MONOTONIC in seconds. */
double tool_now_s(void);

/* Sleep s seconds; a caught signal cuts it short. */
void tool_sleep_s(double s);

/* Set by the handler tool_catch_signals() installs; the tools poll it. */
extern volatile sig_atomic_t tool_interrupted;

/*
 * Catch each signal of sigs (0-terminated) by setting tool_interrupted,
 * without SA_RESTART, so that a blocking poll(), nanosleep() or getline()
 * returns EINTR and the tool can look at the flag.
 */
void tool_catch_signals(const int *sigs);

#endif
