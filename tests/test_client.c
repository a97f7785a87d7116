/*
 * test_client.c — libkvclient's conveniences (kvc_strerror, kvc_arm with an
 * external poll loop, kvc_generate_text) and kvctl as a user runs it (-n 0,
 * --chat/--system, context overflow, --poll sleeping while nothing comes,
 * connect hints for a non-root user, progress, a daemon shutting down)
 * against a real daemon, and across its crash (kvc_session_token,
 * reconnecting off, on with no daemon coming back, on with one that does;
 * kvctl chat). The tests named test_contract_* need the daemon's side of
 * the plain-text, system, progress and shutdown additions to uapi/kvd.h
 * and skip when its HELLO reply does not grant them.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <poll.h>
#include <pty.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include "tests/lib/proc.h"

#define NOBODY 65534

static struct kvd_proc D;	/* shared by the tests, started by the group setup */
static char tmpdir[64];		/* outputs of the programs the tests run */
static char KVCTL[256];		/* the kvctl next to kp_bin()'s kvd: the sanitizer pass has its own */

static int group_setup(void **state)
{
	(void)state;
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvd-client.XXXXXX");
	if (!mkdtemp(tmpdir))
		return -1;
	chmod(tmpdir, 0755);	/* a test runs kvctl as nobody from here */
	const char *kvd = kp_bin(), *slash = strrchr(kvd, '/');
	snprintf(KVCTL, sizeof(KVCTL), "%.*skvctl", slash ? (int)(slash - kvd + 1) : 0, kvd);
	if (kp_no_uring())
		return 0;	/* each daemon test skips, saying why */
	return kp_start(&D, NULL) ? -1 : 0;
}

static int group_teardown(void **state)
{
	(void)state;
	kp_cleanup(&D);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	return system(cmd) ? -1 : 0;
}

/* A test leaves the shared daemon running, whatever it stopped. */
static int teardown(void **state)
{
	(void)state;
	if (D.pid)
		kill(D.pid, SIGCONT);
	return 0;
}

static void need_daemon(void)
{
	kp_skip_without_uring();
	assert_true(D.pid > 0);
	if (access(KVCTL, X_OK))
		fail_msg("%s is missing: run `make` first", KVCTL);
}

static struct kvc_conn *conn(uint32_t *session)
{
	struct kvc_conn *c;
	need_daemon();
	assert_int_equal(kvc_connect(&c, D.sock), 0);
	if (session)
		assert_int_equal(kvc_session_open(c, session), 0);
	return c;
}

/* Skip a contract test unless the daemon grants feat. */
static void need_feature(uint32_t feat, const char *name)
{
	struct kvc_conn *c = conn(NULL);
	uint32_t granted = kvc_info(c)->features;
	kvc_close(c);
	if (!(granted & feat)) {
		print_message("skipped: the daemon does not grant %s (its side is not merged)\n", name);
		skip();
	}
}

/* A whole file, NUL-terminated (NULL on error); the caller frees. */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap + 1);
	while (buf) {
		n += fread(buf + n, 1, cap - n, f);
		if (n < cap)
			break;
		char *nb = realloc(buf, (cap *= 2) + 1);
		if (!nb)
			free(buf);
		buf = nb;
	}
	fclose(f);
	if (buf)
		buf[n] = 0;
	return buf;
}

struct run {
	int	status;		/* exit status, or 128 + signal */
	char	*out, *err;	/* what it wrote, NUL-terminated; free with run_free() */
};

static void run_free(struct run *r)
{
	free(r->out);
	free(r->err);
	memset(r, 0, sizeof(*r));
}

/* In the child: the stdout and stderr files. */
static void child_redirect(const char *out, const char *err)
{
	int null = open("/dev/null", O_RDONLY);
	int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (null < 0 || o < 0 || e < 0 || dup2(null, 0) < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
		_exit(126);
}

/* Start argv (env: extra NAME=VALUE settings, NULL-terminated, may be NULL) with its output in files. */
static pid_t start_cmd(const char *const *argv, const char *const *env, const char *tag)
{
	char out[128], err[128];
	snprintf(out, sizeof(out), "%s/%s.out", tmpdir, tag);
	snprintf(err, sizeof(err), "%s/%s.err", tmpdir, tag);
	pid_t pid = kp_fork();
	if (pid == 0) {
		child_redirect(out, err);
		for (int i = 0; env && env[i]; i++)
			putenv((char *)env[i]);
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* Wait for pid and collect what start_cmd() captured under tag. */
static void finish_cmd(pid_t pid, const char *tag, struct run *r)
{
	char out[128], err[128];
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	snprintf(out, sizeof(out), "%s/%s.out", tmpdir, tag);
	snprintf(err, sizeof(err), "%s/%s.err", tmpdir, tag);
	r->out = slurp(out);
	r->err = slurp(err);
	assert_non_null(r->out);
	assert_non_null(r->err);
	print_message("  $ ... %s: status %d\n  stderr: %s", tag, r->status, r->err);
}

/* kvctl with args (NULL-terminated) against the shared daemon, to completion. */
static void kvctl(struct run *r, const char *tag, ...)
{
	const char *argv[32] = { KVCTL, "--socket", D.sock };
	int n = 3;
	va_list ap;
	va_start(ap, tag);
	for (const char *a; (a = va_arg(ap, const char *)) && n < 31;)
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	finish_cmd(start_cmd(argv, NULL, tag), tag, r);
}

/* ---------------------------------------------------------------------- */
/* libkvclient                                                            */

static void test_strerror(void **state)
{
	(void)state;
	assert_non_null(strstr(kvc_strerror(-E2BIG), "context length"));
	assert_non_null(strstr(kvc_strerror(-E2BIG), "per-request limit"));
	assert_non_null(strstr(kvc_strerror(-ESHUTDOWN), "shutting down"));
	assert_non_null(strstr(kvc_strerror(-ERANGE), "vocabulary"));
	assert_non_null(strstr(kvc_strerror(-EDQUOT), "quota"));
	assert_non_null(strstr(kvc_strerror(-ECANCELED), "cancelled"));
	assert_non_null(strstr(kvc_strerror(-ERESTART), "resubmit"));
	assert_non_null(strstr(kvc_strerror(-ESTALE), "no such session"));
	assert_string_equal(kvc_strerror(-ESHUTDOWN), kvc_strerror(ESHUTDOWN));
	/* A code kvd gives no meaning of its own reads as strerror's. */
	assert_string_equal(kvc_strerror(-ENOTTY), strerror(ENOTTY));
}

/*
 * An external event loop: kvc_arm(), poll() on kvc_call_fd(), kvc_ack().
 * Every token of a stream arrives, and the loop really slept on the fd
 * (without the arm the daemon would ring nobody and poll() would never
 * return).
 */
static void test_arm_poll_loop(void **state)
{
	(void)state;
	uint32_t s, in, out;
	struct kvc_conn *c = conn(NULL);
	assert_int_equal(kvc_arm(c), -ENOTCONN);
	assert_int_equal(kvc_session_open(c, &s), 0);
	const char *p = "1, 2, 3, 4,";
	assert_int_equal(kvc_arena_alloc(c, (uint32_t)strlen(p), &in), 0);
	assert_int_equal(kvc_arena_alloc(c, 16 * 4, &out), 0);
	memcpy(kvc_arena(c, NULL) + in, p, strlen(p));
	struct kvd_sqe q;
	kvc_prep_generate(&q, s, 0, 7, in, (uint32_t)strlen(p), out, 16);
	q.flags = KVD_SQE_TEXT | KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS;
	assert_int_equal(kvc_submit(c, &q), 0);

	int tokens = 0, wakeups = 0, final = 0;
	while (!final) {
		struct kvd_cqe e;
		while (!final && kvc_peek(c, &e) == 0) {
			assert_int_equal(e.user_data, 7);
			assert_true(e.res >= 0);
			tokens++;
			final = !(e.flags & KVD_CQE_MORE);
		}
		if (final)
			break;
		int armed = kvc_arm(c);
		assert_true(armed == 0 || armed == 1);
		if (armed == 1)
			continue;	/* a CQE came in between: never sleep on it */
		struct pollfd pf[2] = { { kvc_call_fd(c), POLLIN, 0 }, { kvc_socket_fd(c), POLLIN, 0 } };
		int n = poll(pf, 2, 60000);
		assert_int_equal(n > 0, 1);	/* 60 s with a token due every fraction of one */
		assert_int_equal(pf[1].revents, 0);
		wakeups += (pf[0].revents & POLLIN) != 0;
		assert_int_equal(kvc_ack(c), 0);
	}
	assert_int_equal(tokens, 16);
	assert_true(wakeups > 0);
	/* Acked: the doorbell holds nothing until the next arm. */
	struct pollfd pf = { kvc_call_fd(c), POLLIN, 0 };
	assert_int_equal(poll(&pf, 1, 0), 0);
	kvc_close(c);
}

struct collect {
	char	buf[8192];
	size_t	n;
	int	chunks;
	int	cut;		/* a chunk ended inside a character */
	int	stop_after;	/* cancel after this many chunks; 0: never */
};

/* Whether s[0, n) ends inside a UTF-8 sequence. */
static int ends_inside(const char *s, size_t n)
{
	size_t i = n, k = 0;
	while (i > 0 && k < 4 && ((uint8_t)s[i - 1] & 0xc0) == 0x80) {
		i--;
		k++;
	}
	if (i == 0)
		return k > 0;
	uint8_t b = (uint8_t)s[i - 1];
	size_t want = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
	return k + 1 < want;
}

static int collect(void *user, const char *utf8, size_t len)
{
	struct collect *co = user;
	assert_true(len > 0);
	assert_true(co->n + len < sizeof(co->buf));
	memcpy(co->buf + co->n, utf8, len);
	co->n += len;
	co->cut |= ends_inside(utf8, len);
	return co->stop_after && ++co->chunks >= co->stop_after;
}

/* The text of a plain GENERATE of the same prompt, token by token, for comparison. */
static size_t reference_text(struct kvc_conn *c, uint32_t s, const char *p, uint32_t max, char *buf)
{
	uint32_t in, out, len;
	struct kvd_sqe q;
	struct kvd_cqe e;
	kvc_arena_reset(c);
	assert_int_equal(kvc_arena_alloc(c, (uint32_t)strlen(p), &in), 0);
	assert_int_equal(kvc_arena_alloc(c, max * 4, &out), 0);
	memcpy(kvc_arena(c, NULL) + in, p, strlen(p));
	kvc_prep_generate(&q, s, 1, 9, in, (uint32_t)strlen(p), out, max);
	q.flags = KVD_SQE_TEXT | KVD_SQE_IGNORE_EOS;
	if (kvc_info(c)->features & KVD_FEAT_PLAIN_TEXT)
		q.flags |= KVD_SQE_PLAIN;
	assert_int_equal(kvc_submit(c, &q), 0);
	assert_int_equal(kvc_wait(c, &e, 120000), 0);
	assert_int_equal(e.res, (int)max);
	const uint32_t *ids = (const uint32_t *)(kvc_arena(c, NULL) + out);
	size_t n = 0;
	for (uint32_t i = 0; i < max; i++) {
		const char *t = kvc_token_bytes(c, ids[i], &len);
		memcpy(buf + n, t ? t : "", t ? len : 0);
		n += t ? len : 0;
	}
	kvc_arena_reset(c);
	return n;
}

static void test_generate_text(void **state)
{
	(void)state;
	uint32_t s, arena_bytes, off;
	struct kvc_conn *c = conn(&s);
	const char *p = "Les fleurs de mon jardin sont très belles, et l'été";
	struct kvc_text_opts o = { .max_tokens = 24, .flags = KVD_SQE_IGNORE_EOS };
	struct kvc_text_result r;
	struct collect co = { .n = 0 };

	if (kvc_info(c)->features & KVD_FEAT_PLAIN_TEXT)
		o.flags |= KVD_SQE_PLAIN;
	assert_int_equal(kvc_generate_text(c, s, 0, p, strlen(p), &o, collect, &co, &r), 24);
	assert_true(r.flags & KVD_CQE_LENGTH);
	assert_false(co.cut);
	char ref[8192];
	size_t n = reference_text(c, s, p, 24, ref);
	assert_int_equal(co.n, n);
	assert_memory_equal(co.buf, ref, n);

	/* A prefill only: positions, no callback. */
	struct kvc_text_opts pre = { .max_tokens = 0 };
	co.n = 0;
	int pos = kvc_generate_text(c, s, 0, p, strlen(p), &pre, collect, &co, NULL);
	assert_true(pos > 5);
	assert_int_equal(co.n, 0);

	/* The callback's nonzero cancels. */
	struct collect stop = { .stop_after = 2 };
	int got = kvc_generate_text(c, s, 0, p, strlen(p), &o, collect, &stop, &r);
	assert_true(got >= 0 && got < 24);
	assert_true(r.flags & KVD_CQE_CANCELLED);

	/* Misuse is refused before anything is sent. */
	struct kvc_text_opts bad = { .max_tokens = 4, .system = "x", .system_len = 1 };
	int want = kvc_info(c)->features & KVD_FEAT_SYSTEM ? -EINVAL : -EOPNOTSUPP;
	assert_int_equal(kvc_generate_text(c, s, 0, p, strlen(p), &bad, NULL, NULL, NULL), want);

	/* Each call gave its arena room back. */
	kvc_arena(c, &arena_bytes);
	assert_int_equal(kvc_arena_alloc(c, arena_bytes, &off), 0);
	assert_int_equal(off, 0);
	kvc_close(c);
}

#define UNWRITTEN 0xffffffffu	/* no token id: an output slot the daemon has not written */

struct late_stop {
	const volatile uint32_t	*last;	/* the output's last slot in the arena */
	int			calls;
};

/* Cancel only once the daemon has written the last token: the request ends before its CANCEL is seen. */
static int stop_when_done(void *user, const char *utf8, size_t len)
{
	struct late_stop *ls = user;
	struct kw_deadline w;
	(void)utf8;
	(void)len;
	ls->calls++;
	for (kw_start_default(&w); *ls->last == UNWRITTEN && !kw_expired(&w);)
		kp_sleep_ms(1);
	return 1;
}

/*
 * A call that cancels takes its CANCEL's CQE (user_data + 1) too: the next
 * call, numbered user_data + 1, gets its own final CQE, not that one. The
 * CANCEL here comes after the request ended, so its CQE (-ENOENT) would
 * come after the final one, which the call used to return on.
 */
static void test_generate_text_cancel_cqe(void **state)
{
	(void)state;
	uint32_t s, in, out, bytes;
	struct kvc_conn *c = conn(&s);
	const char *p = "1, 2, 3, 4,";
	const uint32_t max = 3;
	/* Where the call will put its output: the same allocations, made first here. */
	assert_int_equal(kvc_arena_alloc(c, (uint32_t)strlen(p), &in), 0);
	assert_int_equal(kvc_arena_alloc(c, 0, &out), 0);
	kvc_arena_reset(c);
	uint8_t *arena = kvc_arena(c, &bytes);
	memset(arena, 0xff, bytes);
	struct late_stop ls = { .last = (const volatile uint32_t *)(arena + out) + max - 1 };
	struct kvc_text_opts o = { .max_tokens = max, .flags = KVD_SQE_IGNORE_EOS, .user_data = 1 };
	struct kvc_text_result r;
	int got = kvc_generate_text(c, s, 0, p, strlen(p), &o, stop_when_done, &ls, &r);
	assert_true(got >= 0 && got <= (int)max);
	struct kvd_cqe e;
	assert_int_equal(kvc_peek(c, &e), -EAGAIN);	/* nothing of call 1 is left */
	print_message("  call 1: %d tokens, callback %d times, flags %#x\n", got, ls.calls, r.flags);

	struct kvc_text_opts o2 = { .max_tokens = max, .flags = KVD_SQE_IGNORE_EOS, .user_data = 2 };
	assert_int_equal(kvc_generate_text(c, s, 0, p, strlen(p), &o2, NULL, NULL, &r), (int)max);
	assert_true(r.flags & KVD_CQE_LENGTH);
	kvc_close(c);
}

struct broken_fd {
	struct kvc_conn	*c;
	int		saved;	/* the call doorbell, while a broken pipe stands in for it */
};

/* Put the write end of a pipe with no reader in the call doorbell's place: poll() says POLLERR. */
static int break_call_fd(void *user, const char *utf8, size_t len)
{
	struct broken_fd *b = user;
	int pp[2];
	(void)utf8;
	(void)len;
	if (b->saved >= 0 || pipe(pp))
		return 0;
	close(pp[0]);
	b->saved = dup(kvc_call_fd(b->c));
	if (b->saved < 0 || dup2(pp[1], kvc_call_fd(b->c)) < 0)
		fail_msg("dup: %s", strerror(errno));
	close(pp[1]);
	return 0;
}

/*
 * kvc_wait() failing (-EIO) leaves the request running: its output room
 * stays taken, since the daemon still writes tokens there.
 */
static void test_generate_text_wait_error(void **state)
{
	(void)state;
	uint32_t s, bytes, off;
	struct kvc_conn *c = conn(&s);
	const char *p = "1, 2, 3, 4,";
	struct kvc_text_opts o = { .max_tokens = 2000, .flags = KVD_SQE_IGNORE_EOS, .user_data = 40 };
	struct broken_fd b = { .c = c, .saved = -1 };
	int got = kvc_generate_text(c, s, 0, p, strlen(p), &o, break_call_fd, &b, NULL);
	if (b.saved >= 0) {
		dup2(b.saved, kvc_call_fd(c));
		close(b.saved);
	}
	kvc_arena(c, &bytes);
	int whole = kvc_arena_alloc(c, bytes, &off);
	kvc_close(c);	/* closing the session cancels the request */
	assert_int_equal(got, -EIO);
	assert_int_equal(whole, -ENOSPC);
}

/* ---------------------------------------------------------------------- */
/* Surviving a restart                                                    */

/*
 * Kill d's daemon with SIGKILL (no drain, as a crash would) and, unless
 * down_only, start another on the same socket, as systemd's restart would;
 * 0 once it answers there.
 */
static int crash_daemon(struct kvd_proc *d, int down_only)
{
	kill(d->pid, SIGKILL);
	waitpid(d->pid, NULL, 0);
	d->pid = 0;
	if (down_only)
		return 0;
	const char *argv[] = { kp_bin(), "--model", kp_model(), "--socket", d->sock,
			       "--drain-timeout", "2000", "--bpf", "off", NULL };
	pid_t pid = kp_spawn(argv, d->log, 0, NULL, NULL);
	if (pid < 0)
		return pid;
	d->pid = pid;
	return kp_wait_answer(d);
}

/* A streamed GENERATE of n tokens as user_data ud on slot 0, and its first CQE taken: it runs. */
static void start_long(struct kvc_conn *c, uint32_t s, uint64_t ud, uint32_t n)
{
	uint32_t in, out;
	const char *p = "1, 2, 3, 4,";
	struct kvd_sqe q;
	struct kvd_cqe e;
	assert_int_equal(kvc_arena_alloc(c, (uint32_t)strlen(p), &in), 0);
	assert_int_equal(kvc_arena_alloc(c, n * 4, &out), 0);
	memcpy(kvc_arena(c, NULL) + in, p, strlen(p));
	kvc_prep_generate(&q, s, 0, ud, in, (uint32_t)strlen(p), out, n);
	q.flags = KVD_SQE_TEXT | KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS;
	assert_int_equal(kvc_submit(c, &q), 0);
	assert_int_equal(kvc_wait(c, &e, kw_ms(120000)), 0);
	assert_int_equal(e.user_data, ud);
	assert_true(e.flags & KVD_CQE_MORE);
}

/*
 * Every open session has a token once the daemon grants RESUME (none
 * without it), a different one each, and none once closed. The daemon's
 * side gives real tokens only once it is merged: before, it may grant the
 * bit with all-zero tokens, which the library does not hand out.
 */
static void test_session_token(void **state)
{
	(void)state;
	uint32_t a, b;
	uint64_t ta[2] = { 0 }, tb[2] = { 0 };
	struct kvc_conn *c = conn(&a);
	assert_int_equal(kvc_session_open(c, &b), 0);
	int granted = !!(kvc_info(c)->features & KVD_FEAT_RESUME);
	int ra = kvc_session_token(c, a, ta), rb = kvc_session_token(c, b, tb);
	assert_int_equal(kvc_session_token(c, a ^ 0x100, ta), -ENOENT);	/* another generation */
	assert_int_equal(kvc_session_token(c, 63, ta), -ENOENT);
	assert_int_equal(ra, rb);
	if (!granted)
		assert_int_equal(ra, -EOPNOTSUPP);
	else if (ra == -EOPNOTSUPP)
		print_message("  the daemon grants RESUME but gives no tokens (its side is not merged)\n");
	else
		assert_int_equal(ra, 0);
	if (!ra) {
		assert_true(ta[0] || ta[1]);
		assert_true(tb[0] || tb[1]);
		assert_false(ta[0] == tb[0] && ta[1] == tb[1]);
		/* A token nobody was given names no session. */
		uint64_t bogus[2] = { ta[0] ^ 0x5a5a5a5a5a5a5a5aull, ta[1] ^ 1 };
		uint32_t id;
		assert_int_equal(kvc_session_resume(c, bogus, &id, NULL, NULL), -ESTALE);
	}
	uint64_t zero[2] = { 0, 0 };
	uint32_t id;
	assert_int_equal(kvc_session_resume(c, zero, &id, NULL, NULL), granted ? -EINVAL : -EOPNOTSUPP);
	assert_int_equal(kvc_session_close(c, a), 0);
	assert_int_equal(kvc_session_token(c, a, ta), -ENOENT);
	kvc_close(c);
}

/* Reconnecting off (the default): a daemon that dies is -ECONNRESET, as it always was. */
static void test_reconnect_off(void **state)
{
	(void)state;
	struct kvd_proc d2;
	struct kvc_conn *c;
	struct kvd_cqe e;
	uint32_t s;
	need_daemon();
	assert_int_equal(kp_start(&d2, NULL), 0);
	assert_int_equal(kvc_connect(&c, d2.sock), 0);
	kvc_set_reconnect(c, 0);	/* whatever $KVD_RECONNECT_MS says */
	assert_int_equal(kvc_session_open(c, &s), 0);
	start_long(c, s, 7, 4000);
	crash_daemon(&d2, 1);
	int err;
	while ((err = kvc_wait(c, &e, -1)) == 0)
		assert_true(e.flags & KVD_CQE_MORE);	/* the tokens it posted before it died */
	assert_int_equal(err, -ECONNRESET);
	assert_int_equal(kvc_wait(c, &e, -1), -ECONNRESET);
	kvc_close(c);
	kp_cleanup(&d2);
}

/* Reconnecting on and no daemon coming back: kvc_wait() gives up after its time, -ECONNRESET. */
static void test_reconnect_gives_up(void **state)
{
	(void)state;
	struct kvd_proc d2;
	struct kvc_conn *c;
	struct kvd_cqe e;
	uint32_t s;
	need_daemon();
	assert_int_equal(kp_start(&d2, NULL), 0);
	assert_int_equal(kvc_connect(&c, d2.sock), 0);
	kvc_set_reconnect(c, 300);
	assert_int_equal(kvc_session_open(c, &s), 0);
	start_long(c, s, 7, 4000);
	crash_daemon(&d2, 1);
	int64_t t0 = kp_now_ms();
	int err;
	while ((err = kvc_wait(c, &e, -1)) == 0)
		assert_true(e.flags & KVD_CQE_MORE);
	print_message("  gave up after %lld ms (reconnect time 300 ms)\n", (long long)(kp_now_ms() - t0));
	assert_int_equal(err, -ECONNRESET);
	/* Given up: the next call does not wait that long again. */
	assert_int_equal(kvc_wait(c, &e, -1), -ECONNRESET);
	assert_int_equal(kvc_reconnect(c), -ECONNREFUSED);	/* by hand: the socket is still there */
	kvc_close(c);
	kp_cleanup(&d2);
}

/*
 * The daemon crashes under a request and comes back on the same socket:
 * kvc_wait() reconnects by itself and the request gets one final CQE,
 * flagged RESTARTED (-ERESTART, or its replay once the daemon resumes
 * sessions). The arena keeps its address and its bytes, the socket its fd,
 * kvc_info() is the new daemon's; the session is back, or, from a daemon
 * that cannot resume it, forgotten, and a new one works.
 */
static void test_reconnect_restart(void **state)
{
	(void)state;
	struct kvd_proc d2;
	struct kvc_conn *c;
	struct kvd_cqe e;
	uint32_t s, mark_off, bytes;
	uint64_t tok[2];
	need_daemon();
	assert_int_equal(kp_start(&d2, NULL), 0);
	assert_int_equal(kvc_connect(&c, d2.sock), 0);
	kvc_set_reconnect(c, kw_ms(60000));
	assert_int_equal(kvc_session_open(c, &s), 0);
	assert_int_equal(kvc_arena_alloc(c, 16, &mark_off), 0);
	uint8_t *arena = kvc_arena(c, &bytes);
	memcpy(arena + mark_off, "still here", 11);
	int sock = kvc_socket_fd(c);
	uint32_t old_pid = kvc_info(c)->daemon_pid;
	start_long(c, s, 7, 4000);
	assert_int_equal(crash_daemon(&d2, 0), 0);

	int err;
	while ((err = kvc_wait(c, &e, -1)) == 0 && (e.flags & KVD_CQE_MORE))
		assert_false(e.flags & KVD_CQE_RESTARTED);
	assert_int_equal(err, 0);
	print_message("  final CQE: res %d flags %#x\n", e.res, e.flags);
	assert_int_equal(e.user_data, 7);
	assert_true(e.flags & KVD_CQE_RESTARTED);
	if (e.flags & KVD_CQE_REPLAY)
		assert_true(e.res >= 0);
	else
		assert_int_equal(e.res, -ERESTART);
	assert_int_equal(kvc_peek(c, &e), -EAGAIN);	/* one final CQE, nothing else */
	assert_ptr_equal(kvc_arena(c, NULL), arena);
	assert_string_equal((const char *)arena + mark_off, "still here");
	assert_int_equal(kvc_socket_fd(c), sock);
	assert_int_equal(kvc_info(c)->daemon_pid, (uint32_t)d2.pid);
	assert_true(kvc_info(c)->daemon_pid != old_pid);

	err = kvc_session_token(c, s, tok);
	print_message("  the session %s\n", err == -ENOENT ? "was lost: a new one" : "came back");
	if (err == -ENOENT) {
		assert_int_equal(kvc_session_open(c, &s), 0);
		assert_ptr_equal(kvc_arena(c, NULL), arena);
	}
	struct kvc_text_opts o = { .max_tokens = 4, .flags = KVD_SQE_IGNORE_EOS, .user_data = 20 };
	assert_int_equal(kvc_generate_text(c, s, 0, "Hello", 5, &o, NULL, NULL, NULL), 4);
	kvc_close(c);
	kp_cleanup(&d2);
}

/* ---------------------------------------------------------------------- */
/* kvctl                                                                  */

/* -n 0 is a prefill, said as kvd --prompt -n 0 says it; exit 0. */
static void test_kvctl_prefill_only(void **state)
{
	(void)state;
	struct run r;
	unsigned n = 0;
	need_daemon();
	kvctl(&r, "prefill", "generate", "-n", "0", "The capital of France is", NULL);
	assert_int_equal(r.status, 0);
	assert_string_equal(r.out, "");
	const char *m = strstr(r.err, "prefill only: ");
	assert_non_null(m);
	assert_int_equal(sscanf(m, "prefill only: %u prompt positions cached, no tokens generated", &n), 1);
	assert_true(n >= 5);
	run_free(&r);
	/* chat has no use for it */
	kvctl(&r, "chatn0", "chat", "-n", "0", NULL);
	assert_int_equal(r.status, 2);
	run_free(&r);
}

static void test_kvctl_system_needs_chat(void **state)
{
	(void)state;
	struct run r;
	need_daemon();
	kvctl(&r, "sysnochat", "generate", "--system", "Be brief.", "Hi", NULL);
	assert_int_equal(r.status, 2);
	assert_non_null(strstr(r.err, "--system needs --chat"));
	run_free(&r);
}

/* A context overflow names the numbers instead of "Argument list too long". */
static void test_kvctl_context_overflow(void **state)
{
	(void)state;
	struct run r;
	char n[16], want[96];
	struct kvc_conn *c = conn(NULL);
	const struct kvd_hello_rep *h = kvc_info(c);
	uint32_t ctx = h->ctx_len, lim = h->max_tokens;
	kvc_close(c);
	/* Over both: aux > ctx_len names the context. */
	uint32_t over = (lim > ctx ? lim : ctx) + 1;
	snprintf(n, sizeof(n), "%u", over);
	kvctl(&r, "e2big", "generate", "-n", n, "Hello", NULL);
	assert_int_equal(r.status, 1);
	snprintf(want, sizeof(want), "plus %u to generate exceed the context (%u)", over, ctx);
	assert_non_null(strstr(r.err, want));
	/* A text prompt's positions are a lower bound when it is refused untokenized. */
	assert_non_null(strstr(r.err, "prompt (at least "));
	assert_null(strstr(r.err, "Argument list too long"));
	run_free(&r);
}

/* A per-request limit below the context is named as such, with its own number. */
static void test_kvctl_request_limit(void **state)
{
	(void)state;
	need_daemon();
	struct kvd_proc d2;
	struct kvc_conn *c;
	const char *extra[] = { "--max-tokens", "64", NULL };
	assert_int_equal(kp_start(&d2, extra), 0);
	int err = kvc_connect(&c, d2.sock);
	uint32_t ctx = err ? 0 : kvc_info(c)->ctx_len, lim = err ? 0 : kvc_info(c)->max_tokens;
	if (!err)
		kvc_close(c);
	const char *argv[] = { KVCTL, "--socket", d2.sock, "generate", "-n", "100", "Hello", NULL };
	struct run r;
	finish_cmd(start_cmd(argv, NULL, "reqlimit"), "reqlimit", &r);
	kp_cleanup(&d2);
	assert_int_equal(err, 0);
	assert_int_equal(lim, 64);
	assert_true(ctx > 100);
	assert_int_equal(r.status, 1);
	assert_non_null(strstr(r.err, "plus 100 to generate exceed the per-request limit (64)"));
	assert_non_null(strstr(r.err, "prompt (at least "));
	assert_null(strstr(r.err, "the context"));
	run_free(&r);
}

static void test_kvctl_stats_steps(void **state)
{
	(void)state;
	struct run r;
	need_daemon();
	kvctl(&r, "stats", "stats", NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "\nsteps "));
	assert_non_null(strstr(r.out, "\nrestored_sessions "));
	assert_non_null(strstr(r.out, "\nrestored_blocks "));
	assert_non_null(strstr(r.out, "\nrestored_prefixes "));
	assert_non_null(strstr(r.out, "\nresumed_sessions "));
	run_free(&r);
	kvctl(&r, "statsjson", "stats", "--json", NULL);
	assert_int_equal(r.status, 0);
	assert_non_null(strstr(r.out, "\"steps\":"));
	assert_non_null(strstr(r.out, "\"resumed_sessions\":"));
	run_free(&r);
}

/* kvctl info names the daemon on its socket by pid: the README's `pidof kvd` replacement. */
static void test_kvctl_info_pid(void **state)
{
	(void)state;
	struct run r;
	char want[48];
	need_daemon();
	kvctl(&r, "info", "info", NULL);
	assert_int_equal(r.status, 0);
	snprintf(want, sizeof(want), "pid                %d\n", (int)D.pid);
	assert_non_null(strstr(r.out, want));
	run_free(&r);
	kvctl(&r, "infojson", "info", "--json", NULL);
	assert_int_equal(r.status, 0);
	snprintf(want, sizeof(want), "\"pid\":%d,", (int)D.pid);
	assert_non_null(strstr(r.out, want));
	run_free(&r);
}

/* Wait (no deadline but the test's own death) until path has bytes, or pid exits. */
static int wait_output(const char *path, pid_t pid)
{
	struct stat st;
	for (;;) {
		if (!stat(path, &st) && st.st_size > 0)
			return 0;
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return -1;
		kp_sleep_ms(20);
	}
}

/*
 * --poll spins only for a window after each completion: with the daemon
 * stopped mid-stream, the client sleeps, so its CPU time stays far below the
 * wall time. A client that spun for ever would burn a core (on a loaded
 * 2-core machine, the daemon's). The CPU time is the judge; the state letters
 * are printed only: kvc_generate_text() wakes every 200 ms to look at its
 * cancel flag and spins its 1 ms window then, and on a loaded machine a
 * sample can catch it R, waiting for a core, without it spinning.
 */
static void test_kvctl_poll_sleeps(void **state)
{
	(void)state;
	need_daemon();
	const char *argv[] = { KVCTL, "--socket", D.sock, "generate", "--poll", "-n", "2000",
			       "1, 2, 3, 4, 5, 6, 7, 8,", NULL };
	char out[128];
	pid_t pid = start_cmd(argv, NULL, "poll");
	assert_true(pid > 0);
	snprintf(out, sizeof(out), "%s/poll.out", tmpdir);
	assert_int_equal(wait_output(out, pid), 0);
	assert_int_equal(kill(D.pid, SIGSTOP), 0);

	enum { SAMPLES = 20 };
	char st, states[SAMPLES + 1] = "";
	long long t0 = 0, t1 = 0;
	int bad = 0;
	kp_sleep_ms(100);	/* past any window */
	bad |= kp_proc_stat(pid, &st, &t0) != 0;
	int64_t w0 = kp_now_ms();
	for (int i = 0; i < SAMPLES && !bad; i++) {
		kp_sleep_ms(100);
		bad |= kp_proc_stat(pid, &st, &t1) != 0;
		states[i] = st;
	}
	int64_t wall_ms = kp_now_ms() - w0;
	long hz = sysconf(_SC_CLK_TCK);
	double cpu_ms = (double)(t1 - t0) * 1000.0 / (double)hz;
	print_message("  --poll client, daemon stopped: %.0f ms CPU in %lld ms, states %s\n",
		      cpu_ms, (long long)wall_ms, states);
	kill(D.pid, SIGCONT);
	kill(pid, SIGINT);
	struct run r;
	finish_cmd(pid, "poll", &r);
	assert_int_equal(r.status, 0);
	run_free(&r);
	assert_int_equal(bad, 0);
	assert_true(cpu_ms < (double)wall_ms / 4);
}

/* Wait (no deadline but the test's own death) until path holds lines newlines, or pid exits. */
static int wait_lines(const char *path, pid_t pid, int lines)
{
	for (;;) {
		char *text = slurp(path);
		int n = 0;
		for (const char *p = text; p && (p = strchr(p, '\n')); p++)
			n++;
		free(text);
		if (n >= lines)
			return 0;
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return -1;
		kp_sleep_ms(20);
	}
}

/*
 * kvctl chat rides out a daemon crash between two turns: the second turn
 * reconnects and is answered, by the session the daemon gave back, or,
 * from one that lost it, by a new session sent the whole conversation.
 */
static void test_kvctl_chat_restart(void **state)
{
	(void)state;
	need_daemon();
	struct kvd_proc d2;
	int in[2];
	char out[128], err[128];
	assert_int_equal(kp_start(&d2, NULL), 0);
	assert_int_equal(pipe2(in, O_CLOEXEC), 0);	/* the restarted daemon must not hold it open */
	snprintf(out, sizeof(out), "%s/chatrestart.out", tmpdir);
	snprintf(err, sizeof(err), "%s/chatrestart.err", tmpdir);
	pid_t pid = kp_fork();
	if (pid == 0) {
		child_redirect(out, err);
		dup2(in[0], 0);
		setenv("KVD_RECONNECT_MS", "600000", 1);	/* the restart below waits for the model */
		execl(KVCTL, KVCTL, "--socket", d2.sock, "chat", "-n", "8", (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	const char *first = "My name is Ada.\n", *second = "What is my name?\n";
	assert_int_equal(write(in[1], first, strlen(first)), (ssize_t)strlen(first));
	int answered = wait_lines(out, pid, 1) == 0;
	int back = answered && crash_daemon(&d2, 0) == 0;
	if (back)
		assert_int_equal(write(in[1], second, strlen(second)), (ssize_t)strlen(second));
	close(in[1]);
	struct run r;
	finish_cmd(pid, "chatrestart", &r);
	kp_cleanup(&d2);
	assert_true(answered);
	assert_true(back);
	assert_int_equal(r.status, 0);
	int lines = 0;
	for (const char *p = r.out; (p = strchr(p, '\n')); p++)
		lines++;
	assert_int_equal(lines, 2);
	assert_null(strstr(r.err, "went away"));
	run_free(&r);
}

/* In a child: a private /run holding kvd/kvd.sock -> the test daemon's socket, as the system one. */
static void fake_system_socket(void)
{
	if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) ||
	    mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") ||
	    mkdir("/run/kvd", 0755) || symlink(D.sock, "/run/kvd/kvd.sock"))
		_exit(125);
}

/* kvctl info as nobody (no $XDG_RUNTIME_DIR), its output in files under tag, in a child. */
static void kvctl_as_nobody(const char *tag, const char *sock_env, struct run *r)
{
	char out[128], err[128], bin[128];
	snprintf(out, sizeof(out), "%s/%s.out", tmpdir, tag);
	snprintf(err, sizeof(err), "%s/%s.err", tmpdir, tag);
	snprintf(bin, sizeof(bin), "%s/kvctl", tmpdir);
	pid_t pid = kp_fork();
	if (pid == 0) {
		fake_system_socket();
		child_redirect(out, err);
		unsetenv("XDG_RUNTIME_DIR");
		unsetenv("KVD_SOCKET");
		if (sock_env)
			setenv("KVD_SOCKET", sock_env, 1);
		execlp("setpriv", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", bin,
		       "info", (char *)NULL);
		_exit(127);
	}
	finish_cmd(pid, tag, r);
}

/*
 * The hints a user who is not root gets: with no socket of their own while
 * the system daemon runs, to set KVD_SOCKET=/run/kvd/kvd.sock (and that
 * the socket's group grants access); on "Permission denied", the group.
 */
static void test_kvctl_connect_hints(void **state)
{
	(void)state;
	need_daemon();
	if (access("/usr/bin/setpriv", X_OK) && access("/bin/setpriv", X_OK)) {
		print_message("skipped: setpriv (util-linux) is not installed\n");
		skip();
	}
	char bin[128], cmd[1024];
	snprintf(bin, sizeof(bin), "%s/kvctl", tmpdir);
	snprintf(cmd, sizeof(cmd), "cp %s %s && chmod 0755 %s", KVCTL, bin, bin);
	assert_int_equal(system(cmd), 0);
	/* The daemon's socket is 0660 root:<its group>: nobody may not connect. */
	struct run r;
	kvctl_as_nobody("nobody_default", NULL, &r);
	if (r.status == 125) {
		print_message("skipped: no private mount namespace here (needs CAP_SYS_ADMIN)\n");
		run_free(&r);
		skip();
	}
	assert_int_equal(r.status, 1);
	assert_non_null(strstr(r.err, "cannot connect to /run/user/65534/kvd.sock"));
	assert_non_null(strstr(r.err, "set KVD_SOCKET=/run/kvd/kvd.sock"));
	assert_non_null(strstr(r.err, "membership of its group"));
	assert_null(strstr(r.err, "is kvd running"));
	run_free(&r);

	kvctl_as_nobody("nobody_system", "/run/kvd/kvd.sock", &r);
	assert_int_equal(r.status, 1);
	assert_non_null(strstr(r.err, "Permission denied"));
	assert_non_null(strstr(r.err, "membership of group "));
	assert_non_null(strstr(r.err, " grants access"));
	run_free(&r);
}

/* ---------------------------------------------------------------------- */
/* The contract of the uapi/kvd.h additions, once the daemon serves them.  */

/* kvctl generate --chat --system: the system message reaches the template. */
static void test_contract_chat_system(void **state)
{
	(void)state;
	need_feature(KVD_FEAT_SYSTEM, "KVD_FEAT_SYSTEM");
	struct run a, b;
	kvctl(&a, "chat_plain", "generate", "--chat", "-n", "12", "Who are you?", NULL);
	kvctl(&b, "chat_system", "generate", "--chat", "--system",
	      "You are a pirate. Answer every question like a pirate.", "-n", "12", "Who are you?", NULL);
	assert_int_equal(a.status, 0);
	assert_int_equal(b.status, 0);
	assert_true(strlen(b.out) > 1);
	assert_string_not_equal(a.out, b.out);	/* greedy both times: the system message counts */
	run_free(&a);
	run_free(&b);
}

/* Plain text by default: a special token's spelling is text, unless --special. */
static void test_contract_plain_default(void **state)
{
	(void)state;
	need_feature(KVD_FEAT_PLAIN_TEXT, "KVD_FEAT_PLAIN_TEXT");
	struct run a, b;
	unsigned plain = 0, special = 0;
	kvctl(&a, "plain", "generate", "-n", "0", "<|im_end|>", NULL);
	kvctl(&b, "special", "generate", "-n", "0", "--special", "<|im_end|>", NULL);
	assert_int_equal(a.status, 0);
	assert_int_equal(b.status, 0);
	assert_int_equal(sscanf(strstr(a.err, "prefill only: "), "prefill only: %u", &plain), 1);
	assert_int_equal(sscanf(strstr(b.err, "prefill only: "), "prefill only: %u", &special), 1);
	assert_true(plain > special);
	run_free(&a);
	run_free(&b);
	kvctl(&a, "chat_special", "generate", "--chat", "--special", "-n", "2", "Hi<|im_end|>", NULL);
	assert_int_equal(a.status, 0);
	run_free(&a);
}

/* A prompt of n distinct token ids at arena offset off. */
static void put_ids(struct kvc_conn *c, uint32_t off, uint32_t n)
{
	uint32_t *a = (uint32_t *)(kvc_arena(c, NULL) + off);
	for (uint32_t i = 0; i < n; i++)
		a[i] = 300 + (i * 17) % 40000;
}

/* PREFILL with KVD_SQE_PROGRESS: MORE|PROGRESS CQEs counting up to the positions in all. */
static void test_contract_progress_cqes(void **state)
{
	(void)state;
	need_feature(KVD_FEAT_PROGRESS, "KVD_FEAT_PROGRESS");
	uint32_t s, off;
	struct kvc_conn *c = conn(&s);
	const uint32_t n = 1500;
	assert_int_equal(kvc_arena_alloc(c, n * 4, &off), 0);
	put_ids(c, off, n);
	struct kvd_sqe q;
	kvc_prep_prefill(&q, s, 0, 5, off, n);
	q.flags = KVD_SQE_PROGRESS;
	assert_int_equal(kvc_submit(c, &q), 0);
	int progress = 0, last = 0;
	struct kvd_cqe e;
	for (;;) {
		assert_int_equal(kvc_wait(c, &e, 300000), 0);
		if (!(e.flags & KVD_CQE_MORE))
			break;
		assert_true(e.flags & KVD_CQE_PROGRESS);
		assert_int_equal(e.aux, n);
		assert_true(e.res >= last && e.res <= (int)n);
		last = e.res;
		progress++;
	}
	assert_int_equal(e.res, (int)n);
	assert_false(e.flags & KVD_CQE_PROGRESS);
	print_message("  %d progress CQEs for %u positions\n", progress, n);
	kvc_close(c);
}

/* kvctl on a terminal: a prefill over a second draws "prefill N/M positions", erased before the text. */
static void test_contract_progress_line(void **state)
{
	(void)state;
	need_feature(KVD_FEAT_PROGRESS, "KVD_FEAT_PROGRESS");
	/* ~2000 positions: over a second on 2 cores, not minutes under load; ~700 under ASan (still many seconds) */
	static char prompt[6000];
	const size_t len = KW_HAVE_ASAN ? sizeof(prompt) / 3 : sizeof(prompt);
	size_t n = 0;
	while (n + 16 < len)
		n += (size_t)snprintf(prompt + n, sizeof(prompt) - n, "word%zu ", n % 997);
	int master;
	pid_t pid = forkpty(&master, NULL, NULL, NULL);
	assert_true(pid >= 0);
	if (pid == 0) {
		execl(KVCTL, KVCTL, "--socket", D.sock, "generate", "-n", "1", prompt, (char *)NULL);
		_exit(127);
	}
	static char out[65536];
	size_t got = 0;
	for (ssize_t k; got < sizeof(out) - 1 && (k = read(master, out + got, sizeof(out) - 1 - got)) > 0;)
		got += (size_t)k;	/* EIO once the child closed the terminal */
	out[got] = 0;
	close(master);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	const char *ft = strstr(out, "first token ");
	assert_non_null(ft);
	double first_ms = atof(ft + strlen("first token "));
	const char *line = strstr(out, "\rprefill ");
	print_message("  first token after %.0f ms; progress line %s\n", first_ms, line ? "shown" : "not shown");
	if (first_ms > 1500)	/* the prefill took over a second: the line must have shown */
		assert_non_null(line);
	if (line)
		assert_non_null(strstr(line, "\r\033[K"));
}

/* A request the drain ends: "kvd is shutting down", exit status 3. */
static void test_contract_shutdown(void **state)
{
	(void)state;
	need_feature(KVD_FEAT_PROGRESS, "the uapi additions (KVD_FEAT_PROGRESS as their mark)");
	struct kvd_proc d2;
	const char *extra[] = { "--drain-timeout", "300", NULL };
	assert_int_equal(kp_start(&d2, extra), 0);
	const char *argv[] = { KVCTL, "--socket", d2.sock, "generate", "-n", "4000",
			       "1, 2, 3, 4, 5, 6, 7, 8,", NULL };
	char out[128];
	pid_t pid = start_cmd(argv, NULL, "shutdown");
	snprintf(out, sizeof(out), "%s/shutdown.out", tmpdir);
	int ok = wait_output(out, pid) == 0;
	kill(d2.pid, SIGTERM);
	struct run r;
	finish_cmd(pid, "shutdown", &r);
	kp_cleanup(&d2);
	assert_true(ok);
	assert_int_equal(r.status, 3);
	assert_non_null(strstr(r.err, "kvd is shutting down"));
	run_free(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_strerror),
		cmocka_unit_test_teardown(test_arm_poll_loop, teardown),
		cmocka_unit_test_teardown(test_generate_text, teardown),
		cmocka_unit_test_teardown(test_generate_text_cancel_cqe, teardown),
		cmocka_unit_test_teardown(test_generate_text_wait_error, teardown),
		cmocka_unit_test_teardown(test_session_token, teardown),
		cmocka_unit_test_teardown(test_reconnect_off, teardown),
		cmocka_unit_test_teardown(test_reconnect_gives_up, teardown),
		cmocka_unit_test_teardown(test_reconnect_restart, teardown),
		cmocka_unit_test_teardown(test_kvctl_prefill_only, teardown),
		cmocka_unit_test_teardown(test_kvctl_system_needs_chat, teardown),
		cmocka_unit_test_teardown(test_kvctl_context_overflow, teardown),
		cmocka_unit_test_teardown(test_kvctl_request_limit, teardown),
		cmocka_unit_test_teardown(test_kvctl_stats_steps, teardown),
		cmocka_unit_test_teardown(test_kvctl_info_pid, teardown),
		cmocka_unit_test_teardown(test_kvctl_poll_sleeps, teardown),
		cmocka_unit_test_teardown(test_kvctl_chat_restart, teardown),
		cmocka_unit_test_teardown(test_kvctl_connect_hints, teardown),
		cmocka_unit_test_teardown(test_contract_chat_system, teardown),
		cmocka_unit_test_teardown(test_contract_plain_default, teardown),
		cmocka_unit_test_teardown(test_contract_progress_cqes, teardown),
		cmocka_unit_test_teardown(test_contract_progress_line, teardown),
		cmocka_unit_test_teardown(test_contract_shutdown, teardown),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
