/*
 * test_isolation.c — one uid against another on the same daemon: the
 * socket's mode and group decide who may connect; a second uid can
 * neither open nor map the first one's session region (not through its
 * /proc fds, not through the daemon's, not through its memory), cannot name
 * its sessions, and gets no hit from its prefix-cache entries. Needs root
 * (to run clients as other uids); skips with the reason otherwise.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <grp.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include "tests/lib/proc.h"

#define UID_A	65531	/* ids no real account uses here; the group is nogroup */
#define UID_B	65532
#define UID_C	65533	/* not in the socket's group */
#define N_SECRET 64	/* four full blocks of 16: registered in the prefix cache */

static struct kvd_proc D;
static gid_t nogroup;

static void need_root(void)
{
	const char *why = kp_no_uring();
	if (!why && geteuid() != 0)
		why = "needs root to run clients as other uids";
	struct group *g = why ? NULL : getgrnam("nogroup");
	if (!why && !g)
		why = "no group named nogroup to give the socket";
	if (why) {
		print_message("skipped: %s\n", why);
		skip();
	}
	nogroup = g->gr_gid;
}

/* What a failed test_region_and_cache_isolation leaves: client A, blocked on its pipe, and the pipes. */
static pid_t CLIENT_A;
static int PIPES[4] = { -1, -1, -1, -1 };

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* Whatever a test left, failed or not: client A, the pipes, the daemon and its files. */
static int teardown(void **state)
{
	(void)state;
	if (CLIENT_A > 0) {
		kill(CLIENT_A, SIGKILL);
		waitpid(CLIENT_A, NULL, 0);
	}
	CLIENT_A = 0;
	for (int i = 0; i < 4; i++)
		close_fd(&PIPES[i]);
	if (D.pid) {
		kill(D.pid, SIGKILL);
		waitpid(D.pid, NULL, 0);
		D.pid = 0;
	}
	kp_cleanup(&D);
	return 0;
}

/* fork, drop to uid/gid (no supplementary groups), run fn; its return value is the exit status. */
static pid_t spawn_as(uid_t uid, gid_t gid, int (*fn)(void *), void *arg)
{
	pid_t pid = kp_fork();
	if (pid == 0) {
		if (setgroups(0, NULL) || setgid(gid) || setuid(uid)) {
			fprintf(stderr, "cannot become uid %u: %s\n", (unsigned)uid, strerror(errno));
			_exit(100);
		}
		/* As an ordinary login would be: changing uid made it non-dumpable. */
		prctl(PR_SET_DUMPABLE, 1);
		_exit(fn(arg));
	}
	return pid;
}

static int wait_status(pid_t pid)
{
	int st;
	if (waitpid(pid, &st, 0) != pid)
		return -1;
	int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	if (rc == 100) {	/* e.g. a user namespace that maps no other uid */
		print_message("skipped: this root cannot switch to another uid\n");
		skip();
	}
	return rc;
}

static int connect_rc(void *arg)
{
	(void)arg;
	struct kvc_conn *c = NULL;
	int rc = kvc_connect(&c, D.sock);
	if (!rc)
		kvc_close(c);
	return rc == 0 ? 0 : rc == -EACCES ? 13 : 99;
}

static void test_socket_permissions(void **state)
{
	(void)state;
	need_root();
	struct stat st;
	/* Default: owner and its group only; another uid is refused by the kernel. */
	assert_int_equal(kp_start(&D, NULL), 0);
	assert_int_equal(stat(D.sock, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0660);
	assert_int_equal(st.st_uid, geteuid());
	assert_int_equal(wait_status(spawn_as(UID_A, nogroup, connect_rc, NULL)), 13);
	assert_int_equal(kp_stop(&D), 0);
	/* --socket-group: members connect, others still cannot. */
	static const char *const args[] = { "--socket-group", "nogroup", NULL };
	assert_int_equal(kp_start(&D, args), 0);
	assert_int_equal(stat(D.sock, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0660);
	assert_int_equal(st.st_gid, nogroup);
	assert_int_equal(wait_status(spawn_as(UID_A, nogroup, connect_rc, NULL)), 0);
	assert_int_equal(wait_status(spawn_as(UID_C, UID_C, connect_rc, NULL)), 13);
	assert_int_equal(kp_stop(&D), 0);
}

/* What A tells B: where its region is and which session it holds. */
struct shared {
	int to_b[2], to_a[2];	/* pipes: A -> parent/B, parent -> A */
	pid_t a_pid;
	char a_range[64];	/* A's mapping of its region, as /proc/PID/map_files names it */
	uint32_t a_session;
};

static void secret(uint32_t *ids)
{
	for (uint32_t i = 0; i < N_SECRET; i++)
		ids[i] = 2000 + (i * 7919) % 30000;
}

static int prefill(struct kvc_conn *c, uint32_t s, uint32_t slot)
{
	uint32_t *a = (uint32_t *)kvc_arena(c, NULL);
	secret(a);
	struct kvd_sqe q;
	struct kvd_cqe cqe;
	kvc_prep_prefill(&q, s, slot, 1 + slot, 0, N_SECRET);
	if (kvc_submit(c, &q) || kp_wait_cqe(&D, c, &cqe))
		return -EIO;
	return cqe.res;
}

/* The address range of this process's mapping of its session region ("start-end"). */
static int find_region(char *range, size_t cap)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int found = 0;
	while (f && !found && fgets(line, sizeof(line), f))
		if (strstr(line, "memfd:kvd-session")) {
			snprintf(range, cap, "%.*s", (int)strcspn(line, " "), line);
			found = 1;
		}
	if (f)
		fclose(f);
	return found ? 0 : -ENOENT;
}

/* Client A: a session with a secret prompt prefilled; waits; then the same prompt again. */
static int client_a(void *arg)
{
	struct shared *sh = arg;
	struct kvc_conn *c;
	uint32_t s;
	if (kvc_connect(&c, D.sock) || kvc_session_open(c, &s))
		return 1;
	if (prefill(c, s, 0) != N_SECRET)
		return 2;
	struct shared me = { .a_pid = getpid(), .a_session = s };
	if (find_region(me.a_range, sizeof(me.a_range)) ||
	    write(sh->to_b[1], &me, sizeof(me)) != sizeof(me))
		return 3;
	char go;
	if (read(sh->to_a[0], &go, 1) != 1)
		return 4;
	/* Its own prefix is still cached for it. */
	if (prefill(c, s, 1) != N_SECRET)
		return 5;
	kvc_close(c);
	return 0;
}

/* Client B: every way into A's region and cache must fail. */
static int client_b(void *arg)
{
	struct shared *sh = arg;
	char p[160];
	int fd;
	snprintf(p, sizeof(p), "/proc/%d/map_files/%s", (int)sh->a_pid, sh->a_range);
	if ((fd = open(p, O_RDWR)) >= 0 || (fd = open(p, O_RDONLY)) >= 0) {
		fprintf(stderr, "B opened A's region through %s\n", p);
		return 10;
	}
	snprintf(p, sizeof(p), "/proc/%d/fd", (int)sh->a_pid);
	DIR *d = opendir(p);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		char f[440];
		snprintf(f, sizeof(f), "%s/%s", p, e->d_name);
		if (e->d_name[0] != '.' && (fd = open(f, O_RDONLY)) >= 0) {
			fprintf(stderr, "B opened A's fd %s\n", f);
			return 15;
		}
	}
	if (d)
		closedir(d);
	snprintf(p, sizeof(p), "/proc/%d/map_files", (int)sh->a_pid);
	d = opendir(p);
	while (d && (e = readdir(d))) {
		char f[440];
		snprintf(f, sizeof(f), "%s/%s", p, e->d_name);
		if (e->d_name[0] != '.' && (fd = open(f, O_RDONLY)) >= 0) {
			fprintf(stderr, "B opened A's mapping %s\n", f);
			return 11;
		}
	}
	if (d)
		closedir(d);
	snprintf(p, sizeof(p), "/proc/%d/fd", (int)D.pid);
	if ((d = opendir(p))) {
		fprintf(stderr, "B listed the daemon's fds\n");
		return 12;
	}
	snprintf(p, sizeof(p), "/proc/%d/mem", (int)sh->a_pid);
	if ((fd = open(p, O_RDONLY)) >= 0) {
		fprintf(stderr, "B opened A's memory\n");
		return 13;
	}
	char buf[16];
	struct iovec local = { buf, sizeof(buf) }, remote = { (void *)&buf, sizeof(buf) };
	if (process_vm_readv(sh->a_pid, &local, 1, &remote, 1, 0) >= 0) {
		fprintf(stderr, "B read A's memory\n");
		return 14;
	}
	/*
	 * Through the daemon: session ids live per connection, so A's id can
	 * only ever name one of B's own. B's first session got the same number
	 * as A's; B closes it, and the id then names nothing at all.
	 */
	struct kvc_conn *c;
	uint32_t s, first;
	if (kvc_connect(&c, D.sock) || kvc_session_open(c, &first) || kvc_session_close(c, first) ||
	    kvc_session_open(c, &s) || s == sh->a_session)
		return 20;
	if (kvc_session_close(c, sh->a_session) != -ENOENT)
		return 21;
	struct kvd_sqe q;
	struct kvd_cqe cqe;
	kvc_prep(&q, KVD_OP_RESET, sh->a_session, 0, 9);
	if (kvc_submit(c, &q) || kp_wait_cqe(&D, c, &cqe) || cqe.res != -ENOENT)
		return 22;
	/* The same prompt computes from scratch: A's cached blocks are not B's. */
	struct kvd_stats_rep st0, st1;
	if (kvc_stats(c, &st0) || prefill(c, s, 0) != N_SECRET || kvc_stats(c, &st1))
		return 23;
	if (st1.prefix_hit_tokens != st0.prefix_hit_tokens) {
		fprintf(stderr, "B hit %llu cached tokens of A's prompt\n",
			(unsigned long long)(st1.prefix_hit_tokens - st0.prefix_hit_tokens));
		return 24;
	}
	kvc_close(c);
	return 0;
}

static void test_region_and_cache_isolation(void **state)
{
	(void)state;
	need_root();
	static const char *const args[] = { "--socket-group", "nogroup", "--threads", "1", NULL };
	assert_int_equal(kp_start(&D, args), 0);
	struct shared sh;
	assert_int_equal(pipe(PIPES), 0);
	assert_int_equal(pipe(PIPES + 2), 0);
	memcpy(sh.to_b, PIPES, sizeof(sh.to_b));
	memcpy(sh.to_a, PIPES + 2, sizeof(sh.to_a));
	pid_t a = spawn_as(UID_A, nogroup, client_a, &sh);
	assert_true(a > 0);
	CLIENT_A = a;
	close_fd(&PIPES[1]);	/* A's end: a read sees EOF if A dies first */
	close_fd(&PIPES[2]);
	struct shared got;
	if (read(sh.to_b[0], &got, sizeof(got)) != sizeof(got)) {
		CLIENT_A = 0;
		fail_msg("client A failed (exit status %d)", wait_status(a));
	}
	sh.a_pid = got.a_pid;
	memcpy(sh.a_range, got.a_range, sizeof(sh.a_range));
	sh.a_session = got.a_session;
	/* The control: root can open A's region, so the path B tries is real. */
	char p[160];
	snprintf(p, sizeof(p), "/proc/%d/map_files/%s", (int)sh.a_pid, sh.a_range);
	int fd = open(p, O_RDONLY);
	if (fd >= 0)
		close(fd);
	else	/* map_files wants CAP_SYS_ADMIN, which a container may withhold */
		print_message("note: root cannot open %s either (%s)\n", p, strerror(errno));
	assert_int_equal(wait_status(spawn_as(UID_B, nogroup, client_b, &sh)), 0);
	struct kvd_stats_rep st0, st1;
	assert_int_equal(kp_stats(&D, &st0), 0);
	assert_int_equal(write(sh.to_a[1], "g", 1), 1);
	CLIENT_A = 0;
	assert_int_equal(wait_status(a), 0);
	assert_int_equal(kp_stats(&D, &st1), 0);
	/* ... and A's own second prefill did hit: the cache B missed was there. */
	assert_true(st1.prefix_hit_tokens > st0.prefix_hit_tokens);
	close_fd(&PIPES[3]);
	close_fd(&PIPES[0]);
	assert_int_equal(kp_stop(&D), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_socket_permissions, teardown),
		cmocka_unit_test_teardown(test_region_and_cache_isolation, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
