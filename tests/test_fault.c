/*
 * test_fault.c — fault injection against one running daemon: 1,000+ cycles
 * of clients that connect, open sessions, submit, and then at a random
 * point hang up, kill -9 themselves, stop reading their CQ, flood their SQ
 * or sit idle, while 4 well-behaved clients keep generating. Afterwards the
 * good clients got exactly their expected tokens every time, every KV block
 * is back in the pool, and the daemon's fd count and RSS are where they
 * started. KVD_FAULT_CYCLES overrides the cycle count.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include "tests/lib/proc.h"
#include "tests/lib/rng.h"

#define N_GOOD		4
#define GOOD_TOKENS	8
#define N_IDLE		6	/* idle connections held at once */
#define RSS_SLACK_KB	(16 * 1024)

static const uint32_t PROMPT[] = { 504, 3575, 282, 4649, 314 };
#define N_PROMPT ((uint32_t)(sizeof(PROMPT) / sizeof(PROMPT[0])))

static struct kvd_proc D;

static struct rng R = { 0x9e3779b97f4a7c15ull };

static uint32_t rnd(uint32_t n)
{
	return rng_below(&R, n);
}

/* Prompt at arena offset 0, output after it; one GENERATE of max tokens on slot. */
static int submit_generate(struct kvc_conn *c, uint32_t session, uint32_t slot, uint32_t max,
			   uint16_t flags, uint64_t user_data)
{
	uint8_t *arena = kvc_arena(c, NULL);
	if (!arena)
		return -ENOTCONN;
	memcpy(arena, PROMPT, sizeof(PROMPT));
	struct kvd_sqe q;
	kvc_prep_generate(&q, session, slot, user_data, 0, N_PROMPT, 256 + 256 * slot, max);
	q.flags = flags;
	return kvc_submit(c, &q);
}

/* ---- the well-behaved clients ---- */

struct good {
	pthread_t th;
	int idx;
	const uint32_t *expect;
	volatile int *stop;
	unsigned runs;
	char why[160];
};

/* Static, with the flag that stops them: a failed test's teardown still joins them. */
static struct good GOOD[N_GOOD];
static volatile int STOP;
static int GOOD_RUNNING;

static void good_stop(void)
{
	STOP = 1;
	for (int i = 0; i < GOOD_RUNNING; i++)
		pthread_join(GOOD[i].th, NULL);
	GOOD_RUNNING = 0;
	STOP = 0;
}

static void *good_main(void *arg)
{
	struct good *g = arg;
	struct kvc_conn *c = NULL;
	uint32_t s;
	int rc;
	if ((rc = kvc_connect(&c, D.sock)) || (rc = kvc_session_open(c, &s))) {
		snprintf(g->why, sizeof(g->why), "connect/open: %s", strerror(-rc));
		kvc_close(c);
		return NULL;
	}
	while (!*g->stop) {
		uint32_t *out = (uint32_t *)(kvc_arena(c, NULL) + 256);
		memset(out, 0xff, GOOD_TOKENS * 4);
		/* Streamed every other run: both completion paths under load. */
		uint16_t flags = KVD_SQE_IGNORE_EOS | (g->runs & 1 ? KVD_SQE_STREAM : 0);
		if ((rc = submit_generate(c, s, 0, GOOD_TOKENS, flags, 1000 + g->runs))) {
			snprintf(g->why, sizeof(g->why), "submit: %s", strerror(-rc));
			break;
		}
		struct kvd_cqe cqe;
		do {
			rc = kp_wait_cqe(&D, c, &cqe);
		} while (!rc && (cqe.flags & KVD_CQE_MORE));
		if (rc || cqe.res != GOOD_TOKENS || cqe.user_data != 1000 + g->runs) {
			snprintf(g->why, sizeof(g->why), "run %u: wait %d res %d user_data %llu", g->runs,
				 rc, cqe.res, (unsigned long long)cqe.user_data);
			break;
		}
		if (memcmp(out, g->expect, GOOD_TOKENS * 4)) {
			snprintf(g->why, sizeof(g->why), "run %u: tokens differ from the expected ones",
				 g->runs);
			break;
		}
		__atomic_store_n(&g->runs, g->runs + 1, __ATOMIC_RELAXED);
	}
	kvc_close(c);
	return NULL;
}

/* ---- the faulty ones ---- */

static struct kvc_conn *idle[N_IDLE];

static struct kvc_conn *open_conn(uint32_t sq, uint32_t cq, uint32_t *s)
{
	struct kvc_conn *c = NULL;
	int rc;
	/* Hung-up clients' sessions count against the uid until the daemon reaps them: retry. */
	for (int64_t end = kp_now_ms() + kw_ms(30000);; kp_sleep_ms(5)) {
		rc = kvc_connect(&c, D.sock);
		if (!rc && (rc = kvc_session_open_ex(c, sq, cq, 64 << 10, s)))
			kvc_close(c);
		if (rc != -EMFILE || kp_now_ms() >= end)
			break;
	}
	if (rc) {
		struct kvd_stats_rep st = { 0 };
		kp_stats(&D, &st);
		print_message("connect/open: %s (daemon: %u connections, %u sessions)\n",
			      strerror(-rc), st.connections, st.sessions);
	}
	return rc ? NULL : c;
}

/* In a forked child: connect, open, submit, and SIGKILL itself after step `at`. */
static void child_dies(uint32_t at, uint32_t delay_us)
{
	uint32_t s;
	struct kvc_conn *c;
	if (at == 0 || kvc_connect(&c, D.sock))
		raise(SIGKILL);
	if (at == 1 || kvc_session_open_ex(c, 8, 8, 64 << 10, &s))
		raise(SIGKILL);
	for (uint32_t k = 0; k < 3; k++)
		submit_generate(c, s, k, 4 + k * 8, k & 1 ? KVD_SQE_STREAM : 0, k + 1);
	if (at == 2)
		raise(SIGKILL);
	usleep(delay_us);
	struct kvd_cqe cqe;
	kvc_peek(c, &cqe);
	raise(SIGKILL);
	_exit(1);
}

static void cycle(void)
{
	uint32_t s, s2;
	struct kvc_conn *c;
	switch (rnd(5)) {
	case 0:		/* work submitted, then a hang-up at a random point */
		if (!(c = open_conn(0, 0, &s)))
			fail_msg("connect failed");
		if (rnd(2) && !kvc_session_open(c, &s2))
			submit_generate(c, s2, 1, 1 + rnd(16), KVD_SQE_STREAM, 2);
		submit_generate(c, s, 0, 1 + rnd(16), rnd(2) ? KVD_SQE_STREAM : 0, 1);
		usleep(rnd(4000));
		if (rnd(2)) {
			struct kvd_cqe cqe;
			kvc_wait(c, &cqe, (int)rnd(5));
		}
		kvc_close(c);
		break;
	case 1: {	/* kill -9 at a random point */
		pid_t pid = kp_fork();
		assert_true(pid >= 0);
		if (pid == 0)
			child_dies(rnd(4), rnd(5000));
		int st;
		assert_int_equal(waitpid(pid, &st, 0), pid);
		assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
		break;
	}
	case 2:		/* streams into a CQ it never reads */
		if (!(c = open_conn(8, 4, &s)))
			fail_msg("connect failed");
		for (uint32_t k = 0; k < 3; k++)
			submit_generate(c, s, k, 8 + rnd(24), KVD_SQE_STREAM, k + 1);
		usleep(2000 + rnd(8000));
		kvc_close(c);
		break;
	case 3: {	/* floods its SQ (NOPs, bad SQEs, work) and never reads */
		if (!(c = open_conn(16, 4, &s)))
			fail_msg("connect failed");
		int64_t end = kp_now_ms() + 2 + rnd(4);
		for (uint32_t i = 0; kp_now_ms() < end; i++) {
			struct kvd_sqe q;
			kvc_prep(&q, i % 3 == 0 ? KVD_OP_NOP : i % 3 == 1 ? 77 : KVD_OP_RESET, s,
				 i % 8, i);
			if (i % 50 == 0)
				submit_generate(c, s, i % 8, 4, 0, i);
			else if (kvc_submit(c, &q) == -EAGAIN)
				sched_yield();
		}
		kvc_close(c);
		break;
	}
	case 4: {	/* holds a prefilled session and does nothing */
		uint32_t k = rnd(N_IDLE);
		kvc_close(idle[k]);
		if (!(idle[k] = open_conn(0, 0, &s)))
			fail_msg("connect failed");
		memcpy(kvc_arena(idle[k], NULL), PROMPT, sizeof(PROMPT));
		struct kvd_sqe q;
		kvc_prep_prefill(&q, s, 0, 1, 0, N_PROMPT);
		kvc_submit(idle[k], &q);
		break;
	}
	}
}

static unsigned min_runs(const struct good *g)
{
	unsigned m = ~0u;
	for (int i = 0; i < N_GOOD; i++) {
		unsigned r = __atomic_load_n(&g[i].runs, __ATOMIC_RELAXED);
		m = r < m ? r : m;
	}
	return m;
}

static uint32_t cycles(void)
{
	const char *e = getenv("KVD_FAULT_CYCLES");
	return e && atoi(e) > 0 ? (uint32_t)atoi(e) : 1000;
}

static void test_fault_injection(void **state)
{
	(void)state;
	kp_skip_without_uring();
	static const char *const args[] = { "--kv-blocks", "128", "--threads", "1",
					    "--log-level", "warning", NULL };
	assert_int_equal(kp_start(&D, args), 0);

	/* The expected tokens: one generation alone. */
	uint32_t expect[GOOD_TOKENS];
	struct kvc_conn *c;
	uint32_t s;
	struct kvd_cqe cqe;
	assert_int_equal(kp_connect(&c, D.sock), 0);
	assert_int_equal(kvc_session_open(c, &s), 0);
	assert_int_equal(submit_generate(c, s, 0, GOOD_TOKENS, KVD_SQE_IGNORE_EOS, 7), 0);
	assert_int_equal(kp_wait_cqe(&D, c, &cqe), 0);
	assert_int_equal(cqe.res, GOOD_TOKENS);
	memcpy(expect, kvc_arena(c, NULL) + 256, sizeof(expect));
	kp_close(c);

	/* Warm up every path once, then take the baseline with nobody connected. */
	for (int i = 0; i < 20; i++)
		cycle();
	for (int k = 0; k < N_IDLE; k++) {
		kvc_close(idle[k]);
		idle[k] = NULL;
	}
	struct kvd_stats_rep st;
	assert_int_equal(kp_wait_idle(&D, &st, 20000), 0);
	kp_sleep_ms(kw_ms(200));	/* the STATS connection's socket closes too */
	int fds0 = kp_fds(D.pid);
	long rss0 = kp_status_kb(D.pid, "VmRSS");
	assert_true(fds0 > 0 && rss0 > 0);

	struct good *g = GOOD;
	for (int i = 0; i < N_GOOD; i++) {
		g[i] = (struct good){ .idx = i, .expect = expect, .stop = &STOP };
		assert_int_equal(pthread_create(&g[i].th, NULL, good_main, &g[i]), 0);
		GOOD_RUNNING = i + 1;
	}
	uint32_t n = cycles(), done = 0;
	int64_t t0 = kp_now_ms();
	/* n cycles at least, and on until every good client has generated a few times. */
	for (uint32_t i = 0; i < n || (min_runs(g) < 5 && kp_now_ms() - t0 < kw_ms(60000)); i++, done++) {
		cycle();
		if (kill(D.pid, 0))
			fail_msg("kvd died at cycle %u", i);
	}
	int64_t t1 = kp_now_ms();
	unsigned good_runs = 0;
	good_stop();
	for (int i = 0; i < N_GOOD; i++) {
		if (g[i].why[0])
			fail_msg("good client %d: %s", i, g[i].why);
		good_runs += g[i].runs;
		assert_true(g[i].runs > 0);
	}
	for (int k = 0; k < N_IDLE; k++) {
		kvc_close(idle[k]);
		idle[k] = NULL;
	}

	/* Everything given back: blocks, sessions, connections, fds, memory. */
	if (kp_wait_idle(&D, &st, 20000))
		fail_msg("still held: %u connections, %u sessions, %llu blocks", st.connections,
			 st.sessions, (unsigned long long)st.kv_blocks_used);
	kp_sleep_ms(kw_ms(200));
	int fds1 = kp_fds(D.pid);
	for (int64_t end = kp_now_ms() + kw_ms(30000); fds1 != fds0 && kp_now_ms() < end; kp_sleep_ms(20))
		fds1 = kp_fds(D.pid);
	long rss1 = kp_status_kb(D.pid, "VmRSS");
	print_message("%u fault cycles in %.1f s beside %u good generations; blocks in use %llu of "
		      "%llu; fds %d -> %d; RSS %ld -> %ld kB (%+ld kB)\n",
		      done, (double)(t1 - t0) / 1000, good_runs, (unsigned long long)st.kv_blocks_used,
		      (unsigned long long)st.kv_blocks_total, fds0, fds1, rss0, rss1, rss1 - rss0);
	assert_int_equal(st.kv_blocks_used, 0);
	assert_int_equal(fds1, fds0);
	/* Under ASan, freed memory sits in its quarantine; its leak check at exit stands in. */
	if (!kp_asan(D.pid))
		assert_true(rss1 - rss0 < RSS_SLACK_KB);
	assert_int_equal(kp_stop(&D), 0);
}

/* Whatever the test left, failed or not: the daemon, the good clients, the connections, its files. */
static int teardown(void **state)
{
	(void)state;
	/* The daemon first: its hang-up ends a good client's wait at once, so the join is quick. */
	if (D.pid) {
		kill(D.pid, SIGKILL);
		waitpid(D.pid, NULL, 0);
		D.pid = 0;
	}
	good_stop();
	kp_close_all();
	for (int k = 0; k < N_IDLE; k++) {
		kvc_close(idle[k]);
		idle[k] = NULL;
	}
	kp_cleanup(&D);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_fault_injection, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
