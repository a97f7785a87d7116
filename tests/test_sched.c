/*
 * test_sched.c — the scheduler through a real daemon: batched decode equals
 * decode alone, a long prefill does not stall decoders (by step counts),
 * preemption on a tiny pool changes no token, priorities order service,
 * per-uid quotas hold.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <liburing.h>
#include <cmocka.h>

#include "shm/kvclient.h"
#include "tests/lib/proc.h"

#define MAXN 16
#define OUT 12

/*
 * The daemons of the running test, static so that a failed test's teardown
 * still finds them (its own stack frame is gone by then).
 */
static struct kvd_proc daemons[2];

/* Connections open: a failed test's are closed by the teardown, so nothing leaks. */
static struct kvc_conn *open_conns[8];

static struct kvc_conn *conn_open(const char *sock)
{
	struct kvc_conn *c;
	assert_int_equal(kvc_connect(&c, sock), 0);
	for (int i = 0; i < 8; i++)
		if (!open_conns[i]) {
			open_conns[i] = c;
			return c;
		}
	fail_msg("more than 8 connections open");
	return NULL;
}

static void conn_close(struct kvc_conn *c)
{
	for (int i = 0; i < 8; i++)
		if (open_conns[i] == c)
			open_conns[i] = NULL;
	kvc_close(c);
}

/* The next CQE, however long a slow or sanitized daemon takes (kp_wait_cqe() on the running one). */
static void wait_cqe(struct kvc_conn *c, struct kvd_cqe *cqe)
{
	const struct kvd_proc *d = NULL;
	for (int i = 0; i < 2; i++)
		if (daemons[i].pid)
			d = &daemons[i];
	assert_int_equal(kp_wait_cqe(d, c, cqe), 0);
}

/* Whatever a test left, failed or not: its connections, then its daemons. */
static int teardown(void **state)
{
	(void)state;
	for (int i = 0; i < 8; i++)
		if (open_conns[i]) {
			kvc_close(open_conns[i]);
			open_conns[i] = NULL;
		}
	for (int i = 0; i < 2; i++)
		kp_cleanup(&daemons[i]);
	return 0;
}

/*
 * Start a daemon with a 64 MiB pool and extra arguments (NULL-terminated),
 * wait until it answers; it lives in daemons[], where the teardown ends it.
 */
static struct kvd_proc *daemon_start(const char *first, ...)
{
	const char *extra[32] = { "--kv-mem", "64M" };
	int n = 2;
	va_list ap;
	va_start(ap, first);
	for (const char *a = first; a && n < 31; a = va_arg(ap, const char *))
		extra[n++] = a;
	va_end(ap);
	extra[n] = NULL;
	struct kvd_proc *d = NULL;
	for (int i = 0; i < 2 && !d; i++)
		if (!daemons[i].pid && !daemons[i].dir[0])
			d = &daemons[i];
	if (!d)
		fail_msg("more than 2 daemons in one test");
	int rc = kp_start(d, extra);
	if (rc) {
		kp_cleanup(d);
		fail_msg("kvd did not start: %s", strerror(-rc));
	}
	return d;
}

static void daemon_stop(struct kvd_proc *d)
{
	assert_int_equal(kp_stop(d), 0);
}

static uint64_t steps(struct kvc_conn *c)
{
	struct kvd_stats_rep st;
	assert_int_equal(kvc_stats(c, &st), 0);
	return st.steps;
}

/* Prompt i: 5 + 3i token ids of its own. */
static uint32_t prompt(uint32_t i, uint32_t *ids)
{
	uint32_t n = 5 + 3 * i;
	for (uint32_t k = 0; k < n; k++)
		ids[k] = 1000 + 37 * i + 11 * k;
	return n;
}

/*
 * Submit GENERATEs for prompts [0, n) on slots of one session (each its own
 * sequence, batched by the daemon) and collect each one's tokens.
 */
static void run_batch(struct kvc_conn *c, uint32_t session, uint32_t n, uint32_t first,
		      uint32_t out[][OUT], uint8_t prio[])
{
	uint32_t ids[64], off_in[MAXN], off_out[MAXN];
	uint8_t *arena = kvc_arena(c, NULL);
	kvc_arena_reset(c);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t len = prompt(first + i, ids);
		assert_int_equal(kvc_arena_alloc(c, len * 4, &off_in[i]), 0);
		assert_int_equal(kvc_arena_alloc(c, OUT * 4, &off_out[i]), 0);
		memcpy(arena + off_in[i], ids, len * 4);
		struct kvd_sqe sqe;
		kvc_prep_generate(&sqe, session, i, 100 + i, off_in[i], len, off_out[i], OUT);
		sqe.flags = KVD_SQE_IGNORE_EOS;
		sqe.priority = prio ? prio[i] : 0;
		assert_int_equal(kvc_submit(c, &sqe), 0);
	}
	for (uint32_t done = 0; done < n;) {
		struct kvd_cqe cqe;
		wait_cqe(c, &cqe);
		uint32_t i = (uint32_t)(cqe.user_data - 100);
		assert_true(i < n);
		if (cqe.res != OUT)
			fail_msg("request %u: res %d", i, cqe.res);
		memcpy(out[i], arena + off_out[i], OUT * 4);
		if (prio)
			prio[i] = (uint8_t)(100 + done);	/* completion order */
		done++;
	}
}

/* Each of N sequences decoded alone gives the same tokens as all N decoded together. */
static void test_batched_equals_alone(void **state)
{
	(void)state;
	if (kp_no_uring())
		skip();
	struct kvd_proc *d;
	struct kvc_conn *c;
	uint32_t s1, s2;
	static uint32_t alone[MAXN][OUT], together[MAXN][OUT];
	d = daemon_start("--max-slots", "16", NULL);
	c = conn_open(d->sock);
	assert_int_equal(kvc_session_open(c, &s1), 0);
	assert_int_equal(kvc_session_open(c, &s2), 0);
	for (uint32_t i = 0; i < MAXN; i++)
		run_batch(c, s1, 1, i, &alone[i], NULL);
	static const uint32_t ns[] = { 1, 4, 16 };
	for (size_t t = 0; t < 3; t++) {
		run_batch(c, s2, ns[t], 0, together, NULL);
		for (uint32_t i = 0; i < ns[t]; i++)
			if (memcmp(together[i], alone[i], sizeof(alone[i])))
				fail_msg("N=%u: sequence %u batched differs from alone", ns[t], i);
	}
	conn_close(c);
	daemon_stop(d);
}

/*
 * Eight streaming decoders; a 1500-token prompt arrives: every step still
 * gives each decoder a token (the prefill is chunked under the budget).
 */
static void test_prefill_does_not_stall_decodes(void **state)
{
	(void)state;
	if (kp_no_uring())
		skip();
	struct kvd_proc *d;
	struct kvc_conn *c, *big, *st;
	uint32_t s, sb;
	d = daemon_start("--max-batch-tokens", "128", NULL);
	c = conn_open(d->sock);
	big = conn_open(d->sock);
	st = conn_open(d->sock);
	assert_int_equal(kvc_session_open(c, &s), 0);
	assert_int_equal(kvc_session_open(big, &sb), 0);
	uint8_t *arena = kvc_arena(c, NULL);
	uint32_t ids[64], off_in, off_out[8];
	for (uint32_t i = 0; i < 8; i++) {
		uint32_t len = prompt(i, ids);
		assert_int_equal(kvc_arena_alloc(c, len * 4, &off_in), 0);
		assert_int_equal(kvc_arena_alloc(c, 400 * 4, &off_out[i]), 0);
		memcpy(arena + off_in, ids, len * 4);
		struct kvd_sqe sqe;
		kvc_prep_generate(&sqe, s, i, i, off_in, len, off_out[i], 400);
		sqe.flags = KVD_SQE_IGNORE_EOS | KVD_SQE_STREAM;
		assert_int_equal(kvc_submit(c, &sqe), 0);
	}
	/* Let all eight start decoding. */
	uint32_t got[8] = { 0 };
	struct kvd_cqe cqe;
	for (uint32_t started = 0; started < 8;) {
		wait_cqe(c, &cqe);
		started += got[cqe.user_data]++ == 0;
	}
	/* The long prompt, then count steps and tokens while it is prefilled. */
	uint8_t *ab = kvc_arena(big, NULL);
	uint32_t boff, bout;
	assert_int_equal(kvc_arena_alloc(big, 1500 * 4, &boff), 0);
	assert_int_equal(kvc_arena_alloc(big, 4, &bout), 0);
	for (uint32_t k = 0; k < 1500; k++)
		((uint32_t *)(ab + boff))[k] = 2000 + k % 5000;
	uint64_t s0 = steps(st);
	uint32_t before[8];
	memcpy(before, got, sizeof(got));
	struct kvd_sqe sqe;
	kvc_prep_prefill(&sqe, sb, 0, 999, boff, 1500);
	assert_int_equal(kvc_submit(big, &sqe), 0);
	wait_cqe(big, &cqe);
	assert_int_equal(cqe.res, 1500);
	uint64_t s1 = steps(st);
	while (kvc_peek(c, &cqe) == 0)
		got[cqe.user_data]++;
	uint64_t n = s1 - s0;
	/* 1500 tokens at under 128 rows a step take at least 12 steps. */
	assert_true(n >= 12);
	for (uint32_t i = 0; i < 8; i++)
		if (got[i] - before[i] + 2 < n)
			fail_msg("decoder %u got %u tokens in %llu steps of the prefill", i,
				 got[i] - before[i], (unsigned long long)n);
	conn_close(c);
	conn_close(big);
	conn_close(st);
	daemon_stop(d);
}

/* A pool that holds one request at a time: preemption reorders work, changes no token. */
static void test_preemption_keeps_tokens(void **state)
{
	(void)state;
	if (kp_no_uring())
		skip();
	struct kvd_proc *d, *small;
	struct kvc_conn *c;
	uint32_t s;
	static uint32_t ample[4][OUT], tight[4][OUT];
	d = daemon_start(NULL);
	c = conn_open(d->sock);
	assert_int_equal(kvc_session_open(c, &s), 0);
	run_batch(c, s, 4, 3, ample, NULL);
	conn_close(c);
	daemon_stop(d);
	/* 4 blocks of 16: each request (14..23 + 12 tokens) needs two or three. */
	small = daemon_start("--kv-blocks", "4", NULL);
	c = conn_open(small->sock);
	assert_int_equal(kvc_session_open(c, &s), 0);
	run_batch(c, s, 4, 3, tight, NULL);
	struct kvd_stats_rep st;
	assert_int_equal(kvc_stats(c, &st), 0);
	assert_true(st.preemptions > 0);
	for (uint32_t i = 0; i < 4; i++)
		if (memcmp(ample[i], tight[i], sizeof(ample[i])))
			fail_msg("request %u: tokens differ after preemption", i);
	conn_close(c);
	daemon_stop(small);
}

/* With room for one at a time, interactive requests finish before background ones. */
static void test_priorities(void **state)
{
	(void)state;
	if (kp_no_uring())
		skip();
	struct kvd_proc *d;
	struct kvc_conn *c;
	uint32_t s;
	static uint32_t out[4][OUT];
	uint8_t prio[4] = { KVD_PRIO_BACKGROUND, KVD_PRIO_BACKGROUND, KVD_PRIO_INTERACTIVE,
			    KVD_PRIO_INTERACTIVE };
	/* 3 blocks of 16: each request (5..14 + 12 tokens) needs two: one runs at a time. */
	d = daemon_start("--kv-blocks", "3", NULL);
	c = conn_open(d->sock);
	assert_int_equal(kvc_session_open(c, &s), 0);
	run_batch(c, s, 4, 0, out, prio);
	/* prio[] now holds completion ranks: both interactive ones come first. */
	if (!(prio[2] < prio[0] && prio[2] < prio[1] && prio[3] < prio[0] && prio[3] < prio[1]))
		fail_msg("completion ranks: background %u %u, interactive %u %u", prio[0] - 100,
			 prio[1] - 100, prio[2] - 100, prio[3] - 100);
	conn_close(c);
	daemon_stop(d);
}

/*
 * A uid's KV quota: requests that fit it alone run one after another with
 * unchanged tokens; one that could never fit is refused with -EDQUOT.
 */
static void test_kv_quota(void **state)
{
	(void)state;
	if (kp_no_uring())
		skip();
	struct kvd_proc *d, *q;
	struct kvc_conn *c;
	uint32_t s;
	static uint32_t ample[4][OUT], quota[4][OUT];
	d = daemon_start(NULL);
	c = conn_open(d->sock);
	assert_int_equal(kvc_session_open(c, &s), 0);
	run_batch(c, s, 4, 0, ample, NULL);
	conn_close(c);
	daemon_stop(d);
	/* 3 blocks for the uid: each request (5..14 + 12 tokens) needs two. */
	q = daemon_start("--kv-quota", "3", NULL);
	c = conn_open(q->sock);
	assert_int_equal(kvc_session_open(c, &s), 0);
	run_batch(c, s, 4, 0, quota, NULL);
	for (uint32_t i = 0; i < 4; i++)
		if (memcmp(ample[i], quota[i], sizeof(ample[i])))
			fail_msg("request %u: tokens differ under the quota", i);
	/* 60 prompt tokens + 12 need five blocks: never within a quota of three. */
	uint32_t off, out;
	kvc_arena_reset(c);
	assert_int_equal(kvc_arena_alloc(c, 60 * 4, &off), 0);
	assert_int_equal(kvc_arena_alloc(c, OUT * 4, &out), 0);
	memset(kvc_arena(c, NULL) + off, 0, 60 * 4);
	struct kvd_sqe sqe;
	struct kvd_cqe cqe;
	kvc_prep_generate(&sqe, s, 0, 7, off, 60, out, OUT);
	assert_int_equal(kvc_submit(c, &sqe), 0);
	wait_cqe(c, &cqe);
	assert_int_equal(cqe.res, -EDQUOT);
	conn_close(c);
	daemon_stop(q);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_batched_equals_alone, teardown),
		cmocka_unit_test_teardown(test_prefill_does_not_stall_decodes, teardown),
		cmocka_unit_test_teardown(test_preemption_keeps_tokens, teardown),
		cmocka_unit_test_teardown(test_priorities, teardown),
		cmocka_unit_test_teardown(test_kv_quota, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
