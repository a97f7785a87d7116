/*
 * kvd_proc.h — a real kvd as a child process for the reliability suites
 * (test_fault, test_limits, test_isolation): start it on a private socket
 * with extra options, watch its fds and RSS through /proc, stop it.
 * Include after <cmocka.h>.
 */
#ifndef KVD_TESTS_PROC_H
#define KVD_TESTS_PROC_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <liburing.h>
#include "shm/kvclient.h"

struct kvd_proc {
	pid_t pid;		/* 0: not running */
	char dir[64];		/* mkdtemp'd: socket and log */
	char sock[96];
	char log[96];
};

static inline const char *kp_model(void)
{
	const char *p = getenv("KVD_MODEL");
	return p && *p ? p : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

/* $KVD_BIN (the sanitizer pass points it at its own build), else build/kvd. */
static inline const char *kp_bin(void)
{
	const char *p = getenv("KVD_BIN");
	return p && *p ? p : "build/kvd";
}

static inline int64_t kp_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void kp_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
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

static inline void kp_log_tail(const struct kvd_proc *d)
{
	char buf[4097];
	FILE *f = fopen(d->log, "r");
	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, n > 4096 ? n - 4096 : 0, SEEK_SET);
	size_t got = fread(buf, 1, sizeof(buf) - 1, f);
	buf[got] = 0;
	fclose(f);
	print_message("---- tail of %s ----\n%s---- end ----\n", d->log, buf);
}

/*
 * fork+exec the daemon with the model, a private socket and extra (a
 * NULL-terminated list, may be NULL); before exec, pre_exec(arg) runs in the
 * child when given. 0 once it accepts connections.
 */
static inline int kp_start_ex(struct kvd_proc *d, const char *const *extra,
			      void (*pre_exec)(void *), void *arg)
{
	memset(d, 0, sizeof(*d));
	snprintf(d->dir, sizeof(d->dir), "/tmp/kvd-rel.XXXXXX");
	if (!mkdtemp(d->dir))
		return -errno;
	chmod(d->dir, 0755);
	snprintf(d->sock, sizeof(d->sock), "%s/kvd.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/kvd.log", d->dir);
	if (access(kp_bin(), X_OK)) {
		print_message("%s is missing: run `make` first\n", kp_bin());
		return -ENOENT;
	}
	const char *argv[48] = { kp_bin(), "--model", kp_model(), "--socket", d->sock,
				 "--drain-timeout", "2000", "--bpf", "off" };
	int n = 9;
	for (int i = 0; extra && extra[i] && n < 46; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	int logfd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (logfd < 0)
		return -errno;
	pid_t pid = fork();
	if (pid < 0) {
		close(logfd);
		return -errno;
	}
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);
		if (null < 0 || dup2(null, 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
			_exit(126);
		if (null > 2)
			close(null);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (pre_exec)
			pre_exec(arg);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(logfd);
	d->pid = pid;
	for (int64_t end = kp_now_ms() + 30000; kp_now_ms() < end; kp_sleep_ms(20)) {
		struct kvc_conn *c;
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
	print_message("kvd did not answer within 30 s\n");
	kp_log_tail(d);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	d->pid = 0;
	return -ETIMEDOUT;
}

static inline int kp_start(struct kvd_proc *d, const char *const *extra)
{
	return kp_start_ex(d, extra, NULL, NULL);
}

/* SIGTERM and up to 15 s to drain: 0 when it exited with status 0. */
static inline int kp_stop(struct kvd_proc *d)
{
	if (!d->pid)
		return 0;
	kill(d->pid, SIGTERM);
	int st = 0;
	pid_t w;
	int64_t end = kp_now_ms() + 15000;
	while ((w = waitpid(d->pid, &st, WNOHANG)) == 0 && kp_now_ms() < end)
		kp_sleep_ms(10);
	if (w == 0) {
		kill(d->pid, SIGKILL);
		waitpid(d->pid, &st, 0);
	}
	d->pid = 0;
	int ok = w > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
	if (!ok) {
		print_message("kvd did not exit cleanly (wait status %#x)\n", st);
		kp_log_tail(d);
	}
	unlink(d->log);
	unlink(d->sock);
	rmdir(d->dir);
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
 * in use. 0, or -ETIMEDOUT with the last figures in *st.
 */
static inline int kp_wait_idle(const struct kvd_proc *d, struct kvd_stats_rep *st, int ms)
{
	for (int64_t end = kp_now_ms() + ms;; kp_sleep_ms(20)) {
		/* A daemon short of fds may refuse this connection for a moment. */
		int rc = kp_stats(d, st);
		if (!rc && st->connections == 1 && st->sessions == 0 && st->kv_blocks_used == 0)
			return 0;
		if (kp_now_ms() >= end)
			return rc ? rc : -ETIMEDOUT;
	}
}

#endif
