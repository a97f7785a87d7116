/* proc.h — the one daemon starter: a real kvd (or any program) as a child process of a test. */
/*
 * Every test and benchmark that needs a daemon starts it here: on a
 * private socket with extra options, its output in a log whose tail a
 * failure prints; then it can watch its fds and RSS through /proc,
 * generate through it, signal it, stop it. Its daemons run with --bpf off
 * (no pins in /sys/fs/bpf/kvd) unless the caller gives a --bpf of its own;
 * $KVD_BIN and $KVD_MODEL choose the daemon and model. kp_spawn() starts
 * something else the same way (test_service's systemd-socket-activate),
 * kp_fork() a client child bound to the test. kp_bpffs_open() gives
 * test_bpf and bench_bpf a bpf file system to pin under.
 */
#ifndef KVD_TESTS_LIB_PROC_H
#define KVD_TESTS_LIB_PROC_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/magic.h>
#include <liburing.h>
#include "shm/kvclient.h"
#include "tests/lib/fixture.h"
#include "tests/lib/wait.h"

struct kvd_proc {
	pid_t pid;		/* 0: not running */
	char dir[64];		/* mkdtemp'd: socket and log */
	char sock[96];
	char log[96];
};

static inline const char *kp_model(void)
{
	return fixture_model_path();
}

/* $KVD_BIN (the sanitizer pass points it at its own build), else build/kvd. */
static inline const char *kp_bin(void)
{
	const char *p = getenv("KVD_BIN");
	return p && *p ? p : "build/kvd";
}

static inline int64_t kp_now_ms(void)
{
	return kw_now_ms();
}

static inline void kp_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* pid's state letter (R, S, ...) and CPU time in clock ticks (utime + stime of /proc/PID/stat). */
static inline int kp_proc_stat(pid_t pid, char *state, long long *ticks)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	/* The command name may hold spaces and parentheses: fields count from the last ')'. */
	char *p = strrchr(buf, ')');
	unsigned long long ut, st;
	if (!p || sscanf(p + 2, "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", state, &ut,
			 &st) != 3)
		return -EPROTO;
	*ticks = (long long)(ut + st);
	return 0;
}

/* pid's CPU time in clock ticks, -1 when it is gone. */
static inline long long kp_cpu_ticks(pid_t pid)
{
	char state = 0;
	long long t = -1;
	return kp_proc_stat(pid, &state, &t) ? -1 : t;
}

/*
 * Progress for a kw_deadline: pid used CPU since the last call (*ticks holds
 * what that call saw; start it at -1). A daemon that computes is not hung.
 */
static inline void kp_note_cpu(struct kw_deadline *w, pid_t pid, long long *ticks)
{
	long long t = pid > 0 ? kp_cpu_ticks(pid) : -1;
	if (t >= 0 && t != *ticks) {
		if (*ticks >= 0)
			kw_progress(w);
		*ticks = t;
	}
}

/* NULL when io_uring works here, else why not (the daemon needs it). */
static inline const char *kp_no_uring(void)
{
	struct io_uring r;
	if (io_uring_queue_init(2, &r, 0))
		return "io_uring is unavailable (kernel or seccomp policy)";
	io_uring_queue_exit(&r);
	return NULL;
}

/* A test that needs io_uring skips, saying why, where it is unavailable. */
static inline void kp_skip_without_uring(void)
{
	const char *why = kp_no_uring();
	if (why) {
		print_message("skipped: %s\n", why);
		skip();
	}
}

/* The last 4 KiB of a daemon's log, for a failing test's output. */
static inline void kp_file_tail(const char *path)
{
	char buf[4097];
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, n > 4096 ? n - 4096 : 0, SEEK_SET);
	size_t got = fread(buf, 1, sizeof(buf) - 1, f);
	buf[got] = 0;
	fclose(f);
	print_message("---- tail of %s ----\n%s---- end ----\n", path, buf);
}

static inline void kp_log_tail(const struct kvd_proc *d)
{
	kp_file_tail(d->log);
}

/* Whether extra (NULL-terminated, may be NULL) sets --bpf itself. */
static inline int kp_has_bpf(const char *const *extra)
{
	for (int i = 0; extra && extra[i]; i++)
		if (!strcmp(extra[i], "--bpf") || !strncmp(extra[i], "--bpf=", 6))
			return 1;
	return 0;
}

/*
 * In a child just forked: die with the test, whatever assertion ends it
 * early, and crash as a crash (cmocka's handlers would carry on with the
 * suite in this child). Returns only while the parent is alive.
 */
static inline void kp_child_bound(pid_t parent)
{
	signal(SIGSEGV, SIG_DFL);
	signal(SIGBUS, SIG_DFL);
	signal(SIGILL, SIG_DFL);
	signal(SIGFPE, SIG_DFL);
	signal(SIGABRT, SIG_DFL);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
}

/* fork() for a client child: 0 in the child (bound as kp_child_bound() says), its pid, or -errno. */
static inline pid_t kp_fork(void)
{
	pid_t parent = getpid(), pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0)
		kp_child_bound(parent);
	return pid;
}

/*
 * fork+exec argv (NULL-terminated; searched on $PATH when path is set)
 * with stdin from /dev/null and stdout and stderr into log (created or
 * truncated). Before exec, pre_exec(arg) runs in the child when given.
 * The child's pid, or -errno.
 */
static inline pid_t kp_spawn(const char *const *argv, const char *log, int path,
			     void (*pre_exec)(void *), void *arg)
{
	int logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (logfd < 0)
		return -errno;
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		int rc = -errno;
		close(logfd);
		return rc;
	}
	if (pid == 0) {
		/* A test that crashes takes its daemon with it. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		int null = open("/dev/null", O_RDONLY);
		if (null < 0 || dup2(null, 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
			_exit(126);
		if (null > 2)
			close(null);
		if (pre_exec)
			pre_exec(arg);
		if (path)
			execvp(argv[0], (char *const *)argv);
		else
			execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(logfd);
	return pid;
}

/*
 * A daemon's private directory from template (mkdtemp's XXXXXX), mode 0755
 * so other uids reach its socket, with the socket's and the log's paths in
 * it. 0, or -errno with dir empty.
 */
static inline int kp_mkdir(char *dir, size_t dir_len, const char *template, char *sock,
			   size_t sock_len, char *log, size_t log_len)
{
	snprintf(dir, dir_len, "%s", template);
	if (!mkdtemp(dir)) {
		dir[0] = 0;
		return -errno;
	}
	chmod(dir, 0755);
	snprintf(sock, sock_len, "%s/kvd.sock", dir);
	snprintf(log, log_len, "%s/kvd.log", dir);
	return 0;
}

/*
 * Wait for d's daemon (d->pid, just started) to accept connections on
 * d->sock: 0. Loading the model takes the time it takes: only a daemon that
 * stopped computing is late (-ETIMEDOUT, killed), or one that exited
 * (-ECHILD); its log's tail is printed then.
 */
static inline int kp_wait_answer(struct kvd_proc *d)
{
	pid_t pid = d->pid;
	struct kw_deadline w;
	long long ticks = -1;
	for (kw_start_default(&w); !kw_expired(&w); kp_sleep_ms(20)) {
		struct kvc_conn *c;
		kp_note_cpu(&w, pid, &ticks);
		int st;
		if (!kvc_connect(&c, d->sock)) {
			kvc_close(c);
			return 0;
		}
		if (waitpid(pid, &st, WNOHANG) == pid) {
			d->pid = 0;
			print_message("kvd exited while starting (wait status %#x)\n", st);
			kp_log_tail(d);
			return -ECHILD;
		}
	}
	print_message("kvd did not answer: %d s without using CPU, or %d s in all\n",
		      kw_ms(KW_QUIET_MS) / 1000, kw_ms(KW_HANG_MS) / 1000);
	kp_log_tail(d);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	d->pid = 0;
	return -ETIMEDOUT;
}

/*
 * fork+exec the daemon with the model, a private socket and extra (a
 * NULL-terminated list of at most 38, may be NULL); --bpf off unless extra
 * has a --bpf. Before exec, pre_exec(arg) runs in the child when given.
 * 0 once it accepts connections, else -errno; d->dir is set from the
 * mkdtemp on, so kp_cleanup() removes what a failed start left.
 */
static inline int kp_start_ex(struct kvd_proc *d, const char *const *extra,
			      void (*pre_exec)(void *), void *arg)
{
	memset(d, 0, sizeof(*d));
	if (access(kp_bin(), X_OK)) {
		print_message("%s is missing: run `make` first\n", kp_bin());
		return -ENOENT;
	}
	int rc = kp_mkdir(d->dir, sizeof(d->dir), "/tmp/kvd-proc.XXXXXX", d->sock, sizeof(d->sock),
			  d->log, sizeof(d->log));
	if (rc)
		return rc;
	const char *argv[48] = { kp_bin(), "--model", kp_model(), "--socket", d->sock,
				 "--drain-timeout", "2000" };
	int n = 7;
	if (!kp_has_bpf(extra)) {
		argv[n++] = "--bpf";
		argv[n++] = "off";
	}
	for (int i = 0; extra && extra[i]; i++) {
		if (n >= 47) {
			print_message("kp_start: too many options\n");
			return -E2BIG;
		}
		argv[n++] = extra[i];
	}
	argv[n] = NULL;
	pid_t pid = kp_spawn(argv, d->log, 0, pre_exec, arg);
	if (pid < 0)
		return pid;
	d->pid = pid;
	return kp_wait_answer(d);
}

static inline int kp_start(struct kvd_proc *d, const char *const *extra)
{
	return kp_start_ex(d, extra, NULL, NULL);
}

/* kp_start() on another model file than $KVD_MODEL's (a patched or copied one). */
static inline int kp_start_model(struct kvd_proc *d, const char *model, const char *const *extra)
{
	char *old = getenv("KVD_MODEL") ? strdup(getenv("KVD_MODEL")) : NULL;
	setenv("KVD_MODEL", model, 1);
	int rc = kp_start(d, extra);
	if (old) {
		setenv("KVD_MODEL", old, 1);
		free(old);
	} else {
		unsetenv("KVD_MODEL");
	}
	return rc;
}

/* A pre_exec for kp_start_ex: dir (a string) becomes the child's $KVD_BPF_PIN_DIR. */
static inline void kp_pin_dir_env(void *dir)
{
	if (dir && setenv("KVD_BPF_PIN_DIR", dir, 1))
		_exit(126);
}

/* Where pins can go: /sys/fs/bpf, or a bpf file system of our own. */
struct kp_bpffs {
	char base[64];		/* pin directories go under it */
	int own;		/* base is our mount point: unmount and remove it */
};

/*
 * A bpf file system for the pins: /sys/fs/bpf when one is mounted there.
 * Else (a fresh CI machine, a container) a new one on a temporary directory,
 * mounted in a private mount namespace of this process, which its children
 * (daemons, kvtop, bpftool) share: / is made a slave first, so the mount
 * never shows on the host and goes away with the last process in the
 * namespace even when a test crashes. unshare(CLONE_NEWNS) moves only the
 * calling thread: call it first thing in main, before any other thread, so
 * that every later thread and child is in there too. 0, or -errno with the
 * reason to skip in why.
 */
static inline int kp_bpffs_open(struct kp_bpffs *fs, char *why, size_t whylen)
{
	struct statfs sf;
	memset(fs, 0, sizeof(*fs));
	if (!statfs("/sys/fs/bpf", &sf) && (unsigned long)sf.f_type == (unsigned long)BPF_FS_MAGIC) {
		snprintf(fs->base, sizeof(fs->base), "/sys/fs/bpf");
		return 0;
	}
	int rc;
	if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL)) {
		rc = -errno;
		snprintf(why, whylen, "no bpf file system on /sys/fs/bpf, and no private mount namespace "
			 "to mount one in: %s (needs CAP_SYS_ADMIN)", strerror(-rc));
		return rc;
	}
	snprintf(fs->base, sizeof(fs->base), "/tmp/kvd-bpffs.XXXXXX");
	if (!mkdtemp(fs->base)) {
		rc = -errno;
		snprintf(why, whylen, "mkdtemp %s: %s", fs->base, strerror(-rc));
		return rc;
	}
	if (mount("bpf", fs->base, "bpf", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0700")) {
		rc = -errno;
		snprintf(why, whylen, "cannot mount a bpf file system on %s: %s%s", fs->base, strerror(-rc),
			 rc == -ENODEV ? " (kernel without BPF)" : "");
		rmdir(fs->base);
		return rc;
	}
	fs->own = 1;
	return 0;
}

/* Unmount and remove what kp_bpffs_open() mounted (the maps pinned in it go with it). */
static inline void kp_bpffs_close(struct kp_bpffs *fs)
{
	if (fs->own && !umount2(fs->base, MNT_DETACH))
		rmdir(fs->base);
	fs->own = 0;
}

#define KP_KILL_QUIET_MS 15000	/* scaled: a draining daemon that uses no CPU this long ignored sig */

/*
 * Send sig and wait while it drains (KP_KILL_QUIET_MS without CPU use, or
 * KW_HANG_MS in all, both scaled): the wait status (0 when it was not
 * running), or -1 when it had to be killed. Its files stay.
 */
static inline int kp_kill(struct kvd_proc *d, int sig)
{
	if (!d->pid)
		return 0;
	kill(d->pid, sig);
	int st = 0;
	pid_t w;
	struct kw_deadline dl;
	long long ticks = -1;
	kw_start(&dl, KP_KILL_QUIET_MS, KW_HANG_MS);
	while ((w = waitpid(d->pid, &st, WNOHANG)) == 0 && !kw_expired(&dl)) {
		kp_note_cpu(&dl, d->pid, &ticks);
		kp_sleep_ms(10);
	}
	if (w == 0) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, NULL, 0);
	}
	d->pid = 0;
	return w > 0 ? st : -1;
}

/* Stop it if running (SIGTERM, no check) and remove its socket, log and dir. */
static inline void kp_cleanup(struct kvd_proc *d)
{
	kp_kill(d, SIGTERM);
	if (d->dir[0]) {
		unlink(d->log);
		unlink(d->sock);
		rmdir(d->dir);
		d->dir[0] = 0;
	}
}

/* SIGTERM and time to drain (kp_kill()), then kp_cleanup(): 0 when it exited with status 0. */
static inline int kp_stop(struct kvd_proc *d)
{
	if (!d->pid)
		return 0;
	int st = kp_kill(d, SIGTERM);
	int ok = st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
	if (st < 0)
		print_message("kvd ignored SIGTERM (%d s without using CPU)\n", kw_ms(KP_KILL_QUIET_MS) / 1000);
	else if (WIFSIGNALED(st))
		print_message("kvd died of signal %d on SIGTERM instead of draining and exiting 0\n",
			      WTERMSIG(st));
	else if (!ok)
		print_message("kvd exited with status %d on SIGTERM\n", WEXITSTATUS(st));
	if (!ok)
		kp_log_tail(d);
	kp_cleanup(d);
	return ok ? 0 : -1;
}

/* Open fds of pid, from /proc/PID/fd; -1 when unreadable. */
static inline int kp_fds(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* A field of /proc/PID/status in kB (VmRSS, RssAnon, ...); -1 when missing. */
static inline long kp_status_kb(pid_t pid, const char *field)
{
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	long v = -1;
	size_t n = strlen(field);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, n) && line[n] == ':') {
			v = strtol(line + n + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

/* Whether pid runs with AddressSanitizer (its allocator keeps freed memory resident). */
static inline int kp_asan(pid_t pid)
{
	char path[64], line[512];
	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	FILE *f = fopen(path, "r");
	int yes = 0;
	while (f && !yes && fgets(line, sizeof(line), f))
		yes = strstr(line, "libasan") != NULL;
	if (f)
		fclose(f);
	return yes;
}

/*
 * The libkvclient connections a test holds: kp_connect() opens one and
 * records it, kp_close() closes it, and the test's teardown calls
 * kp_close_all(), so that a failing test (its assertion longjmps past its
 * own kvc_close()) leaks none.
 */
#define KP_MAX_CONNS 64
static inline struct kvc_conn **kp_conn_table(void)
{
	static struct kvc_conn *held[KP_MAX_CONNS];
	return held;
}

/* kvc_connect(), recorded for kp_close_all(): 0 or -errno (-EMFILE when the table is full). */
static inline int kp_connect(struct kvc_conn **out, const char *sock)
{
	struct kvc_conn **t = kp_conn_table();
	int i = 0;
	while (i < KP_MAX_CONNS && t[i])
		i++;
	if (i == KP_MAX_CONNS)
		return -EMFILE;
	int rc = kvc_connect(out, sock);
	if (!rc)
		t[i] = *out;
	return rc;
}

static inline void kp_close(struct kvc_conn *c)
{
	struct kvc_conn **t = kp_conn_table();
	for (int i = 0; i < KP_MAX_CONNS; i++)
		if (t[i] == c)
			t[i] = NULL;
	kvc_close(c);
}

static inline void kp_close_all(void)
{
	struct kvc_conn **t = kp_conn_table();
	for (int i = 0; i < KP_MAX_CONNS; i++)
		if (t[i]) {
			kvc_close(t[i]);
			t[i] = NULL;
		}
}

/* STATS through a connection of its own (which counts as one). */
static inline int kp_stats(const struct kvd_proc *d, struct kvd_stats_rep *st)
{
	struct kvc_conn *c;
	int rc = kvc_connect(&c, d->sock);
	if (rc)
		return rc;
	rc = kvc_stats(c, st);
	kvc_close(c);
	return rc;
}

/*
 * Wait until nothing is held: no other connection, no session, no KV block
 * in use, for up to ms (scaled). 0, or -ETIMEDOUT with the last figures in *st.
 */
static inline int kp_wait_idle(const struct kvd_proc *d, struct kvd_stats_rep *st, int ms)
{
	for (int64_t end = kp_now_ms() + kw_ms(ms);; kp_sleep_ms(20)) {
		/* A daemon short of fds may refuse this connection for a moment. */
		int rc = kp_stats(d, st);
		if (!rc && st->connections == 1 && st->sessions == 0 && st->kv_blocks_used == 0)
			return 0;
		if (kp_now_ms() >= end)
			return rc ? rc : -ETIMEDOUT;
	}
}

/*
 * The next CQE on c, however long a slow or sanitized daemon takes: gives
 * up only after KW_QUIET_MS with no CQE while d (may be NULL: not watched)
 * used no CPU either, or after KW_HANG_MS in all (both scaled), or when d
 * is gone. 0, -ETIMEDOUT, -ECHILD, or kvc_wait()'s error.
 */
static inline int kp_wait_cqe(const struct kvd_proc *d, struct kvc_conn *c, struct kvd_cqe *cqe)
{
	struct kw_deadline w;
	long long ticks = -1;
	kw_start_default(&w);
	for (;;) {
		int left = kw_left_ms(&w);
		int rc = kvc_wait(c, cqe, left < 1000 ? left : 1000);
		if (rc != -ETIMEDOUT && rc != -EINTR)
			return rc;
		/* EPERM is a daemon alive under another uid (test_isolation's clients are not root). */
		if (d && d->pid && kill(d->pid, 0) && errno == ESRCH) {
			print_message("kvd (pid %d) is gone while a completion was awaited\n", (int)d->pid);
			return -ECHILD;
		}
		if (d)
			kp_note_cpu(&w, d->pid, &ticks);
		if (kw_expired(&w)) {
			print_message("no completion: %d s without progress, or %d s in all\n",
				      kw_ms(KW_QUIET_MS) / 1000, kw_ms(KW_HANG_MS) / 1000);
			return -ETIMEDOUT;
		}
	}
}

/*
 * n requests on slots 0..n-1 of one session, all in flight together:
 * request i feeds n_prompt[i] ids from prompts[i] and generates exactly
 * max_out[i] tokens (EOS ignored). Returns the tokens generated, or -errno.
 */
static inline int kp_generate(const char *sock, unsigned n, const uint32_t *const *prompts,
			      const uint32_t *n_prompt, const uint32_t *max_out)
{
	struct kvc_conn *c;
	uint32_t sid;
	int rc = kvc_connect(&c, sock);
	if (rc)
		return rc;
	if ((rc = kvc_session_open(c, &sid)))
		goto out;
	uint8_t *arena = kvc_arena(c, NULL);
	int total = 0;
	for (unsigned i = 0; i < n; i++) {
		uint32_t in, out;
		struct kvd_sqe q;
		if ((rc = kvc_arena_alloc(c, n_prompt[i] * 4, &in)) ||
		    (rc = kvc_arena_alloc(c, max_out[i] * 4, &out)))
			goto out;
		memcpy(arena + in, prompts[i], n_prompt[i] * 4);
		kvc_prep_generate(&q, sid, i, i + 1, in, n_prompt[i], out, max_out[i]);
		q.flags |= KVD_SQE_IGNORE_EOS;
		if ((rc = kvc_submit(c, &q)))
			goto out;
	}
	for (unsigned done = 0; done < n;) {
		struct kvd_cqe e;
		if ((rc = kp_wait_cqe(NULL, c, &e)))
			goto out;
		if (e.flags & KVD_CQE_MORE)
			continue;
		if (e.res < 0) {
			rc = e.res;
			goto out;
		}
		total += e.res;
		done++;
	}
	rc = total;
out:
	kvc_close(c);
	return rc;
}

#endif
