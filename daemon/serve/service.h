/* service.h — kvd under systemd: the listening socket (activated or made), sd_notify, the watchdog. */
#ifndef KVD_SERVICE_H
#define KVD_SERVICE_H

#include <stddef.h>
#include <stdint.h>

struct server_config;

/*
 * The listening socket: the one systemd passed (sd_listen_fds), else a new
 * one bound at cfg->socket_path (mode 0660, group cfg->socket_gid).
 * *activated is set when it came from systemd, and its path is written into
 * path. Returns the fd or -errno (-ENOTSOCK when systemd passed something
 * that is not a listening AF_UNIX SOCK_SEQPACKET socket, -E2BIG when more
 * than one).
 */
int service_listen(const struct server_config *cfg, int *activated, char *path, size_t len);

/*
 * Take every fd systemd passed (sd_listen_fds_with_names: the socket, and
 * what its fd store kept from the last run) once, early; later calls do
 * nothing. service_listen() and service_take_stored() hand them out.
 */
void service_collect_fds(void);
/* The fd systemd's store kept under name ("kvpool", "kvstate"), now the caller's; -1: none. */
int service_take_stored(const char *name);
/*
 * Hand fd to systemd's fd store under name (FDSTORE=1, FDNAME=), replacing
 * what it held under that name, so the next start gets it back. 0, or
 * -errno (-ENOTCONN: not run by systemd). Whether it is kept depends on the
 * unit's FileDescriptorStoreMax=.
 */
int service_store_fd(const char *name, int fd);

/* One sd_notify(3) message ("READY=1\nSTATUS=..."); nothing when not run by systemd. */
void service_notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The watchdog period systemd wants pings within (WATCHDOG_USEC), 0 when off. */
uint64_t service_watchdog_usec(void);

/* What STATUS= reports, copied out by the caller under whatever lock guards it. */
struct service_snapshot {
	const char *model;
	const char *backend;
	uint32_t kv_blocks;
	uint32_t kv_block_tokens;
	uint32_t sessions;
	uint32_t conns;
	int stopping;
};

/* STATUS= for systemctl status: model, backend, pool, sessions and connections. */
void service_status(const struct service_snapshot *st);

#endif
