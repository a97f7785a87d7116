/*
 * test_hostile_limits.c — issue #20: hostile local clients against a real
 * daemon. Each test plays one attack (fd-carrying replies left unread, a
 * connection flood from one uid, thousands of uids, a client that stalls
 * holding the KV pool, a full CQ at SIGTERM, the model file truncated under
 * the daemon) and checks that everyone else is still served. A control
 * round trip to a server that never answers must time out in libkvclient.
 * The tests that run clients as other uids need root; they skip otherwise.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <grp.h>
#include <poll.h>
#include <linux/capability.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <linux/sockios.h>
#include "daemon/model/gguf.h"
#include "tests/lib/proc.h"
#include "tests/lib/wire.h"

#define N_ATTACK 8	/* item 7: attacking connections */
#define N_HELLO 400	/* HELLOs each of them sends without reading a reply */
#define N_UIDS 4200	/* item 9: more distinct uids than today's table holds (4096) */
#define UID_FLOOD 65541	/* item 8: the flooding uid; no real account uses it */
#define UID_BASE 200000	/* item 9: uids UID_BASE .. UID_BASE + N_UIDS, then UID_NEW */
#define UID_NEW 300000

static struct kvd_proc D;
static struct wire W[N_ATTACK + 1];
static pid_t kids[8];
static char model_dir[64], model_copy[128];
static gid_t nogroup;

/*
 * A bound for something that must happen "eventually": generous, never a
 * speed requirement; scaled as every test wait is (tests/lib/wait.h).
 */
static int bound_ms(int ms)
{
	return kw_ms(ms);
}

#define HANG_MS bound_ms(120000)

static int setup(void **state)
{
	(void)state;
	for (int i = 0; i <= N_ATTACK; i++)
		wire_init(&W[i]);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	for (int i = 0; i <= N_ATTACK; i++)
		wire_close(&W[i]);
	for (unsigned i = 0; i < sizeof(kids) / sizeof(kids[0]); i++)
		if (kids[i] > 0) {
			kill(kids[i], SIGKILL);
			waitpid(kids[i], NULL, 0);
			kids[i] = 0;
		}
	if (D.pid) {
		kill(D.pid, SIGKILL);
		waitpid(D.pid, NULL, 0);
		D.pid = 0;
	}
	kp_cleanup(&D);
	if (model_copy[0]) {
		unlink(model_copy);
		model_copy[0] = 0;
	}
	if (model_dir[0]) {
		rmdir(model_dir);
		model_dir[0] = 0;
	}
	return 0;
}

static void need_root(void)
{
	kp_skip_without_uring();
	const char *why = NULL;
	struct group *g = NULL;
	if (geteuid() != 0)
		why = "needs root to run clients as other uids";
	else if (!(g = getgrnam("nogroup")))
		why = "no group named nogroup to give the socket";
	if (why) {
		print_message("skipped: %s\n", why);
		skip();
	}
	nogroup = g->gr_gid;
}

static void start(const char *const *args)
{
	kp_skip_without_uring();
	assert_int_equal(kp_start(&D, args), 0);
}

/* In a child: become uid (group nogroup, no supplementary groups); _exit(100) if refused. */
static void become(uid_t uid)
{
	if (setgroups(0, NULL) || setgid(nogroup) || setuid(uid)) {
		fprintf(stderr, "cannot become uid %u: %s\n", (unsigned)uid, strerror(errno));
		_exit(100);
	}
}

/* Wait up to ms for pid: its exit code (128 + signal if killed), or -ETIMEDOUT (then killed). */
static int wait_bounded(pid_t pid, int ms)
{
	int st = 0;
	pid_t w;
	int64_t end = kp_now_ms() + ms;
	while ((w = waitpid(pid, &st, WNOHANG)) == 0 && kp_now_ms() < end)
		kp_sleep_ms(10);
	if (w == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return -ETIMEDOUT;
	}
	if (w < 0)
		return -errno;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* n distinct prompt ids (salted) inside the vocabulary. */
static void prompt_ids(uint32_t *ids, uint32_t n, uint32_t salt)
{
	for (uint32_t i = 0; i < n; i++)
		ids[i] = 300 + (salt * 7919 + i * 17) % 40000;
}

/* Connect, open a session, generate 8 tokens: 8, or -errno. Uses libkvclient. */
static int generate8(uint32_t salt)
{
	uint32_t ids[16], n = 16, max = 8;
	prompt_ids(ids, n, salt);
	const uint32_t *p[1] = { ids };
	return kp_generate(D.sock, 1, p, &n, &max);
}

/* The child's half of fresh_client(): exit 0 when generate8() gave 8 tokens. */
static int fresh_child(uint32_t salt)
{
	int rc = generate8(salt);
	if (rc != 8)
		fprintf(stderr, "fresh client: connect/open/generate gave %d (%s)\n", rc,
			rc < 0 ? strerror(-rc) : "too few tokens");
	return rc == 8 ? 0 : 1;
}

/*
 * A fresh libkvclient client in a child (as uid unless it is 0): connect,
 * session, 8 tokens. 0 on success; fails the test if it hangs past the
 * bound (libkvclient today waits forever for a reply that never comes).
 */
static void fresh_client(uid_t uid, uint32_t salt, const char *what)
{
	pid_t pid = kp_fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (uid)
			become(uid);
		_exit(fresh_child(salt));
	}
	int rc = wait_bounded(pid, HANG_MS);
	if (rc == 100) {
		print_message("skipped: this root cannot switch to uid %u\n", (unsigned)uid);
		skip();
	}
	if (rc == -ETIMEDOUT) {
		kp_log_tail(&D);
		fail_msg("%s: a fresh client (uid %u) got no answer within %d ms", what, (unsigned)uid,
			 HANG_MS);
	}
	if (rc) {
		kp_log_tail(&D);
		fail_msg("%s: a fresh client (uid %u) could not generate (child status %d)", what,
			 (unsigned)uid, rc);
	}
}

/* ---- item 7: fd-carrying replies left unread ---- */

static int hello_call(struct wire *r, uint32_t features, struct kvd_hello_rep *rep, int *fds, int *nfds)
{
	struct kvd_hello_req q = { .hdr = wire_hdr(KVD_MSG_HELLO, sizeof(q)),
				   .abi_version = KVD_ABI_VERSION, .features = features };
	*nfds = 0;
	int n = wire_call(r, &q, sizeof(q), rep, sizeof(*rep), fds, nfds);
	if (n < 0)
		return n;
	return rep->hdr.status ? rep->hdr.status : n == (int)sizeof(*rep) ? 0 : -EPROTO;
}

/*
 * Item 7, the contract: a connection is passed the vocabulary memfd at most
 * once (a later HELLO's reply has KVD_HELLOF_VOCAB clear and no fd) and the
 * region's three fds once, so whatever it asks, its replies carry at most
 * 4 fds in all. Today every HELLO with KVD_FEAT_VOCAB passes the memfd again.
 */
static void test_vocab_fd_once(void **state)
{
	(void)state;
	static const char *const args[] = { "--threads", "1", NULL };
	start(args);
	struct wire *r = &W[0];
	assert_int_equal(wire_connect(r, D.sock), 0);
	int total = 0;
	for (int i = 0; i < 20; i++) {
		struct kvd_hello_rep rep;
		int fds[4], nfds = 0;
		assert_int_equal(hello_call(r, KVD_FEAT_ALL, &rep, fds, &nfds), 0);
		for (int k = 0; k < nfds; k++)
			close(fds[k]);
		total += nfds;
		if (i == 0) {
			assert_true(rep.flags & KVD_HELLOF_VOCAB);
			assert_int_equal(nfds, 1);
		} else if ((rep.flags & KVD_HELLOF_VOCAB) || nfds) {
			fail_msg("HELLO #%d passed the vocabulary again (flags %#x, %d fds)", i + 1,
				 rep.flags, nfds);
		}
	}
	uint32_t s1, s2;
	assert_int_equal(wire_session_open(r, 0, 0, &s1), 0);	/* it checks: 3 fds, once */
	assert_int_equal(wire_session_open(r, 0, 0, &s2), 0);	/* and none now */
	total += 3;
	assert_true(total <= 4);
	/* Still a working client. */
	struct kvd_stats_rep st;
	assert_int_equal(wire_stats(r, &st), 0);
	wire_close(r);
	assert_int_equal(generate8(1), 8);
	assert_int_equal(kp_stop(&D), 0);
}

/*
 * kp_start_ex's pre_exec for item 7: the daemon (root) without
 * CAP_SYS_RESOURCE and CAP_SYS_ADMIN, which would exempt it from the
 * kernel's limit on fds in flight, and with RLIMIT_NOFILE 256, which is
 * that limit (too_many_unix_fds(): the sender's unix_inflight against its
 * RLIMIT_NOFILE).
 */
static void no_caps_nofile_256(void *arg)
{
	(void)arg;
	struct rlimit r;
	if (prctl(PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0) ||
	    prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) || getrlimit(RLIMIT_NOFILE, &r))
		_exit(125);
	r.rlim_cur = 256;
	if (setrlimit(RLIMIT_NOFILE, &r))
		_exit(125);
}

/* Whether a child can drop both capabilities from its bounding set (needs CAP_SETPCAP). */
static int can_drop_caps(void)
{
	pid_t pid = kp_fork();
	if (pid < 0)
		return 0;
	if (pid == 0)
		_exit(prctl(PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0) ||
		      prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) ? 1 : 0);
	return wait_bounded(pid, bound_ms(30000)) == 0;
}

/* Blocking sends, bounded: a daemon that stops reading must not hang the attacker (the test). */
static int send_bounded(struct wire *r, const void *msg, size_t len)
{
	struct timeval tv = { bound_ms(30000) / 1000, 0 };
	setsockopt(r->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return send(r->fd, msg, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -errno;
}

/*
 * Item 7, the attack: N_ATTACK connections each send N_HELLO HELLOs asking
 * for the vocabulary, then a SESSION_OPEN, and never read a reply. Every
 * reply today carries the vocabulary memfd, and every fd sitting unread in
 * a socket counts against the daemon's uid: past RLIMIT_NOFILE of them the
 * kernel fails the daemon's sendmsg with ETOOMANYREFS, for every client
 * alike, and libkvclient waits for its HELLO reply forever. MUST HOLD: with
 * the attackers still connected, a fresh libkvclient client connects, opens
 * a session and generates.
 */
static void test_unread_fd_replies(void **state)
{
	(void)state;
	kp_skip_without_uring();
	if (geteuid() != 0 || !can_drop_caps()) {
		print_message("skipped: cannot start a daemon without CAP_SYS_RESOURCE and CAP_SYS_ADMIN "
			      "(needs root with CAP_SETPCAP)\n");
		skip();
	}
	static const char *const args[] = { "--threads", "1", NULL };
	assert_int_equal(kp_start_ex(&D, args, no_caps_nofile_256, NULL), 0);
	int sent = 0;
	for (int i = 0; i < N_ATTACK; i++) {
		struct wire *r = &W[i];
		assert_int_equal(wire_connect(r, D.sock), 0);
		for (int k = 0; k < N_HELLO; k++) {
			struct kvd_hello_req q = { .hdr = wire_hdr(KVD_MSG_HELLO, sizeof(q)),
						   .abi_version = KVD_ABI_VERSION,
						   .features = KVD_FEAT_ALL };
			q.hdr.seq = ++r->seq;
			if (send_bounded(r, &q, sizeof(q)))
				break;
			sent++;
		}
		struct kvd_session_open_req o = { .hdr = wire_hdr(KVD_MSG_SESSION_OPEN, sizeof(o)) };
		o.hdr.seq = ++r->seq;
		if (!send_bounded(r, &o, sizeof(o)))
			sent++;
	}
	/* Let the daemon take every request (our unread bytes leave our send queue). */
	for (int i = 0; i < N_ATTACK; i++) {
		int64_t end = kp_now_ms() + bound_ms(30000);
		int q = 1;
		while (kp_now_ms() < end && !ioctl(W[i].fd, SIOCOUTQ, &q) && q > 0)
			kp_sleep_ms(10);
	}
	kp_sleep_ms(200);
	print_message("%d requests sent on %d connections, no reply read\n", sent, N_ATTACK);
	assert_int_not_equal(kill(D.pid, 0), -1);
	fresh_client(0, 7, "after unread fd-carrying replies");
	for (int i = 0; i < N_ATTACK; i++)
		wire_close(&W[i]);
	assert_int_equal(kp_stop(&D), 0);
}

/* ---- item 7: libkvclient bounds its control round trips ---- */

struct fake {
	char dir[32], path[64];
	int lfd;
};

static void fake_open(struct fake *f)
{
	snprintf(f->dir, sizeof(f->dir), "/tmp/kvd-fake.XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->path, sizeof(f->path), "%s/kvd.sock", f->dir);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", f->path);
	f->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	assert_true(f->lfd >= 0);
	assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(f->lfd, 8), 0);
}

static void fake_close(struct fake *f)
{
	if (f->lfd >= 0)
		close(f->lfd);
	f->lfd = -1;
	unlink(f->path);
	rmdir(f->dir);
}

/* Accept one client within the bound: its fd, or -1. */
static int fake_accept(struct fake *f)
{
	struct pollfd p = { f->lfd, POLLIN, 0 };
	if (poll(&p, 1, HANG_MS) != 1)
		return -1;
	return accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
}

/* What ctrl_timeout_child() tries against the fake server. */
enum { TO_CONNECT, TO_STATS, TO_SESSION_OPEN };
static const char *const to_what[] = { "kvc_connect", "kvc_stats", "kvc_session_open" };

static int ctrl_timeout_child(const char *path, int mode)
{
	setenv("KVD_CTRL_TIMEOUT_MS", "300", 1);
	struct kvc_conn *c = NULL;
	int rc = kvc_connect(&c, path);
	if (mode != TO_CONNECT) {
		if (rc) {
			fprintf(stderr, "kvc_connect to the fake server that answers HELLO: %d\n", rc);
			return 2;
		}
		struct kvd_stats_rep st;
		uint32_t s;
		rc = mode == TO_STATS ? kvc_stats(c, &st) : kvc_session_open(c, &s);
	}
	if (rc != -ETIMEDOUT)
		fprintf(stderr, "%s, unanswered: %d, not -ETIMEDOUT (%d)\n", to_what[mode], rc, -ETIMEDOUT);
	kvc_close(c);
	return rc == -ETIMEDOUT ? 0 : 1;
}

/* The fake server's answer to a HELLO: a well-formed reply, no vocabulary. */
static void fake_hello(int fd)
{
	struct kvd_hello_req q;
	struct pollfd p = { fd, POLLIN, 0 };
	if (poll(&p, 1, HANG_MS) != 1 || recv(fd, &q, sizeof(q), 0) != (ssize_t)sizeof(q))
		return;
	struct kvd_hello_rep rep;
	memset(&rep, 0, sizeof(rep));
	rep.hdr = (struct kvd_msg_hdr){ .magic = KVD_MAGIC, .type = KVD_MSG_HELLO, .flags = KVD_MSGF_REPLY,
					.len = sizeof(rep), .seq = q.hdr.seq };
	rep.abi_version = KVD_ABI_VERSION;
	rep.vocab_size = 49152;
	rep.ctx_len = 2048;
	rep.bos_id = rep.eos_id = rep.eot_id = ~0U;
	rep.max_sessions = 8;
	rep.max_sq_entries = 64;
	rep.max_cq_entries = 64;
	rep.max_arena_bytes = 1 << 20;
	rep.kv_block_tokens = 16;
	rep.kv_blocks_total = 64;
	rep.max_tokens = 2048;
	rep.max_slots = 8;
	snprintf(rep.model_name, sizeof(rep.model_name), "fake");
	snprintf(rep.backend, sizeof(rep.backend), "cpu");
	if (send(fd, &rep, sizeof(rep), MSG_NOSIGNAL) != (ssize_t)sizeof(rep))
		print_message("fake server: HELLO reply not sent: %s\n", strerror(errno));
}

/*
 * Item 7, libkvclient's half: KVD_CTRL_TIMEOUT_MS (default 30000) bounds
 * every control round trip, which then returns -ETIMEDOUT. A fake server
 * (a listening SOCK_SEQPACKET socket of the test) accepts and never answers
 * the HELLO: kvc_connect() returns -ETIMEDOUT. One that answers HELLO and
 * nothing else: kvc_stats(), and on another connection kvc_session_open(),
 * return -ETIMEDOUT. Today each waits forever (the child is killed at the
 * bound). The result is asserted, not the time it took.
 */
static void test_ctrl_timeout(void **state)
{
	(void)state;
	struct fake f = { .lfd = -1 };
	fake_open(&f);
	for (int mode = TO_CONNECT; mode <= TO_SESSION_OPEN; mode++) {
		pid_t pid = kp_fork();
		if (pid == 0)
			_exit(ctrl_timeout_child(f.path, mode));
		assert_true(pid > 0);
		kids[0] = pid;
		int fd = fake_accept(&f);
		if (fd >= 0 && mode != TO_CONNECT)
			fake_hello(fd);
		/* The accepted socket stays open, unanswered, while the child waits. */
		int rc = wait_bounded(pid, HANG_MS);
		kids[0] = 0;
		if (fd >= 0)
			close(fd);
		if (rc) {
			fake_close(&f);
			if (rc == -ETIMEDOUT)
				fail_msg("%s did not return within %d ms with KVD_CTRL_TIMEOUT_MS=300",
					 to_what[mode], HANG_MS);
			fail_msg("%s: child status %d (see its message above)", to_what[mode], rc);
		}
	}
	fake_close(&f);
}

/* ---- item 8: one uid floods the daemon with connections ---- */

struct flood_report {
	int n;		/* connections held before the refusal */
	int rc;		/* the refusal: kvc_connect's result */
};

static int flood_child(int report_fd, int go_fd)
{
	struct rlimit r = { 4096, 4096 };
	setrlimit(RLIMIT_NOFILE, &r);	/* as root still: room for 2000 sockets of our own */
	become(UID_FLOOD);
	static struct kvc_conn *held[2000];
	struct flood_report rep = { 0, 0 };
	while (rep.n < 2000 && !(rep.rc = kvc_connect(&held[rep.n], D.sock)))
		rep.n++;
	if (write(report_fd, &rep, sizeof(rep)) != sizeof(rep))
		return 1;
	char go;
	if (read(go_fd, &go, 1) < 0)
		return 2;	/* hold them until the test has checked root */
	for (int i = 0; i < rep.n; i++)
		kvc_close(held[i]);
	return 0;
}

/*
 * Item 8: a child running as another uid opens connections (and keeps
 * them) until it is refused, at most 2000. Contract: --max-uid-connections
 * (here 16) bounds one uid's connections; the one over it is refused,
 * kvc_connect() returning -EMFILE. MUST HOLD: refused at or before 16, and
 * meanwhile root (another uid) still connects and generates. Today there is
 * no such limit: the child reaches its 2000 (or the daemon's fd limit,
 * where everyone else is refused too).
 */
static void test_uid_connection_flood(void **state)
{
	(void)state;
	need_root();
	static const char *const args[] = { "--socket-group", "nogroup", "--max-uid-connections", "16",
					    "--threads", "1", NULL };
	assert_int_equal(kp_start(&D, args), 0);
	int rep_p[2], go_p[2];
	assert_int_equal(pipe(rep_p), 0);
	assert_int_equal(pipe(go_p), 0);
	pid_t pid = kp_fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(rep_p[0]);
		close(go_p[1]);
		_exit(flood_child(rep_p[1], go_p[0]));
	}
	kids[0] = pid;
	close(rep_p[1]);
	close(go_p[0]);
	struct flood_report rep;
	struct pollfd p = { rep_p[0], POLLIN, 0 };
	int got = poll(&p, 1, HANG_MS) == 1 ? (int)read(rep_p[0], &rep, sizeof(rep)) : -1;
	close(rep_p[0]);
	if (got != (int)sizeof(rep)) {
		close(go_p[1]);
		int rc = wait_bounded(pid, HANG_MS);
		kids[0] = 0;
		if (rc == 100) {
			print_message("skipped: this root cannot switch to uid %u\n", UID_FLOOD);
			skip();
		}
		fail_msg("the flooding child did not report (status %d)", rc);
	}
	print_message("uid %u held %d connections; then kvc_connect gave %d\n", UID_FLOOD, rep.n, rep.rc);
	/* While the flood holds its connections: root is served. */
	int root_rc = generate8(3);
	assert_int_equal(write(go_p[1], "g", 1), 1);
	close(go_p[1]);
	assert_int_equal(wait_bounded(pid, HANG_MS), 0);
	kids[0] = 0;
	assert_int_equal(root_rc, 8);
	assert_true(rep.n <= 16);
	assert_int_equal(rep.rc, -EMFILE);
	assert_int_equal(kp_stop(&D), 0);
}

/* ---- item 9: the per-uid table ---- */

static int uid_once_child(uid_t uid)
{
	alarm(kw_s(120000));	/* bounds the parent's blocking waitpid(): a hung child dies */
	become(uid);
	struct kvc_conn *c;
	int rc = kvc_connect(&c, D.sock);
	if (rc)
		return 1;
	kvc_close(c);
	return 0;
}

/*
 * Item 9: N_UIDS children, each as a uid of its own (UID_BASE + i), connect
 * once and leave, four at a time. Today the daemon's per-uid table (4096
 * entries) keeps every uid forever: once full, every new uid is refused.
 * Contract: an entry goes with its uid's last connection. MUST HOLD: after
 * the flood a new uid (UID_NEW) connects, opens a session and generates,
 * and so does root; none of the flooding uids was refused either.
 */
static void test_uid_table(void **state)
{
	(void)state;
	need_root();
	static const char *const args[] = { "--socket-group", "nogroup", "--threads", "1", NULL };
	assert_int_equal(kp_start(&D, args), 0);
	enum { PAR = 4 };
	pid_t run[PAR] = { 0 };
	int refused = 0, next = 0, live = 0;
	int64_t end = kp_now_ms() + bound_ms(600000);
	while ((next < N_UIDS || live) && kp_now_ms() < end) {
		for (int k = 0; k < PAR && next < N_UIDS; k++)
			if (!run[k]) {
				pid_t pid = kp_fork();
				assert_true(pid >= 0);
				if (pid == 0)
					_exit(uid_once_child(UID_BASE + next));
				run[k] = pid;
				kids[k] = pid;
				next++;
				live++;
			}
		int st;
		pid_t w = waitpid(-1, &st, 0);
		for (int k = 0; k < PAR; k++)
			if (w > 0 && run[k] == w) {
				int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
				if (rc == 100) {
					print_message("skipped: this root cannot switch to uid %u\n",
						      UID_BASE + next);
					skip();
				}
				refused += rc != 0;
				run[k] = kids[k] = 0;
				live--;
			}
	}
	print_message("%d uids connected once each; %d were refused\n", next, refused);
	assert_int_equal(live, 0);
	assert_int_equal(next, N_UIDS);
	assert_int_not_equal(kill(D.pid, 0), -1);
	fresh_client(UID_NEW, 5, "a new uid after 4200 others");
	fresh_client(0, 6, "root after 4200 other uids");
	assert_int_equal(refused, 0);
	assert_int_equal(kp_stop(&D), 0);
}

/* ---- item 10: a stalled client holding the KV pool ---- */

/* Until r's CQ is full and the daemon holds at least held more completions for it. */
static int wait_cq_full(struct wire *r, uint32_t held, int ms)
{
	for (int64_t end = kp_now_ms() + ms; kp_now_ms() < end; kp_sleep_ms(10)) {
		uint32_t tail = __atomic_load_n(&r->cq->tail, __ATOMIC_ACQUIRE);
		uint32_t fl = __atomic_load_n(&r->cq->flags, __ATOMIC_ACQUIRE);
		if (tail - r->cq_head >= r->cq_entries && (fl & KVD_RING_CQ_OVERFLOW) &&
		    __atomic_load_n(&r->cq->overflow, __ATOMIC_ACQUIRE) >= held)
			return 0;
	}
	return -ETIMEDOUT;
}

/* Until r's CQ is full and a CQ's worth is held: the daemon generates nothing more for r. */
static int wait_cq_stalled(struct wire *r, int ms)
{
	return wait_cq_full(r, r->cq_entries, ms);
}

/*
 * Item 10: a pool of 16 blocks (256 positions), no KV quota. Client A (the
 * wire client, a CQ of 4) streams a GENERATE of a 160-token prompt (10
 * blocks, 11 once it decodes) and stops reading its CQ: its generation
 * stalls with the blocks held. B then asks for 100 + 20 positions (8
 * blocks, more than the 5 free), and ranks below A, so today it cannot
 * preempt A and waits without end. Contract: a holder that cannot progress
 * because its CQ is full yields its blocks. MUST HOLD: B's GENERATE
 * completes; and A, once it reads again, still gets its final CQE.
 */
static void test_stalled_holder_yields(void **state)
{
	(void)state;
	static const char *const args[] = { "--kv-blocks", "16", "--threads", "1", NULL };
	start(args);
	struct wire *a = &W[0];
	assert_int_equal(wire_open(a, D.sock, 4, 4), 0);
	const uint32_t na = 160, ma = 64;
	prompt_ids((uint32_t *)a->arena, na, 1);
	struct kvd_sqe q;
	kvc_prep_generate(&q, a->session, 0, 77, 0, na, na * 4, ma);
	q.flags = KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS;
	assert_int_equal(wire_submit(a, &q), 0);
	if (wait_cq_stalled(a, HANG_MS)) {
		kp_log_tail(&D);
		fail_msg("A's CQ never filled");
	}
	struct kvd_stats_rep st;
	assert_int_equal(kp_stats(&D, &st), 0);
	print_message("A stalled holding %llu of %llu blocks\n", (unsigned long long)st.kv_blocks_used,
		      (unsigned long long)st.kv_blocks_total);
	assert_true(st.kv_blocks_used >= 10);

	struct kvc_conn *b;
	uint32_t sb;
	assert_int_equal(kvc_connect(&b, D.sock), 0);
	assert_int_equal(kvc_session_open(b, &sb), 0);
	const uint32_t nb = 100, mb = 20;
	prompt_ids((uint32_t *)kvc_arena(b, NULL), nb, 2);
	kvc_prep_generate(&q, sb, 0, 88, 0, nb, nb * 4, mb);
	q.flags = KVD_SQE_IGNORE_EOS;
	assert_int_equal(kvc_submit(b, &q), 0);
	struct kvd_cqe e;
	int rc;
	while ((rc = kvc_wait(b, &e, HANG_MS)) == -EINTR)
		;
	kvc_close(b);
	if (rc == -ETIMEDOUT) {
		kp_log_tail(&D);
		fail_msg("B's GENERATE did not complete within %d ms while A sat on the pool", HANG_MS);
	}
	assert_int_equal(rc, 0);
	assert_int_equal(e.user_data, 88);
	assert_int_equal(e.res, (int)mb);
	/* A reads again: its request still ends with a final CQE. */
	struct kvd_cqe fin;
	rc = wire_finish(a, 77, &fin, HANG_MS);
	if (rc)
		fail_msg("A's request never finished once A read again: %d", rc);
	print_message("A's final CQE: res %d flags %#x\n", fin.res, fin.flags);
	wire_close(a);
	assert_int_equal(kp_stop(&D), 0);
}

/* ---- item 11: SIGTERM while a client's CQ is full ---- */

/*
 * Item 11: client A (a CQ of 4) has three streaming GENERATEs of 2 tokens
 * in flight and does not read: their 6 CQEs fill the CQ and 2 more wait
 * in the daemon's overflow list. The daemon (--drain-timeout 30000) gets
 * SIGTERM; once it has closed its socket (draining), A reads. Contract: the
 * drain delivers every completion it holds, waiting (up to the drain
 * timeout) for the client to make room. MUST HOLD: A gets a final CQE (no
 * KVD_CQE_MORE) for each of its three requests, then the daemon hangs up and
 * exits 0. Today nothing is left to run, so the drain ends at once and the
 * held completions die with the daemon.
 */
static void test_drain_full_cq(void **state)
{
	(void)state;
	static const char *const args[] = { "--drain-timeout", "30000", "--threads", "1", NULL };
	start(args);
	struct wire *a = &W[0];
	assert_int_equal(wire_open(a, D.sock, 8, 4), 0);
	prompt_ids((uint32_t *)a->arena, 8, 4);
	enum { NREQ = 3, MAXT = 2 };
	for (uint32_t k = 0; k < NREQ; k++) {
		struct kvd_sqe q;
		kvc_prep_generate(&q, a->session, k, 1 + k, 0, 8, 4096 + 256 * k, MAXT);
		q.flags = KVD_SQE_STREAM | KVD_SQE_IGNORE_EOS;
		assert_int_equal(wire_submit(a, &q), 0);
	}
	/* All 3 x 2 CQEs posted: 4 in the CQ, 2 held. */
	if (wait_cq_full(a, NREQ * MAXT - a->cq_entries, HANG_MS)) {
		kp_log_tail(&D);
		fail_msg("A's CQ never filled");
	}
	assert_int_equal(kill(D.pid, SIGTERM), 0);
	/* The socket goes away when the drain begins. */
	int64_t end = kp_now_ms() + HANG_MS;
	while (access(D.sock, F_OK) == 0 && kp_now_ms() < end)
		kp_sleep_ms(10);
	assert_int_not_equal(access(D.sock, F_OK), 0);
	kp_sleep_ms(200);	/* (not needed for the outcome: the engine thread sees the drain) */
	int finals[NREQ] = { 0 }, more = 0, rc;
	struct kvd_cqe e;
	while ((rc = wire_wait(a, &e, HANG_MS)) == 0) {
		if (e.user_data < 1 || e.user_data > NREQ)
			fail_msg("CQE for unknown user_data %llu", (unsigned long long)e.user_data);
		if (e.flags & KVD_CQE_MORE) {
			more++;
			continue;
		}
		finals[e.user_data - 1]++;
	}
	print_message("after SIGTERM: %d streamed CQEs, finals %d %d %d, then %d\n", more, finals[0],
		      finals[1], finals[2], rc);
	wire_close(a);
	int st = 0;
	pid_t w;
	end = kp_now_ms() + HANG_MS;
	while ((w = waitpid(D.pid, &st, WNOHANG)) == 0 && kp_now_ms() < end)
		kp_sleep_ms(10);
	if (w == D.pid)
		D.pid = 0;
	for (int k = 0; k < NREQ; k++)
		if (finals[k] != 1)
			fail_msg("request %d got %d final CQEs through the drain, not 1", k + 1, finals[k]);
	assert_int_equal(rc, -ECONNRESET);
	if (w <= 0)
		fail_msg("kvd did not exit within %d ms of its client's last completion", HANG_MS);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fail_msg("kvd's drain ended with wait status %#x, not exit 0", st);
	kp_cleanup(&D);
}

/* ---- item 13: the model file truncated while it is served ---- */

static int copy_file(const char *from, const char *to, mode_t mode)
{
	int in = open(from, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return -errno;
	int out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (out < 0) {
		int rc = -errno;
		close(in);
		return rc;
	}
	static char buf[1 << 20];
	ssize_t n;
	int rc = 0;
	while ((n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, (size_t)n) != n) {
			rc = -EIO;
			break;
		}
	if (n < 0)
		rc = -errno;
	if (!rc && fchmod(out, mode))	/* not subject to the umask */
		rc = -errno;
	close(in);
	close(out);
	return rc;
}

/* The default model copied to model_copy (mode mode) in a directory of its own; the teardown removes both. */
static void copy_model(mode_t mode)
{
	snprintf(model_dir, sizeof(model_dir), "/tmp/kvd-model.XXXXXX");
	if (!mkdtemp(model_dir)) {
		model_dir[0] = 0;
		fail_msg("mkdtemp: %s", strerror(errno));
	}
	chmod(model_dir, 0755);
	snprintf(model_copy, sizeof(model_copy), "%s/model.gguf", model_dir);
	int rc = copy_file(kp_model(), model_copy, mode);
	if (rc)
		fail_msg("copying %s: %s", kp_model(), strerror(-rc));
}

/*
 * Item 13: the model file is writable by others (0666); the daemon serves
 * it, then someone truncates it to 0 bytes. Today the weights are mapped
 * from the file and the next forward pass dies of SIGBUS. Contract: a model
 * file that others than the daemon's uid may write is copied into the
 * daemon's own memory at load. MUST HOLD: the second generation succeeds
 * and the daemon is still alive.
 */
static void test_model_truncated(void **state)
{
	(void)state;
	kp_skip_without_uring();
	copy_model(0666);
	static const char *const args[] = { "--threads", "1", NULL };
	int rc = kp_start_model(&D, model_copy, args);
	assert_int_equal(rc, 0);
	assert_int_equal(generate8(8), 8);
	assert_int_equal(truncate(model_copy, 0), 0);
	rc = generate8(9);
	int st = 0;
	pid_t w = waitpid(D.pid, &st, WNOHANG);
	if (w == D.pid) {
		D.pid = 0;
		kp_log_tail(&D);
		if (WIFSIGNALED(st))
			fail_msg("kvd died of signal %d after its model file was truncated", WTERMSIG(st));
		fail_msg("kvd exited (status %d) after its model file was truncated", WEXITSTATUS(st));
	}
	assert_int_equal(rc, 8);
	assert_int_equal(kp_stop(&D), 0);
}

/* ---- item 6: a tokenizer larger than the embedding ---- */

/* Whether the file at path holds needle (a log is small). */
static int file_has(const char *path, const char *needle)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	int yes = 0;
	while (f && !yes && fgets(line, sizeof(line), f))
		yes = strstr(line, needle) != NULL;
	if (f)
		fclose(f);
	return yes;
}

/*
 * In the GGUF at path (a copy), give tensor name `rows` rows: its ne[1] in
 * the tensor info, which follows the name (u64 length, bytes) and n_dims
 * (u32). The tensor's data offset stays, so the file stays well-formed.
 */
static int set_rows(const char *path, const char *name, uint64_t rows)
{
	char err[256];
	struct gguf_file *f;
	int rc = gguf_open(&f, path, err, sizeof(err));
	if (rc) {
		print_message("gguf_open %s: %s\n", path, err);
		return rc;
	}
	const struct gguf_tensor *t = gguf_find_tensor(f, name);
	if (!t) {
		gguf_close(f);
		return 0;	/* e.g. no output.weight: tied to the embedding */
	}
	off_t off = (off_t)((const uint8_t *)t->name.ptr - f->base + t->name.len);
	uint32_t n_dims;
	uint64_t ne1;
	memcpy(&n_dims, f->base + off, 4);
	memcpy(&ne1, f->base + off + 12, 8);
	int ok = n_dims == t->n_dims && ne1 == t->ne[1];
	gguf_close(f);
	if (!ok)
		return -EPROTO;
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	rc = pwrite(fd, &rows, 8, off + 12) == 8 ? 0 : -EIO;
	close(fd);
	return rc;
}

/*
 * Item 6: a GGUF whose tokenizer has more tokens (49152) than the embedding
 * has rows (here 1000: token_embd.weight's shape edited in a copy). Every
 * id the tokenizer makes would index past the embedding. Contract: the
 * daemon and `kvd --prompt` create their tokenizer with
 * tokenizer_for_model(), which refuses such a model: the daemon does not
 * start and --prompt fails, each with a message naming the embedding
 * (never a signal). Today the daemon serves it and --prompt runs.
 */
static void test_model_vocab_mismatch(void **state)
{
	(void)state;
	kp_skip_without_uring();
	copy_model(0644);
	assert_int_equal(set_rows(model_copy, "token_embd.weight", 1000), 0);
	assert_int_equal(set_rows(model_copy, "output.weight", 1000), 0);

	static const char *const args[] = { "--threads", "1", NULL };
	int rc = kp_start_model(&D, model_copy, args);
	if (!rc)
		fail_msg("kvd serves a model with 49152 tokens and 1000 embedding rows");
	assert_int_equal(rc, -ECHILD);
	if (!file_has(D.log, "embedding"))
		fail_msg("kvd's refusal does not name the embedding");
	kp_cleanup(&D);

	char log[128];
	snprintf(log, sizeof(log), "%s/prompt.log", model_dir);
	const char *argv[] = { kp_bin(), "--model", model_copy, "--prompt", "Hello there", "-n", "4",
			       "--threads", "1", NULL };
	pid_t pid = kp_spawn(argv, log, 0, NULL, NULL);
	assert_true(pid > 0);
	kids[0] = pid;
	rc = wait_bounded(pid, HANG_MS);
	kids[0] = 0;
	int named = file_has(log, "embedding");
	if (rc != 0 && !named)
		kp_file_tail(log);
	unlink(log);
	if (rc == 0)
		fail_msg("kvd --prompt ran on a model with 49152 tokens and 1000 embedding rows");
	if (rc == -ETIMEDOUT || rc >= 128)
		fail_msg("kvd --prompt did not refuse the model cleanly (status %d)", rc);
	if (!named)
		fail_msg("kvd --prompt's refusal does not name the embedding");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_vocab_fd_once, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unread_fd_replies, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ctrl_timeout, setup, teardown),
		cmocka_unit_test_setup_teardown(test_uid_connection_flood, setup, teardown),
		cmocka_unit_test_setup_teardown(test_uid_table, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stalled_holder_yields, setup, teardown),
		cmocka_unit_test_setup_teardown(test_drain_full_cq, setup, teardown),
		cmocka_unit_test_setup_teardown(test_model_truncated, setup, teardown),
		cmocka_unit_test_setup_teardown(test_model_vocab_mismatch, setup, teardown),
	};
	/* KVD_TEST_FILTER=test_drain* runs only the tests whose names match. */
	const char *only = getenv("KVD_TEST_FILTER");
	if (only && *only)
		cmocka_set_test_filter(only);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
