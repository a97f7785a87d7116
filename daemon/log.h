/* log.h — one line per event to stderr, with <N> priority prefixes when stderr is the journal. */
#ifndef KVD_LOG_H
#define KVD_LOG_H

#include <syslog.h>

/* Messages above level (LOG_ERR .. LOG_DEBUG) are dropped. */
void log_set_level(int level);
int log_level_parse(const char *name);	/* "err", "warning", "notice", "info", "debug"; -1 if unknown */
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
