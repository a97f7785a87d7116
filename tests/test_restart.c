/*
 * test_restart.c — KV that survives a restart: kvd killed (-9) under a
 * 16-client load or stopped (SIGTERM), started again with the pool and
 * state memfds it handed to an emulated systemd fd store, and every
 * client's conversation goes on as if nothing happened: token for token
 * what an uninterrupted daemon gives, with its prefix reused (prefill rows
 * counted, not time), no KV block leaked or held twice. A restart with
 * another pool, block size or model starts empty; another uid cannot
 * resume a session; a client that hung up leaves nothing to resume.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include "daemon/model/gguf.h"
#include "tests/lib/gguf_patch.h"
#include "tests/lib/restart.h"

#define CLIENTS 16
#define TURNS 4
#define FIRST 100	/* the first turn's prompt */
#define NEXT 20		/* each later turn's */
#define OUT 16		/* tokens each turn generates */
#define KILL_TURN 2	/* the turn in flight when the daemon dies */

static const char *const POOL[] = { "--kv-blocks", "2048", NULL };

static uint32_t turn_len(int t)
{
	return t ? NEXT : FIRST;
}

/* Client k's turn t: ids no other client's share, so no prefix is common by chance. */
static void turn_tokens(uint32_t *p, int k, int t)
{
	for (uint32_t i = 0; i < turn_len(t); i++)
		p[i] = 200 + ((uint32_t)k * 1009u + (uint32_t)t * 131u + i * 7u) % 30000u;
}

struct client {
	const char *sock;
	int k;
	int pause_after;		/* turns before waiting for go (TURNS: never) */
	uint32_t out[TURNS][OUT];
	uint32_t n_out[TURNS];
	int restarted;			/* final CQEs that said the daemon restarted */
	int replayed;			/* ... of which had been applied */
	int err;			/* 0, or what went wrong */
	char why[160];
};

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int paused;
	int go;
	atomic_int streamed;		/* tokens streamed in KILL_TURN, all clients */
} G = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0 };

static int client_fail(struct client *cl, int err, const char *what)
{
	cl->err = err ? err : -EIO;
	snprintf(cl->why, sizeof(cl->why), "client %d: %s: %s", cl->k, what, kvc_strerror(cl->err));
	return cl->err;
}

/* One turn to its final CQE, submitted again when the daemon restarted before applying it. */
static int run_turn(struct client *cl, struct kvc_conn *c, uint32_t sid, int t, uint32_t in,
		    uint32_t out)
{
	struct kvd_sqe q;
	kvc_prep_generate(&q, sid, 0, (uint64_t)t + 1, in, turn_len(t), out, OUT);
	q.flags |= KVD_SQE_IGNORE_EOS | KVD_SQE_STREAM | (t ? KVD_SQE_APPEND : 0);
	for (int tries = 0; tries < 4; tries++) {
		int rc = kvc_submit(c, &q);
		if (rc)
			return client_fail(cl, rc, "submit");
		struct kvd_cqe e;
		do {
			if ((rc = kp_wait_cqe(NULL, c, &e)))
				return client_fail(cl, rc, "wait");
			if ((e.flags & KVD_CQE_MORE) && t == KILL_TURN)
				atomic_fetch_add(&G.streamed, 1);
		} while (e.flags & KVD_CQE_MORE);
		cl->restarted += !!(e.flags & KVD_CQE_RESTARTED);
		if (e.res == -ERESTART)
			continue;	/* not applied: the session is as it was, send it again */
		if (e.res < 0)
			return client_fail(cl, e.res, "turn");
		if (e.user_data != (uint64_t)t + 1 || e.res != OUT || e.n_out != OUT)
			return client_fail(cl, -EPROTO, "a final CQE of the wrong request or length");
		cl->replayed += !!(e.flags & KVD_CQE_REPLAY);
		memcpy(cl->out[t], kvc_arena(c, NULL) + out, OUT * 4);
		cl->n_out[t] = OUT;
		return 0;
	}
	return client_fail(cl, -ERESTART, "restarted again and again");
}

static void *client_main(void *arg)
{
	struct client *cl = arg;
	struct kvc_conn *c;
	uint32_t sid, in[TURNS], out[TURNS];
	int rc = kvc_connect(&c, cl->sock);
	if (rc) {
		client_fail(cl, rc, "connect");
		return NULL;
	}
	kvc_set_reconnect(c, kw_ms(120000));
	if ((rc = kvc_session_open(c, &sid))) {
		client_fail(cl, rc, "session");
		goto out;
	}
	for (int t = 0; t < TURNS; t++)
		if ((rc = kvc_arena_alloc(c, turn_len(t) * 4, &in[t])) ||
		    (rc = kvc_arena_alloc(c, OUT * 4, &out[t]))) {
			client_fail(cl, rc, "arena");
			goto out;
		}
	for (int t = 0; t < TURNS; t++) {
		turn_tokens((uint32_t *)(kvc_arena(c, NULL) + in[t]), cl->k, t);
		if (t == cl->pause_after) {
			pthread_mutex_lock(&G.mu);
			G.paused++;
			pthread_cond_broadcast(&G.cv);
			while (!G.go)
				pthread_cond_wait(&G.cv, &G.mu);
			pthread_mutex_unlock(&G.mu);
		}
		if (run_turn(cl, c, sid, t, in[t], out[t]))
			break;
	}
out:
	kvc_close(c);
	return NULL;
}

/* n clients' conversations started, each pausing before turn pause_after (TURNS: never); 0 or -EAGAIN. */
static int clients_start(struct client *cl, int n, const char *sock, int pause_after, pthread_t *th)
{
	G.paused = G.go = 0;
	atomic_store(&G.streamed, 0);
	for (int k = 0; k < n; k++) {
		cl[k] = (struct client){ .sock = sock, .k = k, .pause_after = pause_after };
		if (pthread_create(&th[k], NULL, client_main, &cl[k]))
			return -EAGAIN;
	}
	return 0;
}

/* They are over: 0, or the first failure (its message printed). */
static int clients_join(struct client *cl, int n, pthread_t *th)
{
	for (int k = 0; k < n; k++)
		pthread_join(th[k], NULL);
	for (int k = 0; k < n; k++)
		if (cl[k].err) {
			print_message("%s\n", cl[k].why);
			return cl[k].err;
		}
	return 0;
}

/* n clients' conversations at once; 0, or the first failure (message printed). */
static int run_clients(struct client *cl, int n, const char *sock, int pause_after)
{
	pthread_t th[CLIENTS];
	int rc = clients_start(cl, n, sock, pause_after, th);
	return rc ? rc : clients_join(cl, n, th);
}

/*
 * Once all n paused clients wait, let them send KILL_TURN together, and
 * return when they have streamed at least `streamed` tokens of it: the
 * turn is in flight.
 */
static void go_until_streaming(int n, int streamed)
{
	pthread_mutex_lock(&G.mu);
	while (G.paused < n)
		pthread_cond_wait(&G.cv, &G.mu);
	G.go = 1;
	pthread_cond_broadcast(&G.cv);
	pthread_mutex_unlock(&G.mu);
	struct kw_deadline w;
	kw_start_default(&w);
	while (atomic_load(&G.streamed) < streamed && !kw_expired(&w))
		kp_sleep_ms(1);
	assert_true(atomic_load(&G.streamed) >= streamed);
}

static struct client ref[CLIENTS];	/* an uninterrupted daemon's conversations */
static int have_ref;

static void need_ref(void)
{
	if (have_ref)
		return;
	struct kr_daemon d;
	assert_int_equal(kr_open(&d, 0), 0);
	const char *extra[] = { "--no-persist", "--kv-blocks", "2048", NULL };
	assert_true(kr_start(&d, extra) > 0);
	int rc = run_clients(ref, CLIENTS, d.sock, TURNS);
	kr_close(&d);
	assert_int_equal(rc, 0);
	have_ref = 1;
}

static void stats_of(const struct kr_daemon *d, struct kvd_stats_rep *st)
{
	struct kvd_proc p = kr_proc(d);
	assert_int_equal(kp_stats(&p, st), 0);
}

/* Everything given back once the clients are gone: no session, no block in use. */
static void assert_idle(const struct kr_daemon *d)
{
	struct kvd_proc p = kr_proc(d);
	struct kvd_stats_rep st;
	int rc = kp_wait_idle(&p, &st, 30000);
	if (rc)
		print_message("not idle: %u sessions, %llu blocks in use\n", st.sessions,
			      (unsigned long long)st.kv_blocks_used);
	assert_int_equal(rc, 0);
}

static void test_kill9_under_load(void **state)
{
	(void)state;
	kp_skip_without_uring();
	need_ref();
	struct kr_daemon d;
	assert_int_equal(kr_open(&d, 1), 0);
	d.env[0] = "KVD_POOL_CHECK=1";
	const char *extra[] = { "--kv-blocks", "2048", "--log-level", "info", NULL };
	assert_true(kr_start(&d, extra) > 0);
	assert_int_equal(d.n_stored, 2);	/* kvpool and kvstate, handed over before READY */

	static struct client cl[CLIENTS];
	pthread_t th[CLIENTS];
	assert_int_equal(clients_start(cl, CLIENTS, d.sock, KILL_TURN, th), 0);
	/* Two turns each, then all sixteen send the third together; the daemon dies in it. */
	go_until_streaming(CLIENTS, CLIENTS * 2);
	assert_int_equal(kr_kill(&d, SIGKILL) & 0x7f, SIGKILL);

	assert_true(kr_start(&d, extra) > 0);
	if (clients_join(cl, CLIENTS, th))
		fail_msg("a client failed across the restart");

	int restarted = 0, replayed = 0;
	for (int k = 0; k < CLIENTS; k++) {
		for (int t = 0; t < TURNS; t++)
			if (memcmp(cl[k].out[t], ref[k].out[t], sizeof(cl[k].out[t])))
				fail_msg("client %d turn %d: not what an uninterrupted daemon gave", k, t);
		restarted += cl[k].restarted;
		replayed += cl[k].replayed;
	}
	/* Every client had its third turn in flight: each learned of the restart. */
	assert_int_equal(restarted, CLIENTS);
	struct kvd_stats_rep st;
	stats_of(&d, &st);
	assert_int_equal(st.restored_sessions, CLIENTS);
	assert_int_equal(st.resumed_sessions, CLIENTS);
	/*
	 * Prefill rows after the restart: per client the turn again (unless it
	 * had been applied) and the last one, their pending tokens, and what
	 * the restore left to recompute, under a block. Had the KV been lost,
	 * each would have prefilled its whole conversation (over 150 rows).
	 */
	uint64_t bound = (uint64_t)CLIENTS * (2 * NEXT + 16 + 2);
	if (st.tokens_prefilled > bound)
		fail_msg("%llu prompt rows computed after the restart, more than %llu: the prefix was not reused",
			 (unsigned long long)st.tokens_prefilled, (unsigned long long)bound);
	print_message("restart under load: %d of %d in-flight turns had been applied; %llu prefill rows "
		      "after the restart\n", replayed, CLIENTS, (unsigned long long)st.tokens_prefilled);
	assert_idle(&d);
	assert_int_equal(kr_log_count(&d, "pool check failed"), 0);
	assert_true(kr_log_count(&d, "pool check: ok") > 0);
	assert_true(kr_log_count(&d, "restored from the last run: 16 sessions") == 1);
	int st_exit = kr_kill(&d, SIGTERM);
	assert_true(WIFEXITED(st_exit) && WEXITSTATUS(st_exit) == 0);
	kr_close(&d);
}

/* One client, one session: a prefill of n tokens into slot 0; the connection stays open. */
static void one_session(const char *sock, struct kvc_conn **c, uint64_t token[2], uint32_t n)
{
	uint32_t sid, in;
	struct kvd_sqe q;
	struct kvd_cqe e;
	assert_int_equal(kvc_connect(c, sock), 0);
	assert_int_equal(kvc_session_open(*c, &sid), 0);
	assert_int_equal(kvc_arena_alloc(*c, n * 4, &in), 0);
	turn_tokens((uint32_t *)(kvc_arena(*c, NULL) + in), 99, 0);
	kvc_prep_prefill(&q, sid, 0, 1, in, n);
	assert_int_equal(kvc_submit(*c, &q), 0);
	assert_int_equal(kp_wait_cqe(NULL, *c, &e), 0);
	assert_int_equal(e.res, (int)n);
	assert_int_equal(kvc_session_token(*c, sid, token), 0);
}

/* A kept daemon with one session of an n-token prefill, killed (-9): its token in token. */
static void crashed_with_session(struct kr_daemon *d, uint64_t token[2], uint32_t n)
{
	struct kvc_conn *c;
	assert_int_equal(kr_open(d, 1), 0);
	assert_true(kr_start(d, POOL) > 0);
	one_session(d->sock, &c, token, n);
	assert_int_equal(kr_kill(d, SIGKILL) & 0x7f, SIGKILL);
	kvc_close(c);
}

static void test_sigterm_resubmits(void **state)
{
	(void)state;
	kp_skip_without_uring();
	need_ref();
	struct kr_daemon d;
	assert_int_equal(kr_open(&d, 1), 0);
	assert_true(kr_start(&d, POOL) > 0);
	struct client cl;
	pthread_t th;
	assert_int_equal(clients_start(&cl, 1, d.sock, KILL_TURN, &th), 0);
	go_until_streaming(1, 3);
	/* The step in flight, then out: nothing drained, everything kept. */
	int st = kr_kill(&d, SIGTERM);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_int_equal(kr_log_count(&d, "stopping: 1 sessions kept for the next start"), 1);
	assert_true(kr_start(&d, POOL) > 0);
	if (clients_join(&cl, 1, &th))
		fail_msg("the client failed across the restart");
	for (int t = 0; t < TURNS; t++)
		assert_memory_equal(cl.out[t], ref[0].out[t], sizeof(cl.out[t]));
	assert_int_equal(cl.restarted, 1);
	assert_idle(&d);
	kr_close(&d);
}

/* A state the daemon made, then a restart with extra: does the session come back? */
static int restarts_with(const char *model, const char *const *extra, const char *log_says)
{
	struct kr_daemon d;
	struct kvc_conn *c2;
	uint64_t token[2];
	uint32_t sid, restored = 0;
	crashed_with_session(&d, token, 64);
	char *old = getenv("KVD_MODEL") ? strdup(getenv("KVD_MODEL")) : NULL;
	if (model)
		setenv("KVD_MODEL", model, 1);
	double up = kr_start(&d, extra);
	if (old)
		setenv("KVD_MODEL", old, 1);
	else if (model)
		unsetenv("KVD_MODEL");
	free(old);
	assert_true(up > 0);
	if (log_says && kr_log_count(&d, log_says) != 1) {
		kp_file_tail(d.log);
		fail_msg("the log does not say \"%s\"", log_says);
	}
	struct kvd_stats_rep st;
	stats_of(&d, &st);
	assert_int_equal(kvc_connect(&c2, d.sock), 0);
	int rc = kvc_session_resume(c2, token, &sid, &restored, NULL);
	kvc_close(c2);
	kr_close(&d);
	if (rc == 0) {
		assert_int_equal(st.restored_sessions, 1);
		assert_int_equal(restored, 1);
		assert_true(st.restored_prefixes >= 3);	/* 64 tokens: four blocks */
	} else {
		assert_int_equal(rc, -ESTALE);
		assert_int_equal(st.restored_sessions, 0);
		assert_int_equal(st.restored_prefixes, 0);
	}
	return rc;
}

static void test_mismatch_starts_empty(void **state)
{
	(void)state;
	kp_skip_without_uring();
	/* The control: the same daemon again gets the session back. */
	assert_int_equal(restarts_with(NULL, POOL, "restored from the last run: 1 sessions"), 0);
	const char *blocks[] = { "--kv-blocks", "1024", NULL };
	assert_int_equal(restarts_with(NULL, blocks, "the pool had another size in blocks"), -ESTALE);
	const char *bt[] = { "--kv-blocks", "2048", "--kv-block-tokens", "32", NULL };
	assert_int_equal(restarts_with(NULL, bt, "the blocks held another number of tokens"), -ESTALE);
	const char *type[] = { "--kv-blocks", "2048", "--kv-type", "f32", NULL };
	assert_int_equal(restarts_with(NULL, type, "the KV cache had another type"), -ESTALE);
	/* The same weights under other metadata is another model. */
	char path[64];
	snprintf(path, sizeof(path), "/tmp/kvd-restart-model.%d.gguf", (int)getpid());
	struct gguf_add_kv kv = { .key = "kvd.test.variant", .type = GGUF_VT_STRING, .str = "b" };
	assert_int_equal(gguf_extend(kp_model(), path, &kv, 1, NULL, 0), 0);
	int rc = restarts_with(path, POOL, "it was made with another model");
	unlink(path);
	assert_int_equal(rc, -ESTALE);
}

static void test_other_uid_cannot_resume(void **state)
{
	(void)state;
	kp_skip_without_uring();
	if (geteuid() != 0) {
		print_message("skipped: needs root to run a client as another uid\n");
		skip();
	}
	struct kr_daemon d;
	struct kvc_conn *c;
	uint64_t token[2];
	crashed_with_session(&d, token, 40);
	assert_true(kr_start(&d, POOL) > 0);
	assert_int_equal(chmod(d.sock, 0666), 0);
	pid_t pid = kp_fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct kvc_conn *o;
		uint32_t sid;
		if (setgid(65534) || setuid(65534) || kvc_connect(&o, d.sock))
			_exit(2);
		int rc = kvc_session_resume(o, token, &sid, NULL, NULL);
		_exit(rc == -ESTALE ? 0 : 1);
	}
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	/* The owner still can: the other uid's try took nothing away. */
	uint32_t sid, restored = 0;
	assert_int_equal(kvc_connect(&c, d.sock), 0);
	assert_int_equal(kvc_session_resume(c, token, &sid, &restored, NULL), 0);
	assert_int_equal(restored, 1);
	kvc_close(c);
	kr_close(&d);
}

static void test_hangup_leaves_nothing(void **state)
{
	(void)state;
	kp_skip_without_uring();
	struct kr_daemon d;
	struct kvc_conn *c;
	uint64_t token[2];
	assert_int_equal(kr_open(&d, 1), 0);
	assert_true(kr_start(&d, POOL) > 0);
	one_session(d.sock, &c, token, 64);
	kvc_close(c);	/* its client went: the session with it */
	assert_idle(&d);
	assert_int_equal(kr_kill(&d, SIGKILL) & 0x7f, SIGKILL);
	assert_true(kr_start(&d, POOL) > 0);
	struct kvd_stats_rep st;
	stats_of(&d, &st);
	assert_int_equal(st.restored_sessions, 0);
	assert_true(st.restored_prefixes >= 3);	/* its prompt's blocks stay in the prefix cache */
	uint32_t sid;
	assert_int_equal(kvc_connect(&c, d.sock), 0);
	assert_int_equal(kvc_session_resume(c, token, &sid, NULL, NULL), -ESTALE);
	kvc_close(c);
	kr_close(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kill9_under_load),
		cmocka_unit_test(test_sigterm_resubmits),
		cmocka_unit_test(test_mismatch_starts_empty),
		cmocka_unit_test(test_other_uid_cannot_resume),
		cmocka_unit_test(test_hangup_leaves_nothing),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
