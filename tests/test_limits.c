/*
 * test_limits.c — resource exhaustion against a real daemon: the KV pool
 * full, the per-uid quotas reached, RLIMIT_NOFILE reached (so accept,
 * memfd_create and eventfd fail inside the daemon), a CQ the client does
 * not read. Each gives the documented error (uapi/kvd.h) or back-pressure,
 * nothing leaks, and the daemon serves normally once the pressure goes.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sys/resource.h>
#include "tests/lib/proc.h"

static struct kvd_proc D;

static void start(const char *const *args)
{
	kp_skip_without_uring();
	assert_int_equal(kp_start(&D, args), 0);
}

/* Whatever a test left, failed or not: its connections, then the daemon and its files. */
static int teardown(void **state)
{
	(void)state;
	kp_close_all();
	if (D.pid) {
		kill(D.pid, SIGKILL);
		waitpid(D.pid, NULL, 0);
		D.pid = 0;
	}
	kp_cleanup(&D);
	return 0;
}

/* n prompt ids (distinct, inside the vocabulary) at arena offset 0. */
static void put_prompt(struct kvc_conn *c, uint32_t n, uint32_t salt)
{
	uint32_t *a = (uint32_t *)kvc_arena(c, NULL);
	for (uint32_t i = 0; i < n; i++)
		a[i] = 300 + (salt * 131 + i * 17) % 40000;
}

/* GENERATE on slot and the final CQE's res (tokens, or -errno). */
static int generate(struct kvc_conn *c, uint32_t s, uint32_t slot, uint32_t n_prompt, uint32_t max)
{
	struct kvd_sqe q;
	struct kvd_cqe cqe;
	put_prompt(c, n_prompt, slot);
	kvc_prep_generate(&q, s, slot, 42, 0, n_prompt, 32768, max);
	q.flags = KVD_SQE_IGNORE_EOS;
	assert_int_equal(kvc_submit(c, &q), 0);
	assert_int_equal(kp_wait_cqe(&D, c, &cqe), 0);
	assert_int_equal(cqe.user_data, 42);
	return cqe.res;
}

static struct kvc_conn *conn(uint32_t *s)
{
	struct kvc_conn *c;
	assert_int_equal(kp_connect(&c, D.sock), 0);
	assert_int_equal(kvc_session_open(c, s), 0);
	return c;
}

static void assert_idle(void)
{
	struct kvd_stats_rep st;
	if (kp_wait_idle(&D, &st, 10000))
		fail_msg("still held: %u connections, %u sessions, %llu blocks", st.connections,
			 st.sessions, (unsigned long long)st.kv_blocks_used);
}

/* 8 blocks of 16: a request that can never fit fails at once; sequences that fit take turns. */
static void test_pool_full(void **state)
{
	(void)state;
	static const char *const args[] = { "--kv-blocks", "8", "--threads", "1", NULL };
	start(args);
	uint32_t s;
	struct kvc_conn *c = conn(&s);
	assert_int_equal(generate(c, s, 0, 5, 200), -ENOSPC);
	/* Four prefilled sequences of 40 positions (3 blocks each) want 12 blocks of 8. */
	struct kvd_sqe q;
	struct kvd_cqe cqe;
	put_prompt(c, 40, 9);
	for (uint32_t k = 0; k < 4; k++) {
		kvc_prep_prefill(&q, s, k, 100 + k, 0, 40);
		assert_int_equal(kvc_submit(c, &q), 0);
	}
	for (uint32_t k = 0; k < 4; k++) {
		assert_int_equal(kp_wait_cqe(&D, c, &cqe), 0);
		assert_int_equal(cqe.res, 40);
	}
	/* And then a generation still runs: the idle ones give way. */
	assert_int_equal(generate(c, s, 5, 5, 16), 16);
	kp_close(c);
	assert_idle();
	c = conn(&s);
	assert_int_equal(generate(c, s, 0, 5, 16), 16);
	kp_close(c);
	assert_int_equal(kp_stop(&D), 0);
}

/* Per-uid limits: KV quota (-EDQUOT), sessions (-EMFILE), in flight (-EBUSY), region bytes (-EDQUOT). */
static void test_uid_quotas(void **state)
{
	(void)state;
	static const char *const args[] = { "--kv-quota", "4", "--max-uid-sessions", "2",
					    "--max-uid-inflight", "2", "--max-uid-arena", "4M",
					    "--threads", "1", NULL };
	start(args);
	uint32_t s, s2, s3;
	struct kvc_conn *c = conn(&s);
	/* 5 + 100 positions need 7 blocks: over a quota of 4, however empty the pool. */
	assert_int_equal(generate(c, s, 0, 5, 100), -EDQUOT);
	assert_int_equal(generate(c, s, 0, 5, 20), 20);

	/* Sessions: two per uid, counted across connections. */
	struct kvc_conn *c2;
	assert_int_equal(kp_connect(&c2, D.sock), 0);
	assert_int_equal(kvc_session_open_ex(c2, 0, 0, 4096, &s2), 0);
	assert_int_equal(kvc_session_open(c2, &s3), -EMFILE);
	assert_int_equal(kvc_session_close(c2, s2), 0);
	/* The close takes effect at the engine's next step boundary. */
	int rc = -EMFILE;
	for (int64_t end = kp_now_ms() + kw_ms(10000); rc == -EMFILE && kp_now_ms() < end; kp_sleep_ms(10))
		rc = kvc_session_open(c2, &s3);
	assert_int_equal(rc, 0);
	kp_close(c2);

	/* In flight: the third concurrent request of the uid is refused. */
	struct kvd_sqe q;
	struct kvd_cqe cqe;
	put_prompt(c, 5, 1);
	int busy = 0, done = 0;
	for (uint32_t k = 0; k < 3; k++) {
		kvc_prep_generate(&q, s, k, 10 + k, 0, 5, 32768 + 512 * k, 40);
		q.flags = KVD_SQE_IGNORE_EOS;
		assert_int_equal(kvc_submit(c, &q), 0);
	}
	while (done + busy < 3) {
		assert_int_equal(kp_wait_cqe(&D, c, &cqe), 0);
		if (cqe.res == -EBUSY)
			busy++;
		else if (cqe.res == 40)
			done++;
		else
			fail_msg("unexpected res %d", cqe.res);
	}
	assert_int_equal(busy, 1);
	assert_int_equal(generate(c, s, 0, 5, 8), 8);
	kp_close(c);
	assert_idle();

	/* Region bytes: a second 3 MiB region does not fit in 4 MiB for the uid. */
	struct kvc_conn *a, *b;
	assert_int_equal(kp_connect(&a, D.sock), 0);
	assert_int_equal(kp_connect(&b, D.sock), 0);
	assert_int_equal(kvc_session_open_ex(a, 0, 0, 3 << 20, &s), 0);
	assert_int_equal(kvc_session_open_ex(b, 0, 0, 3 << 20, &s2), -EDQUOT);
	kp_close(a);
	/* a's region counts until the daemon has reaped it. */
	rc = -EDQUOT;
	for (int64_t end = kp_now_ms() + kw_ms(10000); rc == -EDQUOT && kp_now_ms() < end; kp_sleep_ms(10))
		rc = kvc_session_open_ex(b, 0, 0, 3 << 20, &s2);
	assert_int_equal(rc, 0);
	kp_close(b);
	assert_int_equal(kp_stop(&D), 0);
}

static int set_nofile(pid_t pid, rlim_t soft)
{
	struct rlimit old, r;
	if (prlimit(pid, RLIMIT_NOFILE, NULL, &old))
		return -errno;
	r.rlim_cur = soft;
	r.rlim_max = old.rlim_max;
	return prlimit(pid, RLIMIT_NOFILE, &r, NULL) ? -errno : 0;
}

/* The n lowest fd numbers pid does not use: where its next fds will go. */
static void free_fds(pid_t pid, int *out, int n)
{
	char path[64];
	uint8_t used[4096] = { 0 };
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	assert_non_null(d);
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' && atoi(e->d_name) < 4096)
			used[atoi(e->d_name)] = 1;
	closedir(d);
	for (int fd = 0, k = 0; k < n; fd++)
		if (!used[fd])
			out[k++] = fd;
}

static void wait_fds(int want)
{
	int n = kp_fds(D.pid);
	for (int64_t end = kp_now_ms() + kw_ms(30000); n != want && kp_now_ms() < end; kp_sleep_ms(10))
		n = kp_fds(D.pid);
	assert_int_equal(n, want);
}

/*
 * RLIMIT_NOFILE lowered on the running daemon (prlimit) so that it has no
 * fd left, then one, two, ... five: SESSION_OPEN fails with -EMFILE as the
 * region's memfd and each end of its two doorbell socketpairs fail in turn
 * (this is how memfd creation failing is produced: for real, in the
 * daemon). No fd is lost; raising the limit again brings service back.
 */
static void test_fd_limit(void **state)
{
	(void)state;
	static const char *const args[] = { "--threads", "1", NULL };
	start(args);
	struct rlimit old;
	assert_int_equal(prlimit(D.pid, RLIMIT_NOFILE, NULL, &old), 0);
	/* The start-up probe's and the STATS connection's sockets must be gone first. */
	assert_idle();
	kp_sleep_ms(kw_ms(200));
	int fds0 = kp_fds(D.pid);
	assert_true(fds0 > 0);
	int free[7];
	free_fds(D.pid, free, 7);
	struct kvc_conn *c;
	uint32_t s;
	/*
	 * A limit of free[k] leaves exactly k fds to allocate: with k = 1 .. 5
	 * the socket fits and the memfd, or one of the four doorbell ends, does
	 * not (the client's two are closed once the reply carried them). With
	 * k = 0 an accept armed before the change still takes the socket (then
	 * the memfd fails); one armed after it is refused.
	 */
	for (int k = 0; k <= 5; k++) {
		assert_int_equal(set_nofile(D.pid, (rlim_t)free[k]), 0);
		int rc = kp_connect(&c, D.sock);
		if (k == 0 && rc == -EMFILE) {
			wait_fds(fds0);
			continue;
		}
		assert_int_equal(rc, 0);
		assert_int_equal(kvc_session_open(c, &s), -EMFILE);
		kp_close(c);
		wait_fds(fds0);
	}
	/* With room for the socket and the region's five fds (three kept) it all works. */
	assert_int_equal(set_nofile(D.pid, (rlim_t)free[6]), 0);
	c = conn(&s);
	assert_int_equal(generate(c, s, 0, 5, 8), 8);
	kp_close(c);
	wait_fds(fds0);
	assert_int_equal(set_nofile(D.pid, old.rlim_cur), 0);
	struct kvc_conn *many[8];
	for (int i = 0; i < 8; i++)
		many[i] = conn(&s);
	assert_int_equal(generate(many[7], s, 0, 5, 8), 8);
	for (int i = 0; i < 8; i++)
		kp_close(many[i]);
	assert_idle();
	wait_fds(fds0);
	assert_int_equal(kp_stop(&D), 0);
}

static void nofile_32(void *arg)
{
	(void)arg;
	struct rlimit r;
	if (!getrlimit(RLIMIT_NOFILE, &r)) {
		r.rlim_cur = 32;
		setrlimit(RLIMIT_NOFILE, &r);
	}
}

/*
 * A daemon started under RLIMIT_NOFILE 32: clients that hold their
 * connections and sessions use it up; the daemon then refuses with
 * -EMFILE, at connect (accept failed: the waiting client is answered and
 * shed, not left to spin the loop) or at SESSION_OPEN, and serves again
 * once they leave.
 */
static void test_fd_limit_at_start(void **state)
{
	(void)state;
	static const char *const args[] = { "--threads", "1", NULL };
	kp_skip_without_uring();
	assert_int_equal(kp_start_ex(&D, args, nofile_32, NULL), 0);
	assert_idle();
	kp_sleep_ms(kw_ms(200));
	int fds0 = kp_fds(D.pid);
	struct kvc_conn *held[32];
	int n = 0, rc = 0, open_fail = 0;
	uint32_t s;
	while (n < 32) {
		/*
		 * Settled first: a SESSION_OPEN holds the client's two doorbell
		 * ends until its reply is sent, so connecting in that moment
		 * would meet a limit that is gone a moment later.
		 */
		wait_fds(fds0 + 4 * (n - open_fail) + open_fail);
		if ((rc = kp_connect(&held[n], D.sock)))
			break;
		int o = kvc_session_open(held[n++], &s);
		if (o) {
			assert_int_equal(o, -EMFILE);
			open_fail++;
		}
	}
	assert_int_equal(rc, -EMFILE);
	print_message("%d connections held (%d without a session) before -EMFILE at connect\n", n,
		      open_fail);
	wait_fds(fds0 + 4 * (n - open_fail) + open_fail);
	assert_int_equal(kp_connect(&held[n], D.sock), -EMFILE);	/* and again */
	for (int i = 0; i < n; i++)
		kp_close(held[i]);
	assert_idle();
	wait_fds(fds0);
	struct kvc_conn *c = conn(&s);
	assert_int_equal(generate(c, s, 0, 5, 8), 8);
	kp_close(c);
	assert_int_equal(kp_stop(&D), 0);
}

/*
 * A client that stops reading its CQ: completions wait in the daemon
 * (nothing dropped), its SQ stops being consumed (kvc_submit: -EAGAIN),
 * and once it reads again every CQE arrives in order.
 */
static void test_cq_full(void **state)
{
	(void)state;
	static const char *const args[] = { "--threads", "1", NULL };
	start(args);
	struct kvc_conn *c;
	uint32_t s;
	assert_int_equal(kp_connect(&c, D.sock), 0);
	assert_int_equal(kvc_session_open_ex(c, 4, 4, 0, &s), 0);
	struct kvd_sqe q;
	put_prompt(c, 5, 3);
	kvc_prep_generate(&q, s, 0, 1, 0, 5, 32768, 24);
	q.flags = KVD_SQE_IGNORE_EOS | KVD_SQE_STREAM;
	assert_int_equal(kvc_submit(c, &q), 0);
	kp_sleep_ms(kw_ms(300));
	/* The CQ (4) and the held completions (4 more) are full: the SQ is not drained. */
	int queued = 0, rc = 0;
	for (int64_t end = kp_now_ms() + kw_ms(30000); kp_now_ms() < end; kp_sleep_ms(5)) {
		kvc_prep(&q, KVD_OP_NOP, s, 0, 100 + queued);
		if ((rc = kvc_submit(c, &q)) == -EAGAIN)
			break;
		assert_int_equal(rc, 0);
		queued++;
	}
	assert_int_equal(rc, -EAGAIN);
	assert_true(queued >= 4);	/* the SQ's 4, and any drained before the CQ filled */
	uint32_t next = 1;
	int nops = 0;
	struct kvd_cqe cqe;
	while (next <= 24 || nops < queued) {
		assert_int_equal(kp_wait_cqe(&D, c, &cqe), 0);
		if (cqe.user_data >= 100) {
			assert_int_equal(cqe.user_data, 100 + nops);
			nops++;
			continue;
		}
		assert_int_equal(cqe.n_out, next);
		assert_int_equal(!!(cqe.flags & KVD_CQE_MORE), next < 24);
		next++;
	}
	assert_int_equal(generate(c, s, 1, 5, 8), 8);
	kp_close(c);
	assert_idle();
	assert_int_equal(kp_stop(&D), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_pool_full, teardown),
		cmocka_unit_test_teardown(test_uid_quotas, teardown),
		cmocka_unit_test_teardown(test_fd_limit, teardown),
		cmocka_unit_test_teardown(test_fd_limit_at_start, teardown),
		cmocka_unit_test_teardown(test_cq_full, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
