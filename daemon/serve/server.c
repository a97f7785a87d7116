/* server.c — the control plane on the loop thread: the socket, HELLO/SESSION/STATS, shared regions, signals. */
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
#include "daemon/serve/server.h"
#include "daemon/serve/service.h"
#include "daemon/tokenizer/tokenizer.h"
#include "kernels/backend.h"
#include "shm/kvring.h"
#include "uapi/kvd_pins.h"

static void on_recv(struct loop *l, struct loop_op *op, int res, int more);
static void on_kick(struct loop *l, struct loop_op *op, int res, int more);

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the vocabulary memfd: token bytes for clients to detokenize locally ---- */

static int build_vocab(struct server *srv)
{
	uint32_t n = tokenizer_vocab_size(srv->tok);
	size_t bytes = 0;
	char buf[1024];
	for (uint32_t i = 0; i < n; i++) {
		int b = tokenizer_token_bytes(srv->tok, i, 0, buf, sizeof(buf));
		if (b < 0)
			return b;
		bytes += (size_t)b;
	}
	struct kvd_vocab_hdr h = { .magic = KVD_VOCAB_MAGIC, .n_tokens = n };
	h.offsets_off = sizeof(h);
	h.flags_off = h.offsets_off + ((size_t)n + 1) * sizeof(uint32_t);
	h.bytes_off = (h.flags_off + n + 7) & ~(uint64_t)7;
	h.bytes_len = bytes;
	size_t total = h.bytes_off + bytes;
	if (total > UINT32_MAX)
		return -E2BIG;
	int fd = memfd_create("kvd-vocab", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	uint8_t *p = MAP_FAILED;
	if (ftruncate(fd, (off_t)total) ||
	    (p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	memcpy(p, &h, sizeof(h));
	uint32_t *off = (uint32_t *)(p + h.offsets_off);
	uint8_t *flags = p + h.flags_off;
	uint32_t at = 0;
	for (uint32_t i = 0; i < n; i++) {
		int b = tokenizer_token_bytes(srv->tok, i, 0, (char *)p + h.bytes_off + at,
					      total - h.bytes_off - at);
		off[i] = at;
		at += (uint32_t)b;
		flags[i] = (tokenizer_is_eog(srv->tok, i) ? KVD_TOKF_EOG : 0) |
			   (b == 0 && tokenizer_token_bytes(srv->tok, i, 1, buf, sizeof(buf)) > 0 ?
				    KVD_TOKF_CONTROL : 0);
	}
	off[n] = at;
	munmap(p, total);
	/* Sealed: clients map it read-only and nobody can change or resize it. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	srv->vocab_fd = fd;
	srv->vocab_bytes = (uint32_t)total;
	return 0;
}

/* ---- sending replies ---- */

static int send_reply(struct conn *c, void *msg, size_t len, const int *fds, int nfds)
{
	struct kvd_msg_hdr *h = msg;
	h->flags |= KVD_MSGF_REPLY;
	h->len = (uint32_t)len;
	struct iovec iov = { msg, len };
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds) {
		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
	}
	/* Never block the loop on a client that does not read its socket. */
	ssize_t n = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	return n == (ssize_t)len ? 0 : n < 0 ? -errno : -EIO;
}

static void reply_error(struct conn *c, const struct kvd_msg_hdr *req, int type, int status)
{
	struct kvd_msg_hdr h = { .magic = KVD_MAGIC, .type = (uint16_t)type,
				 .seq = req ? req->seq : 0, .status = status };
	send_reply(c, &h, sizeof(h), NULL, 0);
}

static int all_zero(const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

/* ---- HELLO ---- */

static void do_hello(struct server *srv, struct conn *c, const struct kvd_hello_req *rq)
{
	if (rq->abi_version != KVD_ABI_VERSION) {
		reply_error(c, &rq->hdr, KVD_MSG_HELLO, -EPROTO);
		return;
	}
	if (!all_zero(rq->resv, sizeof(rq->resv))) {
		reply_error(c, &rq->hdr, KVD_MSG_HELLO, -EINVAL);
		return;
	}
	struct kvd_hello_rep r;
	memset(&r, 0, sizeof(r));
	const struct model_hparams *hp = &srv->m->hp;
	const struct kvpool_config *pc = kvpool_config(srv->pool);
	r.hdr = (struct kvd_msg_hdr){ .magic = KVD_MAGIC, .type = KVD_MSG_HELLO, .seq = rq->hdr.seq };
	r.abi_version = KVD_ABI_VERSION;
	r.features = rq->features & KVD_FEAT_ALL;
	r.vocab_size = hp->vocab;
	r.ctx_len = hp->ctx_len;
	r.bos_id = tokenizer_bos(srv->tok);
	r.eos_id = tokenizer_eos(srv->tok);
	r.eot_id = tokenizer_eot(srv->tok);
	r.max_sessions = srv->cfg.max_sessions;
	r.max_sq_entries = 4096;
	r.max_cq_entries = 16384;
	r.max_arena_bytes = srv->cfg.max_arena_bytes;
	r.kv_block_tokens = pc->block_tokens;
	r.kv_blocks_total = pc->n_blocks;
	snprintf(r.model_name, sizeof(r.model_name), "%s", hp->name);
	snprintf(r.backend, sizeof(r.backend), "%s", srv->be->ops->name);
	r.max_tokens = srv->cfg.max_tokens;
	r.max_slots = srv->cfg.max_slots;
	if (r.features & KVD_FEAT_VOCAB) {
		r.flags = KVD_HELLOF_VOCAB;
		r.vocab_bytes = srv->vocab_bytes;
		send_reply(c, &r, sizeof(r), &srv->vocab_fd, 1);
	} else {
		send_reply(c, &r, sizeof(r), NULL, 0);
	}
}

/* ---- SESSION_OPEN: the region on the first open ---- */

static int is_pow2(uint32_t x)
{
	return x && !(x & (x - 1));
}

static size_t align64(size_t x)
{
	return (x + 63) & ~(size_t)63;
}

static int make_region(struct server *srv, struct conn *c, const struct kvd_session_open_req *rq)
{
	uint32_t sq = rq->sq_entries ? rq->sq_entries : srv->cfg.sq_entries;
	uint32_t cq = rq->cq_entries ? rq->cq_entries : srv->cfg.cq_entries;
	uint32_t arena = rq->arena_bytes ? rq->arena_bytes : srv->cfg.arena_bytes;
	if (!is_pow2(sq) || !is_pow2(cq) || sq > 4096 || cq > 16384 || arena % 4 ||
	    arena > srv->cfg.max_arena_bytes)
		return -EINVAL;
	size_t sq_off = 0, cq_off = align64(sizeof(struct kvd_ring_hdr));
	size_t sqes_off = cq_off + align64(sizeof(struct kvd_ring_hdr));
	size_t cqes_off = sqes_off + align64((size_t)sq * sizeof(struct kvd_sqe));
	size_t arena_off = cqes_off + align64((size_t)cq * sizeof(struct kvd_cqe));
	long page = sysconf(_SC_PAGESIZE);
	size_t total = (arena_off + arena + (size_t)page - 1) & ~((size_t)page - 1);
	int memfd = memfd_create("kvd-session", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (memfd < 0)
		return -errno;
	int rc = 0;
	uint8_t *p = MAP_FAILED;
	if (ftruncate(memfd, (off_t)total) ||
	    (p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0)) == MAP_FAILED ||
	    /* A client must not shrink the region under the daemon (SIGBUS). */
	    fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		rc = -errno;
		goto err;
	}
	c->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->call_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->kick_fd < 0 || c->call_fd < 0) {
		rc = -errno;
		goto err;
	}
	c->memfd = memfd;
	c->region = p;
	c->region_bytes = total;
	c->sq = (struct kvd_ring_hdr *)(p + sq_off);
	c->cq = (struct kvd_ring_hdr *)(p + cq_off);
	c->sqes = (struct kvd_sqe *)(p + sqes_off);
	c->cqes = (struct kvd_cqe *)(p + cqes_off);
	c->arena = p + arena_off;
	c->arena_bytes = arena;
	c->sq_entries = sq;
	c->cq_entries = cq;
	kvring_init(c->sq, sq);
	kvring_init(c->cq, cq);
	/* The engine thread may be asleep already: the first SQE must kick it. */
	kvring_set_need_wakeup(c->sq);
	c->kick_op = (struct loop_op){ .cb = on_kick, .data = c };
	if ((rc = loop_poll_multishot(srv->loop, &c->kick_op, c->kick_fd)))
		goto err;
	return 0;
err:
	if (p != MAP_FAILED)
		munmap(p, total);
	close(memfd);
	c->memfd = -1;	/* closed here: server_conn_free must not close it (or its reuse) again */
	if (c->kick_fd >= 0)
		close(c->kick_fd);
	if (c->call_fd >= 0)
		close(c->call_fd);
	c->kick_fd = c->call_fd = -1;
	c->region = NULL;
	return rc;
}

static void do_session_open(struct server *srv, struct conn *c, const struct kvd_session_open_req *rq)
{
	if (rq->resv0 || !all_zero(rq->resv, sizeof(rq->resv))) {
		reply_error(c, &rq->hdr, KVD_MSG_SESSION_OPEN, -EINVAL);
		return;
	}
	pthread_mutex_lock(&srv->lock);
	int rc = 0, first = !c->region;
	uint32_t idx = SRV_MAX_SESSIONS;
	if (c->n_sessions >= srv->cfg.max_sessions || c->use->sessions >= srv->cfg.max_uid_sessions)
		rc = -EMFILE;
	uint64_t want = rq->arena_bytes ? rq->arena_bytes : srv->cfg.arena_bytes;
	if (!rc && first && c->use->arena + want > srv->cfg.max_uid_arena)
		rc = -EDQUOT;
	for (uint32_t i = 0; !rc && i < srv->cfg.max_sessions && idx == SRV_MAX_SESSIONS; i++)
		if (!c->sessions[i])
			idx = i;
	struct session *s = NULL;
	if (!rc && !(s = calloc(1, sizeof(*s))))
		rc = -ENOMEM;
	if (!rc && !(s->slots = calloc(srv->cfg.max_slots, sizeof(struct slot))))
		rc = -ENOMEM;
	if (!rc && first)
		rc = make_region(srv, c, rq);
	if (rc) {
		pthread_mutex_unlock(&srv->lock);
		if (s)
			free(s->slots);
		free(s);
		reply_error(c, &rq->hdr, KVD_MSG_SESSION_OPEN, rc);
		return;
	}
	/* Session ids carry their table index in the low bits and a generation above. */
	s->id = (++c->next_session << 8) | idx;
	c->sessions[idx] = s;
	c->n_sessions++;
	c->use->sessions++;
	if (first)
		c->use->arena += c->region_bytes;
	srv->n_sessions++;
	struct kvd_session_open_rep r;
	memset(&r, 0, sizeof(r));
	r.hdr = (struct kvd_msg_hdr){ .magic = KVD_MAGIC, .type = KVD_MSG_SESSION_OPEN,
				      .seq = rq->hdr.seq };
	r.session_id = s->id;
	r.flags = first ? KVD_OPENF_FDS : 0;
	r.sq_entries = c->sq_entries;
	r.cq_entries = c->cq_entries;
	r.region_bytes = c->region_bytes;
	r.sq_off = (uint64_t)((uint8_t *)c->sq - c->region);
	r.cq_off = (uint64_t)((uint8_t *)c->cq - c->region);
	r.sqes_off = (uint64_t)((uint8_t *)c->sqes - c->region);
	r.cqes_off = (uint64_t)((uint8_t *)c->cqes - c->region);
	r.arena_off = (uint64_t)(c->arena - c->region);
	r.arena_bytes = c->arena_bytes;
	pthread_mutex_unlock(&srv->lock);
	int fds[3] = { c->memfd, c->kick_fd, c->call_fd };
	send_reply(c, &r, sizeof(r), fds, first ? 3 : 0);
}

static struct session *find_session(struct conn *c, uint32_t id)
{
	if ((id & 0xff) >= SRV_MAX_SESSIONS)
		return NULL;
	struct session *s = c->sessions[id & 0xff];
	return s && s->id == id && !s->closing ? s : NULL;
}

static void do_session_close(struct server *srv, struct conn *c, const struct kvd_session_close_req *rq)
{
	if (rq->resv) {
		reply_error(c, &rq->hdr, KVD_MSG_SESSION_CLOSE, -EINVAL);
		return;
	}
	pthread_mutex_lock(&srv->lock);
	struct session *s = find_session(c, rq->session_id);
	if (s) {
		/*
		 * The id is dead from now on; the engine thread ends its requests
		 * CANCELLED and returns its blocks at the next step boundary.
		 */
		s->closing = 1;
		pthread_cond_signal(&srv->work);
	}
	pthread_mutex_unlock(&srv->lock);
	struct kvd_msg_hdr h = { .magic = KVD_MAGIC, .type = KVD_MSG_SESSION_CLOSE,
				 .seq = rq->hdr.seq, .status = s ? 0 : -ENOENT };
	send_reply(c, &h, sizeof(h), NULL, 0);
}

static void do_stats(struct server *srv, struct conn *c, const struct kvd_msg_hdr *rq)
{
	struct kvd_stats_rep r;
	memset(&r, 0, sizeof(r));
	r.hdr = (struct kvd_msg_hdr){ .magic = KVD_MAGIC, .type = KVD_MSG_STATS, .seq = rq->seq };
	pthread_mutex_lock(&srv->lock);
	r.requests = srv->n_requests;
	r.tokens_prefilled = srv->n_prefilled;
	r.tokens_generated = srv->n_generated;
	r.kv_blocks_total = srv->pool_stats.blocks_total;
	r.kv_blocks_used = srv->pool_stats.blocks_in_use;
	r.kv_blocks_cached = srv->pool_stats.blocks_cached;
	r.prefix_hit_tokens = srv->pool_stats.prefix_hit_tokens;
	r.prefix_miss_tokens = srv->pool_stats.prefix_miss_tokens;
	r.evictions = srv->pool_stats.evictions;
	r.preemptions = srv->n_preemptions;
	r.steps = srv->n_steps;
	r.connections = srv->n_conns;
	r.sessions = srv->n_sessions;
	pthread_mutex_unlock(&srv->lock);
	send_reply(c, &r, sizeof(r), NULL, 0);
}

/* One control datagram: checked, dispatched, answered; the connection stays usable. */
static void handle_msg(struct server *srv, struct conn *c, size_t len)
{
	const struct kvd_msg_hdr *h = (const struct kvd_msg_hdr *)c->rx;
	if (len < sizeof(*h) || h->magic != KVD_MAGIC) {
		reply_error(c, len >= sizeof(*h) ? h : NULL, KVD_MSG_ERROR, -EPROTO);
		return;
	}
	if (h->len != len || h->flags || h->status || h->resv) {
		reply_error(c, h, KVD_MSG_ERROR, -EINVAL);
		return;
	}
	static const size_t sizes[KVD_MSG_LAST] = {
		[KVD_MSG_HELLO] = sizeof(struct kvd_hello_req),
		[KVD_MSG_SESSION_OPEN] = sizeof(struct kvd_session_open_req),
		[KVD_MSG_SESSION_CLOSE] = sizeof(struct kvd_session_close_req),
		[KVD_MSG_STATS] = sizeof(struct kvd_msg_hdr),
	};
	if (h->type >= KVD_MSG_LAST || !sizes[h->type]) {
		reply_error(c, h, KVD_MSG_ERROR, -EINVAL);
		return;
	}
	if (len != sizes[h->type]) {
		reply_error(c, h, h->type, -EINVAL);
		return;
	}
	switch (h->type) {
	case KVD_MSG_HELLO:
		do_hello(srv, c, (const struct kvd_hello_req *)c->rx);
		break;
	case KVD_MSG_SESSION_OPEN:
		do_session_open(srv, c, (const struct kvd_session_open_req *)c->rx);
		break;
	case KVD_MSG_SESSION_CLOSE:
		do_session_close(srv, c, (const struct kvd_session_close_req *)c->rx);
		break;
	case KVD_MSG_STATS:
		do_stats(srv, c, h);
		break;
	}
}

/* ---- per-uid accounting ---- */

struct uid_usage *server_uid(struct server *srv, uid_t uid)
{
	for (uint32_t i = 0; i < srv->n_uids; i++)
		if (srv->uids[i].uid == uid)
			return &srv->uids[i];
	/* Records live in a fixed array and are never removed, so pointers to them stay valid. */
	return NULL;
}

static struct uid_usage *uid_add(struct server *srv, uid_t uid)
{
	struct uid_usage *u = server_uid(srv, uid);
	if (u || srv->n_uids >= 4096)
		return u;
	u = &srv->uids[srv->n_uids++];
	*u = (struct uid_usage){ .uid = uid };
	return u;
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
		reply_error(c, (const struct kvd_msg_hdr *)c->rx, KVD_MSG_ERROR, -EMSGSIZE);
	else
		handle_msg(srv, c, (size_t)res);
	if (arm_recv(srv, c))
		conn_hangup(srv, c);
}

static void on_kick(struct loop *l, struct loop_op *op, int res, int more)
{
	struct conn *c = op->data;
	struct server *srv = c->srv;
	uint64_t v;
	if (c->dead)
		return;
	if (res < 0 && res != -ECANCELED)
		log_msg(LOG_WARNING, "poll on a kick eventfd failed: %s", strerror(-res));
	if (read(c->kick_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_msg(LOG_WARNING, "kick eventfd: %s", strerror(errno));
	pthread_mutex_lock(&srv->lock);
	pthread_cond_signal(&srv->work);
	pthread_mutex_unlock(&srv->lock);
	if (!more && !c->dead && loop_poll_multishot(l, &c->kick_op, c->kick_fd))
		conn_hangup(srv, c);
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

static void on_accept(struct loop *l, struct loop_op *op, int res, int more)
{
	struct server *srv = op->data;
	if (res >= 0) {
		struct conn *c = calloc(1, sizeof(*c));
		struct ucred cred;
		socklen_t cl = sizeof(cred);
		if (!c || getsockopt(res, SOL_SOCKET, SO_PEERCRED, &cred, &cl)) {
			free(c);
			close(res);
		} else {
			c->srv = srv;
			c->fd = res;
			c->pid = cred.pid;
			c->uid = cred.uid;
			c->gid = cred.gid;
			c->memfd = c->kick_fd = c->call_fd = -1;
			c->recv_op = (struct loop_op){ .cb = on_recv, .data = c };
			pthread_mutex_lock(&srv->lock);
			c->use = uid_add(srv, c->uid);
			if (!c->use) {
				pthread_mutex_unlock(&srv->lock);
				log_msg(LOG_WARNING, "too many distinct uids; refusing pid %d", (int)c->pid);
				close(res);
				free(c);
				goto rearm;
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
	} else if (res == -EMFILE || res == -ENFILE) {
		if (shed_connection(srv, res) && !more && !srv->stopping && srv->listen_fd >= 0) {
			/* Not even a spare fd: look again in 100 ms. */
			loop_timeout(l, &srv->accept_retry_op, 100);
			return;
		}
	} else if (res != -ECANCELED) {
		log_msg(LOG_WARNING, "accept: %s", strerror(-res));
	}
rearm:
	if (!more && !srv->stopping && srv->listen_fd >= 0)
		loop_accept_multishot(l, &srv->accept_op, srv->listen_fd);
}

void server_conn_free(struct server *srv, struct conn *c)
{
	(void)srv;
	if (c->region)
		munmap(c->region, c->region_bytes);
	if (c->memfd >= 0)
		close(c->memfd);
	if (c->kick_fd >= 0)
		close(c->kick_fd);
	if (c->call_fd >= 0)
		close(c->call_fd);
	if (c->fd >= 0)
		close(c->fd);
	while (c->ovf_head) {
		struct cqe_node *n = c->ovf_head;
		c->ovf_head = n->next;
		free(n);
	}
	for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++)
		if (c->sessions[i]) {
			free(c->sessions[i]->slots);
			free(c->sessions[i]);
		}
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
		if (c->region)
			c->use->arena -= c->region_bytes;
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

static void on_signal(struct loop *l, struct loop_op *op, int res, int more)
{
	(void)more;
	struct server *srv = op->data;
	const struct signalfd_siginfo *si = (const void *)srv->sigbuf;
	if (res == (int)sizeof(struct signalfd_siginfo) && si->ssi_signo == SIGHUP) {
		service_reload(srv);
	} else if (res == (int)sizeof(struct signalfd_siginfo)) {
		log_msg(LOG_NOTICE, "%s: draining (at most %u ms)",
			si->ssi_signo == SIGINT ? "SIGINT" : "SIGTERM", srv->cfg.drain_timeout_ms);
		service_notify("STOPPING=1\nSTATUS=draining: finishing requests in flight (at most %u ms)",
			       srv->cfg.drain_timeout_ms);
		pthread_mutex_lock(&srv->lock);
		srv->stopping = 1;
		srv->drain_deadline_ns = now_ns() + (uint64_t)srv->cfg.drain_timeout_ms * 1000000ull;
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

int server_create(struct server **out, const struct server_config *cfg, struct model *m,
		  struct tokenizer *tok, struct backend *be, struct kvpool *pool)
{
	struct server *srv = calloc(1, sizeof(*srv));
	if (!srv)
		return -ENOMEM;
	srv->cfg = *cfg;
	srv->m = m;
	srv->tok = tok;
	srv->be = be;
	srv->pool = pool;
	srv->listen_fd = srv->signal_fd = srv->reap_fd = srv->vocab_fd = -1;
	srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	pthread_mutex_init(&srv->lock, NULL);
	pthread_cond_init(&srv->work, NULL);
	int rc = -ENOMEM;
	srv->uids = calloc(4096, sizeof(*srv->uids));
	if (!srv->uids)
		goto err;
	if ((rc = engine_create(&srv->eng, m, be, pool, cfg->max_batch_rows))) {
		log_msg(LOG_ERR, "engine: %s", strerror(-rc));
		goto err;
	}
	if ((rc = build_vocab(srv))) {
		log_msg(LOG_ERR, "vocabulary memfd: %s", strerror(-rc));
		goto err;
	}
	if ((rc = loop_create(&srv->loop, 256))) {
		log_msg(LOG_ERR, "io_uring: %s", strerror(-rc));
		goto err;
	}
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
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
	if ((rc = pthread_create(&srv->engine_thread, NULL, sched_thread, srv)))
		return -rc;
	log_msg(LOG_NOTICE, "listening on %s%s", srv->socket_name,
		srv->activated ? " (socket from systemd)" : "");
	service_watchdog_start(srv);
	/* The model is loaded, the pool reserved, the socket listening: ready. */
	service_notify("READY=1");
	service_status(srv);
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
	free(srv->uids);
	free(srv);
}

/* One control datagram as on_recv hands it over (tests and fuzzing enter here). */
void server_handle_msg(struct server *srv, struct conn *c, const void *msg, size_t len)
{
	if (len > sizeof(c->rx)) {
		reply_error(c, NULL, KVD_MSG_ERROR, -EMSGSIZE);
		return;
	}
	memcpy(c->rx, msg, len);
	handle_msg(srv, c, len);
}
