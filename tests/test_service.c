/* test_service.c — kvd under systemd's protocols: socket activation, READY/STATUS/WATCHDOG/RELOADING/STOPPING, SIGHUP. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shm/kvclient.h"
#include "tests/lib/proc.h"

/*
 * One daemon for the whole file, started the way systemd starts it:
 * systemd-socket-activate binds the socket, waits for the first
 * connection and execs kvd with LISTEN_FDS=1; NOTIFY_SOCKET names a
 * datagram socket this test reads, WATCHDOG_USEC asks for pings. The tests
 * run in order and share it: ready, generate, watchdog, reload, stop.
 */

#define WATCHDOG_USEC	1000000		/* 1 s: pings every 500 ms */

static struct {
	char why[160];		/* non-empty: skip every test, saying this */
	char dir[64];
	char sock[96];
	char notify[96];
	char conf[96];
	char log[96];
	int nfd;		/* the notify socket */
	pid_t pid;		/* kvd (systemd-socket-activate execs it in place) */
	int ready;
} S;


static int in_path(const char *prog)
{
	const char *path = getenv("PATH");
	char buf[512];
	for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
		size_t n = strcspn(p, ":");
		snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, p, prog);
		if (!access(buf, X_OK))
			return 1;
		p += n + (p[n] == ':');
	}
	return 0;
}

static void log_tail(void)
{
	kp_file_tail(S.log);
}

static int log_has(const char *text)
{
	char buf[65536];
	FILE *f = fopen(S.log, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return strstr(buf, text) != NULL;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* ---- the notify socket ---- */

struct note {
	char text[1024];
	int64_t at_ms;
	pid_t pid;		/* the sender, from SCM_CREDENTIALS */
};

/* The next datagram within timeout_ms: 0, or -ETIMEDOUT. */
static int next_note(struct note *n, int timeout_ms)
{
	struct pollfd p = { S.nfd, POLLIN, 0 };
	int rc = poll(&p, 1, timeout_ms);
	if (rc <= 0)
		return rc < 0 ? -errno : -ETIMEDOUT;
	struct iovec iov = { n->text, sizeof(n->text) - 1 };
	union {
		char buf[CMSG_SPACE(sizeof(struct ucred))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			     .msg_controllen = sizeof(u.buf) };
	ssize_t got = recvmsg(S.nfd, &mh, 0);
	if (got < 0)
		return -errno;
	n->text[got] = 0;
	n->at_ms = kp_now_ms();
	n->pid = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS) {
			struct ucred cr;
			memcpy(&cr, CMSG_DATA(cm), sizeof(cr));
			n->pid = cr.pid;
		}
	return 0;
}

/* Does one of the message's lines start with prefix? */
static const char *note_line(const struct note *n, const char *prefix)
{
	size_t pl = strlen(prefix);
	for (const char *l = n->text; l && *l;) {
		if (!strncmp(l, prefix, pl))
			return l;
		l = strchr(l, '\n');
		l = l ? l + 1 : NULL;
	}
	return NULL;
}

/*
 * Read messages until one has a line starting with prefix, within
 * timeout_ms. Every STATUS= line seen on the way is appended to statuses
 * (when not NULL).
 */
static int wait_note(const char *prefix, int timeout_ms, struct note *out, char *statuses, size_t len)
{
	int64_t end = kp_now_ms() + timeout_ms;
	struct note n;
	for (;;) {
		int left = (int)(end - kp_now_ms());
		if (left < 0 || next_note(&n, left))
			return -ETIMEDOUT;
		const char *st = note_line(&n, "STATUS=");
		if (st && statuses) {
			size_t at = strlen(statuses);
			snprintf(statuses + at, len - at, "%.*s\n", (int)strcspn(st, "\n"), st);
		}
		if (note_line(&n, prefix)) {
			if (out)
				*out = n;
			return 0;
		}
	}
}

/* ---- the daemon ---- */

/* 1 when a listening unix socket is bound at path (/proc/net/unix: __SO_ACCEPTCON in Flags). */
static int listening(const char *path)
{
	FILE *f = fopen("/proc/net/unix", "r");
	char line[512];
	int found = 0;
	size_t n = strlen(path);
	while (f && !found && fgets(line, sizeof(line), f)) {
		unsigned long flags;
		size_t len = strcspn(line, "\n");
		line[len] = 0;
		if (len > n && !strcmp(line + len - n, path) && line[len - n - 1] == ' ' &&
		    sscanf(line, "%*s %*s %*s %lx", &flags) == 1)
			found = (flags & 0x10000) != 0;
	}
	if (f)
		fclose(f);
	return found;
}

static int start(void)
{
	snprintf(S.dir, sizeof(S.dir), "/tmp/kvd-service.XXXXXX");
	if (!mkdtemp(S.dir))
		return -errno;
	snprintf(S.sock, sizeof(S.sock), "%s/kvd.sock", S.dir);
	snprintf(S.notify, sizeof(S.notify), "%s/notify", S.dir);
	snprintf(S.conf, sizeof(S.conf), "%s/kvd.conf", S.dir);
	snprintf(S.log, sizeof(S.log), "%s/kvd.log", S.dir);
	write_file(S.conf, "# the test's kvd.conf\nmax-sessions = 4\nkv-blocks = 256\n");

	S.nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", S.notify);
	int one = 1;
	if (S.nfd < 0 || bind(S.nfd, (struct sockaddr *)&a, sizeof(a)) ||
	    setsockopt(S.nfd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)))
		return -errno;

	char e_notify[160], e_wd[64], e_conf[160];
	snprintf(e_notify, sizeof(e_notify), "NOTIFY_SOCKET=%s", S.notify);
	snprintf(e_wd, sizeof(e_wd), "WATCHDOG_USEC=%d", WATCHDOG_USEC);
	snprintf(e_conf, sizeof(e_conf), "KVD_CONFIG=%s", S.conf);
	const char *argv[] = { "systemd-socket-activate", "--seqpacket", "-l", S.sock,
			       "-E", e_notify, "-E", e_wd, "-E", e_conf,
			       kp_bin(), "--model", kp_model(), "--log-level", "info",
			       "--drain-timeout", "3000", "--bpf", "off", NULL };
	pid_t pid = kp_spawn(argv, S.log, 1, NULL, NULL);
	if (pid < 0)
		return pid;
	S.pid = pid;
	/*
	 * systemd-socket-activate binds, then listens: the path appears before
	 * a connection is accepted. Wait for the listening state without
	 * connecting, since the first connection is what activates kvd.
	 */
	for (int64_t end = kp_now_ms() + kw_ms(30000); !listening(S.sock); usleep(10000))
		if (kp_now_ms() > end || waitpid(pid, NULL, WNOHANG) == pid) {
			log_tail();
			return -ETIMEDOUT;
		}
	return 0;
}

static int group_setup(void **state)
{
	(void)state;
	struct io_uring r;
	S.nfd = -1;
	if (!in_path("systemd-socket-activate"))
		snprintf(S.why, sizeof(S.why), "systemd-socket-activate is not installed (package systemd)");
	else if (access(kp_bin(), X_OK))
		snprintf(S.why, sizeof(S.why), "%s is missing: run `make` first", kp_bin());
	else if (access(kp_model(), R_OK))
		snprintf(S.why, sizeof(S.why), "no model at %s: run `make model`", kp_model());
	else if (io_uring_queue_init(2, &r, 0))
		snprintf(S.why, sizeof(S.why), "io_uring is not available here");
	else
		io_uring_queue_exit(&r);
	if (S.why[0])
		return 0;
	int rc = start();
	if (rc)
		snprintf(S.why, sizeof(S.why), "could not start systemd-socket-activate: %s", strerror(-rc));
	return rc ? -1 : 0;
}

static int group_teardown(void **state)
{
	(void)state;
	if (S.pid > 0) {
		kill(S.pid, SIGKILL);
		waitpid(S.pid, NULL, 0);
	}
	if (S.nfd >= 0)
		close(S.nfd);
	if (S.dir[0]) {
		unlink(S.sock);
		unlink(S.notify);
		unlink(S.conf);
		unlink(S.log);
		rmdir(S.dir);
	}
	return 0;
}

/* A failed test's connections (the daemon is the group's). */
static int test_teardown(void **state)
{
	(void)state;
	kp_close_all();
	return 0;
}

#define NEED_DAEMON()						\
	do {							\
		if (S.why[0]) {					\
			print_message("skipped: %s\n", S.why);	\
			skip();					\
		}						\
		if (!S.ready && S.pid <= 0)			\
			fail_msg("the daemon is gone");		\
	} while (0)

static void test_ready_after_model_load(void **state)
{
	(void)state;
	NEED_DAEMON();
	/* Nothing runs yet: the first connection makes systemd-socket-activate exec kvd. */
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", S.sock);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);

	char statuses[4096] = "";
	struct note n;
	if (wait_note("READY=1", kw_ms(KW_HANG_MS), &n, statuses, sizeof(statuses))) {
		log_tail();
		fail_msg("no READY=1 within %d s; status lines seen:\n%s", kw_ms(KW_HANG_MS) / 1000, statuses);
	}
	S.ready = 1;
	print_message("status before READY=1:\n%s", statuses);
	/* In order: the model, then the pool, then ready; all from kvd itself (NotifyAccess=main). */
	char *load = strstr(statuses, "STATUS=loading model ");
	char *pool = strstr(statuses, "STATUS=reserving the KV pool");
	assert_non_null(load);
	assert_non_null(pool);
	assert_true(load < pool);
	assert_non_null(strstr(load, kp_model()));
	assert_int_equal(n.pid, S.pid);
	/* The model was loaded and the pool reserved before READY=1 was sent. */
	assert_true(log_has("KV cache f16"));
	assert_true(log_has("(socket from systemd)"));
	assert_true(log_has("watchdog: a ping every 500 ms"));
	close(fd);
}

static void test_generate_through_activated_socket(void **state)
{
	(void)state;
	NEED_DAEMON();
	struct kvc_conn *c = NULL;
	int rc = kp_connect(&c, S.sock);
	if (rc) {
		log_tail();
		fail_msg("kvc_connect(%s): %s", S.sock, strerror(-rc));
	}
	/* The file's value: kvd read KVD_CONFIG. */
	assert_int_equal(kvc_info(c)->max_sessions, 4);
	uint32_t session, in_off, out_off;
	const char *prompt = "The capital of France is";
	assert_int_equal(kvc_session_open(c, &session), 0);
	assert_int_equal(kvc_arena_alloc(c, (uint32_t)strlen(prompt), &in_off), 0);
	assert_int_equal(kvc_arena_alloc(c, 16 * sizeof(uint32_t), &out_off), 0);
	memcpy(kvc_arena(c, NULL) + in_off, prompt, strlen(prompt));
	struct kvd_sqe sqe;
	struct kvd_cqe cqe;
	kvc_prep_generate(&sqe, session, 0, 7, in_off, (uint32_t)strlen(prompt), out_off, 16);
	sqe.flags = KVD_SQE_TEXT;
	assert_int_equal(kvc_submit(c, &sqe), 0);
	assert_int_equal(kvc_wait(c, &cqe, kw_ms(KW_HANG_MS)), 0);
	assert_int_equal(cqe.user_data, 7);
	assert_true(cqe.res > 0 && cqe.res <= 16);
	const uint32_t *ids = (const uint32_t *)(kvc_arena(c, NULL) + out_off);
	char text[512] = "";
	size_t at = 0;
	for (int i = 0; i < cqe.res; i++) {
		int n = kvc_token_text(c, ids[i], text + at, sizeof(text) - at);
		if (n > 0 && (size_t)n < sizeof(text) - at)
			at += (size_t)n;
	}
	print_message("generated %d tokens: %s\n", cqe.res, text);
	assert_true(at > 0);

	/* While the session is open, the status counts it. */
	char statuses[8192] = "";
	assert_int_equal(wait_note("WATCHDOG=1", kw_ms(10000), NULL, NULL, 0), 0);
	assert_int_equal(wait_note("STATUS=serving", kw_ms(10000), NULL, statuses, sizeof(statuses)), 0);
	print_message("%s", statuses);
	assert_non_null(strstr(statuses, "1 sessions on 1 connections"));
	assert_non_null(strstr(statuses, "cpu backend, KV pool 256 blocks of 16 tokens"));
	kp_close(c);
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

/*
 * The daemon pings every half WATCHDOG_USEC. On a loaded machine one ping
 * can come late and the next on time, so single gaps say little: the
 * median of six says what the timer is set to (a flood or a stall moves it).
 */
static void test_watchdog_interval(void **state)
{
	(void)state;
	NEED_DAEMON();
	enum { PINGS = 7 };
	int64_t t[PINGS], gaps[PINGS - 1];
	int n = 0;
	struct note m = { .pid = 0 };
	/* Pings queued while earlier tests ran arrive at once: drain them first. */
	while (!next_note(&m, 0))
		;
	const int64_t end = kp_now_ms() + kw_ms(60000);
	while (n < PINGS && kp_now_ms() < end &&
	       !wait_note("WATCHDOG=1", (int)(end - kp_now_ms()), &m, NULL, 0)) {
		t[n++] = m.at_ms;
		assert_int_equal(m.pid, S.pid);
	}
	assert_int_equal(n, PINGS);
	print_message("watchdog gaps (ms):");
	for (int i = 1; i < n; i++) {
		gaps[i - 1] = t[i] - t[i - 1];
		print_message(" %lld", (long long)gaps[i - 1]);
	}
	qsort(gaps, PINGS - 1, sizeof(gaps[0]), cmp_i64);
	const int64_t median = (gaps[(PINGS - 1) / 2 - 1] + gaps[(PINGS - 1) / 2]) / 2;
	print_message("; median %lld\n", (long long)median);
	/* About 500 ms: well inside WATCHDOG_USEC, and not flooding. */
	assert_true(median > 300);
	assert_true(median < WATCHDOG_USEC / 1000);
}

static void test_sighup_reload(void **state)
{
	(void)state;
	NEED_DAEMON();
	/* One live change, one that needs a restart. */
	write_file(S.conf, "max-sessions = 6\nkv-blocks = 512\n");
	assert_int_equal(kill(S.pid, SIGHUP), 0);
	char statuses[4096] = "";
	assert_int_equal(wait_note("RELOADING=1", kw_ms(30000), NULL, statuses, sizeof(statuses)), 0);
	assert_int_equal(wait_note("READY=1", kw_ms(30000), NULL, statuses, sizeof(statuses)), 0);
	struct kvc_conn *c = NULL;
	assert_int_equal(kp_connect(&c, S.sock), 0);
	assert_int_equal(kvc_info(c)->max_sessions, 6);
	/* The socket was opened by this test (as systemd would): HELLO names the daemon, not us. */
	assert_int_equal(kvc_info(c)->daemon_pid, S.pid);
	assert_int_equal(kvc_info(c)->kv_blocks_total, 256);
	kp_close(c);
	assert_true(log_has("reload: max-sessions 4 -> 6"));
	assert_true(log_has("reload: kv-blocks = 512 ("));
	assert_true(log_has("needs a restart; still 256"));

	/* A broken file: logged, and the daemon keeps serving with what it has. */
	write_file(S.conf, "max-sessions = 5\nmax-sessions = 7\n");
	assert_int_equal(kill(S.pid, SIGHUP), 0);
	assert_int_equal(wait_note("READY=1", kw_ms(30000), NULL, NULL, 0), 0);
	assert_int_equal(kp_connect(&c, S.sock), 0);
	assert_int_equal(kvc_info(c)->max_sessions, 6);
	kp_close(c);
	assert_true(log_has(":2: max-sessions is already set on line 1; the running configuration stays"));
}

static void test_sigterm_stopping(void **state)
{
	(void)state;
	NEED_DAEMON();
	assert_int_equal(kill(S.pid, SIGTERM), 0);
	char statuses[4096] = "";
	struct note n;
	assert_int_equal(wait_note("STOPPING=1", kw_ms(30000), &n, statuses, sizeof(statuses)), 0);
	assert_non_null(note_line(&n, "STATUS=draining"));
	int st = 0;
	pid_t w = 0;
	for (int64_t end = kp_now_ms() + kw_ms(60000); (w = waitpid(S.pid, &st, WNOHANG)) == 0 && kp_now_ms() < end;)
		usleep(10000);
	if (w != S.pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
		log_tail();
		fail_msg("kvd did not exit 0 after SIGTERM (wait status %#x)", st);
	}
	S.pid = 0;
	/* The socket belongs to whoever activated kvd: still there. */
	struct stat sb;
	assert_int_equal(stat(S.sock, &sb), 0);
	assert_true(S_ISSOCK(sb.st_mode));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_ready_after_model_load, test_teardown),
		cmocka_unit_test_teardown(test_generate_through_activated_socket, test_teardown),
		cmocka_unit_test_teardown(test_watchdog_interval, test_teardown),
		cmocka_unit_test_teardown(test_sighup_reload, test_teardown),
		cmocka_unit_test_teardown(test_sigterm_stopping, test_teardown),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
