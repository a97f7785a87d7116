/* server.c — the loop thread: the listening socket, accept, receive, reap, signals; the engine thread starts here. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/model/model.h"
#include "daemon/probes.h"
#include "daemon/serve/persist.h"
#include "daemon/serve/server.h"
#include "daemon/serve/service.h"
#include "daemon/serve/worker.h"
#include "daemon/tokenizer/tokenizer.h"
#include "kernels/backend.h"
#include "shm/kvring.h"
#include "uapi/kvd_pins.h"

static void on_recv(struct loop *l, struct loop_op *op, int res, int more);
static void on_kick(struct loop *l, struct loop_op *op, int res, int more);

/* ---- per-uid accounting ---- */

struct uid_usage *server_uid(struct server *srv, uid_t uid)
{
	for (struct uid_usage *u = srv->uids; u; u = u->next)
		if (u->uid == uid)
			return u;
	return NULL;
}

struct uid_usage *server_uid_get(struct server *srv, uid_t uid)
{
	struct uid_usage *u = server_uid(srv, uid);
	if (!u) {
		/* Each record is its own allocation: conns hold pointers to it. */
		if (!(u = calloc(1, sizeof(*u))))
			return NULL;
		u->uid = uid;
		u->next = srv->uids;
		srv->uids = u;
		srv->n_uids++;
	}
	u->conns++;
	return u;
}

void server_uid_put(struct server *srv, struct uid_usage *u)
{
	if (--u->conns)
		return;
	for (struct uid_usage **pp = &srv->uids; *pp; pp = &(*pp)->next)
		if (*pp == u) {
			*pp = u->next;
			break;
		}
	srv->n_uids--;
	free(u);
}

/* ---- connections ---- */

static int arm_recv(struct server *srv, struct conn *c)
{
	c->iov = (struct iovec){ c->rx, sizeof(c->rx) };
	c->msg = (struct msghdr){ .msg_iov = &c->iov, .msg_iovlen = 1,
				  .msg_control = c->cmsg.buf, .msg_controllen = sizeof(c->cmsg.buf) };
	return loop_recvmsg(srv->loop, &c->recv_op, c->fd, &c->msg);
}

/* Hang-up or protocol death: the engine thread cancels and releases, then the loop frees. */
static void conn_hangup(struct server *srv, struct conn *c)
{
	pthread_mutex_lock(&srv->lock);
	if (!c->dead) {
		c->dead = 1;
		c->rg.closed = 1;	/* nothing more is posted to it */
		KVD_PROBE(conn_close, c->pid, c->uid);
		log_msg(LOG_DEBUG, "connection from pid %d uid %u closed", (int)c->pid, (unsigned)c->uid);
	}
	pthread_cond_signal(&srv->work);
	pthread_mutex_unlock(&srv->lock);
}

static void close_passed_fds(struct msghdr *mh)
{
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int n = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		int *fds = (int *)CMSG_DATA(cm);
		for (int i = 0; i < n; i++)
			close(fds[i]);
	}
}

static void on_recv(struct loop *l, struct loop_op *op, int res, int more)
{
	(void)l;
	(void)more;
	struct conn *c = op->data;
	struct server *srv = c->srv;
	if (c->dead)
		return;
	if (res <= 0) {
		conn_hangup(srv, c);
		return;
	}
	/* A client has no business passing fds to the daemon. */
	if (c->msg.msg_controllen)
		close_passed_fds(&c->msg);
	if (c->msg.msg_flags & MSG_TRUNC)
		ctrl_reply_error(c, (const struct kvd_msg_hdr *)c->rx, KVD_MSG_ERROR, -EMSGSIZE);
	else
		ctrl_handle_msg(srv, c, c->rx, (size_t)res);
	if (arm_recv(srv, c))
		conn_hangup(srv, c);
}

static void on_kick(struct loop *l, struct loop_op *op, int res, int more)
{
	struct conn *c = op->data;
	struct server *srv = c->srv;
	if (c->dead)
		return;
	if (res < 0 && res != -ECANCELED)
		log_msg(LOG_WARNING, "poll on a kick eventfd failed: %s", strerror(-res));
	region_ack_kick(&c->rg);
	pthread_mutex_lock(&srv->lock);
	pthread_cond_signal(&srv->work);
	pthread_mutex_unlock(&srv->lock);
	if (!more && !c->dead && loop_poll_multishot(l, &c->kick_op, c->rg.kick_fd))
		conn_hangup(srv, c);
}

int server_watch_kick(struct server *srv, struct conn *c)
{
	c->kick_op = (struct loop_op){ .cb = on_kick, .data = c };
	return loop_poll_multishot(srv->loop, &c->kick_op, c->rg.kick_fd);
}

void server_kick_reaper(struct server *srv)
{
	uint64_t one = 1;
	if (write(srv->reap_fd, &one, sizeof(one)) < 0)
		log_msg(LOG_WARNING, "reap eventfd: write failed");
}

/*
 * Out of file descriptors (accept failed with EMFILE/ENFILE): a connection
 * left in the backlog would fail every re-armed accept at once, forever.
 * Take it on the spare fd kept for this, answer its HELLO (if it arrives
 * within 50 ms) with -EMFILE, and close it; the spare is reopened. Returns
 * nonzero when even the spare is gone, so the caller waits before it
 * accepts again rather than spin.
 */
static int shed_connection(struct server *srv, int err)
{
	if (srv->spare_fd < 0)
		srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (srv->spare_fd < 0)
		return 1;
	struct pollfd lp = { .fd = srv->listen_fd, .events = POLLIN };
	if (poll(&lp, 1, 0) != 1)
		return 0;	/* nobody waiting: never block the loop in accept */
	close(srv->spare_fd);
	int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd >= 0) {
		struct kvd_msg_hdr h = { 0 };
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		if (poll(&pfd, 1, 50) == 1 &&
		    recv(fd, &h, sizeof(h), MSG_DONTWAIT) == (ssize_t)sizeof(h) && h.magic == KVD_MAGIC) {
			struct kvd_msg_hdr r = { .magic = KVD_MAGIC, .type = KVD_MSG_ERROR,
						 .flags = KVD_MSGF_REPLY, .len = sizeof(r),
						 .seq = h.seq, .status = -EMFILE };
			if (send(fd, &r, sizeof(r), MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
				log_msg(LOG_DEBUG, "refusal not sent: %s", strerror(errno));
		}
		close(fd);
		log_msg(LOG_WARNING, "accept: %s: refused a connection", strerror(-err));
	}
	srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return 0;
}

static void on_accept_retry(struct loop *l, struct loop_op *op, int res, int more)
{
	(void)res;
	(void)more;
	struct server *srv = op->data;
	if (!srv->stopping && srv->listen_fd >= 0 && !srv->accept_op.armed)
		loop_accept_multishot(l, &srv->accept_op, srv->listen_fd);
}

/*
 * Say no to a connection at once, before it says anything: one ERROR reply
 * of sequence 0 (libkvclient takes it as the answer to its HELLO), then
 * close. Nothing of the daemon stays held for it.
 */
static void refuse(int fd, int status)
{
	struct kvd_msg_hdr r = { .magic = KVD_MAGIC, .type = KVD_MSG_ERROR, .flags = KVD_MSGF_REPLY,
				 .len = sizeof(r), .status = status };
	if (send(fd, &r, sizeof(r), MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
		log_msg(LOG_DEBUG, "refusal not sent: %s", strerror(errno));
	/*
	 * Closing with the client's HELLO unread would reset the connection
	 * and lose the refusal: stop it sending, drop what it sent, then close.
	 */
	shutdown(fd, SHUT_RDWR);
	char buf[SRV_RXBUF];
	while (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0)
		;
	close(fd);
}

/* A new connection on fd: its peer's credentials, its uid's record and limit, its first receive. */
static void add_conn(struct server *srv, int fd)
{
	struct conn *c = calloc(1, sizeof(*c));
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	if (!c || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl)) {
		free(c);
		close(fd);
		return;
	}
	c->srv = srv;
	c->fd = fd;
	c->pid = cred.pid;
	c->uid = cred.uid;
	c->gid = cred.gid;
	region_init(&c->rg);
	c->recv_op = (struct loop_op){ .cb = on_recv, .data = c };
	pthread_mutex_lock(&srv->lock);
	int status = (c->use = server_uid_get(srv, c->uid)) ? 0 : -ENOMEM;
	/* One uid's connections must leave file descriptors for everyone else's. */
	if (!status && c->use->conns > srv->cfg.max_uid_conns) {
		server_uid_put(srv, c->use);
		status = -EMFILE;
	}
	if (status) {
		pthread_mutex_unlock(&srv->lock);
		log_msg(LOG_WARNING, "refused pid %d uid %u: %s", (int)c->pid, (unsigned)c->uid,
			status == -EMFILE ? "its uid holds max-uid-connections already" : strerror(-status));
		refuse(fd, status);
		free(c);
		return;
	}
	c->next = srv->conns;
	srv->conns = c;
	srv->n_conns++;
	pthread_mutex_unlock(&srv->lock);
	log_msg(LOG_DEBUG, "connection from pid %d uid %u", (int)c->pid, (unsigned)c->uid);
	KVD_PROBE(conn_open, c->pid, c->uid);
	if (arm_recv(srv, c))
		conn_hangup(srv, c);
}

static void on_accept(struct loop *l, struct loop_op *op, int res, int more)
{
	struct server *srv = op->data;
	if (res >= 0) {
		add_conn(srv, res);
	} else if (res == -EMFILE || res == -ENFILE) {
		if (shed_connection(srv, res) && !more && !srv->stopping && srv->listen_fd >= 0) {
			/* Not even a spare fd: look again in 100 ms. */
			loop_timeout(l, &srv->accept_retry_op, 100);
			return;
		}
	} else if (res != -ECANCELED) {
		log_msg(LOG_WARNING, "accept: %s", strerror(-res));
	}
	if (!more && !srv->stopping && srv->listen_fd >= 0)
		loop_accept_multishot(l, &srv->accept_op, srv->listen_fd);
}

void server_conn_free(struct server *srv, struct conn *c)
{
	(void)srv;
	region_destroy(&c->rg);
	if (c->fd >= 0)
		close(c->fd);
	for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++)
		session_free(c->sessions[i]);
	free(c);
}

/*
 * Connections the engine thread has released: cancel their loop operations,
 * and free them once none is armed.
 */
static void reap(struct server *srv)
{
	if (srv->spare_fd < 0)	/* spent refusing a client while out of fds */
		srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	pthread_mutex_lock(&srv->lock);
	for (struct conn **pp = &srv->conns; *pp;) {
		struct conn *c = *pp;
		if (!c->released) {
			pp = &c->next;
			continue;
		}
		if (c->recv_op.armed || c->kick_op.armed) {
			if (!c->closing_ops) {
				loop_cancel(srv->loop, &c->recv_op);
				loop_cancel(srv->loop, &c->kick_op);
				/* Shutting the socket down completes a pending recvmsg too. */
				shutdown(c->fd, SHUT_RDWR);
				c->closing_ops = 1;
			}
			pp = &c->next;
			continue;
		}
		*pp = c->next;
		srv->n_conns--;
		srv->n_sessions -= c->n_sessions;
		c->use->sessions -= c->n_sessions;
		c->use->arena -= c->rg.bytes;
		server_uid_put(srv, c->use);
		server_conn_free(srv, c);
	}
	pthread_mutex_unlock(&srv->lock);
}

static void on_reap(struct loop *l, struct loop_op *op, int res, int more)
{
	struct server *srv = op->data;
	(void)res;
	reap(srv);
	if (!more)
		loop_read(l, &srv->reap_op, srv->reap_fd, &srv->reap_val, sizeof(srv->reap_val));
}

/* ---- systemd: status, watchdog, reload ---- */

static void server_status(struct server *srv)
{
	struct service_snapshot st = { .model = srv->m->hp.name, .backend = srv->be->ops->name,
				       .kv_blocks = engine_pool_blocks(srv->eng),
				       .kv_block_tokens = engine_pool_block_tokens(srv->eng) };
	pthread_mutex_lock(&srv->lock);
	st.sessions = srv->n_sessions;
	st.conns = srv->n_conns;
	st.stopping = srv->stopping;
	pthread_mutex_unlock(&srv->lock);
	service_status(&st);
}

/*
 * When systemd asked for a watchdog, it is pinged twice per period from
 * the event loop. The ping also takes the lock the engine thread holds for
 * a step, so a wedged loop or a deadlock stops the pings and systemd
 * restarts kvd.
 */
static void on_watchdog(struct loop *l, struct loop_op *op, int res, int more)
{
	(void)res;
	(void)more;
	struct server *srv = op->data;
	service_notify("WATCHDOG=1");
	server_status(srv);
	if (!op->armed)
		loop_timeout(l, op, srv->watchdog_ms);
}

static void watchdog_start(struct server *srv)
{
	uint64_t usec = service_watchdog_usec();
	if (!usec)
		return;
	/* Twice per period, as sd_watchdog_enabled(3) advises. */
	srv->watchdog_ms = (unsigned)(usec / 2000 ? usec / 2000 : 1);
	srv->watchdog_op = (struct loop_op){ .cb = on_watchdog, .data = srv };
	int rc = loop_timeout(srv->loop, &srv->watchdog_op, srv->watchdog_ms);
	if (rc)
		log_msg(LOG_ERR, "watchdog timer: %s", strerror(-rc));
	else
		log_msg(LOG_INFO, "watchdog: a ping every %u ms", srv->watchdog_ms);
}

static void reload(struct server *srv)
{
	if (!srv->cfg.reload) {
		log_msg(LOG_NOTICE, "SIGHUP: nothing to reload");
		return;
	}
	service_notify("RELOADING=1\nSTATUS=reloading the configuration");
	/* Only the loop thread writes cfg, so it may read it without the lock. */
	struct server_config live = srv->cfg;
	srv->cfg.reload(srv->cfg.reload_arg, &live);
	pthread_mutex_lock(&srv->lock);
	srv->cfg = live;
	/* A raised limit or quota may let waiting work run. */
	pthread_cond_signal(&srv->work);
	pthread_mutex_unlock(&srv->lock);
	service_notify("READY=1");
	server_status(srv);
}

static void on_signal(struct loop *l, struct loop_op *op, int res, int more)
{
	(void)more;
	struct server *srv = op->data;
	const struct signalfd_siginfo *si = (const void *)srv->sigbuf;
	if (res == (int)sizeof(struct signalfd_siginfo) && si->ssi_signo == SIGHUP) {
		reload(srv);
	} else if (res == (int)sizeof(struct signalfd_siginfo)) {
		const char *sig = si->ssi_signo == SIGINT ? "SIGINT" : "SIGTERM";
		if (srv->ps) {
			/* Everything is committed already: the step in flight, then out. */
			log_msg(LOG_NOTICE, "%s: stopping after the step in flight; the KV and the "
				"sessions are kept for the next start", sig);
			service_notify("STOPPING=1\nSTATUS=draining the step in flight; the KV and the "
				       "sessions are kept for the next start");
		} else {
			log_msg(LOG_NOTICE, "%s: draining (at most %u ms)", sig, srv->cfg.drain_timeout_ms);
			service_notify("STOPPING=1\nSTATUS=draining: finishing requests in flight (at most %u ms)",
				       srv->cfg.drain_timeout_ms);
		}
		pthread_mutex_lock(&srv->lock);
		srv->stopping = 1;
		srv->drain_deadline_ns = log_now_ns() + (uint64_t)srv->cfg.drain_timeout_ms * 1000000ull;
		pthread_cond_signal(&srv->work);
		pthread_mutex_unlock(&srv->lock);
		/* No new connections; the socket goes away now. */
		if (srv->listen_fd >= 0) {
			loop_cancel(l, &srv->accept_op);
			close(srv->listen_fd);
			srv->listen_fd = -1;
			/* An activated socket is systemd's: it stays for the next start. */
			if (!srv->activated)
				unlink(srv->cfg.socket_path);
		}
		return;
	}
	loop_read(l, &srv->signal_op, srv->signal_fd, srv->sigbuf, sizeof(struct signalfd_siginfo));
}

/* ---- setup ---- */

void server_block_signals(sigset_t *out)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	if (out)
		*out = set;
}

int server_create(struct server **out, const struct server_config *cfg, struct model *m,
		  struct tokenizer *tok, struct backend *be, struct kvpool *pool, struct persist *ps)
{
	struct server *srv = calloc(1, sizeof(*srv));
	if (!srv)
		return -ENOMEM;
	srv->cfg = *cfg;
	srv->m = m;
	srv->tok = tok;
	srv->be = be;
	srv->listen_fd = srv->signal_fd = srv->reap_fd = srv->vocab_fd = -1;
	srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	pthread_mutex_init(&srv->lock, NULL);
	pthread_cond_init(&srv->work, NULL);
	int rc;
	if ((rc = engine_create(&srv->eng, m, be, pool, cfg->max_batch_rows))) {
		log_msg(LOG_ERR, "engine: %s", strerror(-rc));
		goto err;
	}
	srv->ps = ps;
	const char *check = getenv("KVD_POOL_CHECK");
	srv->pool_check = check && *check && strcmp(check, "0");
	/* The sessions the last run kept wait for their clients; none can connect yet. */
	persist_restore_sessions(ps, srv);
	if ((rc = ctrl_build_vocab(srv))) {
		log_msg(LOG_ERR, "vocabulary memfd: %s", strerror(-rc));
		goto err;
	}
	if ((rc = loop_create(&srv->loop, 256))) {
		log_msg(LOG_ERR, "io_uring: %s", strerror(-rc));
		goto err;
	}
	sigset_t set;
	server_block_signals(&set);
	srv->signal_fd = signalfd(-1, &set, SFD_CLOEXEC);
	srv->reap_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (srv->signal_fd < 0 || srv->reap_fd < 0) {
		rc = -errno;
		goto err;
	}
	rc = service_listen(cfg, &srv->activated, srv->socket_name, sizeof(srv->socket_name));
	if (rc < 0) {
		log_msg(LOG_ERR, "%s: %s", srv->socket_name[0] ? srv->socket_name : cfg->socket_path,
			strerror(-rc));
		goto err;
	}
	srv->listen_fd = rc;
	*out = srv;
	return 0;
err:
	server_destroy(srv);
	return rc;
}

int server_run(struct server *srv)
{
	srv->accept_op = (struct loop_op){ .cb = on_accept, .data = srv };
	srv->signal_op = (struct loop_op){ .cb = on_signal, .data = srv };
	srv->reap_op = (struct loop_op){ .cb = on_reap, .data = srv };
	srv->accept_retry_op = (struct loop_op){ .cb = on_accept_retry, .data = srv };
	int rc = loop_accept_multishot(srv->loop, &srv->accept_op, srv->listen_fd);
	if (!rc)
		rc = loop_read(srv->loop, &srv->signal_op, srv->signal_fd, srv->sigbuf,
			       sizeof(struct signalfd_siginfo));
	if (!rc)
		rc = loop_read(srv->loop, &srv->reap_op, srv->reap_fd, &srv->reap_val,
			       sizeof(srv->reap_val));
	if (rc)
		return rc;
	if ((rc = pthread_create(&srv->engine_thread, NULL, worker_main, srv)))
		return -rc;
	log_msg(LOG_NOTICE, "listening on %s%s", srv->socket_name,
		srv->activated ? " (socket from systemd)" : "");
	watchdog_start(srv);
	/* The model is loaded, the pool reserved, the socket listening: ready. */
	service_notify("READY=1");
	server_status(srv);
	for (;;) {
		rc = loop_run_once(srv->loop, 1);
		if (rc < 0) {
			log_msg(LOG_ERR, "event loop: %s", strerror(-rc));
			break;
		}
		reap(srv);
		pthread_mutex_lock(&srv->lock);
		int done = srv->engine_exited;
		pthread_mutex_unlock(&srv->lock);
		if (done)
			break;
	}
	pthread_join(srv->engine_thread, NULL);
	reap(srv);
	return rc < 0 ? rc : 0;
}

void server_destroy(struct server *srv)
{
	if (!srv)
		return;
	while (srv->conns) {
		struct conn *c = srv->conns;
		srv->conns = c->next;
		server_conn_free(srv, c);
	}
	while (srv->uids) {
		struct uid_usage *u = srv->uids;
		srv->uids = u->next;
		free(u);
	}
	/* Their records stay for the next start; only this process's memory goes. */
	while (srv->orphans) {
		struct session *o = srv->orphans;
		srv->orphans = o->next_orphan;
		release_session(srv, NULL, o, 0);
		session_free(o);
	}
	if (srv->listen_fd >= 0) {
		close(srv->listen_fd);
		if (!srv->activated)
			unlink(srv->cfg.socket_path);
	}
	if (srv->signal_fd >= 0)
		close(srv->signal_fd);
	if (srv->reap_fd >= 0)
		close(srv->reap_fd);
	if (srv->vocab_fd >= 0)
		close(srv->vocab_fd);
	if (srv->spare_fd >= 0)
		close(srv->spare_fd);
	loop_destroy(srv->loop);
	engine_destroy(srv->eng);
	pthread_mutex_destroy(&srv->lock);
	pthread_cond_destroy(&srv->work);
	free(srv);
}

