/* test_daemon.c — a real kvd on a private socket, driven by a raw client: batching, cancel, hang-ups, malformed input, CQ overflow, wake-ups. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "uapi/kvd.h"
#include "shm/kvring.h"
#include "daemon/engine/sampler.h"
#include "daemon/tokenizer/tokenizer.h"
#include "tests/lib/fixture.h"
#include "tests/lib/proc.h"
#include "tests/lib/ref.h"
#include "tests/lib/wire.h"

/*
 * Every test gets a daemon of its own (started in setup, stopped with
 * SIGTERM in teardown), so counters and fd tables start from a known state
 * and the test that kills it hurts nobody. The client here is written from
 * uapi/kvd.h alone, not libkvclient, so it can also say things a library
 * never would.
 */

#define KV_BLOCKS	"256"		/* 4096 positions of 16: plenty, and quick to reserve */
#define OUT_OFF		4096		/* arena byte offset of the sampled ids; prompts sit at 0 */
#define WAIT_MS		kw_ms(60000)	/* a CQE that takes longer than this is lost (scaled) */

/* Five ids well inside any vocabulary, for tests that do not care what they say. */
static const uint32_t PROMPT[] = { 504, 3575, 282, 4649, 314 };
#define N_PROMPT ((uint32_t)(sizeof(PROMPT) / sizeof(PROMPT[0])))

static struct kvd_proc D;
static int uring_ok;
static char uring_why[128];

/* For failures where the daemon went quiet: its own account, then the failure. */
#define fail_with_log(...)			\
	do {					\
		kp_log_tail(&D);		\
		fail_msg(__VA_ARGS__);		\
	} while (0)

static const uint32_t *out_ids(const struct wire *r)
{
	return (const uint32_t *)(r->arena + OUT_OFF);
}

/* GENERATE of max_tokens after PROMPT, which this puts at arena offset 0. */
static struct kvd_sqe gen_sqe(struct wire *r, uint64_t ud, uint32_t max_tokens, uint16_t flags)
{
	memcpy(r->arena, PROMPT, sizeof(PROMPT));
	return (struct kvd_sqe){ .opcode = KVD_OP_GENERATE, .flags = flags, .session_id = r->session,
				 .user_data = ud, .tokens_off = 0, .n_tokens = N_PROMPT,
				 .out_off = OUT_OFF, .max_tokens = max_tokens };
}

static struct kvd_sqe reset_sqe(const struct wire *r, uint64_t ud, uint32_t slot)
{
	return (struct kvd_sqe){ .opcode = KVD_OP_RESET, .session_id = r->session,
				 .user_data = ud, .slot = slot };
}

/* The connection still works: a short GENERATE completes with all its tokens. */
static void assert_serves(struct wire *r, const char *after)
{
	struct kvd_sqe q = gen_sqe(r, 0x5e5e, 4, KVD_SQE_IGNORE_EOS);
	struct kvd_cqe c = { 0 };
	int rc = wire_submit(r, &q);
	if (!rc)
		rc = wire_finish(r, q.user_data, &c, WAIT_MS);
	if (rc)
		fail_with_log("after %s: GENERATE got no final CQE: %s", after, strerror(-rc));
	if (c.res != 4 || c.n_out != 4 || !(c.flags & KVD_CQE_LENGTH))
		fail_msg("after %s: GENERATE ended res %d n_out %u flags %#x, want 4 tokens, LENGTH",
			 after, c.res, c.n_out, c.flags);
}

/* Ask STATS until pred holds or timeout_ms (scaled) pass; the last reply in *st. */
static int stats_until(struct wire *r, struct kvd_stats_rep *st, int timeout_ms,
		       int (*pred)(const struct kvd_stats_rep *, const void *), const void *arg)
{
	for (int64_t end = kp_now_ms() + kw_ms(timeout_ms);; kp_sleep_ms(20)) {
		int rc = wire_stats(r, st);
		if (rc)
			return rc;
		if (pred(st, arg))
			return 0;
		if (kp_now_ms() >= end)
			return -ETIMEDOUT;
	}
}

static int used_is(const struct kvd_stats_rep *st, const void *want)
{
	return st->kv_blocks_used == *(const uint64_t *)want;
}

static int conns_are(const struct kvd_stats_rep *st, const void *want)
{
	return st->connections == *(const uint32_t *)want;
}

/* ---- setup ---- */

static int group_setup(void **state)
{
	(void)state;
	signal(SIGPIPE, SIG_IGN);
	struct io_uring ring;
	int rc = io_uring_queue_init(4, &ring, 0);
	if (rc == -ENOSYS || rc == -EPERM) {
		snprintf(uring_why, sizeof(uring_why),
			 "io_uring is unavailable here (%s): kvd cannot serve", strerror(-rc));
		return 0;
	}
	if (!rc)
		io_uring_queue_exit(&ring);
	uring_ok = 1;	/* any other failure is the daemon's to report */
	return 0;
}

/* A daemon of plenty of KV blocks with debug logs; threads: its compute threads, NULL for its default (every core). */
static int daemon_start(const char *threads)
{
	const char *extra[] = { "--kv-blocks", KV_BLOCKS, "--log-level", "debug",
				threads ? "--threads" : NULL, threads, NULL };
	return kp_start(&D, extra);
}

/*
 * One compute thread, for the daemon and for test 1's reference engine: the
 * pool's workers spin, and a pool of one thread per core slows down 30-fold
 * or more when anything else wants those cores (another daemon, a build), so
 * the tests would crawl and time out on a busy machine.
 */
static int setup(void **state)
{
	(void)state;
	if (!uring_ok)
		return 0;
	if (!daemon_start("1"))
		return 0;
	kp_cleanup(&D);	/* no teardown follows a failed setup */
	return -1;
}

/* The daemon as it is usually run: one compute thread per core. */
static int setup_all_cores(void **state)
{
	(void)state;
	if (!uring_ok)
		return 0;
	if (!daemon_start(NULL))
		return 0;
	kp_cleanup(&D);
	return -1;
}

static int teardown(void **state)
{
	(void)state;
	int rc = kp_stop(&D);
	kp_cleanup(&D);	/* a test that killed it leaves its files */
	return rc;
}

static void need_daemon(void)
{
	if (!uring_ok) {
		print_message("skipped: %s\n", uring_why);
		skip();
	}
}

/* ---- 1. concurrent client processes get exactly the in-process tokens ---- */

#define N_CLIENTS	8
#define GEN_TOKENS	16
#define MAX_PROMPT	48

struct client_case {
	const char *prompt;
	uint16_t temperature_milli, top_k, top_p_e4, min_p_e4, repeat_penalty_milli, repeat_last_n;
	uint64_t seed;
	int stream;
};

static const struct client_case CASES[N_CLIENTS] = {
	{ .prompt = "The capital of France is" },
	{ .prompt = "Once upon a time, there was a", .seed = 7, .stream = 1 },
	{ .prompt = "def fibonacci(n):", .temperature_milli = 800, .top_k = 40, .top_p_e4 = 9000,
	  .seed = 1 },
	{ .prompt = "The three primary colors are", .temperature_milli = 800, .top_k = 40,
	  .top_p_e4 = 9000, .seed = 2, .stream = 1 },
	{ .prompt = "In 1969, astronauts", .temperature_milli = 800, .top_p_e4 = 9500,
	  .min_p_e4 = 500, .seed = 3 },
	{ .prompt = "My favourite recipe for soup", .temperature_milli = 800, .top_k = 20,
	  .repeat_penalty_milli = 1100, .seed = 4, .stream = 1 },
	{ .prompt = "Water boils at", .repeat_penalty_milli = 1300, .repeat_last_n = 16, .seed = 5 },
	{ .prompt = "Here is a short poem about the sea:", .temperature_milli = 800, .top_k = 50,
	  .top_p_e4 = 9000, .min_p_e4 = 200, .repeat_penalty_milli = 1050, .repeat_last_n = 32,
	  .seed = 6, .stream = 1 },
};

/* What a child reports through the results pipe (< PIPE_BUF: written at once). */
struct client_result {
	uint32_t idx;
	int32_t status;		/* 0, or -errno of what went wrong on the client side */
	int32_t res;
	uint32_t flags;
	uint32_t n_out;
	uint32_t n_more;	/* streamed CQEs */
	uint32_t tokens[GEN_TOKENS];
};

static struct kvd_sqe case_sqe(uint32_t session, uint32_t idx, uint32_t n_prompt)
{
	const struct client_case *k = &CASES[idx];
	return (struct kvd_sqe){
		.opcode = KVD_OP_GENERATE, .flags = k->stream ? KVD_SQE_STREAM : 0,
		.session_id = session, .user_data = 1000 + idx, .tokens_off = 0,
		.n_tokens = n_prompt, .out_off = OUT_OFF, .max_tokens = GEN_TOKENS, .seed = k->seed,
		.temperature_milli = k->temperature_milli, .top_k = k->top_k,
		.top_p_e4 = k->top_p_e4, .min_p_e4 = k->min_p_e4,
		.repeat_penalty_milli = k->repeat_penalty_milli, .repeat_last_n = k->repeat_last_n,
	};
}

/* The sampler a GENERATE asks for, read from its fixed-point fields as uapi/kvd.h defines them. */
static void params_from_sqe(const struct kvd_sqe *q, struct sampler_params *p)
{
	sampler_params_default(p);
	p->temperature = (float)q->temperature_milli / 1000.0f;
	p->top_k = q->top_k;
	p->top_p = q->top_p_e4 ? (float)q->top_p_e4 / 10000.0f : 1.0f;
	p->min_p = (float)q->min_p_e4 / 10000.0f;
	p->repeat_penalty = q->repeat_penalty_milli ? (float)q->repeat_penalty_milli / 1000.0f : 1.0f;
	p->repeat_last_n = q->repeat_last_n ? q->repeat_last_n : 64;
	p->seed = q->seed;
}

/* In the child: one GENERATE, started when the parent closes go_fd; never returns. */
static void client_main(uint32_t idx, const uint32_t *prompt, uint32_t n, int ready_fd, int go_fd,
			int res_fd)
{
	struct client_result out = { .idx = idx };
	struct wire r;
	struct kvd_cqe c;
	char b = 1;
	int rc = wire_open(&r, D.sock, 0, 0);
	alarm(kw_s(120000));	/* a lost client must not outlive the test by long */
	if (write(ready_fd, &b, 1) != 1 || read(go_fd, &b, 1) != 0)
		rc = rc ? rc : -EPIPE;
	struct kvd_sqe q = { 0 };
	if (!rc) {
		memcpy(r.arena, prompt, (size_t)n * sizeof(uint32_t));
		q = case_sqe(r.session, idx, n);
		rc = wire_submit(&r, &q);
	}
	while (!rc && !(rc = wire_wait(&r, &c, WAIT_MS))) {
		if (c.user_data != q.user_data) {
			rc = -EPROTO;
		} else if (c.flags & KVD_CQE_MORE) {
			/* A streamed token is already in the arena and matches the CQE. */
			out.n_more++;
			if (c.n_out != out.n_more || c.res != (int32_t)c.n_out || c.n_out > GEN_TOKENS ||
			    out_ids(&r)[c.n_out - 1] != c.token)
				rc = -EBADMSG;
		} else {
			out.res = c.res;
			out.flags = c.flags;
			out.n_out = c.n_out;
			if (c.res > 0 && c.res <= GEN_TOKENS)
				memcpy(out.tokens, out_ids(&r), (size_t)c.res * sizeof(uint32_t));
			break;
		}
	}
	out.status = rc;
	wire_close(&r);
	_exit(write(res_fd, &out, sizeof(out)) == (ssize_t)sizeof(out) ? 0 : 1);
}

struct expected {
	uint32_t prompt[MAX_PROMPT];
	uint32_t n_prompt;
	uint32_t tokens[GEN_TOKENS];
	uint32_t n;
	uint32_t flags;		/* KVD_CQE_EOS or KVD_CQE_LENGTH */
};

/* The tokens the daemon must give case q: the reference generator's, in process. */
static void expect_in_process(struct fixture *fx, const struct kvd_sqe *q, struct expected *x)
{
	struct sampler_params sp;
	int eos;
	params_from_sqe(q, &sp);
	int n = ref_generate(fx, &sp, x->prompt, x->n_prompt, q->max_tokens, 0, x->tokens, &eos);
	assert_in_range(n, 1, GEN_TOKENS);
	x->n = (uint32_t)n;
	x->flags = eos ? KVD_CQE_EOS : KVD_CQE_LENGTH;
}

/* Loads the model and computes every case's tokens; all threads gone when it returns. */
static void expect_all(struct expected *x)
{
	char err[256];
	struct fixture fx;
	/* One thread (see setup()); the daemon's pool layout. */
	if (fixture_open(&fx, 1, 64, MAX_PROMPT, err, sizeof(err)))
		fail_msg("%s", err);
	for (uint32_t i = 0; i < N_CLIENTS; i++) {
		const char *p = CASES[i].prompt;
		int n = tokenizer_encode(fx.tok, p, strlen(p), tokenizer_add_bos(fx.tok), 0, x[i].prompt,
					 MAX_PROMPT);
		assert_in_range(n, 1, MAX_PROMPT);
		x[i].n_prompt = (uint32_t)n;
		struct kvd_sqe q = case_sqe(0, i, x[i].n_prompt);
		expect_in_process(&fx, &q, &x[i]);
	}
	fixture_close(&fx);
}

/* Read exactly len bytes within timeout_ms (scaled): 0, -ETIMEDOUT, or -EPIPE at EOF. */
static int read_full(int fd, void *buf, size_t len, int timeout_ms)
{
	int64_t end = kp_now_ms() + kw_ms(timeout_ms);
	for (size_t got = 0; got < len;) {
		struct pollfd p = { fd, POLLIN, 0 };
		int64_t left = end - kp_now_ms();
		if (left <= 0 || poll(&p, 1, (int)left) == 0)
			return -ETIMEDOUT;
		ssize_t n = read(fd, (char *)buf + got, len - got);
		if (n < 0 && errno != EINTR)
			return -errno;
		if (n == 0)
			return -EPIPE;
		got += n > 0 ? (size_t)n : 0;
	}
	return 0;
}

static void test_concurrent_clients_match_in_process(void **state)
{
	(void)state;
	need_daemon();
	static struct expected x[N_CLIENTS];
	/* Before any fork: the backend's threads must be gone when the children are made. */
	expect_all(x);

	int ready[2], go[2], res[2];
	assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
	assert_int_equal(pipe2(go, O_CLOEXEC), 0);
	assert_int_equal(pipe2(res, O_CLOEXEC), 0);
	pid_t kids[N_CLIENTS];
	for (uint32_t i = 0; i < N_CLIENTS; i++) {
		kids[i] = kp_fork();
		assert_true(kids[i] >= 0);
		if (kids[i] == 0) {
			close(ready[0]);
			close(go[1]);
			close(res[0]);
			client_main(i, x[i].prompt, x[i].n_prompt, ready[1], go[0], res[1]);
		}
	}
	close(ready[1]);
	close(go[0]);
	close(res[1]);
	/* Every client connected and waiting: let them all go at once, so the daemon batches them. */
	char b[N_CLIENTS];
	assert_int_equal(read_full(ready[0], b, sizeof(b), 30000), 0);
	close(go[1]);
	struct client_result got[N_CLIENTS];
	int seen[N_CLIENTS] = { 0 };
	for (uint32_t i = 0; i < N_CLIENTS; i++) {
		struct client_result cr;
		int rc = read_full(res[0], &cr, sizeof(cr), 60000);
		if (rc)
			fail_with_log("only %u of %d clients reported: %s", i, N_CLIENTS, strerror(-rc));
		assert_true(cr.idx < N_CLIENTS && !seen[cr.idx]);
		seen[cr.idx] = 1;
		got[cr.idx] = cr;
	}
	for (uint32_t i = 0; i < N_CLIENTS; i++) {
		int st;
		assert_int_equal(waitpid(kids[i], &st, 0), kids[i]);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	close(ready[0]);
	close(res[0]);

	int bad = 0;
	for (uint32_t i = 0; i < N_CLIENTS; i++) {
		const struct client_result *g = &got[i];
		const struct expected *w = &x[i];
		/* Streamed: a MORE CQE for every token but the last, which the final CQE carries. */
		uint32_t want_more = CASES[i].stream ? w->n - 1 : 0;
		int same = g->status == 0 && g->res == (int32_t)w->n && g->n_out == w->n &&
			   (g->flags & ~KVD_CQE_PREFIX_HIT) == w->flags && g->n_more == want_more &&
			   !memcmp(g->tokens, w->tokens, w->n * sizeof(uint32_t));
		if (same)
			continue;
		bad++;
		print_error("client %u (\"%s\", temp %u, seed %llu): %s%s res %d n_out %u flags %#x"
			    " MORE CQEs %u, want res %u flags %#x MORE CQEs %u\n", i, CASES[i].prompt,
			    CASES[i].temperature_milli, (unsigned long long)CASES[i].seed,
			    g->status ? "client failed: " : "", g->status ? strerror(-g->status) : "ok",
			    g->res, g->n_out, g->flags, g->n_more, w->n, w->flags, want_more);
		for (uint32_t k = 0; k < w->n && g->status == 0; k++)
			print_error("  token %2u: got %5u want %5u%s\n", k, k < (uint32_t)g->res ?
				    g->tokens[k] : 0, w->tokens[k],
				    k < (uint32_t)g->res && g->tokens[k] == w->tokens[k] ? "" : "  <--");
	}
	if (bad)
		fail_msg("%d of %d clients got other tokens than the in-process engine", bad, N_CLIENTS);
}

/* ---- 2. CANCEL mid-generation ---- */

static void test_cancel_mid_generation(void **state)
{
	(void)state;
	need_daemon();
	struct wire r;
	struct kvd_stats_rep st0, st;
	struct kvd_cqe c, fin = { 0 };
	assert_int_equal(wire_open(&r, D.sock, 0, 0), 0);
	assert_int_equal(wire_stats(&r, &st0), 0);

	struct kvd_sqe q = gen_sqe(&r, 100, 200, KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS);
	assert_int_equal(wire_submit(&r, &q), 0);
	uint32_t n_more = 0;
	while (n_more < 3) {
		assert_int_equal(wire_wait(&r, &c, WAIT_MS), 0);
		assert_int_equal(c.user_data, 100);
		assert_true(c.flags & KVD_CQE_MORE);
		assert_int_equal(c.n_out, ++n_more);
	}
	assert_int_equal(wire_stats(&r, &st), 0);
	assert_true(st.kv_blocks_used > st0.kv_blocks_used);

	struct kvd_sqe x = { .opcode = KVD_OP_CANCEL, .session_id = r.session, .user_data = 101,
			     .target_user_data = 100 };
	assert_int_equal(wire_submit(&r, &x), 0);
	int got_cancel = 0, got_final = 0;
	while (!got_cancel || !got_final) {
		assert_int_equal(wire_wait(&r, &c, WAIT_MS), 0);
		if (c.user_data == 101) {
			assert_false(got_cancel);
			assert_int_equal(c.res, 0);
			assert_int_equal(c.flags, 0);
			got_cancel = 1;
		} else if (c.user_data == 100 && (c.flags & KVD_CQE_MORE)) {
			assert_false(got_final);
			assert_int_equal(c.n_out, ++n_more);
			assert_int_equal(out_ids(&r)[c.n_out - 1], c.token);
		} else {
			assert_int_equal(c.user_data, 100);
			assert_false(got_final);
			fin = c;
			got_final = 1;
		}
	}
	/* Ended by the CANCEL, with every token so far produced, written and streamed. */
	assert_int_equal(fin.flags & ~KVD_CQE_PREFIX_HIT, KVD_CQE_CANCELLED);
	assert_int_equal(fin.res, n_more);
	assert_int_equal(fin.n_out, n_more);
	assert_true(fin.res < 200);
	assert_int_equal(fin.token, out_ids(&r)[fin.n_out - 1]);

	/* Nothing of that name is in flight any more. */
	assert_int_equal(wire_submit(&r, &x), 0);
	assert_int_equal(wire_wait(&r, &c, WAIT_MS), 0);
	assert_int_equal(c.user_data, 101);
	assert_int_equal(c.res, -ENOENT);

	/* The same session and slot serve again; then RESET returns the slot's blocks. */
	assert_serves(&r, "a cancelled GENERATE");
	struct kvd_sqe z = reset_sqe(&r, 102, 0);
	assert_int_equal(wire_submit(&r, &z), 0);
	assert_int_equal(wire_wait(&r, &c, WAIT_MS), 0);
	assert_int_equal(c.user_data, 102);
	assert_int_equal(c.res, 0);
	if (stats_until(&r, &st, 30000, used_is, &st0.kv_blocks_used))
		fail_msg("kv_blocks_used %llu (cached %llu), was %llu before the cancelled GENERATE",
			 (unsigned long long)st.kv_blocks_used, (unsigned long long)st.kv_blocks_cached,
			 (unsigned long long)st0.kv_blocks_used);
	assert_true(st.kv_blocks_used + st.kv_blocks_cached <= st.kv_blocks_total);
	wire_close(&r);
}

/* ---- 3. a client killed mid-generation ---- */

static void test_killed_client_is_reclaimed(void **state)
{
	(void)state;
	need_daemon();
	struct wire s, b;
	struct kvd_stats_rep st0, st;
	struct kvd_cqe c;
	/* s only asks STATS; b keeps generating while the other client dies. */
	assert_int_equal(wire_connect(&s, D.sock), 0);
	assert_int_equal(wire_hello(&s, 0), 0);
	assert_int_equal(wire_open(&b, D.sock, 0, 0), 0);
	uint32_t two = 2;
	assert_int_equal(stats_until(&s, &st0, 30000, conns_are, &two), 0);
	int fd0 = kp_fds(D.pid);
	assert_true(fd0 > 0);

	int sig[2];
	assert_int_equal(pipe2(sig, O_CLOEXEC), 0);
	pid_t kid = kp_fork();
	assert_true(kid >= 0);
	if (kid == 0) {
		struct wire k;
		char one = 1;
		alarm(kw_s(120000));
		close(sig[0]);
		if (wire_open(&k, D.sock, 0, 0))
			_exit(1);
		struct kvd_sqe q = gen_sqe(&k, 1, 1000, KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS);
		if (wire_submit(&k, &q) || wire_wait(&k, &c, WAIT_MS) || write(sig[1], &one, 1) != 1)
			_exit(1);
		for (;;)
			pause();	/* mid-generation, until SIGKILL */
	}
	close(sig[1]);
	char one;
	assert_int_equal(read_full(sig[0], &one, 1, 30000), 0);
	close(sig[0]);
	assert_int_equal(wire_stats(&s, &st), 0);
	assert_true(st.kv_blocks_used > st0.kv_blocks_used);
	assert_true(kp_fds(D.pid) > fd0);

	struct kvd_sqe q = gen_sqe(&b, 7, 16, KVD_SQE_IGNORE_EOS);
	assert_int_equal(wire_submit(&b, &q), 0);
	int wst;
	assert_int_equal(kill(kid, SIGKILL), 0);
	assert_int_equal(waitpid(kid, &wst, 0), kid);
	assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
	assert_int_equal(wire_finish(&b, 7, &c, WAIT_MS), 0);
	assert_int_equal(c.res, 16);
	assert_true(c.flags & KVD_CQE_LENGTH);
	struct kvd_sqe z = reset_sqe(&b, 8, 0);
	assert_int_equal(wire_submit(&b, &z), 0);
	assert_int_equal(wire_finish(&b, 8, &c, WAIT_MS), 0);
	assert_int_equal(c.res, 0);

	/* The dead client's connection, blocks and fds all go back. */
	if (stats_until(&s, &st, 30000, used_is, &st0.kv_blocks_used))
		fail_msg("kv_blocks_used %llu, was %llu before the client was killed",
			 (unsigned long long)st.kv_blocks_used, (unsigned long long)st0.kv_blocks_used);
	assert_int_equal(stats_until(&s, &st, 30000, conns_are, &two), 0);
	int fds = kp_fds(D.pid);
	for (int64_t end = kp_now_ms() + kw_ms(30000); fds != fd0 && kp_now_ms() < end; kp_sleep_ms(20))
		fds = kp_fds(D.pid);
	if (fds != fd0)
		fail_msg("kvd holds %d fds, %d before the client was killed", fds, fd0);
	wire_close(&b);
	wire_close(&s);
}

/* ---- 4. malformed input, answered precisely; the daemon serves on ---- */

enum sqe_bad {
	SB_OPCODE, SB_OPCODE_255, SB_SESSION_GEN, SB_SESSION_NEVER, SB_SLOT, SB_TOKENS_PAST,
	SB_TOKENS_STRADDLE, SB_TOKENS_WRAP, SB_TOKENS_HUGE, SB_OUT_MISALIGNED, SB_OUT_PAST,
	SB_TOKEN_RANGE, SB_FLAG_BIT5, SB_FLAG_BIT15, SB_TARGET, SB_E2BIG, SB_PRIORITY,
	SB_MAX_ZERO, SB_PROMPT_EMPTY, SB_CHAT_NO_TEXT, SB_TOP_P, SB_DECODE_PROMPT, SB_CANCEL_NONE,
	SB_RESV, SB_SPECIAL_NO_TEXT, SB_PLAIN_SPECIAL, SB_SYSTEM_NO_CHAT, SB_SYSTEM_PAST,
	SB_SYSTEM_OFF_ONLY, SB_PROGRESS_RESET, SB_NOP_PROGRESS, SB_CANCEL_SYSTEM, SB_DECODE_TEXT,
};

static const struct {
	enum sqe_bad bad;
	const char *what;
	int res;
} SQE_CASES[] = {
	{ SB_OPCODE, "opcode KVD_OP_LAST", -EINVAL },
	{ SB_OPCODE_255, "opcode 255", -EINVAL },
	{ SB_SESSION_GEN, "session id of another generation", -ENOENT },
	{ SB_SESSION_NEVER, "session id never issued", -ENOENT },
	/* uapi Conventions: -ENOENT "unknown session or sequence slot". */
	{ SB_SLOT, "slot == max_slots", -ENOENT },
	{ SB_TOKENS_PAST, "tokens_off at the arena's end", -EFAULT },
	{ SB_TOKENS_STRADDLE, "prompt running off the arena", -EFAULT },
	{ SB_TOKENS_WRAP, "tokens_off + 4 * n_tokens wrapping 32 bits", -EFAULT },
	{ SB_TOKENS_HUGE, "n_tokens 2^30", -EFAULT },
	{ SB_OUT_MISALIGNED, "out_off not a multiple of 4", -EFAULT },
	{ SB_OUT_PAST, "output running off the arena", -EFAULT },
	{ SB_TOKEN_RANGE, "token id == vocab_size", -ERANGE },
	{ SB_FLAG_BIT5, "KVD_SQE_PLAIN (1 << 5) without KVD_SQE_TEXT", -EINVAL },
	{ SB_FLAG_BIT15, "unknown SQE flag 1 << 15", -EINVAL },
	{ SB_TARGET, "target_user_data on a GENERATE", -EINVAL },
	{ SB_E2BIG, "prompt + max_tokens over max_tokens", -E2BIG },
	{ SB_PRIORITY, "priority 2", -EINVAL },
	{ SB_MAX_ZERO, "GENERATE with max_tokens 0", -EINVAL },
	{ SB_PROMPT_EMPTY, "GENERATE with n_tokens 0", -EINVAL },
	{ SB_CHAT_NO_TEXT, "KVD_SQE_CHAT without KVD_SQE_TEXT", -EINVAL },
	{ SB_TOP_P, "top_p_e4 10001", -EINVAL },
	{ SB_DECODE_PROMPT, "DECODE carrying a prompt", -EINVAL },
	{ SB_CANCEL_NONE, "CANCEL of a request never submitted", -ENOENT },
	{ SB_RESV, "nonzero SQE resv", -EINVAL },
	{ SB_SPECIAL_NO_TEXT, "KVD_SQE_SPECIAL without KVD_SQE_TEXT", -EINVAL },
	{ SB_PLAIN_SPECIAL, "KVD_SQE_PLAIN with KVD_SQE_SPECIAL", -EINVAL },
	{ SB_SYSTEM_NO_CHAT, "a system message without KVD_SQE_CHAT", -EINVAL },
	{ SB_SYSTEM_PAST, "a system message running off the arena", -EFAULT },
	{ SB_SYSTEM_OFF_ONLY, "system_off without system_len", -EINVAL },
	{ SB_PROGRESS_RESET, "KVD_SQE_PROGRESS on a RESET", -EINVAL },
	{ SB_NOP_PROGRESS, "KVD_SQE_PROGRESS on a NOP", -EINVAL },
	{ SB_CANCEL_SYSTEM, "a system message on a CANCEL", -EINVAL },
	{ SB_DECODE_TEXT, "KVD_SQE_TEXT on a DECODE", -EINVAL },
};

/* q's prompt as the text "Hello" (valid as it stands), flags added to KVD_SQE_TEXT. */
static void text_hello(struct wire *r, struct kvd_sqe *q, uint16_t flags)
{
	memcpy(r->arena, "Hello", 5);
	q->n_tokens = 5;
	q->flags |= KVD_SQE_TEXT | flags;
}

static void sqe_mangle(struct wire *r, struct kvd_sqe *q, enum sqe_bad bad)
{
	switch (bad) {
	case SB_OPCODE: q->opcode = KVD_OP_LAST; break;
	case SB_OPCODE_255: q->opcode = 255; break;
	case SB_SESSION_GEN: q->session_id += 1U << 8; break;
	case SB_SESSION_NEVER: q->session_id = 0xdeadbeef; break;
	case SB_SLOT: q->slot = r->hello.max_slots; break;
	case SB_TOKENS_PAST: q->tokens_off = r->arena_bytes; break;
	case SB_TOKENS_STRADDLE: q->tokens_off = r->arena_bytes - 8; break;
	case SB_TOKENS_WRAP: q->tokens_off = 0xfffffff0u; q->n_tokens = 8; break;
	case SB_TOKENS_HUGE: q->n_tokens = 1U << 30; break;
	case SB_OUT_MISALIGNED: q->out_off = OUT_OFF + 2; break;
	case SB_OUT_PAST: q->out_off = r->arena_bytes - 8; break;
	case SB_TOKEN_RANGE: ((uint32_t *)r->arena)[1] = r->hello.vocab_size; break;
	case SB_FLAG_BIT5: q->flags |= 1U << 5; break;
	case SB_FLAG_BIT15: q->flags |= 1U << 15; break;
	case SB_TARGET: q->target_user_data = 1; break;
	case SB_E2BIG: q->max_tokens = r->hello.max_tokens; break;
	case SB_PRIORITY: q->priority = 2; break;
	case SB_MAX_ZERO: q->max_tokens = 0; break;
	case SB_PROMPT_EMPTY: q->n_tokens = 0; break;
	case SB_CHAT_NO_TEXT: q->flags |= KVD_SQE_CHAT; break;
	case SB_TOP_P: q->top_p_e4 = 10001; break;
	case SB_DECODE_PROMPT: q->opcode = KVD_OP_DECODE; break;
	case SB_CANCEL_NONE:
		*q = (struct kvd_sqe){ .opcode = KVD_OP_CANCEL, .session_id = q->session_id,
				       .user_data = q->user_data, .target_user_data = 12345 };
		break;
	case SB_RESV: q->resv[4] = 1; break;
	case SB_SPECIAL_NO_TEXT: q->flags |= KVD_SQE_SPECIAL; break;
	case SB_PLAIN_SPECIAL: text_hello(r, q, KVD_SQE_PLAIN | KVD_SQE_SPECIAL); break;
	case SB_SYSTEM_NO_CHAT:
		text_hello(r, q, 0);
		q->system_off = 64;
		q->system_len = 4;
		break;
	case SB_SYSTEM_PAST:
		text_hello(r, q, KVD_SQE_CHAT);
		q->system_off = r->arena_bytes - 2;
		q->system_len = 4;
		break;
	case SB_SYSTEM_OFF_ONLY: text_hello(r, q, KVD_SQE_CHAT); q->system_off = 64; break;
	case SB_PROGRESS_RESET: *q = reset_sqe(r, q->user_data, 0); q->flags = KVD_SQE_PROGRESS; break;
	case SB_NOP_PROGRESS:
		*q = (struct kvd_sqe){ .opcode = KVD_OP_NOP, .user_data = q->user_data,
				       .flags = KVD_SQE_PROGRESS };
		break;
	case SB_CANCEL_SYSTEM:
		*q = (struct kvd_sqe){ .opcode = KVD_OP_CANCEL, .session_id = q->session_id,
				       .user_data = q->user_data, .target_user_data = 12345,
				       .system_off = 64, .system_len = 4 };
		break;
	case SB_DECODE_TEXT:
		q->opcode = KVD_OP_DECODE;
		q->tokens_off = 0;
		q->n_tokens = 0;
		q->flags |= KVD_SQE_TEXT;
		break;
	}
}

static void test_malformed_sqes(void **state)
{
	(void)state;
	need_daemon();
	int bad = 0;
	for (size_t i = 0; i < sizeof(SQE_CASES) / sizeof(SQE_CASES[0]); i++) {
		struct wire r;
		struct kvd_cqe c;
		assert_int_equal(wire_open(&r, D.sock, 0, 0), 0);
		assert_true(r.arena_bytes > OUT_OFF + 64);
		struct kvd_sqe q = gen_sqe(&r, 77, 4, 0);
		sqe_mangle(&r, &q, SQE_CASES[i].bad);
		assert_int_equal(wire_submit(&r, &q), 0);
		int rc = wire_wait(&r, &c, WAIT_MS);
		if (rc) {
			fail_with_log("%s: no CQE: %s", SQE_CASES[i].what, strerror(-rc));
		} else if (c.user_data != 77 || c.res != SQE_CASES[i].res || c.flags) {
			print_error("%s: CQE user_data %llu res %d (%s) flags %#x; want res %d (%s)\n",
				    SQE_CASES[i].what, (unsigned long long)c.user_data, c.res,
				    strerror(c.res < 0 ? -c.res : 0), c.flags, SQE_CASES[i].res,
				    strerror(-SQE_CASES[i].res));
			bad++;
		}
		if (wire_peek(&r, &c))
			fail_msg("%s: a second CQE (user_data %llu res %d)", SQE_CASES[i].what,
				 (unsigned long long)c.user_data, c.res);
		assert_serves(&r, SQE_CASES[i].what);
		wire_close(&r);
	}

	/* An SQ tail no producer could write: one CQE (user_data 0, -EINVAL), then in step again. */
	struct wire r;
	struct kvd_cqe c;
	assert_int_equal(wire_open(&r, D.sock, 0, 0), 0);
	r.sq_tail += 4 * r.sq_entries;
	kvring_publish(r.sq, r.sq_tail);
	assert_int_equal(wire_kick_if_asleep(&r), 0);
	assert_int_equal(wire_wait(&r, &c, WAIT_MS), 0);
	if (c.user_data != 0 || c.res != -EINVAL)
		fail_msg("SQ tail jump: CQE user_data %llu res %d, want 0 and -EINVAL",
			 (unsigned long long)c.user_data, c.res);
	for (int64_t end = kp_now_ms() + kw_ms(10000); kvring_load_head(r.sq) != r.sq_tail && kp_now_ms() < end;)
		kp_sleep_ms(5);
	assert_int_equal(kvring_load_head(r.sq), r.sq_tail);
	assert_serves(&r, "an SQ tail jump");
	wire_close(&r);

	if (bad)
		fail_msg("%d malformed SQEs got the wrong answer", bad);
	assert_int_equal(wire_open(&r, D.sock, 0, 0), 0);
	assert_serves(&r, "every malformed SQE");
	wire_close(&r);
}

enum msg_bad {
	MB_MAGIC, MB_SHORT, MB_TRUNC_HELLO, MB_LEN_FIELD, MB_TYPE_99, MB_TYPE_0, MB_TYPE_ERROR,
	MB_HDR_FLAGS, MB_HDR_STATUS, MB_HDR_RESV, MB_HELLO_RESV, MB_ABI_NEXT, MB_ABI_0,
	MB_OPEN_RESV, MB_OPEN_SQ3, MB_CLOSE_UNKNOWN, MB_CLOSE_RESV, MB_STATS_LONG, MB_HUGE,
};

static const struct {
	enum msg_bad bad;
	const char *what;
	uint16_t type;		/* of the reply */
	int status, status_alt;	/* the reply's status; alt: another reading of the uapi */
} MSG_CASES[] = {
	{ MB_MAGIC, "wrong magic", KVD_MSG_ERROR, -EPROTO, -EPROTO },
	/* Too short to hold a magic: a size error (-EINVAL) or an unreadable magic (-EPROTO). */
	{ MB_SHORT, "8-byte datagram", KVD_MSG_ERROR, -EINVAL, -EPROTO },
	{ MB_TRUNC_HELLO, "truncated HELLO", KVD_MSG_HELLO, -EINVAL, -EINVAL },
	{ MB_LEN_FIELD, "hdr.len not the datagram's length", KVD_MSG_ERROR, -EINVAL, -EINVAL },
	{ MB_TYPE_99, "unknown message type 99", KVD_MSG_ERROR, -EINVAL, -EINVAL },
	{ MB_TYPE_0, "message type 0", KVD_MSG_ERROR, -EINVAL, -EINVAL },
	{ MB_TYPE_ERROR, "KVD_MSG_ERROR sent by a client", KVD_MSG_ERROR, -EINVAL, -EINVAL },
	{ MB_HDR_FLAGS, "KVD_MSGF_REPLY on a request", KVD_MSG_ERROR, -EINVAL, -EINVAL },
	{ MB_HDR_STATUS, "nonzero status on a request", KVD_MSG_ERROR, -EINVAL, -EINVAL },
	{ MB_HDR_RESV, "nonzero hdr.resv", KVD_MSG_ERROR, -EINVAL, -EINVAL },
	{ MB_HELLO_RESV, "nonzero HELLO resv", KVD_MSG_HELLO, -EINVAL, -EINVAL },
	{ MB_ABI_NEXT, "the next ABI version", KVD_MSG_HELLO, -EPROTO, -EPROTO },
	{ MB_ABI_0, "ABI version 0", KVD_MSG_HELLO, -EPROTO, -EPROTO },
	{ MB_OPEN_RESV, "nonzero SESSION_OPEN flags", KVD_MSG_SESSION_OPEN, -EINVAL, -EINVAL },
	{ MB_OPEN_SQ3, "SESSION_OPEN sq_entries 3", KVD_MSG_SESSION_OPEN, -EINVAL, -EINVAL },
	{ MB_CLOSE_UNKNOWN, "SESSION_CLOSE of an unknown id", KVD_MSG_SESSION_CLOSE, -ENOENT, -ENOENT },
	{ MB_CLOSE_RESV, "nonzero SESSION_CLOSE resv", KVD_MSG_SESSION_CLOSE, -EINVAL, -EINVAL },
	{ MB_STATS_LONG, "STATS with a body", KVD_MSG_STATS, -EINVAL, -EINVAL },
	/* Larger than any control message: "malformed message (size)"; the daemon says -EMSGSIZE. */
	{ MB_HUGE, "4 KiB datagram", KVD_MSG_ERROR, -EINVAL, -EMSGSIZE },
};

/* Build the bad message into buf; returns its length. */
static size_t msg_mangle(uint8_t *buf, enum msg_bad bad, uint32_t seq)
{
	struct kvd_hello_req *h = (struct kvd_hello_req *)buf;
	struct kvd_session_open_req *o = (struct kvd_session_open_req *)buf;
	struct kvd_session_close_req *x = (struct kvd_session_close_req *)buf;
	size_t len = sizeof(*h);
	*h = (struct kvd_hello_req){ .hdr = wire_hdr(KVD_MSG_HELLO, sizeof(*h)),
				     .abi_version = KVD_ABI_VERSION };
	h->hdr.seq = seq;
	switch (bad) {
	case MB_MAGIC: h->hdr.magic = 0x12345678; break;
	case MB_SHORT: len = 8; break;
	case MB_TRUNC_HELLO: len = h->hdr.len = sizeof(*h) - 8; break;
	case MB_LEN_FIELD: h->hdr.len = sizeof(*h) + 8; break;
	case MB_TYPE_99: h->hdr.type = 99; break;
	case MB_TYPE_0: h->hdr.type = 0; break;
	case MB_TYPE_ERROR: h->hdr.type = KVD_MSG_ERROR; break;
	case MB_HDR_FLAGS: h->hdr.flags = KVD_MSGF_REPLY; break;
	case MB_HDR_STATUS: h->hdr.status = -EIO; break;
	case MB_HDR_RESV: h->hdr.resv = 1; break;
	case MB_HELLO_RESV: h->resv[1] = 1; break;
	case MB_ABI_NEXT: h->abi_version = KVD_ABI_VERSION + 1; break;
	case MB_ABI_0: h->abi_version = 0; break;
	case MB_OPEN_RESV:
	case MB_OPEN_SQ3:
		*o = (struct kvd_session_open_req){ .hdr = wire_hdr(KVD_MSG_SESSION_OPEN, sizeof(*o)) };
		o->hdr.seq = seq;
		if (bad == MB_OPEN_RESV)
			o->flags = 1u << 7;	/* no such KVD_OPEN_ flag */
		else
			o->sq_entries = 3;
		len = sizeof(*o);
		break;
	case MB_CLOSE_UNKNOWN:
	case MB_CLOSE_RESV:
		*x = (struct kvd_session_close_req){ .hdr = wire_hdr(KVD_MSG_SESSION_CLOSE, sizeof(*x)),
						     .session_id = 0x4242 };
		x->hdr.seq = seq;
		x->resv = bad == MB_CLOSE_RESV;
		len = sizeof(*x);
		break;
	case MB_STATS_LONG: h->hdr.type = KVD_MSG_STATS; break;
	case MB_HUGE: len = h->hdr.len = 4096; break;
	}
	return len;
}

static void test_malformed_control_messages(void **state)
{
	(void)state;
	need_daemon();
	int bad = 0;
	for (size_t i = 0; i < sizeof(MSG_CASES) / sizeof(MSG_CASES[0]); i++) {
		const char *what = MSG_CASES[i].what;
		struct wire r;
		static uint8_t buf[4096];
		union {
			struct kvd_msg_hdr hdr;
			uint8_t b[512];
		} rep;
		memset(buf, 0, sizeof(buf));
		assert_int_equal(wire_connect(&r, D.sock), 0);
		size_t len = msg_mangle(buf, MSG_CASES[i].bad, 900 + (uint32_t)i);
		assert_int_equal(send(r.fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
		int n = wire_recv(&r, &rep, sizeof(rep), NULL, NULL, WAIT_MS);
		if (n < (int)sizeof(rep.hdr))
			fail_msg("%s: no reply (%d): the connection should stay usable", what, n);
		const struct kvd_msg_hdr *h = &rep.hdr;
		/* The seq is echoed whenever there was a header to read it from. */
		int seq_ok = MSG_CASES[i].bad == MB_SHORT || h->seq == 900 + i;
		if (h->magic != KVD_MAGIC || !(h->flags & KVD_MSGF_REPLY) || h->len != (uint32_t)n ||
		    h->type != MSG_CASES[i].type || !seq_ok ||
		    (h->status != MSG_CASES[i].status && h->status != MSG_CASES[i].status_alt)) {
			print_error("%s: reply type %u status %d (%s) seq %u flags %#x len %u/%d;"
				    " want type %u status %d (%s)\n", what, h->type, h->status,
				    strerror(h->status < 0 ? -h->status : 0), h->seq, h->flags, h->len,
				    n, MSG_CASES[i].type, MSG_CASES[i].status,
				    strerror(-MSG_CASES[i].status));
			bad++;
		}
		/* Control-message errors leave the connection usable: the whole handshake, then work. */
		int rc = wire_hello(&r, KVD_FEAT_ALL & ~KVD_FEAT_VOCAB);
		if (!rc)
			rc = wire_session_open(&r, 0, 0, &r.session);
		if (rc)
			fail_msg("after %s: handshake on the same connection: %s", what, strerror(-rc));
		assert_serves(&r, what);
		wire_close(&r);
	}
	if (bad)
		fail_msg("%d malformed control messages got the wrong answer", bad);
	struct wire r;
	assert_int_equal(wire_open(&r, D.sock, 0, 0), 0);
	assert_serves(&r, "every malformed control message");
	wire_close(&r);
}

/* ---- 5. the daemon dies under a sleeping client ---- */

static int64_t killed_at;

static void *kill_daemon_soon(void *arg)
{
	(void)arg;
	kp_sleep_ms(300);
	__atomic_store_n(&killed_at, kp_now_ms(), __ATOMIC_SEQ_CST);
	kill(D.pid, SIGKILL);
	return NULL;
}

static void test_daemon_death_wakes_waiter(void **state)
{
	(void)state;
	need_daemon();
	struct wire r;
	struct kvd_cqe c;
	pthread_t t;
	assert_int_equal(wire_open(&r, D.sock, 0, 0), 0);
	struct kvd_sqe q = gen_sqe(&r, 5, 1000, KVD_SQE_IGNORE_EOS);
	assert_int_equal(wire_submit(&r, &q), 0);
	assert_int_equal(pthread_create(&t, NULL, kill_daemon_soon, NULL), 0);
	int rc = wire_wait(&r, &c, WAIT_MS);
	int64_t woke = kp_now_ms();
	assert_int_equal(pthread_join(t, NULL), 0);
	int st;
	assert_int_equal(waitpid(D.pid, &st, 0), D.pid);
	D.pid = 0;
	assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	if (rc != -ECONNRESET)
		fail_msg("the waiter got %d (%s), want -ECONNRESET from the hang-up", rc, strerror(-rc));
	int64_t late = woke - __atomic_load_n(&killed_at, __ATOMIC_SEQ_CST);
	if (late >= kw_ms(2000))
		fail_msg("the waiter noticed the daemon's death %lld ms late", (long long)late);
	/* And the socket says so plainly: POLLHUP, then EOF. */
	struct pollfd p = { r.fd, POLLIN, 0 };
	assert_int_equal(poll(&p, 1, 0), 1);
	assert_true(p.revents & POLLHUP);
	char b;
	assert_int_equal(recv(r.fd, &b, 1, MSG_DONTWAIT), 0);
	wire_close(&r);
}

/* ---- 6. a full CQ loses nothing ---- */

static void test_cq_overflow_loses_nothing(void **state)
{
	(void)state;
	need_daemon();
	enum { N = 40 };
	struct wire r;
	struct kvd_cqe c;
	assert_int_equal(wire_open(&r, D.sock, 0, 4), 0);
	assert_int_equal(r.cq_entries, 4);
	struct kvd_sqe q = gen_sqe(&r, 9, N, KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS);
	assert_int_equal(wire_submit(&r, &q), 0);
	/* Read nothing until the daemon says it holds completions the CQ had no room for. */
	uint32_t flags = 0;
	for (int64_t end = kp_now_ms() + WAIT_MS; kp_now_ms() < end; kp_sleep_ms(5))
		if ((flags = __atomic_load_n(&r.cq->flags, __ATOMIC_ACQUIRE)) & KVD_RING_CQ_OVERFLOW)
			break;
	if (!(flags & KVD_RING_CQ_OVERFLOW)) {
		if (wire_peek(&r, &c))
			fail_with_log("a CQ of 4 never showed KVD_RING_CQ_OVERFLOW in %d ms; its first"
				      " CQE: user_data %llu res %d", WAIT_MS,
				      (unsigned long long)c.user_data, c.res);
		fail_with_log("a CQ of 4 never showed KVD_RING_CQ_OVERFLOW in %d ms", WAIT_MS);
	}
	assert_true(__atomic_load_n(&r.cq->overflow, __ATOMIC_RELAXED) > 0);
	assert_int_equal(kvring_ready(r.cq, r.cq_head), 4);
	/* Stay away a while longer: a full CQ is never written over. */
	kp_sleep_ms(300);
	assert_int_equal(kvring_ready(r.cq, r.cq_head), 4);

	/* Every token in order: a MORE CQE for each but the last, which the final CQE carries. */
	uint32_t n_more = 0;
	for (;;) {
		assert_int_equal(wire_wait(&r, &c, WAIT_MS), 0);
		assert_int_equal(c.user_data, 9);
		if (!(c.flags & KVD_CQE_MORE))
			break;
		if (c.n_out != n_more + 1 || c.res != (int32_t)c.n_out)
			fail_msg("MORE CQE %u: n_out %u res %d, want %u: a completion was lost or reordered",
				 n_more, c.n_out, c.res, n_more + 1);
		assert_int_equal(out_ids(&r)[c.n_out - 1], c.token);
		n_more++;
	}
	assert_int_equal(c.res, N);
	assert_int_equal(c.n_out, N);
	assert_int_equal(c.flags & ~KVD_CQE_PREFIX_HIT, KVD_CQE_LENGTH);
	assert_int_equal(c.token, out_ids(&r)[N - 1]);
	if (n_more != N - 1)
		fail_msg("%u MORE CQEs for %d tokens, want %d: one for every token but the last",
			 n_more, N, N - 1);
	assert_false(wire_peek(&r, &c));
	assert_false(__atomic_load_n(&r.cq->flags, __ATOMIC_ACQUIRE) & KVD_RING_CQ_OVERFLOW);
	assert_int_equal(__atomic_load_n(&r.cq->overflow, __ATOMIC_RELAXED), 0);
	wire_close(&r);

	/*
	 * Completions held while the daemon has nothing else to do: 60 NOPs
	 * into a CQ of 4, unread until the daemon is surely idle, then read
	 * through it, a few times over. Freeing room kicks the daemon when its
	 * SQ says it sleeps, and a daemon about to sleep looks at its CQs once
	 * more, so none is stranded (the race between the two is what the
	 * rounds are for).
	 */
	enum { N_NOP = 60 };
	assert_int_equal(wire_open(&r, D.sock, 0, 4), 0);
	for (int round = 0; round < 4; round++) {
		for (uint64_t i = 1; i <= N_NOP; i++) {
			struct kvd_sqe nop = { .opcode = KVD_OP_NOP, .user_data = i };
			assert_int_equal(wire_submit(&r, &nop), 0);
		}
		kp_sleep_ms(50);
		for (uint64_t i = 1; i <= N_NOP; i++) {
			int rc = wire_wait(&r, &c, WAIT_MS);
			if (rc)
				fail_with_log("NOP %llu of %d (round %d) never completed (%s) while kvd held %u"
					 " completions for a CQ with room: it went to sleep on them",
					 (unsigned long long)i, N_NOP, round, strerror(-rc),
					 __atomic_load_n(&r.cq->overflow, __ATOMIC_RELAXED));
			if (c.user_data != i || c.res != 0)
				fail_msg("NOP %llu: CQE user_data %llu res %d", (unsigned long long)i,
					 (unsigned long long)c.user_data, c.res);
		}
	}
	wire_close(&r);

	/*
	 * Back-pressure reaches the SQ: a client that keeps submitting NOPs and
	 * never reads its CQ sees its SQ fill up; the daemon does not buffer
	 * completions without bound.
	 */
	assert_int_equal(wire_open(&r, D.sock, 0, 4), 0);
	uint64_t n_sub = 0;
	for (int64_t end = kp_now_ms() + 1000, full_since = 0; kp_now_ms() < end;) {
		struct kvd_sqe nop = { .opcode = KVD_OP_NOP, .user_data = n_sub + 1 };
		if (!wire_submit(&r, &nop)) {
			n_sub++;
			full_since = 0;
			continue;
		}
		if (!full_since)
			full_since = kp_now_ms();
		else if (kp_now_ms() - full_since > 200)
			break;	/* the SQ stays full: the daemon stopped taking SQEs */
		kp_sleep_ms(1);
	}
	uint32_t held = __atomic_load_n(&r.cq->overflow, __ATOMIC_RELAXED);
	if (held > r.cq_entries + r.sq_entries)
		fail_msg("kvd holds %u completions for a client that does not read its CQ of %u"
			 " (%llu NOPs taken in 1 s): a full CQ must back-pressure the SQ", held,
			 r.cq_entries, (unsigned long long)n_sub);
	for (uint64_t i = 1; i <= n_sub; i++) {
		assert_int_equal(wire_wait(&r, &c, WAIT_MS), 0);
		assert_int_equal(c.user_data, i);
	}
	assert_false(wire_peek(&r, &c));
	wire_close(&r);
}

/* ---- 7. the call eventfd is written only for a client that asked ---- */

static int call_fd_readable(const struct wire *r)
{
	struct pollfd p = { r->call_fd, POLLIN, 0 };
	return poll(&p, 1, 0) == 1;
}

static void test_wakeup_only_when_asked(void **state)
{
	(void)state;
	need_daemon();
	struct wire r;
	struct kvd_cqe c;
	assert_int_equal(wire_open(&r, D.sock, 0, 0), 0);
	assert_false(call_fd_readable(&r));

	/* A client that polls its CQ and never sets NEED_WAKEUP: no eventfd write, ever. */
	struct kvd_sqe q = gen_sqe(&r, 11, 16, KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS);
	assert_int_equal(wire_submit(&r, &q), 0);
	uint32_t n = 0;
	for (int64_t end = kp_now_ms() + WAIT_MS;; kp_sleep_ms(1)) {
		assert_false(call_fd_readable(&r));
		if (wire_peek(&r, &c)) {
			assert_int_equal(c.user_data, 11);
			n++;
			if (!(c.flags & KVD_CQE_MORE))
				break;
		}
		assert_true(kp_now_ms() < end);
	}
	assert_int_equal(c.res, 16);
	kp_sleep_ms(100);	/* the daemon's wake-up pass follows its posting */
	assert_false(call_fd_readable(&r));
	assert_false(__atomic_load_n(&r.cq->flags, __ATOMIC_RELAXED) & KVD_RING_NEED_WAKEUP);

	/* One that sets NEED_WAKEUP, looks once more, and sleeps: woken by the call eventfd. */
	q = gen_sqe(&r, 12, 24, KVD_SQE_IGNORE_EOS);
	assert_int_equal(wire_submit(&r, &q), 0);
	kvring_set_need_wakeup(r.cq);
	assert_false(wire_peek(&r, &c));	/* 24 tokens take longer than this look */
	struct pollfd p = { r.call_fd, POLLIN, 0 };
	int got = poll(&p, 1, WAIT_MS);
	kvring_clear_need_wakeup(r.cq);
	if (got != 1)
		fail_with_log("a client asleep with CQ NEED_WAKEUP was not woken in %d ms", WAIT_MS);
	uint64_t v;
	assert_int_equal(read(r.call_fd, &v, sizeof(v)), (ssize_t)sizeof(v));
	assert_true(v >= 1);
	/* A wake-up means a completion is there. */
	assert_true(wire_peek(&r, &c));
	assert_int_equal(c.user_data, 12);
	assert_int_equal(c.res, 24);
	wire_close(&r);
}

/* ---- 8. SIGTERM drains: in-flight work ends, then kvd exits 0 ---- */

static void test_sigterm_drains(void **state)
{
	(void)state;
	need_daemon();
	enum { N = 48 };
	struct wire r;
	struct kvd_cqe c;
	assert_int_equal(wire_open(&r, D.sock, 0, 0), 0);
	struct kvd_sqe q = gen_sqe(&r, 21, N, KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS);
	assert_int_equal(wire_submit(&r, &q), 0);
	assert_int_equal(wire_wait(&r, &c, WAIT_MS), 0);
	if (c.user_data != 21 || !(c.flags & KVD_CQE_MORE))
		fail_msg("first CQE: user_data %llu res %d flags %#x, want a MORE of request 21",
			 (unsigned long long)c.user_data, c.res, c.flags);
	pid_t pid = D.pid;
	int64_t t0 = kp_now_ms();
	assert_int_equal(kill(pid, SIGTERM), 0);
	/* The socket goes once kvd has begun draining; from then on new work is refused. */
	for (int64_t end = kp_now_ms() + kw_ms(30000); !access(D.sock, F_OK) && kp_now_ms() < end;)
		kp_sleep_ms(1);
	assert_int_equal(access(D.sock, F_OK), -1);
	struct kvd_sqe late = gen_sqe(&r, 22, 4, 0);
	late.out_off = OUT_OFF + 1024;	/* clear of the running request's output */
	assert_int_equal(wire_submit(&r, &late), 0);

	/*
	 * The request in flight runs to its end (48 tokens take well under the
	 * 2000 ms of --drain-timeout), or, on a machine too busy for that, is
	 * cancelled at the deadline and not before.
	 */
	uint32_t n_more = 1;
	int rc, refused = 0;
	while (!(rc = wire_wait(&r, &c, WAIT_MS))) {
		if (c.user_data == 22) {
			if (c.res != -ESHUTDOWN)
				fail_msg("GENERATE submitted while draining: res %d, want -ESHUTDOWN", c.res);
			refused++;
		} else if (c.user_data == 21 && (c.flags & KVD_CQE_MORE)) {
			n_more++;
		} else {
			break;
		}
	}
	int64_t took = kp_now_ms() - t0;
	if (rc)
		fail_with_log("the request in flight at SIGTERM got no final CQE: %s", strerror(-rc));
	assert_int_equal(c.user_data, 21);
	/* Refused at once: its CQE came before the drained request's final one. */
	assert_int_equal(refused, 1);
	if (c.flags & KVD_CQE_CANCELLED) {
		if (took < 1900)
			fail_msg("cancelled %lld ms after SIGTERM, before the 2000 ms drain deadline",
				 (long long)took);
		assert_int_equal(c.res, n_more);
	} else if (c.res != N || (c.flags & ~KVD_CQE_PREFIX_HIT) != KVD_CQE_LENGTH) {
		fail_msg("the request in flight at SIGTERM ended res %d flags %#x, want %d tokens, LENGTH",
			 c.res, c.flags, N);
	}

	int st = 0;
	pid_t w = 0;
	for (int64_t end = kp_now_ms() + kw_ms(30000); (w = waitpid(pid, &st, WNOHANG)) == 0 && kp_now_ms() < end;)
		kp_sleep_ms(10);
	if (w == 0)
		fail_msg("kvd still runs %d s after SIGTERM with nothing left to drain", kw_ms(30000) / 1000);
	D.pid = 0;
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		fail_msg("kvd ended with wait status %#x after SIGTERM, want exit 0", st);
	/* Gone for good: the socket file too, and this connection sees the hang-up. */
	assert_int_equal(access(D.sock, F_OK), -1);
	assert_int_equal(wire_wait(&r, &c, WAIT_MS), -ECONNRESET);
	wire_close(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_concurrent_clients_match_in_process, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cancel_mid_generation, setup, teardown),
		cmocka_unit_test_setup_teardown(test_killed_client_is_reclaimed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_malformed_sqes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_malformed_control_messages, setup, teardown),
		cmocka_unit_test_setup_teardown(test_daemon_death_wakes_waiter, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cq_overflow_loses_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wakeup_only_when_asked, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sigterm_drains, setup_all_cores, teardown),
	};
	/* KVD_TEST_FILTER=test_cancel* runs only the tests matching the pattern. */
	const char *filter = getenv("KVD_TEST_FILTER");
	if (filter && *filter)
		cmocka_set_test_filter(filter);
	return cmocka_run_group_tests(tests, group_setup, NULL);
}
