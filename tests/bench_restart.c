/*
 * bench_restart.c — what keeping the KV across a restart buys (a
 * benchmark, not a test). A client holds a 2,000-token conversation in a
 * session; the daemon restarts (SIGTERM, then a new kvd); the client's
 * next turn, 24 new tokens and its first reply token, is timed two ways in
 * each round:
 *   resumed: the daemon kept its pool and state (--state-dir on a tmpfs);
 *            the client reopens the session by token and sends the turn;
 *   lost:    a daemon that kept nothing (--no-persist); the client opens a
 *            new session and sends the whole conversation and the turn.
 * And the restart itself, SIGTERM to READY=1, with the pool full (every
 * block holding a cached prefix the restart restores), against a daemon
 * that keeps nothing. Medians over the rounds; the modes alternate within
 * each round.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "tests/bench_util.h"
#include "tests/lib/restart.h"

#define CONV 2000
#define TURN 24

struct client {
	struct kvc_conn *c;
	uint32_t sid;
	uint64_t token[2];
};

static const char *state_dir;

/* Prompt ids of round r: a conversation nobody else has, so no prefix is shared by chance. */
static void fill(uint32_t *p, uint32_t n, uint32_t r, uint32_t from)
{
	for (uint32_t i = 0; i < n; i++)
		p[i] = 300 + (from + i) * 7919u % 20000u + r * 13u % 50u;
}

/* Submit one streamed request and wait for its first token (or end); seconds, or < 0. */
static double first_token(struct kvc_conn *c, const struct kvd_sqe *q)
{
	struct kvd_cqe e;
	double t0 = now_s(), ttft = -1;
	if (kvc_submit(c, q))
		return -1;
	for (;;) {
		if (kp_wait_cqe(NULL, c, &e))
			return -1;
		if (e.flags & KVD_CQE_REPLAY)
			continue;	/* the conversation's own last completion, replayed */
		if (ttft < 0 && (e.flags & KVD_CQE_MORE) && !(e.flags & KVD_CQE_PROGRESS))
			ttft = now_s() - t0;
		if (!(e.flags & KVD_CQE_MORE))
			return e.res < 0 ? -1 : ttft >= 0 ? ttft : now_s() - t0;
	}
}

/* The conversation so far, prefilled into slot 0 of a new session. */
static int converse(const char *sock, uint32_t r, struct client *cl)
{
	uint32_t in;
	struct kvd_sqe q;
	struct kvd_cqe e;
	if (kvc_connect(&cl->c, sock) || kvc_session_open(cl->c, &cl->sid) ||
	    kvc_arena_alloc(cl->c, (CONV + TURN) * 4, &in))
		return -1;
	fill((uint32_t *)(kvc_arena(cl->c, NULL) + in), CONV, r, 0);
	kvc_prep_prefill(&q, cl->sid, 0, 1, in, CONV);
	if (kvc_submit(cl->c, &q) || kp_wait_cqe(NULL, cl->c, &e) || e.res != CONV)
		return -1;
	return kvc_session_token(cl->c, cl->sid, cl->token);
}

/* The next turn on a session resumed by token: TTFT in seconds, or < 0. */
static double turn_resumed(const char *sock, uint32_t r, const struct client *old)
{
	struct kvc_conn *c;
	uint32_t sid, in, out, restored = 0;
	struct kvd_sqe q;
	double t = -1;
	if (kvc_connect(&c, sock))
		return -1;
	if (kvc_session_resume(c, old->token, &sid, &restored, NULL) || restored != 1 ||
	    kvc_arena_alloc(c, TURN * 4, &in) || kvc_arena_alloc(c, 8 * 4, &out))
		goto out;
	fill((uint32_t *)(kvc_arena(c, NULL) + in), TURN, r, CONV);
	kvc_prep_generate(&q, sid, 0, 2, in, TURN, out, 1);
	q.flags |= KVD_SQE_APPEND | KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS;
	t = first_token(c, &q);
out:
	kvc_close(c);
	return t;
}

/* The same turn for a daemon that lost the conversation: all of it again. */
static double turn_lost(const char *sock, uint32_t r)
{
	struct kvc_conn *c;
	uint32_t sid, in, out;
	struct kvd_sqe q;
	double t = -1;
	if (kvc_connect(&c, sock) || kvc_session_open(c, &sid) ||
	    kvc_arena_alloc(c, (CONV + TURN) * 4, &in) || kvc_arena_alloc(c, 8 * 4, &out))
		goto out;
	fill((uint32_t *)(kvc_arena(c, NULL) + in), CONV + TURN, r, 0);
	kvc_prep_generate(&q, sid, 0, 2, in, CONV + TURN, out, 1);
	q.flags |= KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS;
	t = first_token(c, &q);
out:
	kvc_close(c);
	return t;
}

/* Fill the pool with cached prefixes: conversations prefilled and let go. */
static int fill_pool(const struct kr_daemon *d, uint32_t blocks, uint32_t bt)
{
	struct kvd_stats_rep st;
	struct kvd_proc p = kr_proc(d);
	for (uint32_t r = 1000;; r++) {
		if (kp_stats(&p, &st))
			return -1;
		if (st.kv_blocks_cached + st.kv_blocks_used >= blocks - CONV / bt)
			return 0;
		struct client cl = { 0 };
		int rc = converse(d->sock, r, &cl);
		kvc_close(cl.c);
		if (rc)
			return -1;
	}
}

/* keep: with the state directory, else --no-persist; rows: --max-batch-tokens, or NULL for the default. */
static int start(struct kr_daemon *d, int keep, const char *blocks, const char *rows, double *secs)
{
	const char *extra[8] = { "--kv-blocks", blocks };
	int n = 2;
	if (keep) {
		extra[n++] = "--state-dir";
		extra[n++] = state_dir;
	} else {
		extra[n++] = "--no-persist";
	}
	if (rows) {
		extra[n++] = "--max-batch-tokens";
		extra[n++] = rows;
	}
	extra[n] = NULL;
	double t = kr_start(d, extra);
	if (t < 0)
		return -1;
	if (secs)
		*secs = t;
	return 0;
}

/* SIGTERM to READY=1 of the next daemon: seconds, or < 0. */
static double restart(struct kr_daemon *d, int keep_next, const char *blocks)
{
	double t0 = now_s(), ready;
	int st = kr_kill(d, SIGTERM);
	if (st < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
		return -1;
	if (start(d, keep_next, blocks, NULL, &ready))
		return -1;
	(void)ready;
	return now_s() - t0;
}

int main(void)
{
	int rounds = bench_pick(5, 2);
	uint32_t n_blocks = bench_pick(4096, 1024), bt = 16;
	char blocks[16], dir[64];
	snprintf(blocks, sizeof(blocks), "%u", n_blocks);
	snprintf(dir, sizeof(dir), "/dev/shm/kvd-bench-restart.XXXXXX");
	struct stat sb;
	if (stat("/dev/shm", &sb) || !mkdtemp(dir)) {
		snprintf(dir, sizeof(dir), "/tmp/kvd-bench-restart.XXXXXX");
		if (!mkdtemp(dir)) {
			perror("mkdtemp");
			return 1;
		}
	}
	state_dir = dir;
	struct kr_daemon d;
	/* The pool is filled by a daemon taking 512 prompt rows a step (quicker); then the defaults. */
	if (kr_open(&d, 0) || start(&d, 1, blocks, "512", NULL)) {
		fprintf(stderr, "bench_restart: kvd did not start\n");
		return 1;
	}
	printf("restart with the KV kept%s: a %d-token conversation, the next turn %d tokens and "
	       "its first token; pool %u blocks of %u tokens, filled; state in %s\n", bench_mark(),
	       CONV, TURN, n_blocks, bt, dir);
	double t_fill = now_s();
	if (fill_pool(&d, n_blocks, bt)) {
		fprintf(stderr, "bench_restart: filling the pool failed\n");
		kr_close(&d);
		return 1;
	}
	printf("pool filled with cached prefixes in %.1f s\n", now_s() - t_fill);
	if (restart(&d, 1, blocks) < 0) {
		fprintf(stderr, "bench_restart: the restart after the fill failed\n");
		kr_close(&d);
		return 1;
	}
	double res[8], lost[8], rs_keep[8], rs_none[8], rows_res[8], rows_lost[8];
	struct kvd_proc p = kr_proc(&d);	/* only its socket is used: it stays across restarts */
	struct kvd_stats_rep st;
	int ok = 1;
	for (int r = 0; r < rounds && ok; r++) {
		struct client cl = { 0 };
		/* The daemon keeping state runs: the conversation goes in, then it restarts. */
		ok = !converse(d.sock, (uint32_t)r, &cl);
		rs_keep[r] = ok ? restart(&d, 1, blocks) : -1;
		kvc_close(cl.c);
		res[r] = rs_keep[r] > 0 ? turn_resumed(d.sock, (uint32_t)r, &cl) : -1;
		/* A new daemon: everything it prefilled was this turn's. */
		rows_res[r] = kp_stats(&p, &st) ? -1 : (double)st.tokens_prefilled;
		/* A daemon that keeps nothing: the same conversation is gone. */
		rs_none[r] = restart(&d, 0, blocks);
		lost[r] = rs_none[r] > 0 ? turn_lost(d.sock, (uint32_t)r) : -1;
		rows_lost[r] = kp_stats(&p, &st) ? -1 : (double)st.tokens_prefilled;
		/* Back to the keeping daemon, whose pool the no-persist run did not touch. */
		ok = ok && res[r] > 0 && lost[r] > 0 && restart(&d, 1, blocks) > 0;
		printf("round %d: TTFT resumed %.1f ms (%.0f prompt rows), lost %.1f ms (%.0f rows); "
		       "restart %.0f ms kept, %.0f ms not\n", r + 1, res[r] * 1e3, rows_res[r], lost[r] * 1e3,
		       rows_lost[r], rs_keep[r] * 1e3, rs_none[r] * 1e3);
	}
	int have = !kp_stats(&p, &st);
	kr_close(&d);
	char path[128];
	snprintf(path, sizeof(path), "%s/kvpool", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/kvstate", dir);
	unlink(path);
	rmdir(dir);
	if (!ok) {
		fprintf(stderr, "bench_restart: a round failed\n");
		return 1;
	}
	double m_res = median(res, rounds), m_lost = median(lost, rounds);
	printf("\n| median of %d | resumed (KV kept) | lost (--no-persist) | ratio |\n|---|---|---|---|\n", rounds);
	printf("| TTFT of the next turn, ms | %.1f | %.1f | %.1fx faster |\n", m_res * 1e3, m_lost * 1e3,
	       m_lost / m_res);
	printf("| prompt rows computed for it | %.0f | %.0f | |\n", median(rows_res, rounds),
	       median(rows_lost, rounds));
	printf("| restart, SIGTERM to READY=1, ms | %.0f | %.0f | |\n", median(rs_keep, rounds) * 1e3,
	       median(rs_none, rounds) * 1e3);
	if (have)
		printf("each kept restart restores the full pool: the last one %u prefix-cache blocks of %u\n",
		       st.restored_prefixes, n_blocks);
	return 0;
}
