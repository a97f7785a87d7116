/* log.h — one line per event to stderr (<N> priority prefixes when stderr is the journal), error strings, the clock. */
#ifndef KVD_LOG_H
#define KVD_LOG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <syslog.h>

/* Messages above level (LOG_ERR .. LOG_DEBUG) are dropped. */
void log_set_level(int level);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * The one way a function reports why it failed: format into the caller's
 * err (errlen bytes, truncated; nothing is written when err is NULL or
 * errlen 0) and return rc, so a failure reads `return log_errf(err,
 * errlen, -EINVAL, "...")`. Leaf code (model/, tokenizer/, engine/) may use
 * it: it touches nothing but err.
 */
int log_errf(char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
int log_verrf(char *err, size_t errlen, int rc, const char *fmt, va_list ap)
	__attribute__((format(printf, 4, 0)));

/* CLOCK_MONOTONIC in nanoseconds: every duration kvd measures or reports. */
uint64_t log_now_ns(void);

#endif
