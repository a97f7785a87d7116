/* restart.h — a kvd restarted on the same socket, with systemd's notify socket and file-descriptor store played by the test. */
/*
 * What test_restart and bench_restart start: kvd on a socket path that
 * stays the same across restarts (so libkvclient reconnects to it), with
 * $NOTIFY_SOCKET naming a datagram socket this process reads. READY=1 says
 * the daemon is up; FDSTORE=1 messages hand over fds (the KV pool and
 * state memfds), which the next start gets back the way systemd passes
 * them: as fds 3, 4, ... with $LISTEN_FDS, $LISTEN_FDNAMES and
 * $LISTEN_PID. The log is appended to across restarts.
 */
#ifndef KVD_TESTS_LIB_RESTART_H
#define KVD_TESTS_LIB_RESTART_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tests/lib/proc.h"

#define KR_MAX_STORED 4

struct kr_daemon {
	pid_t pid;
	char dir[64];
	char sock[96];
	char notify[96];
	char log[96];
	int nfd;			/* the notify socket */
	int fdstore;			/* keep what FDSTORE hands over, pass it back on start */
	int n_stored;
	int stored[KR_MAX_STORED];
	char stored_name[KR_MAX_STORED][32];
	const char *env[4];		/* more NAME=VALUE for the daemon, NULL-terminated */
};

/* A directory with the socket path, the notify socket and the log; 0 or -errno. */
static inline int kr_open(struct kr_daemon *d, int fdstore)
{
	memset(d, 0, sizeof(*d));
	d->nfd = -1;
	d->fdstore = fdstore;
	int rc = kp_mkdir(d->dir, sizeof(d->dir), "/tmp/kvd-restart.XXXXXX", d->sock, sizeof(d->sock),
			  d->log, sizeof(d->log));
	if (rc)
		return rc;
	snprintf(d->notify, sizeof(d->notify), "%s/notify", d->dir);
	d->nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", d->notify);
	if (d->nfd < 0 || bind(d->nfd, (struct sockaddr *)&a, sizeof(a)))
		return -errno;
	return 0;
}

static inline void kr_forget(struct kr_daemon *d, const char *name)
{
	for (int i = 0; i < d->n_stored;)
		if (!strcmp(d->stored_name[i], name)) {
			close(d->stored[i]);
			d->stored[i] = d->stored[--d->n_stored];
			memcpy(d->stored_name[i], d->stored_name[d->n_stored], sizeof(d->stored_name[i]));
		} else {
			i++;
		}
}

/* The fd store's part of one notify datagram: FDSTOREREMOVE and FDSTORE with FDNAME. */
static inline void kr_store(struct kr_daemon *d, const char *text, const int *fds, int n_fds)
{
	const char *name = strstr(text, "FDNAME=");
	char nm[32] = "stored";
	if (name)
		snprintf(nm, sizeof(nm), "%.*s", (int)strcspn(name + 7, "\n"), name + 7);
	int keep = d->fdstore && strstr(text, "FDSTORE=1") && n_fds == 1;
	if (d->fdstore && strstr(text, "FDSTOREREMOVE=1"))
		kr_forget(d, nm);
	if (keep) {
		kr_forget(d, nm);
		if (d->n_stored < KR_MAX_STORED) {
			d->stored[d->n_stored] = fds[0];
			snprintf(d->stored_name[d->n_stored], sizeof(d->stored_name[0]), "%s", nm);
			d->n_stored++;
			return;
		}
	}
	for (int i = 0; i < n_fds; i++)
		close(fds[i]);
}

/* Read notify datagrams for up to ms: 1 once one has a line READY=1, 0 if none did. */
static inline int kr_read_notes(struct kr_daemon *d, int ms)
{
	for (int64_t end = kp_now_ms() + ms;;) {
		int left = (int)(end - kp_now_ms());
		struct pollfd p = { d->nfd, POLLIN, 0 };
		if (left < 0 || poll(&p, 1, left) <= 0)
			return 0;
		char text[1024];
		union {
			char buf[CMSG_SPACE(8 * sizeof(int))];
			struct cmsghdr align;
		} u;
		struct iovec iov = { text, sizeof(text) - 1 };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
				     .msg_controllen = sizeof(u.buf) };
		ssize_t got = recvmsg(d->nfd, &mh, MSG_CMSG_CLOEXEC);
		if (got < 0)
			return 0;
		text[got] = 0;
		int fds[8], n = 0;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
			if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
				for (size_t k = 0; k < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int) && n < 8; k++)
					memcpy(&fds[n++], CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
		kr_store(d, text, fds, n);
		if (!strncmp(text, "READY=1", 7) || strstr(text, "\nREADY=1"))
			return 1;
	}
}

/* In the child: the stored fds as 3, 4, ... and the environment systemd would give. */
static inline void kr_child(struct kr_daemon *d)
{
	char buf[160], names[160] = "";
	int high[KR_MAX_STORED];
	for (int i = 0; i < d->n_stored; i++)
		if ((high[i] = fcntl(d->stored[i], F_DUPFD, 64)) < 0)
			_exit(126);
	for (int i = 0; i < d->n_stored; i++) {
		if (dup2(high[i], 3 + i) < 0)
			_exit(126);
		size_t at = strlen(names);
		snprintf(names + at, sizeof(names) - at, "%s%s", i ? ":" : "", d->stored_name[i]);
	}
	if (d->n_stored) {
		snprintf(buf, sizeof(buf), "%d", d->n_stored);
		setenv("LISTEN_FDS", buf, 1);
		setenv("LISTEN_FDNAMES", names, 1);
		snprintf(buf, sizeof(buf), "%d", (int)getpid());
		setenv("LISTEN_PID", buf, 1);
	}
	setenv("NOTIFY_SOCKET", d->notify, 1);
	for (int i = 0; d->env[i]; i++)
		putenv((char *)d->env[i]);
}

/*
 * Start kvd with the model, d's socket and extra (NULL-terminated, at most
 * 30) and wait for READY=1 (a slow daemon gets the time it keeps using
 * CPU, as kp_start_ex gives). Returns seconds from the fork to READY, or
 * a negative -errno.
 */
static inline double kr_start(struct kr_daemon *d, const char *const *extra)
{
	const char *argv[40] = { kp_bin(), "--model", kp_model(), "--socket", d->sock, "--bpf", "off" };
	int n = 7;
	for (int i = 0; extra && extra[i] && n < 39; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	int logfd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (logfd < 0)
		return -errno;
	double t0 = (double)kp_now_ms() / 1000;
	pid_t parent = getpid(), pid = fork();
	if (pid < 0) {
		close(logfd);
		return -errno;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		int null = open("/dev/null", O_RDONLY);
		if (null < 0 || dup2(null, 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
			_exit(126);
		kr_child(d);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(logfd);
	d->pid = pid;
	struct kw_deadline w;
	long long ticks = -1;
	for (kw_start_default(&w); !kw_expired(&w);) {
		if (kr_read_notes(d, 100))
			return (double)kp_now_ms() / 1000 - t0;
		kp_note_cpu(&w, pid, &ticks);
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			d->pid = 0;
			print_message("kvd exited while starting (wait status %#x)\n", st);
			kp_file_tail(d->log);
			return -ECHILD;
		}
	}
	print_message("kvd sent no READY=1\n");
	kp_file_tail(d->log);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	d->pid = 0;
	return -ETIMEDOUT;
}

/* Signal it and wait for it to exit (SIGKILL after KW_HANG_MS); its wait status, or -1. */
static inline int kr_kill(struct kr_daemon *d, int sig)
{
	if (!d->pid)
		return -1;
	struct kvd_proc p = { .pid = d->pid };
	int st = kp_kill(&p, sig);
	d->pid = 0;
	kr_read_notes(d, 0);	/* what it stored on its way out */
	return st;
}

/* The daemon as proc.h's helpers (kp_stats, kp_wait_idle) see it: its socket and pid. */
static inline struct kvd_proc kr_proc(const struct kr_daemon *d)
{
	struct kvd_proc p = { .pid = d->pid };
	snprintf(p.sock, sizeof(p.sock), "%s", d->sock);
	return p;
}

/* How many lines of its log hold text. */
static inline int kr_log_count(const struct kr_daemon *d, const char *text)
{
	FILE *f = fopen(d->log, "r");
	char line[1024];
	int n = 0;
	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, text) != NULL;
	if (f)
		fclose(f);
	return n;
}

static inline void kr_close(struct kr_daemon *d)
{
	kr_kill(d, SIGKILL);
	while (d->n_stored)
		close(d->stored[--d->n_stored]);
	if (d->nfd >= 0)
		close(d->nfd);
	d->nfd = -1;
	if (d->dir[0]) {
		unlink(d->sock);
		unlink(d->notify);
		unlink(d->log);
		rmdir(d->dir);
		d->dir[0] = 0;
	}
}

#endif
