/*
 * harness.h — what the daemon-side fuzz targets share: the model and
 * tokenizer loaded once, a real struct server built by server_create() on a
 * private socket (never run: the target plays the loop and engine threads),
 * and connections whose client end is a socketpair the target reads.
 */
#ifndef KVD_FUZZ_HARNESS_H
#define KVD_FUZZ_HARNESS_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/model/model.h"
#include "daemon/serve/server.h"
#include "daemon/tokenizer/tokenizer.h"
#include "kernels/backend.h"
#include "tests/lib/fixture.h"

static struct {
	struct fixture fx;		/* model, tokenizer; backend and pool for the server */
	struct server *srv;
	char dir[64];
	char sock[96];
} FZ;

/* Setup that fails makes every later input meaningless: stop loudly. */
static inline void fz_die(const char *what, const char *why)
{
	fprintf(stderr, "fuzz harness: %s: %s\n", what, why);
	abort();
}

static inline void fz_cleanup(void)
{
	if (FZ.srv)
		server_destroy(FZ.srv);	/* unlinks the socket */
	if (FZ.dir[0])
		rmdir(FZ.dir);
}

/* The model (KVD_MODEL, else the default one) and its tokenizer, once. */
static inline struct tokenizer *fz_tokenizer(void)
{
	if (FZ.fx.tok)
		return FZ.fx.tok;
	char err[512];
	log_set_level(LOG_ERR);
	if (fixture_load(&FZ.fx, err, sizeof(err)))
		fz_die("fixture", err);
	return FZ.fx.tok;
}

/* The daemon's defaults, a one-thread backend and a small pool. */
static inline struct server *fz_server(void)
{
	if (FZ.srv)
		return FZ.srv;
	fz_tokenizer();
	int rc;
	if ((rc = fixture_pool(&FZ.fx, 1, 64)))
		fz_die("cpu backend and kv pool", strerror(-rc));
	snprintf(FZ.dir, sizeof(FZ.dir), "/tmp/kvd-fuzz.XXXXXX");
	if (!mkdtemp(FZ.dir))
		fz_die("mkdtemp", strerror(errno));
	snprintf(FZ.sock, sizeof(FZ.sock), "%s/kvd.sock", FZ.dir);
	struct server_config cfg = {
		.socket_path = FZ.sock, .socket_gid = (gid_t)-1, .max_sessions = 16, .max_slots = 8,
		.max_tokens = 8192, .max_inflight = 256, .max_uid_sessions = 64,
		.max_uid_inflight = 1024, .max_uid_arena = 1ull << 30, .sq_entries = 64,
		.cq_entries = 256, .arena_bytes = 1 << 20, .max_arena_bytes = 64 << 20,
		.max_batch_rows = 8, .drain_timeout_ms = 1000,
	};
	if ((rc = server_create(&FZ.srv, &cfg, FZ.fx.m, FZ.fx.tok, FZ.fx.be, FZ.fx.pool, NULL)))
		fz_die("server_create", strerror(-rc));
	/* server_create blocks SIGINT/SIGTERM for its signalfd; the fuzzer wants them. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_UNBLOCK, &set, NULL);
	kvpool_get_stats(FZ.fx.pool, &FZ.srv->pool_stats);	/* the engine thread does this first */
	atexit(fz_cleanup);
	return FZ.srv;
}

/* A connection of the calling uid, as on_accept makes it; *client: the other end. */
static inline struct conn *fz_conn_new(struct server *srv, int *client)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv))
		fz_die("socketpair", strerror(errno));
	struct conn *c = calloc(1, sizeof(*c));
	if (!c)
		fz_die("calloc", "out of memory");
	c->srv = srv;
	c->fd = sv[0];
	c->pid = getpid();
	c->uid = getuid();
	c->gid = getgid();
	region_init(&c->rg);
	c->use = server_uid_get(srv, c->uid);
	if (!c->use)
		fz_die("uid record", "out of memory");
	srv->n_conns++;
	*client = sv[1];
	return c;
}

/* Read and drop every reply waiting at the client end, closing passed fds. */
static inline void fz_drain_replies(int client, void (*check)(const void *msg, size_t len))
{
	uint8_t buf[2048];
	union {
		char b[CMSG_SPACE(8 * sizeof(int))];
		struct cmsghdr align;
	} u;
	for (;;) {
		struct iovec iov = { buf, sizeof(buf) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
				     .msg_controllen = sizeof(u.b) };
		ssize_t n = recvmsg(client, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n <= 0)
			return;
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			for (int i = 0; i < k; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(fd));
				close(fd);
			}
		}
		if (check)
			check(buf, (size_t)n);
	}
}


/*
 * Hang-up: the engine thread's release, then the loop thread's reap. Every
 * count the connection added must come back to what it was: anything else
 * is a leak the fuzzer reports as a crash.
 */
static inline void fz_conn_free(struct server *srv, struct conn *c, int client)
{
	close(client);
	c->dead = 1;
	c->rg.closed = 1;
	release_conn(srv, c);
	uint64_t v;
	if (read(srv->reap_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		fz_die("reap eventfd", strerror(errno));
	if (c->kick_op.armed) {
		loop_cancel(srv->loop, &c->kick_op);
		for (int i = 0; c->kick_op.armed && i < 1000; i++)
			loop_run_once(srv->loop, 1);
		if (c->kick_op.armed)
			fz_die("kick poll", "not cancelled");
	}
	if (c->inflight || c->use->inflight)
		fz_die("released connection", "requests still counted in flight");
	srv->n_conns--;
	srv->n_sessions -= c->n_sessions;
	c->use->sessions -= c->n_sessions;
	c->use->arena -= c->rg.bytes;
	if (c->use->sessions || c->use->arena || srv->n_sessions || srv->n_conns)
		fz_die("released connection", "session or arena accounting off");
	server_uid_put(srv, c->use);
	if (srv->n_uids)
		fz_die("released connection", "its uid's record outlives its last connection");
	server_conn_free(srv, c);
}

/* A little-endian reader over the fuzz input. */
struct fz_in {
	const uint8_t *p;
	size_t left;
};

static inline uint32_t fz_take(struct fz_in *in, unsigned bytes)
{
	uint32_t v = 0;
	for (unsigned i = 0; i < bytes && in->left; i++, in->left--)
		v |= (uint32_t)*in->p++ << (8 * i);
	return v;
}

#endif
