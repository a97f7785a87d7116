/* wire.c — the raw client of wire.h: control messages, the mapped region, SQ and CQ by hand. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include "shm/kvring.h"
#include "tests/lib/wait.h"
#include "tests/lib/wire.h"

static int64_t wire_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void wire_init(struct wire *r)
{
	memset(r, 0, sizeof(*r));
	r->fd = r->memfd = r->kick_fd = r->call_fd = -1;
}

void wire_close(struct wire *r)
{
	if (r->region)
		munmap(r->region, r->region_bytes);
	int fds[4] = { r->fd, r->memfd, r->kick_fd, r->call_fd };
	for (int i = 0; i < 4; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	wire_init(r);
}

int wire_connect(struct wire *r, const char *sock)
{
	wire_init(r);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	r->fd = fd;
	return 0;
}

/*
 * One datagram within timeout_ms: its length, 0 at EOF, or -errno
 * (-ETIMEDOUT). Passed fds go to fds (at most 4, *nfds of them); with fds
 * NULL they are closed.
 */
int wire_recv(struct wire *r, void *buf, size_t cap, int *fds, int *nfds, int timeout_ms)
{
	struct pollfd p = { r->fd, POLLIN, 0 };
	int n = poll(&p, 1, timeout_ms);
	if (n <= 0)
		return n < 0 ? -errno : -ETIMEDOUT;
	union {
		char b[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { buf, cap };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
			     .msg_controllen = sizeof(u.b) };
	ssize_t got = recvmsg(r->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (got < 0)
		return -errno;
	int k = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int cnt = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int i = 0; i < cnt; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(fd));
			if (fds && k < 4)
				fds[k++] = fd;
			else
				close(fd);
		}
	}
	if (nfds)
		*nfds = k;
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		while (k)
			close(fds[--k]);
		if (nfds)
			*nfds = 0;
		return -EMSGSIZE;
	}
	return (int)got;
}

/* Send req (its header's seq is filled in here) and take the reply: its length or -errno. */
int wire_call(struct wire *r, void *req, size_t len, void *rep, size_t cap, int *fds,
		    int *nfds)
{
	struct kvd_msg_hdr *q = req;
	q->seq = ++r->seq;
	if (send(r->fd, req, len, MSG_NOSIGNAL) != (ssize_t)len)
		return -errno;
	/* A reply is a hang detector's wait, not a speed requirement (tests/lib/wait.h). */
	int n = wire_recv(r, rep, cap, fds, nfds, kw_ms(30000));
	if (n <= 0)
		return n ? n : -ECONNRESET;
	const struct kvd_msg_hdr *h = rep;
	if ((size_t)n < sizeof(*h) || h->magic != KVD_MAGIC || !(h->flags & KVD_MSGF_REPLY) ||
	    h->seq != q->seq || h->len != (uint32_t)n) {
		if (nfds)
			while (*nfds)
				close(fds[--*nfds]);
		return -EPROTO;
	}
	return n;
}

int wire_hello(struct wire *r, uint32_t features)
{
	struct kvd_hello_req q = { .hdr = wire_hdr(KVD_MSG_HELLO, sizeof(q)),
				   .abi_version = KVD_ABI_VERSION, .features = features };
	int n = wire_call(r, &q, sizeof(q), &r->hello, sizeof(r->hello), NULL, NULL);
	if (n < 0)
		return n;
	if (r->hello.hdr.status)
		return r->hello.hdr.status;
	/* Senders zero reserved fields: the daemon too. */
	return n == (int)sizeof(r->hello) && r->hello.hdr.type == KVD_MSG_HELLO &&
	       !r->hello.resv0 && !r->hello.resv[0] ? 0 : -EPROTO;
}

/* Map the region a first SESSION_OPEN reply describes; fds (memfd, kick, call) become r's on 0. */
static int wire_map(struct wire *r, const struct kvd_session_open_rep *a, const int *fds)
{
	const uint64_t offs[5] = { a->sq_off, a->cq_off, a->sqes_off, a->cqes_off, a->arena_off };
	/* Every part starts on a 64-byte boundary and lies inside the region. */
	for (int i = 0; i < 5; i++)
		if (offs[i] % 64 || offs[i] >= a->region_bytes)
			return -EPROTO;
	if (a->sqes_off + (uint64_t)a->sq_entries * sizeof(struct kvd_sqe) > a->region_bytes ||
	    a->cqes_off + (uint64_t)a->cq_entries * sizeof(struct kvd_cqe) > a->region_bytes ||
	    a->arena_off + a->arena_bytes > a->region_bytes)
		return -EPROTO;
	uint8_t *p = mmap(NULL, a->region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (p == MAP_FAILED)
		return -errno;
	if (((struct kvd_ring_hdr *)(p + a->sq_off))->ring_entries != a->sq_entries ||
	    ((struct kvd_ring_hdr *)(p + a->cq_off))->ring_entries != a->cq_entries) {
		munmap(p, a->region_bytes);
		return -EPROTO;
	}
	r->region = p;
	r->region_bytes = a->region_bytes;
	r->sq = (struct kvd_ring_hdr *)(r->region + a->sq_off);
	r->cq = (struct kvd_ring_hdr *)(r->region + a->cq_off);
	r->sqes = (struct kvd_sqe *)(r->region + a->sqes_off);
	r->cqes = (struct kvd_cqe *)(r->region + a->cqes_off);
	r->arena = r->region + a->arena_off;
	r->arena_bytes = a->arena_bytes;
	r->sq_entries = a->sq_entries;
	r->cq_entries = a->cq_entries;
	r->memfd = fds[0];
	r->kick_fd = fds[1];
	r->call_fd = fds[2];
	return 0;
}

/* SESSION_OPEN; the first one also maps the region. 0 (id in *id), the reply's status or -errno. */
int wire_session_open(struct wire *r, uint32_t sq, uint32_t cq, uint32_t *id)
{
	struct kvd_session_open_req q = { .hdr = wire_hdr(KVD_MSG_SESSION_OPEN, sizeof(q)),
					  .sq_entries = sq, .cq_entries = cq };
	struct kvd_session_open_rep a;
	int fds[4], nfds = 0;
	int n = wire_call(r, &q, sizeof(q), &a, sizeof(a), fds, &nfds);
	if (n < 0)
		return n;
	int rc = 0, first = !r->region;
	if (a.hdr.status)
		rc = a.hdr.status;
	else if (n != (int)sizeof(a) || a.hdr.type != KVD_MSG_SESSION_OPEN || a.resv0)
		rc = -EPROTO;
	else if (first != !!(a.flags & KVD_OPENF_FDS) || nfds != (first ? 3 : 0))
		rc = -EPROTO;
	else if (first)
		rc = wire_map(r, &a, fds);
	if (rc)
		while (nfds)
			close(fds[--nfds]);
	if (!rc)
		*id = a.session_id;
	return rc;
}

/* Connect, HELLO, SESSION_OPEN with sq/cq entries (0: defaults). */
int wire_open(struct wire *r, const char *sock, uint32_t sq, uint32_t cq)
{
	int rc = wire_connect(r, sock);
	if (!rc)
		rc = wire_hello(r, KVD_FEAT_ALL & ~KVD_FEAT_VOCAB);
	if (!rc)
		rc = wire_session_open(r, sq, cq, &r->session);
	if (rc)
		wire_close(r);
	return rc;
}

int wire_stats(struct wire *r, struct kvd_stats_rep *st)
{
	struct kvd_msg_hdr q = wire_hdr(KVD_MSG_STATS, sizeof(q));
	int n = wire_call(r, &q, sizeof(q), st, sizeof(*st), NULL, NULL);
	if (n < 0)
		return n;
	if (st->hdr.status)
		return st->hdr.status;
	return n == (int)sizeof(*st) && st->hdr.type == KVD_MSG_STATS ? 0 : -EPROTO;
}

/*
 * Kick the daemon if it said it sleeps. The full barrier in
 * kvring_needs_wakeup() orders our tail (or CQ head) store before the flag
 * load; it pairs with the one in the daemon's kvring_set_need_wakeup().
 */
int wire_kick_if_asleep(struct wire *r)
{
	if (!kvring_needs_wakeup(r->sq))
		return 0;
	uint64_t one = 1;
	return write(r->kick_fd, &one, sizeof(one)) == (ssize_t)sizeof(one) ? 0 : -errno;
}

/* Publish one SQE; -EAGAIN when the SQ is full. */
int wire_submit(struct wire *r, const struct kvd_sqe *q)
{
	if (kvring_space(r->sq, r->sq_tail) == 0)
		return -EAGAIN;
	r->sqes[r->sq_tail & (r->sq_entries - 1)] = *q;
	kvring_publish(r->sq, ++r->sq_tail);
	return wire_kick_if_asleep(r);
}

/* Take one CQE if there is one (1), else 0. */
int wire_peek(struct wire *r, struct kvd_cqe *out)
{
	if (kvring_ready(r->cq, r->cq_head) == 0)
		return 0;
	*out = r->cqes[r->cq_head & (r->cq_entries - 1)];
	kvring_consume(r->cq, ++r->cq_head);
	/* Room freed while the daemon holds overflow: it may sleep waiting for exactly that. */
	if (__atomic_load_n(&r->cq->flags, __ATOMIC_ACQUIRE) & KVD_RING_CQ_OVERFLOW)
		wire_kick_if_asleep(r);
	return 1;
}

/*
 * Wait for a CQE the way a client library sleeps: set CQ NEED_WAKEUP, look
 * once more, then poll the call eventfd and the socket. 0 with a CQE,
 * -ETIMEDOUT, -ECONNRESET when the daemon hung up.
 */
int wire_wait(struct wire *r, struct kvd_cqe *out, int timeout_ms)
{
	int64_t end = wire_now_ms() + timeout_ms;
	for (;;) {
		if (wire_peek(r, out))
			return 0;
		kvring_set_need_wakeup(r->cq);
		if (wire_peek(r, out)) {
			kvring_clear_need_wakeup(r->cq);
			return 0;
		}
		struct pollfd p[2] = { { r->call_fd, POLLIN, 0 }, { r->fd, POLLIN, 0 } };
		int64_t left = end - wire_now_ms();
		int n = poll(p, 2, left > 0 ? (int)left : 0);
		kvring_clear_need_wakeup(r->cq);
		if (n < 0 && errno != EINTR)
			return -errno;
		if (p[0].revents & POLLIN) {
			uint64_t v;
			if (read(r->call_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				return -errno;
		}
		/* A daemon that exits may have posted completions first: they are ours still. */
		if ((p[1].revents & (POLLHUP | POLLERR | POLLIN)) && wire_peek(r, out))
			return 0;
		if (p[1].revents & (POLLHUP | POLLERR))
			return -ECONNRESET;
		if (p[1].revents & POLLIN) {
			char b;
			/* The daemon sends nothing unasked: anything readable is EOF or a protocol error. */
			return recv(r->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0 ? -ECONNRESET : -EPROTO;
		}
		if (n == 0 && wire_now_ms() >= end)
			return wire_peek(r, out) ? 0 : -ETIMEDOUT;
	}
}

/* Wait for ud's final CQE, passing over its MORE ones; another request's CQE is -EPROTO. */
int wire_finish(struct wire *r, uint64_t ud, struct kvd_cqe *fin, int timeout_ms)
{
	for (;;) {
		int rc = wire_wait(r, fin, timeout_ms);
		if (rc)
			return rc;
		if (fin->user_data != ud)
			return -EPROTO;
		if (!(fin->flags & KVD_CQE_MORE))
			return 0;
	}
}
