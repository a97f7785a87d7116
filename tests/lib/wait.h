/* wait.h — how long a test waits for what must happen eventually: scaled bounds and progress deadlines. */
/*
 * A wait in a test detects a hang; it is never a speed requirement. So no
 * test waits a fixed number of seconds: kw_ms() scales every bound, and a
 * struct kw_deadline expires only after a quiet spell with no progress
 * (a CQE, a token, the daemon's CPU time moving), or at a generous outer
 * bound (minutes) that still turns a real livelock into a failure.
 *
 * The scale is $KVD_TEST_TIMEOUT_SCALE (> 0; $KVD_TEST_SLOW is its older
 * name; default 1), times KW_ASAN_FACTOR in a build with AddressSanitizer
 * and KW_VALGRIND_FACTOR under valgrind: the ASan and valgrind passes of
 * `make test` need nothing set, and a program of build/asan run by hand
 * gets the same bounds as in `make test`. A value below 1 gives a quicker
 * look at a hang.
 */
#ifndef KVD_TESTS_LIB_WAIT_H
#define KVD_TESTS_LIB_WAIT_H

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KW_ASAN_FACTOR		4.0
#define KW_VALGRIND_FACTOR	20.0
#define KW_QUIET_MS		60000	/* no progress at all for this long: a hang */
#define KW_HANG_MS		600000	/* the outer bound, whatever the progress */

#if defined(__SANITIZE_ADDRESS__)
#define KW_HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KW_HAVE_ASAN 1
#endif
#endif
#ifndef KW_HAVE_ASAN
#define KW_HAVE_ASAN 0
#endif

static inline int64_t kw_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* valgrind preloads its core into the program it runs. */
static inline int kw_valgrind(void)
{
	const char *p = getenv("LD_PRELOAD");
	return p && strstr(p, "vgpreload") != NULL;
}

/* The factor every bound is multiplied by (see the top of this file). */
static inline double kw_scale(void)
{
	const char *s = getenv("KVD_TEST_TIMEOUT_SCALE");
	if (!s || !*s)
		s = getenv("KVD_TEST_SLOW");
	double f = s && *s ? atof(s) : 1.0;
	if (!(f > 0))
		f = 1.0;
	if (KW_HAVE_ASAN)
		f *= KW_ASAN_FACTOR;
	if (kw_valgrind())
		f *= KW_VALGRIND_FACTOR;
	return f;
}

/* ms scaled, at least 1 and at most INT_MAX: the bound to pass to poll, kvc_wait or a loop. */
static inline int kw_ms(int ms)
{
	double v = ms * kw_scale();
	if (v < 1)
		return 1;
	return v > INT_MAX ? INT_MAX : (int)v;
}

/* ms scaled, in seconds (rounded up): for alarm() and SO_RCVTIMEO. */
static inline unsigned kw_s(int ms)
{
	return (unsigned)((kw_ms(ms) + 999LL) / 1000);
}

struct kw_deadline {
	int64_t quiet_ms;	/* scaled: how long without progress before it expires */
	int64_t last;		/* when progress was last seen (kw_now_ms) */
	int64_t end;		/* the scaled outer bound, whatever the progress */
};

/* Start a deadline: quiet_ms without progress, or outer_ms in all (both scaled here). */
static inline void kw_start(struct kw_deadline *w, int quiet_ms, int outer_ms)
{
	w->quiet_ms = kw_ms(quiet_ms);
	w->last = kw_now_ms();
	w->end = w->last + kw_ms(outer_ms);
}

/* The default one: a minute of no progress, ten minutes in all (scaled). */
static inline void kw_start_default(struct kw_deadline *w)
{
	kw_start(w, KW_QUIET_MS, KW_HANG_MS);
}

/* Progress was seen: the quiet spell starts again. */
static inline void kw_progress(struct kw_deadline *w)
{
	w->last = kw_now_ms();
}

/* Milliseconds until it expires (0 once it has), for a poll timeout. */
static inline int kw_left_ms(const struct kw_deadline *w)
{
	int64_t now = kw_now_ms(), quiet = w->last + w->quiet_ms;
	int64_t until = quiet < w->end ? quiet : w->end;
	if (until <= now)
		return 0;
	return until - now > INT_MAX ? INT_MAX : (int)(until - now);
}

static inline int kw_expired(const struct kw_deadline *w)
{
	return kw_left_ms(w) == 0;
}

#endif
