/* test_hostile.c — hostile local clients against a real kvd: none may stall, starve or corrupt anyone else (#20). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "uapi/kvd.h"
#include "shm/kvring.h"
#include "tests/lib/gguf_patch.h"
#include "tests/lib/proc.h"
#include "tests/lib/wire.h"

/*
 * Each test starts a daemon of its own, lets a hostile client written here
 * attack it the way a local user could (through the wire protocol, the
 * doorbell fds it is handed, its own shared rings), and then checks that
 * somebody else is still served and that SIGTERM still stops the daemon.
 *
 * A stalled daemon is detected only with generous bounds (hang_ms(): 90 s,
 * scaled by tests/lib/wait.h's kw_ms()), never by asserting that anything is
 * fast. Victims that must connect after an attack run in a child process
 * (victim_*()) so that a daemon that no longer answers even HELLO cannot
 * hang the test: the child is killed at the bound. Whatever a failing test
 * holds (the daemon, children, fds, a patched model) its teardown frees.
 */

#define OUT_OFF		4096		/* arena offset of sampled ids; prompts at 0 */
#define VICTIM_TOKENS	16

static struct kvd_proc D;
static struct wire ATK;			/* the attacker of the wire tests */
static struct kvc_conn *CONN[3];	/* libkvclient connections of a test */
static pid_t VICTIM;			/* a victim child, while it runs */
static char MODEL_DIR[64];		/* a patched model's temporary directory */
static char MODEL_PATH[128];

static const uint32_t PROMPT[] = { 504, 3575, 282, 4649, 314 };
#define N_PROMPT ((uint32_t)(sizeof(PROMPT) / sizeof(PROMPT[0])))

static int hang_ms(void)
{
	return kw_ms(90000);
}

static int setup(void **state)
{
	(void)state;
	memset(&D, 0, sizeof(D));
	wire_init(&ATK);
	VICTIM = 0;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (VICTIM > 0) {
		kill(VICTIM, SIGKILL);
		waitpid(VICTIM, NULL, 0);
		VICTIM = 0;
	}
	wire_close(&ATK);
	for (int i = 0; i < 3; i++) {
		kvc_close(CONN[i]);
		CONN[i] = NULL;
	}
	if (D.pid) {
		kill(D.pid, SIGKILL);
		waitpid(D.pid, NULL, 0);
		D.pid = 0;
	}
	kp_cleanup(&D);
	if (MODEL_DIR[0]) {
		unlink(MODEL_PATH);
		rmdir(MODEL_DIR);
		MODEL_DIR[0] = 0;
	}
	return 0;
}

static void start(const char *const *args)
{
	kp_skip_without_uring();
	assert_int_equal(kp_start(&D, args), 0);
}

#define fail_with_log(...)			\
	do {					\
		kp_log_tail(&D);		\
		fail_msg(__VA_ARGS__);		\
	} while (0)

/*
 * A victim in a child: connect, open a session, generate VICTIM_TOKENS
 * tokens (EOS ignored); it exits 0 when it got them all. The child dies
 * with the test.
 */
static void victim_start(void)
{
	pid_t pid = kp_fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		const uint32_t *p[1] = { PROMPT };
		const uint32_t n[1] = { N_PROMPT }, max[1] = { VICTIM_TOKENS };
		int rc = kp_generate(D.sock, 1, p, n, max);
		if (rc != VICTIM_TOKENS)
			fprintf(stderr, "victim: generate returned %d (%s)\n", rc,
				rc < 0 ? strerror(-rc) : "short");
		_exit(rc == VICTIM_TOKENS ? 0 : 1);
	}
	VICTIM = pid;
}

/* Wait for the victim up to hang_ms(): 0 when it was served, -ETIMEDOUT (it is killed), or 1. */
static int victim_wait(void)
{
	int st = 0;
	pid_t pid = VICTIM, w = 0;
	for (int64_t end = kp_now_ms() + hang_ms(); kp_now_ms() < end; kp_sleep_ms(10))
		if ((w = waitpid(pid, &st, WNOHANG)) != 0)
			break;
	if (w == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	VICTIM = 0;
	if (w == 0)
		return -ETIMEDOUT;
	return w == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

/* Another client, on a connection of its own, still completes a GENERATE. */
static void assert_victim_served(const char *after)
{
	victim_start();
	int rc = victim_wait();
	if (rc == -ETIMEDOUT)
		fail_with_log("after %s, another client got no answer within %d ms: the daemon is stalled",
			      after, hang_ms());
	if (rc)
		fail_with_log("after %s, another client's GENERATE failed", after);
}

static void assert_stops(const char *after)
{
	if (kp_stop(&D))
		fail_msg("after %s, SIGTERM did not stop the daemon cleanly", after);
}

/* A streaming GENERATE of the raw client: PROMPT at 0, max ids at OUT_OFF. */
static struct kvd_sqe wire_gen(const struct wire *r, uint32_t slot, uint64_t ud, uint32_t max)
{
	memcpy(r->arena, PROMPT, sizeof(PROMPT));
	struct kvd_sqe q;
	kvc_prep_generate(&q, r->session, slot, ud, 0, N_PROMPT, OUT_OFF, max);
	q.flags = KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS;
	return q;
}

static int clear_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK))
		return -errno;
	return 0;
}

/* ---------------------------------------------------------------------- */

/*
 * Attack 1, the call doorbell: the client saturates the call fd it was
 * handed (today an eventfd whose open file description the daemon shares:
 * a counter of 2^64 - 2 makes the next write of 1 block), clears
 * O_NONBLOCK on it (so, shared, the daemon's write blocks instead of
 * failing with EAGAIN), says it sleeps (CQ NEED_WAKEUP) and starts a
 * streaming GENERATE that the daemon must wake it for; it never reads.
 * Today the engine thread blocks in write(call_fd) holding the server lock.
 * After the fix the fds are the client's ends of datagram socketpairs, so
 * the attack is written to work on either type (errors of the saturating
 * write ignored). Must hold: another client still completes a GENERATE,
 * and SIGTERM stops the daemon.
 */
static void test_call_doorbell_blocked(void **state)
{
	(void)state;
	static const char *const args[] = { "--threads", "1", "--kv-blocks", "256", NULL };
	start(args);
	assert_int_equal(wire_open(&ATK, D.sock, 0, 0), 0);
	uint64_t v = 0xfffffffffffffffeULL;
	if (write(ATK.call_fd, &v, sizeof(v)) < 0)
		print_message("(the saturating write failed: %s; going on)\n", strerror(errno));
	assert_int_equal(clear_nonblock(ATK.call_fd), 0);
	kvring_set_need_wakeup(ATK.cq);
	struct kvd_sqe q = wire_gen(&ATK, 0, 1, 200);
	assert_int_equal(wire_submit(&ATK, &q), 0);
	/* The daemon has posted a completion, so it wakes (or tried to wake) the attacker. */
	int64_t end = kp_now_ms() + hang_ms();
	while (kvring_load_tail(ATK.cq) == 0 && kp_now_ms() < end)
		kp_sleep_ms(5);
	if (kvring_load_tail(ATK.cq) == 0)
		fail_with_log("the attacker's GENERATE never produced a completion");
	assert_victim_served("a client blocked its call doorbell");
	assert_stops("a client blocked its call doorbell");
}

#define KICK_TRIES 200000
#define KICK_ROUND 5000

/* Whether a new connection's HELLO is answered (wire_call gives up after 5 s). */
static int answers_hello(void)
{
	struct wire w;
	int rc = wire_connect(&w, D.sock);
	if (!rc)
		rc = wire_hello(&w, 0);
	wire_close(&w);
	return rc == 0;
}

static void on_alarm(int sig)
{
	(void)sig;
}

/*
 * Attack 2, the kick doorbell: the client clears O_NONBLOCK on its kick fd
 * (today an eventfd shared with the daemon), then over and over kicks and
 * at once drains the kick itself, so that when the daemon's poll handler
 * reads, the counter is 0 again; today that read blocks the loop thread
 * forever (no accept, no control message, no signal handled). The attacker
 * never blocks itself: it reads or writes only what poll (timeout 0) says
 * is ready, and a timer interrupts a read that the daemon won the race
 * for. Must hold: another client still completes a GENERATE, and SIGTERM
 * stops the daemon.
 */
static void test_kick_doorbell_drained(void **state)
{
	(void)state;
	static const char *const args[] = { "--threads", "1", "--kv-blocks", "256", NULL };
	start(args);
	assert_int_equal(wire_open(&ATK, D.sock, 0, 0), 0);
	assert_int_equal(clear_nonblock(ATK.kick_fd), 0);
	/*
	 * The daemon reads only when its poll saw the counter set: the steal
	 * must land between its poll and its read, so the attacker waits a
	 * little longer each time (0 to 63 us) before taking the kick back.
	 */
	int kicks = 0, stolen = 0, interrupted = 0;
	struct sigaction sa = { .sa_handler = on_alarm }, old_sa;
	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGALRM, &sa, &old_sa), 0);
	int rounds = 0;
	for (int i = 0; i < KICK_TRIES; i++) {
		/* Now and then: has it worked yet? (Only decides when to stop attacking.) */
		if (i % KICK_ROUND == KICK_ROUND - 1) {
			rounds++;
			if (!answers_hello())
				break;
		}
		struct pollfd p = { ATK.kick_fd, POLLOUT, 0 };
		uint64_t one = 1, got;
		if (poll(&p, 1, 0) == 1 && (p.revents & POLLOUT) &&
		    write(ATK.kick_fd, &one, sizeof(one)) == (ssize_t)sizeof(one))
			kicks++;
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		do
			clock_gettime(CLOCK_MONOTONIC, &t1);
		while ((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec) < (i % 64) * 1000L);
		p = (struct pollfd){ ATK.kick_fd, POLLIN, 0 };
		if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) {
			/* The daemon may take it between our poll and our read: a timer ends that wait. */
			struct itimerval it = { { 0, 0 }, { 0, 20000 } }, off = { { 0, 0 }, { 0, 0 } };
			setitimer(ITIMER_REAL, &it, NULL);
			ssize_t n = read(ATK.kick_fd, &got, sizeof(got));
			int e = errno;
			setitimer(ITIMER_REAL, &off, NULL);
			if (n == (ssize_t)sizeof(got))
				stolen++;
			else if (n < 0 && e == EINTR)
				interrupted++;
		}
	}
	sigaction(SIGALRM, &old_sa, NULL);
	print_message("(%d kicks written, %d taken back by the attacker, %d of its reads came too late, "
		      "%d rounds)\n", kicks, stolen, interrupted, rounds);
	assert_victim_served("a client drained its own kicks");
	assert_stops("a client drained its own kicks");
}

/*
 * Attack 3, back-pressure: a client with a CQ of 4 submits streaming
 * GENERATEs and never reads its CQ, until the completions held for it
 * reach a CQ's worth (back-pressure: the daemon stops taking its SQ), then
 * submits one more SQE and kicks. Today the engine thread then spins
 * forever holding the lock (the idle wait sees a new SQE it will not take),
 * even after the attacker is gone. Must hold: another client completes a
 * GENERATE while the attacker is stuck; after the attacker closes, the
 * daemon still serves and SIGTERM stops it.
 */
static void test_backpressure_spin(void **state)
{
	(void)state;
	static const char *const args[] = { "--threads", "1", "--kv-blocks", "256", NULL };
	start(args);
	assert_int_equal(wire_open(&ATK, D.sock, 4, 4), 0);
	for (uint32_t k = 0; k < 2; k++) {
		struct kvd_sqe q = wire_gen(&ATK, k, 1 + k, 64);
		q.out_off = OUT_OFF + 1024 * k;
		assert_int_equal(wire_submit(&ATK, &q), 0);
	}
	int64_t end = kp_now_ms() + hang_ms();
	while (__atomic_load_n(&ATK.cq->overflow, __ATOMIC_RELAXED) < ATK.cq_entries && kp_now_ms() < end)
		kp_sleep_ms(5);
	if (__atomic_load_n(&ATK.cq->overflow, __ATOMIC_RELAXED) < ATK.cq_entries)
		fail_with_log("the attacker's completions never reached back-pressure (%u held)",
			      ATK.cq->overflow);
	struct kvd_sqe nop;
	kvc_prep(&nop, KVD_OP_NOP, ATK.session, 0, 99);
	assert_int_equal(wire_submit(&ATK, &nop), 0);
	uint64_t one = 1;
	if (write(ATK.kick_fd, &one, sizeof(one)) < 0)
		print_message("(kick: %s)\n", strerror(errno));
	assert_victim_served("a back-pressured client submitted one more SQE");
	wire_close(&ATK);
	assert_victim_served("a back-pressured client went away");
	assert_stops("a back-pressured client went away");
}

/* ---------------------------------------------------------------------- */

#define HUGE_TEXT	(16u << 20)
#define VICTIM_LONG	160
#define ATTACK_AT	10		/* victim tokens before the attack is sent */
#define GAP_RATIO	50		/* see test_huge_text_prompt */

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

/*
 * Attack 4, a huge TEXT prompt: 16 MiB of one letter as a TEXT GENERATE
 * (in an arena big enough for it). Today the engine thread tokenizes all
 * of it (seconds) before it finds the prompt too long, and everyone
 * else's decoding stops meanwhile. After the fix the work is bounded before
 * tokenizing (text bytes against the token limit) and the request is
 * refused with -E2BIG without tokenizing it.
 *
 * What must hold is that the victim, a long streaming GENERATE running
 * when the attack arrives, keeps getting its tokens. No ordering or
 * count tells the two behaviours apart: while the engine thread tokenizes
 * nothing else advances (no step, no token, no completion), so the
 * victim's count when the refusal arrives is the same either way. So this
 * compares durations, but only with each other, never with a clock
 * constant: the attacker's submit-to-refusal time and the victim's longest
 * token gap across it must each stay under GAP_RATIO times the victim's own
 * median token gap. A refusal without tokenizing costs at most a step or
 * two; tokenizing 16 MiB costs thousands of steps. The ratio is generous
 * for a loaded machine, and both sides slow down together under ASan.
 */
static void test_huge_text_prompt(void **state)
{
	(void)state;
	static const char *const args[] = { "--threads", "1", "--kv-blocks", "256", NULL };
	start(args);
	uint32_t sv, sa;
	assert_int_equal(kvc_connect(&CONN[0], D.sock), 0);
	assert_int_equal(kvc_session_open(CONN[0], &sv), 0);
	assert_int_equal(kvc_connect(&CONN[1], D.sock), 0);
	const struct kvd_hello_rep *h = kvc_info(CONN[1]);
	if (h->max_arena_bytes < HUGE_TEXT + OUT_OFF) {
		print_message("skipped: the daemon's arena limit (%u) is below 16 MiB\n", h->max_arena_bytes);
		skip();
	}
	assert_int_equal(kvc_session_open_ex(CONN[1], 0, 0, HUGE_TEXT + OUT_OFF, &sa), 0);
	uint8_t *aa = kvc_arena(CONN[1], NULL);
	memset(aa, 'a', HUGE_TEXT);
	struct kvd_sqe attack;
	kvc_prep_generate(&attack, sa, 0, 7, 0, HUGE_TEXT, HUGE_TEXT, 16);
	attack.flags = KVD_SQE_TEXT;

	uint32_t *va = (uint32_t *)kvc_arena(CONN[0], NULL);
	memcpy(va, PROMPT, sizeof(PROMPT));
	struct kvd_sqe q;
	kvc_prep_generate(&q, sv, 0, 1, 0, N_PROMPT, OUT_OFF, VICTIM_LONG);
	q.flags = KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS;
	assert_int_equal(kvc_submit(CONN[0], &q), 0);

	int64_t t[VICTIM_LONG + 1], t_sub = -1, t_ref = -1;
	int n = 0, vres = 0, ares = 0, vdone = 0;
	int64_t end = kp_now_ms() + 2 * hang_ms();
	while ((!vdone || t_ref < 0) && kp_now_ms() < end) {
		struct kvd_cqe e;
		int got = 0;
		while (!vdone && kvc_peek(CONN[0], &e) == 0) {
			got = 1;
			if (n <= VICTIM_LONG)
				t[n++] = kp_now_ms();
			if (!(e.flags & KVD_CQE_MORE)) {
				vdone = 1;
				vres = e.res;
			}
		}
		if (t_sub < 0 && n >= ATTACK_AT) {
			assert_int_equal(kvc_submit(CONN[1], &attack), 0);
			t_sub = kp_now_ms();
		}
		if (t_sub >= 0 && t_ref < 0 && kvc_peek(CONN[1], &e) == 0) {
			t_ref = kp_now_ms();
			ares = e.res;
			got = 1;
		}
		if (!got)
			kp_sleep_ms(1);
	}
	if (!vdone || t_ref < 0)
		fail_with_log("no end within %d ms (victim %s, attacker %s)", 2 * hang_ms(),
			      vdone ? "done" : "not done", t_ref < 0 ? "not answered" : "answered");
	assert_int_equal(vres, VICTIM_LONG);
	assert_int_equal(ares, -E2BIG);

	int64_t gaps[VICTIM_LONG], worst = 0;
	int ng = 0;
	for (int i = 1; i < n; i++) {
		gaps[ng++] = t[i] - t[i - 1];
		/* A gap that overlaps the attack's submit-to-refusal window. */
		if (t[i] >= t_sub && t[i - 1] <= t_ref && t[i] - t[i - 1] > worst)
			worst = t[i] - t[i - 1];
	}
	qsort(gaps, (size_t)ng, sizeof(gaps[0]), cmp_i64);
	int64_t med = gaps[ng / 2] > 0 ? gaps[ng / 2] : 1;
	print_message("(victim median gap %lld ms; attack refused after %lld ms; worst victim gap across it %lld ms)\n",
		      (long long)med, (long long)(t_ref - t_sub), (long long)worst);
	if (t_ref - t_sub > GAP_RATIO * med)
		fail_with_log("the 16 MiB prompt took %lld ms to refuse, over %d x the victim's median token gap "
			      "(%lld ms): it was tokenized first", (long long)(t_ref - t_sub), GAP_RATIO,
			      (long long)med);
	if (worst > GAP_RATIO * med)
		fail_with_log("the victim's tokens stopped for %lld ms during the attack (median gap %lld ms)",
			      (long long)worst, (long long)med);
	kvc_close(CONN[1]);
	CONN[1] = NULL;
	kvc_close(CONN[0]);
	CONN[0] = NULL;
	assert_stops("a 16 MiB text prompt");
}

/* ---------------------------------------------------------------------- */

#define SMALL_CTX	64

/* The fixture's model with llama.context_length = ctx, in a temporary directory; $KVD_MODEL points at it. */
static void patched_model(uint32_t ctx)
{
	snprintf(MODEL_DIR, sizeof(MODEL_DIR), "/tmp/kvd-hostile.XXXXXX");
	if (!mkdtemp(MODEL_DIR)) {
		MODEL_DIR[0] = 0;
		fail_msg("mkdtemp: %s", strerror(errno));
	}
	snprintf(MODEL_PATH, sizeof(MODEL_PATH), "%s/model.gguf", MODEL_DIR);
	int rc = gguf_patch_int(kp_model(), MODEL_PATH, "llama.context_length", ctx);
	if (rc)
		fail_msg("cannot patch llama.context_length of %s: %s", kp_model(), strerror(-rc));
}

/* kp_start() on the patched model: $KVD_MODEL names it only while the daemon starts. */
static void start_on_patched(const char *const *args)
{
	kp_skip_without_uring();
	int rc = kp_start_model(&D, MODEL_PATH, args);
	assert_int_equal(rc, 0);
}

/* Wait up to hang_ms() for ud's final CQE on c, passing over any other CQE. */
static int final_of(struct kvc_conn *c, uint64_t ud, struct kvd_cqe *fin)
{
	for (int64_t end = kp_now_ms() + hang_ms(); kp_now_ms() < end;) {
		int rc = kvc_wait(c, fin, 1000);
		if (rc == -ETIMEDOUT || rc == -EINTR)
			continue;
		if (rc)
			return rc;
		if (fin->user_data == ud && !(fin->flags & KVD_CQE_MORE))
			return 0;
	}
	return -ETIMEDOUT;
}

/*
 * Attack 5, a DECODE past the context end: on a model whose context is 64,
 * a GENERATE that stops with LENGTH exactly at the end (prompt 62 +
 * max_tokens 2 = 64), then DECODEs on the same slot. Today the first
 * DECODE feeds the pending token at position 63 and stops (LENGTH), and the
 * second one's row lands at position 64 and fails the whole shared engine
 * step (-ERANGE) for every request in it. Must hold: a DECODE (the first
 * or, at the latest, the second) completes -E2BIG, and a victim streaming
 * on another connection, started before and running in the same steps,
 * gets no error and all its tokens.
 */
static void test_decode_at_context_end(void **state)
{
	(void)state;
	patched_model(SMALL_CTX);
	static const char *const args[] = { "--threads", "1", "--kv-blocks", "256", NULL };
	start_on_patched(args);
	uint32_t sv, sa;
	assert_int_equal(kvc_connect(&CONN[0], D.sock), 0);
	assert_int_equal(kvc_info(CONN[0])->ctx_len, SMALL_CTX);
	assert_int_equal(kvc_session_open(CONN[0], &sv), 0);
	assert_int_equal(kvc_connect(&CONN[1], D.sock), 0);
	assert_int_equal(kvc_session_open(CONN[1], &sa), 0);

	/* The victim: 4 + 56 = 60 positions, streaming, one token per step. */
	const uint32_t victim_max = SMALL_CTX - 8;
	uint32_t *va = (uint32_t *)kvc_arena(CONN[0], NULL);
	memcpy(va, PROMPT, 4 * sizeof(uint32_t));
	struct kvd_sqe q;
	kvc_prep_generate(&q, sv, 0, 1, 0, 4, OUT_OFF, victim_max);
	q.flags = KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS;
	assert_int_equal(kvc_submit(CONN[0], &q), 0);
	/* Its first tokens are out: the attack's steps are its steps too. */
	struct kvd_cqe e;
	uint32_t seen = 0;
	while (seen < 3) {
		int rc = kvc_wait(CONN[0], &e, hang_ms());
		if (rc)
			fail_with_log("victim: %s", strerror(-rc));
		assert_true(e.res >= 0);
		assert_true(e.flags & KVD_CQE_MORE);
		seen++;
	}

	uint32_t *aa = (uint32_t *)kvc_arena(CONN[1], NULL);
	for (uint32_t i = 0; i < SMALL_CTX - 2; i++)
		aa[i] = 300 + i * 37;
	kvc_prep_generate(&q, sa, 0, 10, 0, SMALL_CTX - 2, OUT_OFF, 2);
	q.flags = KVD_SQE_IGNORE_EOS;
	assert_int_equal(kvc_submit(CONN[1], &q), 0);
	struct kvd_cqe fin;
	int rc = final_of(CONN[1], 10, &fin);
	if (rc)
		fail_with_log("attacker's GENERATE: %s", strerror(-rc));
	assert_int_equal(fin.res, 2);
	assert_true(fin.flags & KVD_CQE_LENGTH);
	/*
	 * The GENERATE leaves 63 positions cached and its last token pending:
	 * a DECODE may still feed it at position 63 and stop there (LENGTH);
	 * the one after that has no position left. Either way, by the second
	 * DECODE the refusal must come: -E2BIG, and no other error.
	 */
	int refused = 0;
	for (uint32_t k = 0; k < 2 && !refused; k++) {
		kvc_prep_decode(&q, sa, 0, 11 + k, OUT_OFF, 8);
		q.flags = KVD_SQE_IGNORE_EOS;
		assert_int_equal(kvc_submit(CONN[1], &q), 0);
		rc = final_of(CONN[1], 11 + k, &fin);
		if (rc)
			fail_with_log("attacker's DECODE: %s", strerror(-rc));
		if (fin.res == -E2BIG)
			refused = 1;
		else if (k > 0 || fin.res < 0 || !(fin.flags & KVD_CQE_LENGTH))
			break;
	}

	/* The victim, to its end: no error, every token. */
	int vres = 0, done = 0;
	while (!done) {
		rc = kvc_wait(CONN[0], &e, hang_ms());
		if (rc)
			fail_with_log("victim: %s after %u tokens", strerror(-rc), seen);
		if (e.res < 0)
			fail_with_log("the victim's GENERATE failed with %s after %u tokens, in the steps of "
				      "another client's DECODE at the context end", strerror(-e.res), seen);
		seen++;
		if (!(e.flags & KVD_CQE_MORE)) {
			done = 1;
			vres = e.res;
		}
	}
	assert_int_equal(vres, victim_max);
	assert_int_equal(seen, victim_max);
	if (!refused)
		fail_msg("a DECODE past the context end completed with %d (flags %#x), not -E2BIG", fin.res,
			 fin.flags);
	kvc_close(CONN[1]);
	CONN[1] = NULL;
	kvc_close(CONN[0]);
	CONN[0] = NULL;
	assert_stops("a DECODE at the context end");
}

/* ---------------------------------------------------------------------- */

/* A GENERATE of text (flags added to KVD_SQE_TEXT) on slot 0; its final CQE's res. */
static int text_turn(struct kvc_conn *c, uint32_t s, uint64_t ud, const char *text, uint16_t flags)
{
	uint8_t *a = kvc_arena(c, NULL);
	size_t len = strlen(text);
	memcpy(a, text, len);
	struct kvd_sqe q;
	kvc_prep_generate(&q, s, 0, ud, 0, (uint32_t)len, OUT_OFF, 8);
	q.flags = KVD_SQE_TEXT | flags;
	assert_int_equal(kvc_submit(c, &q), 0);
	struct kvd_cqe fin;
	int rc = final_of(c, ud, &fin);
	if (rc)
		fail_with_log("chat turn %llu: %s (did the daemon die?)", (unsigned long long)ud, strerror(-rc));
	return fin.res;
}

/*
 * Not an attack, ordinary use that UBSan rejects today: the second turn of
 * a chat (TEXT|CHAT, then TEXT|CHAT|APPEND on the same slot, as kvctl chat
 * does) goes through the scheduler's start path with a pending token and
 * no preempted tokens, where it calls memcpy(dst, NULL, 0); under the
 * ASan+UBSan build (KVD_BIN=build/asan/kvd) the daemon aborts. Must hold:
 * both turns complete without error, and the daemon stops cleanly.
 */
static void test_chat_second_turn(void **state)
{
	(void)state;
	static const char *const args[] = { "--threads", "1", "--kv-blocks", "256", NULL };
	start(args);
	uint32_t s;
	assert_int_equal(kvc_connect(&CONN[0], D.sock), 0);
	assert_int_equal(kvc_session_open(CONN[0], &s), 0);
	int r1 = text_turn(CONN[0], s, 1, "What is the capital of France?", KVD_SQE_CHAT);
	assert_true(r1 > 0);
	int r2 = text_turn(CONN[0], s, 2, "And of Italy?", KVD_SQE_CHAT | KVD_SQE_APPEND);
	assert_true(r2 > 0);
	int r3 = text_turn(CONN[0], s, 3, "Thanks.", KVD_SQE_CHAT | KVD_SQE_APPEND);
	assert_true(r3 > 0);
	kvc_close(CONN[0]);
	CONN[0] = NULL;
	assert_stops("a three-turn chat");
}

/*
 * Also ordinary use: a sequence preempted for KV blocks (a pool of 8
 * blocks of 16; the idle sequence of one client gives way to another
 * client's generation), then a DECODE on the preempted slot, which resumes
 * it through the start path with no prompt of its own: memcpy(dst, NULL,
 * 0) today, an abort under UBSan. Must hold: every request completes
 * without error, a preemption did happen, and the daemon stops cleanly.
 */
static void test_decode_after_preemption(void **state)
{
	(void)state;
	static const char *const args[] = { "--threads", "1", "--kv-blocks", "8", NULL };
	start(args);
	uint32_t sa, sb;
	assert_int_equal(kvc_connect(&CONN[0], D.sock), 0);
	assert_int_equal(kvc_session_open(CONN[0], &sa), 0);
	assert_int_equal(kvc_connect(&CONN[1], D.sock), 0);
	assert_int_equal(kvc_session_open(CONN[1], &sb), 0);

	/* A: 36 + 4 positions (3 blocks), then idle. */
	uint32_t *a = (uint32_t *)kvc_arena(CONN[0], NULL);
	for (uint32_t i = 0; i < 36; i++)
		a[i] = 300 + i * 53;
	struct kvd_sqe q;
	struct kvd_cqe fin;
	kvc_prep_generate(&q, sa, 0, 1, 0, 36, OUT_OFF, 4);
	q.flags = KVD_SQE_IGNORE_EOS;
	assert_int_equal(kvc_submit(CONN[0], &q), 0);
	int rc = final_of(CONN[0], 1, &fin);
	if (rc)
		fail_with_log("A's GENERATE: %s", strerror(-rc));
	assert_int_equal(fin.res, 4);

	/* B: 5 + 100 positions want 7 of the 8 blocks: A's idle sequence is preempted. */
	uint32_t *b = (uint32_t *)kvc_arena(CONN[1], NULL);
	memcpy(b, PROMPT, sizeof(PROMPT));
	kvc_prep_generate(&q, sb, 0, 2, 0, N_PROMPT, OUT_OFF, 100);
	q.flags = KVD_SQE_IGNORE_EOS;
	assert_int_equal(kvc_submit(CONN[1], &q), 0);
	rc = final_of(CONN[1], 2, &fin);
	if (rc)
		fail_with_log("B's GENERATE: %s", strerror(-rc));
	assert_int_equal(fin.res, 100);
	struct kvd_stats_rep st;
	assert_int_equal(kvc_stats(CONN[1], &st), 0);
	assert_true(st.preemptions >= 1);

	/* A's DECODE on the preempted slot: recomputed, then decoding goes on. */
	kvc_prep_decode(&q, sa, 0, 3, OUT_OFF, 8);
	q.flags = KVD_SQE_IGNORE_EOS;
	assert_int_equal(kvc_submit(CONN[0], &q), 0);
	rc = final_of(CONN[0], 3, &fin);
	if (rc)
		fail_with_log("A's DECODE after preemption: %s (did the daemon die?)", strerror(-rc));
	assert_int_equal(fin.res, 8);
	kvc_close(CONN[1]);
	CONN[1] = NULL;
	kvc_close(CONN[0]);
	CONN[0] = NULL;
	assert_stops("a DECODE after preemption");
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_call_doorbell_blocked, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kick_doorbell_drained, setup, teardown),
		cmocka_unit_test_setup_teardown(test_backpressure_spin, setup, teardown),
		cmocka_unit_test_setup_teardown(test_huge_text_prompt, setup, teardown),
		cmocka_unit_test_setup_teardown(test_decode_at_context_end, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chat_second_turn, setup, teardown),
		cmocka_unit_test_setup_teardown(test_decode_after_preemption, setup, teardown),
	};
	const char *filter = getenv("KVD_TEST_FILTER");
	if (filter && *filter)
		cmocka_set_test_filter(filter);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
