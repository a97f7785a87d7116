/* service.c — kvd under systemd: socket activation, readiness and status, the watchdog period. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/serve/server_config.h"
#include "daemon/serve/service.h"

/* A socket bound by kvd itself, when systemd did not pass one. */
static int bind_socket(const struct server_config *cfg)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(cfg->socket_path) >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	strcpy(a.sun_path, cfg->socket_path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* A stale socket from an earlier run: replace it only if nobody answers on it. */
	struct stat st;
	if (!lstat(a.sun_path, &st) && S_ISSOCK(st.st_mode)) {
		int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		int live = probe >= 0 && !connect(probe, (struct sockaddr *)&a, sizeof(a));
		if (probe >= 0)
			close(probe);
		if (live) {
			close(fd);
			return -EADDRINUSE;
		}
		unlink(a.sun_path);
	}
	mode_t old = umask(0117);
	int rc = bind(fd, (struct sockaddr *)&a, sizeof(a));
	umask(old);
	/* It plays the part of a device node: owner and group may talk to kvd. */
	if (!rc)
		rc = chmod(a.sun_path, 0660);
	if (!rc && cfg->socket_gid != (gid_t)-1)
		rc = chown(a.sun_path, (uid_t)-1, cfg->socket_gid);
	if (!rc)
		rc = listen(fd, 128);
	if (rc) {
		rc = -errno;
		close(fd);
		return rc;
	}
	return fd;
}

/* What systemd passed at start, taken once: sockets (kvd.socket) and stored fds by name. */
#define SERVICE_MAX_FDS 16
static struct {
	int collected;
	int n;
	int fd[SERVICE_MAX_FDS];
	char name[SERVICE_MAX_FDS][64];
} passed;

/* The store's names kvd gives its own fds; anything else is a socket. */
static int stored_name(const char *name)
{
	return !strncmp(name, "kv", 2) && (!strcmp(name, "kvpool") || !strcmp(name, "kvstate"));
}

void service_collect_fds(void)
{
	char **names = NULL;
	if (passed.collected)
		return;
	passed.collected = 1;
	/* unset_environment: nothing kvd starts should think the fds are its own. */
	int n = sd_listen_fds_with_names(1, &names);
	for (int i = 0; i < n; i++) {
		int fd = SD_LISTEN_FDS_START + i;
		fcntl(fd, F_SETFD, FD_CLOEXEC);
		if (passed.n < SERVICE_MAX_FDS) {
			passed.fd[passed.n] = fd;
			snprintf(passed.name[passed.n], sizeof(passed.name[0]), "%s",
				 names && names[i] ? names[i] : "unknown");
			passed.n++;
		} else {
			close(fd);
		}
	}
	if (n < 0)
		log_msg(LOG_WARNING, "sd_listen_fds: %s", strerror(-n));
	for (int i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
}

int service_take_stored(const char *name)
{
	service_collect_fds();
	int fd = -1;
	for (int i = 0; i < passed.n; i++) {
		if (passed.fd[i] < 0 || strcmp(passed.name[i], name))
			continue;
		if (fd >= 0)
			close(passed.fd[i]);	/* one of each is ever stored; a second is stale */
		else
			fd = passed.fd[i];
		passed.fd[i] = -1;
	}
	return fd;
}

int service_store_fd(const char *name, int fd)
{
	char msg[96];
	if (!getenv("NOTIFY_SOCKET"))
		return -ENOTCONN;
	/* Replace, never pile up: the store keeps every fd sent under a name. */
	snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
	sd_pid_notify(0, 0, msg);
	snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
	int rc = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
	return rc > 0 ? 0 : rc < 0 ? rc : -ENOTCONN;
}

int service_listen(const struct server_config *cfg, int *activated, char *path, size_t len)
{
	int fd = -1, n = 0;
	service_collect_fds();
	*activated = 0;
	for (int i = 0; i < passed.n; i++) {
		if (passed.fd[i] < 0 || stored_name(passed.name[i]))
			continue;
		if (n++)
			close(passed.fd[i]);
		else
			fd = passed.fd[i];
		passed.fd[i] = -1;
	}
	if (n == 0) {
		snprintf(path, len, "%s", cfg->socket_path);
		return bind_socket(cfg);
	}
	if (n > 1) {
		log_msg(LOG_ERR, "systemd passed %d sockets; kvd.socket should listen on one", n);
		if (fd >= 0)
			close(fd);
		return -E2BIG;
	}
	if (sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0) {
		log_msg(LOG_ERR, "the socket systemd passed is not a listening AF_UNIX SOCK_SEQPACKET socket");
		close(fd);
		return -ENOTSOCK;
	}
	struct sockaddr_un a;
	socklen_t al = sizeof(a);
	memset(&a, 0, sizeof(a));
	if (!getsockname(fd, (struct sockaddr *)&a, &al) && al > offsetof(struct sockaddr_un, sun_path) &&
	    a.sun_path[0])
		snprintf(path, len, "%.*s", (int)sizeof(a.sun_path), a.sun_path);
	else
		snprintf(path, len, "(socket from systemd)");
	*activated = 1;
	return fd;
}

void service_notify(const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	int rc = sd_notify(0, msg);
	if (rc < 0)
		log_msg(LOG_WARNING, "sd_notify: %s", strerror(-rc));
}

uint64_t service_watchdog_usec(void)
{
	uint64_t usec = 0;
	return sd_watchdog_enabled(0, &usec) > 0 ? usec : 0;
}

void service_status(const struct service_snapshot *st)
{
	service_notify("STATUS=%s: model %s, %s backend, KV pool %u blocks of %u tokens, "
		       "%u sessions on %u connections", st->stopping ? "draining" : "serving",
		       st->model, st->backend, st->kv_blocks, st->kv_block_tokens, st->sessions,
		       st->conns);
}
