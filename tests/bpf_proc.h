/* bpf_proc.h — start a real build/kvd on a private socket for a test or benchmark, generate through it, stop it. */
#ifndef KVD_TESTS_BPF_PROC_H
#define KVD_TESTS_BPF_PROC_H

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
#include "shm/kvclient.h"

/* $KVD_BIN (the sanitizer pass points it at its own build), else build/kvd. */
static inline const char *kvd_proc_bin(void)
{
	const char *p = getenv("KVD_BIN");
	return p && *p ? p : "build/kvd";
}

struct kvd_proc {
	pid_t pid;		/* 0: not running */
	char dir[64];		/* mkdtemp'd: socket and log */
	char sock[96];
	char log[96];
};

static inline double kvd_proc_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline void kvd_proc_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static inline void kvd_proc_log_tail(const struct kvd_proc *p)
{
	char buf[2049];
	FILE *f = fopen(p->log, "r");
	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, n > 2048 ? n - 2048 : 0, SEEK_SET);
	size_t got = fread(buf, 1, sizeof(buf) - 1, f);
	buf[got] = 0;
	fclose(f);
	fprintf(stderr, "---- tail of %s ----\n%s---- end ----\n", p->log, buf);
}

/*
 * fork+exec build/kvd with extra (NULL-terminated, at most 12) arguments;
 * pin_dir, when not NULL, becomes its $KVD_BPF_PIN_DIR. 0 once it accepts
 * connections, else -errno.
 */
static inline int kvd_proc_start(struct kvd_proc *p, const char *pin_dir, const char *const *extra)
{
	memset(p, 0, sizeof(*p));
	snprintf(p->dir, sizeof(p->dir), "/tmp/kvd-bpf.XXXXXX");
	if (!mkdtemp(p->dir))
		return -errno;
	snprintf(p->sock, sizeof(p->sock), "%s/kvd.sock", p->dir);
	snprintf(p->log, sizeof(p->log), "%s/kvd.log", p->dir);
	if (access(kvd_proc_bin(), X_OK))
		return -ENOENT;
	const char *model = getenv("KVD_MODEL");
	const char *argv[24] = { kvd_proc_bin(), "--socket", p->sock, "--log-level", "info" };
	int n = 5;
	if (model && *model) {
		argv[n++] = "--model";
		argv[n++] = model;
	}
	for (int i = 0; extra && extra[i] && n < 23; i++)
		argv[n++] = extra[i];
	int logfd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (logfd < 0)
		return -errno;
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		close(logfd);
		return -errno;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		if (pin_dir)
			setenv("KVD_BPF_PIN_DIR", pin_dir, 1);
		int null = open("/dev/null", O_RDONLY);
		if (null < 0 || dup2(null, 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
			_exit(126);
		execv(kvd_proc_bin(), (char **)argv);
		_exit(127);
	}
	close(logfd);
	p->pid = pid;
	for (double end = kvd_proc_now() + 60; kvd_proc_now() < end; kvd_proc_sleep_ms(20)) {
		struct kvc_conn *c;
		int st;
		if (kvc_connect(&c, p->sock) == 0) {
			kvc_close(c);
			return 0;
		}
		if (waitpid(pid, &st, WNOHANG) == pid) {
			p->pid = 0;
			kvd_proc_log_tail(p);
			return -ECHILD;
		}
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	p->pid = 0;
	kvd_proc_log_tail(p);
	return -ETIMEDOUT;
}

/* SIGTERM (or sig), wait up to 10 s; the wait status, or -1 when it had to be killed. */
static inline int kvd_proc_stop(struct kvd_proc *p, int sig)
{
	int st = -1;
	if (!p->pid)
		return 0;
	kill(p->pid, sig);
	for (double end = kvd_proc_now() + 10; kvd_proc_now() < end; kvd_proc_sleep_ms(10))
		if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
			p->pid = 0;
			return st;
		}
	kill(p->pid, SIGKILL);
	waitpid(p->pid, NULL, 0);
	p->pid = 0;
	return -1;
}

static inline void kvd_proc_cleanup(struct kvd_proc *p)
{
	kvd_proc_stop(p, SIGTERM);
	if (p->dir[0]) {
		unlink(p->sock);
		unlink(p->log);
		rmdir(p->dir);
	}
}

/*
 * n requests on slots 0..n-1 of one session, all in flight together:
 * request i feeds n_prompt[i] ids from prompts[i] and generates exactly
 * max_out[i] tokens (EOS ignored). Returns the tokens generated, or -errno.
 */
static inline int kvd_proc_generate(const char *sock, unsigned n, const uint32_t *const *prompts,
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
		if ((rc = kvc_wait(c, &e, 60000)) == -EINTR)
			continue;
		if (rc)
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
