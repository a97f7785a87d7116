/* service.h — kvd under systemd: the listening socket (activated or made), sd_notify, the watchdog. */
#ifndef KVD_SERVICE_H
#define KVD_SERVICE_H

#include <stddef.h>
#include <stdint.h>

struct server;
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

/* One sd_notify(3) message ("READY=1\nSTATUS=..."); nothing when not run by systemd. */
void service_notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The watchdog period systemd wants pings within (WATCHDOG_USEC), 0 when off. */
uint64_t service_watchdog_usec(void);

/* STATUS= for systemctl status: model, backend, pool, sessions and connections. */
void service_status(struct server *srv);

/*
 * When systemd asked for a watchdog: ping it twice per period from the
 * event loop. The ping also takes the lock the engine thread holds for a
 * step, so a wedged loop or a deadlock stops the pings and systemd
 * restarts kvd.
 */
void service_watchdog_start(struct server *srv);

/* SIGHUP: RELOADING=1, the reload hook, the new live limits installed, READY=1. */
void service_reload(struct server *srv);

#endif
