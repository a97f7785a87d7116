/* log.c — stderr logging that journald understands (sd-daemon(3) <N> prefixes), error strings, the clock. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include "daemon/log.h"

static int max_level = LOG_NOTICE;
static int journal = -1;

/* stderr is the journal when $JOURNAL_STREAM names its device and inode. */
static int stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long dev, ino;
	struct stat st;
	if (!js || sscanf(js, "%lu:%lu", &dev, &ino) != 2 || fstat(2, &st))
		return 0;
	return st.st_dev == dev && st.st_ino == ino;
}

void log_set_level(int level)
{
	max_level = level;
}

void log_msg(int level, const char *fmt, ...)
{
	if (level > max_level)
		return;
	if (journal < 0)
		journal = stderr_is_journal();
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (journal)
		fprintf(stderr, "<%d>%s\n", level, line);
	else
		fprintf(stderr, "kvd: %s\n", line);
}

int log_verrf(char *err, size_t errlen, int rc, const char *fmt, va_list ap)
{
	if (err && errlen)
		vsnprintf(err, errlen, fmt, ap);
	return rc;
}

int log_errf(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_verrf(err, errlen, rc, fmt, ap);
	va_end(ap);
	return rc;
}

uint64_t log_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
