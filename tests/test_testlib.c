/*
 * test_testlib.c — the test library's waits (tests/lib/wait.h, proc.h):
 * bounds scale with $KVD_TEST_TIMEOUT_SCALE and the sanitizer, a progress
 * deadline expires only after a quiet spell or at its outer bound, and a
 * process's CPU time counts as progress.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <unistd.h>
#include "tests/lib/proc.h"
#include "tests/lib/wait.h"

/* What the build and the process add to the factor from the environment. */
static double implicit(void)
{
	return (KW_HAVE_ASAN ? KW_ASAN_FACTOR : 1.0) * (kw_valgrind() ? KW_VALGRIND_FACTOR : 1.0);
}

static void test_scale_from_env(void **state)
{
	(void)state;
	/* The caller's scale comes back at the end: later tests here keep it. */
	const char *s = getenv("KVD_TEST_TIMEOUT_SCALE"), *o = getenv("KVD_TEST_SLOW");
	char *keep = s ? strdup(s) : NULL, *keep_old = o ? strdup(o) : NULL;
	unsetenv("KVD_TEST_SLOW");
	unsetenv("KVD_TEST_TIMEOUT_SCALE");
	assert_int_equal(kw_ms(1000), (int)(1000 * implicit()));
	setenv("KVD_TEST_TIMEOUT_SCALE", "3", 1);
	assert_int_equal(kw_ms(1000), (int)(3000 * implicit()));
	setenv("KVD_TEST_TIMEOUT_SCALE", "0.5", 1);
	assert_int_equal(kw_ms(1000), (int)(500 * implicit()));
	/* Nonsense is ignored, not a zero bound. */
	setenv("KVD_TEST_TIMEOUT_SCALE", "-2", 1);
	assert_int_equal(kw_ms(1000), (int)(1000 * implicit()));
	setenv("KVD_TEST_TIMEOUT_SCALE", "fast", 1);
	assert_int_equal(kw_ms(1000), (int)(1000 * implicit()));
	/* The older name, where the new one is not set. */
	unsetenv("KVD_TEST_TIMEOUT_SCALE");
	setenv("KVD_TEST_SLOW", "2", 1);
	assert_int_equal(kw_ms(1000), (int)(2000 * implicit()));
	setenv("KVD_TEST_TIMEOUT_SCALE", "4", 1);
	assert_int_equal(kw_ms(1000), (int)(4000 * implicit()));
	/* Never 0 (poll would not wait), never past INT_MAX. */
	setenv("KVD_TEST_TIMEOUT_SCALE", "0.0001", 1);
	assert_true(kw_ms(1) >= 1);
	setenv("KVD_TEST_TIMEOUT_SCALE", "1e9", 1);
	assert_int_equal(kw_ms(1000000), INT_MAX);
	assert_int_equal(kw_s(1500), (unsigned)((INT_MAX + 999LL) / 1000));
	unsetenv("KVD_TEST_TIMEOUT_SCALE");
	unsetenv("KVD_TEST_SLOW");
	if (keep)
		setenv("KVD_TEST_TIMEOUT_SCALE", keep, 1);
	if (keep_old)
		setenv("KVD_TEST_SLOW", keep_old, 1);
	free(keep);
	free(keep_old);
}

/* Fields set by hand: no test here depends on how fast this machine is. */
static void test_deadline_quiet_and_outer(void **state)
{
	(void)state;
	struct kw_deadline w;
	kw_start(&w, 1000, 10000);
	assert_int_equal(w.quiet_ms, kw_ms(1000));
	assert_int_equal(w.end - w.last, kw_ms(10000));
	int64_t now = kw_now_ms();
	w = (struct kw_deadline){ .quiet_ms = 1000, .last = now - 900, .end = now + 60000 };
	assert_false(kw_expired(&w));
	w.last = now - 1100;	/* quiet too long */
	assert_true(kw_expired(&w));
	assert_int_equal(kw_left_ms(&w), 0);
	kw_progress(&w);	/* progress: the quiet spell starts again */
	assert_false(kw_expired(&w));
	assert_true(kw_left_ms(&w) > 0 && kw_left_ms(&w) <= 1000);
	w.end = now - 1;	/* the outer bound holds whatever the progress */
	kw_progress(&w);
	assert_true(kw_expired(&w));
}

/* A process that computes makes progress; one that is gone has no CPU time. */
static void test_cpu_progress(void **state)
{
	(void)state;
	long long t0 = kp_cpu_ticks(getpid());
	assert_true(t0 >= 0);
	struct kw_deadline w;
	kw_start_default(&w);
	w.last -= w.quiet_ms + 1;	/* expired: only CPU use can revive it */
	assert_true(kw_expired(&w));
	long long ticks = -1;
	kp_note_cpu(&w, getpid(), &ticks);	/* the first look only records */
	assert_true(kw_expired(&w));
	/* Spin until the tick count moves (bounded: a test must end). */
	volatile uint64_t x = 0;
	for (int64_t end = kw_now_ms() + kw_ms(KW_HANG_MS); kp_cpu_ticks(getpid()) == ticks &&
	     kw_now_ms() < end;)
		for (int i = 0; i < 1000000; i++)
			x += (uint64_t)i;
	kp_note_cpu(&w, getpid(), &ticks);
	assert_false(kw_expired(&w));
	pid_t kid = fork();
	assert_true(kid >= 0);
	if (kid == 0)
		_exit(0);
	assert_int_equal(waitpid(kid, NULL, 0), kid);
	assert_int_equal(kp_cpu_ticks(kid), -1);
}

/* A connection that failed is not recorded for kp_close_all() (which would close garbage). */
static void test_conn_table(void **state)
{
	(void)state;
	struct kvc_conn **t = kp_conn_table();
	struct kvc_conn *c = (struct kvc_conn *)&c;
	assert_int_not_equal(kp_connect(&c, "/nonexistent/kvd.sock"), 0);
	for (int i = 0; i < KP_MAX_CONNS; i++)
		assert_null(t[i]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scale_from_env),
		cmocka_unit_test(test_deadline_quiet_and_outer),
		cmocka_unit_test(test_cpu_progress),
		cmocka_unit_test(test_conn_table),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
