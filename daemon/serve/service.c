/* service.c — kvd under systemd: socket activation, readiness and status, the watchdog period. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
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

int service_listen(const struct server_config *cfg, int *activated, char *path, size_t len)
{
	/* unset_environment: nothing kvd starts should think the fds are its own. */
	int n = sd_listen_fds(1);
	*activated = 0;
	if (n < 0)
		return n;
	if (n == 0) {
		snprintf(path, len, "%s", cfg->socket_path);
		return bind_socket(cfg);
	}
	if (n > 1) {
		log_msg(LOG_ERR, "systemd passed %d sockets; kvd.socket should listen on one", n);
		return -E2BIG;
	}
	int fd = SD_LISTEN_FDS_START;
	if (sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0) {
		log_msg(LOG_ERR, "the socket systemd passed is not a listening AF_UNIX SOCK_SEQPACKET socket");
		return -ENOTSOCK;
	}
	if (fcntl(fd, F_SETFD, FD_CLOEXEC))
		return -errno;
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
