/* obs.c — the daemon loads its own BPF programs (--bpf) so its metrics are there from the first request. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include "bpf/kvd_load.h"
#include "bpf/kvd_pin.h"
#include "daemon/log.h"
#include "daemon/serve/obs.h"

/*
 * The path clients will connect to: the socket systemd passes (read before
 * service_listen() takes it, without unsetting $LISTEN_FDS) when there is
 * one, for kvd.socket may name another path than --socket; its group then
 * is the socket unit's SocketGroup.
 */
static const char *served_socket(const char *configured, char *buf, size_t len, gid_t *gid)
{
	struct sockaddr_un a;
	socklen_t al = sizeof(a);
	struct stat st;
	memset(&a, 0, sizeof(a));
	if (sd_listen_fds(0) != 1 || getsockname(SD_LISTEN_FDS_START, (struct sockaddr *)&a, &al) ||
	    al <= offsetof(struct sockaddr_un, sun_path) || !a.sun_path[0])
		return configured;
	snprintf(buf, len, "%.*s", (int)sizeof(a.sun_path), a.sun_path);
	if (*gid == (gid_t)-1 && !stat(buf, &st))
		*gid = st.st_gid;
	return buf;
}

int obs_start(enum kvd_bpf_mode m, const char *socket_path, const char *instance, gid_t gid,
	      struct kvd_bpf **out)
{
	char err[512], dir[256], sock[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
	*out = NULL;
	if (m == KVD_BPF_OFF)
		return 0;
	if (m == KVD_BPF_AUTO && !kvd_bpf_capable()) {
		log_msg(LOG_INFO, "bpf: not loading the metrics programs: no CAP_BPF and CAP_PERFMON");
		return 0;
	}
	const char *path = served_socket(socket_path, sock, sizeof(sock), &gid);
	int rc = kvd_pin_dir(dir, sizeof(dir), instance, path);
	if (rc < 0) {
		log_msg(m == KVD_BPF_ON ? LOG_ERR : LOG_WARNING, "bpf: no pin directory for instance '%s': %s",
			instance ? instance : path, strerror(-rc));
		return m == KVD_BPF_ON ? rc : 0;
	}
	rc = kvd_bpf_load(out, getpid(), dir, gid, err, sizeof(err));
	if (rc == -EBUSY) {
		log_msg(m == KVD_BPF_ON ? LOG_ERR : LOG_WARNING, "bpf: %s; not touching them: this daemon "
			"has no metrics (give it an instance of its own: --instance NAME)", err);
		return m == KVD_BPF_ON ? rc : 0;
	}
	if (rc) {
		log_msg(m == KVD_BPF_ON ? LOG_ERR : LOG_WARNING, "bpf: %s", err);
		return m == KVD_BPF_ON ? rc : 0;
	}
	log_msg(LOG_NOTICE, "bpf: metrics maps pinned under %s (kvtop --socket %s)", dir, path);
	return 0;
}

void obs_stop(struct kvd_bpf *b)
{
	kvd_bpf_unload(b);
}
