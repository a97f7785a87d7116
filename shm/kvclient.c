/* kvclient.c — libkvclient: control messages, the shared rings and the vocabulary. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include "shm/kvclient.h"
#include "shm/kvclient_priv.h"
#include "shm/kvring.h"
#include "uapi/kvd_pins.h"

#define KVC_SPIN_US_DEFAULT 50
#define KVC_MAX_FDS 4		/* more than any reply carries, so extras are seen and closed */
#define KVC_ARENA_ALIGN 64

struct kvc_conn {
	int			sock;		/* AF_UNIX SOCK_SEQPACKET to the daemon */
	int			kick_fd;	/* doorbell, client -> daemon; -1 before the first session */
	int			call_fd;	/* doorbell, daemon -> client */
	uint32_t		seq;		/* of the last control request */
	unsigned int		spin_us;
	struct kvd_hello_rep	info;

	/* The vocabulary memfd, read-only. */
	const uint8_t		*vocab;		/* (vocab_len,) */
	size_t			vocab_len;
	uint32_t		n_tokens;
	const uint32_t		*tok_off;	/* (n_tokens + 1,) into tok_bytes */
	const uint8_t		*tok_bytes;	/* (tok_bytes_len,) */
	uint64_t		tok_bytes_len;
	const uint8_t		*tok_flags;	/* (n_tokens,) KVD_TOKF_* */

	/* The shared region, read-write. */
	uint8_t			*region;	/* (region_len,) */
	size_t			region_len;
	struct kvd_ring_hdr	*sq, *cq;
	struct kvd_sqe		*sqes;		/* (sq_mask + 1,) */
	struct kvd_cqe		*cqes;		/* (cq_mask + 1,) */
	uint32_t		sq_mask, cq_mask; /* from the reply, not the writable headers */
	uint32_t		sq_tail;	/* ours; the header's copy is only published */
	uint32_t		cq_head;
	uint8_t			*arena;		/* (arena_len,) */
	uint32_t		arena_len;
	uint32_t		arena_used;
};

uint32_t kvc_abi_version(void)
{
	return KVD_ABI_VERSION;
}

void kvc_msg_init(struct kvd_msg_hdr *h, uint16_t type, uint32_t len, uint32_t seq)
{
	h->magic = KVD_MAGIC;
	h->type = type;
	h->flags = 0;
	h->len = len;
	h->seq = seq;
	h->status = 0;
	h->resv = 0;
}

int kvc_msg_check_reply(const struct kvd_msg_hdr *h, size_t got, uint16_t type,
			uint32_t min_len, uint32_t seq)
{
	/* An ERROR of sequence 0 is the daemon refusing the connection before any request. */
	int refusal = got >= sizeof(*h) && h->type == KVD_MSG_ERROR && h->seq == 0;
	if (got < sizeof(*h) || h->magic != KVD_MAGIC || !(h->flags & KVD_MSGF_REPLY) ||
	    h->len != got || (h->seq != seq && !refusal) || h->resv != 0)
		return -EPROTO;
	if (h->type == KVD_MSG_ERROR)
		return h->status < 0 ? h->status : -EPROTO;
	if (h->type != type)
		return -EPROTO;
	if (h->status < 0)
		return h->status;
	if (got < min_len)
		return -EPROTO;
	return 0;
}

/* [off, off + len) lies inside [0, size), without overflow. */
static int in_bounds(uint64_t off, uint64_t len, uint64_t size)
{
	return off <= size && len <= size - off;
}

static void close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

/* KVD_CTRL_TIMEOUT_MS, else 30 s: how long a control round trip may wait for its reply. */
static int ctrl_timeout_ms(void)
{
	const char *s = getenv("KVD_CTRL_TIMEOUT_MS");
	char *end;
	long v = s && *s ? strtol(s, &end, 10) : 0;
	return s && *s && !*end && v > 0 && v <= INT32_MAX ? (int)v : 30000;
}

/* Wait for the reply: 0 when there is one to read, -ETIMEDOUT, or -errno. */
static int wait_reply(int sock)
{
	struct pollfd p = { .fd = sock, .events = POLLIN };
	int n;
	do
		n = poll(&p, 1, ctrl_timeout_ms());
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n == 0 ? -ETIMEDOUT : 0;
}

/*
 * One control round trip: send req (its header is filled here), receive the
 * reply into rep (rep_len bytes; longer replies from a newer daemon are
 * cut, shorter successful ones refused) and any fds passed with it into
 * fds (*n_fds; the caller owns them). On failure no fd stays open.
 */
static int kvc_rpc(struct kvc_conn *c, void *req, uint16_t type, uint32_t req_len,
		   void *rep, uint32_t rep_len, int *fds, int *n_fds)
{
	struct kvd_msg_hdr *h = req;
	uint32_t seq = ++c->seq;
	ssize_t n;

	kvc_msg_init(h, type, req_len, seq);
	do
		n = send(c->sock, req, req_len, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	/* A daemon that refused the connection said why before it closed: read that below. */
	if (n < 0 && errno != EPIPE && errno != ECONNRESET)
		return -errno;
	if (n >= 0 && (size_t)n != req_len)
		return -EPROTO;
	int err = wait_reply(c->sock);
	if (err)
		return err;

	union {
		struct kvd_msg_hdr hdr;
		uint8_t bytes[512];
	} buf;
	union {
		struct cmsghdr align;
		char bytes[CMSG_SPACE(KVC_MAX_FDS * sizeof(int))];
	} cbuf;
	struct iovec iov = { .iov_base = &buf, .iov_len = sizeof(buf) };
	struct msghdr msg = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = &cbuf, .msg_controllen = sizeof(cbuf),
	};
	do
		n = recvmsg(c->sock, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	if (n == 0)
		return -ECONNRESET;

	int got_fds = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		for (int i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(fd));
			if (got_fds < KVC_MAX_FDS)
				fds[got_fds++] = fd;
			else
				close(fd);
		}
	}
	err = kvc_msg_check_reply(&buf.hdr, (size_t)n, type, rep_len, seq);
	if (!err && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
		err = -EPROTO;
	if (err) {
		close_fds(fds, got_fds);
		return err;
	}
	memcpy(rep, &buf, rep_len);
	*n_fds = got_fds;
	return 0;
}

/* A round trip whose reply must carry no fd. */
static int kvc_rpc_nofd(struct kvc_conn *c, void *req, uint16_t type, uint32_t req_len,
			void *rep, uint32_t rep_len)
{
	int fds[KVC_MAX_FDS], n_fds;
	int err = kvc_rpc(c, req, type, req_len, rep, rep_len, fds, &n_fds);
	if (err)
		return err;
	if (n_fds) {
		close_fds(fds, n_fds);
		return -EPROTO;
	}
	return 0;
}

int kvc_default_socket(char *buf, size_t cap)
{
	const char *env = getenv("KVD_SOCKET");
	int n;

	if (env && *env)
		n = snprintf(buf, cap, "%s", env);
	else if (geteuid() == 0)
		n = snprintf(buf, cap, "/run/kvd/kvd.sock");
	else if ((env = getenv("XDG_RUNTIME_DIR")) && *env)
		n = snprintf(buf, cap, "%s/kvd.sock", env);
	else
		n = snprintf(buf, cap, "/run/user/%u/kvd.sock", (unsigned int)geteuid());
	if (n < 0 || (size_t)n >= cap)
		return -ENAMETOOLONG;
	return n;
}

/* mmap fd's first len bytes after checking the file holds them. */
static void *map_fd(int fd, size_t len, int prot, int *err)
{
	struct stat st;
	if (fstat(fd, &st) < 0) {
		*err = -errno;
		return NULL;
	}
	if (len == 0 || st.st_size < 0 || (uint64_t)st.st_size < len) {
		*err = -EPROTO;
		return NULL;
	}
	void *p = mmap(NULL, len, prot, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		*err = -errno;
		return NULL;
	}
	return p;
}

/* Map the vocabulary memfd and check its layout once, so lookups need only bounds on ids. */
static int kvc_map_vocab(struct kvc_conn *c, int fd)
{
	int err = 0;
	size_t len = c->info.vocab_bytes;
	const uint8_t *v = map_fd(fd, len, PROT_READ, &err);
	if (!v)
		return err;
	c->vocab = v;
	c->vocab_len = len;

	const struct kvd_vocab_hdr *h = (const void *)v;
	if (len < sizeof(*h) || h->magic != KVD_VOCAB_MAGIC || h->n_tokens == 0 ||
	    h->offsets_off % sizeof(uint32_t) != 0 ||
	    !in_bounds(h->offsets_off, ((uint64_t)h->n_tokens + 1) * sizeof(uint32_t), len) ||
	    !in_bounds(h->bytes_off, h->bytes_len, len) ||
	    !in_bounds(h->flags_off, h->n_tokens, len))
		return -EPROTO;
	c->n_tokens = h->n_tokens;
	c->tok_off = (const uint32_t *)(v + h->offsets_off);
	c->tok_bytes = v + h->bytes_off;
	c->tok_bytes_len = h->bytes_len;
	c->tok_flags = v + h->flags_off;
	return 0;
}

int kvc_connect(struct kvc_conn **out, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char def[sizeof(sa.sun_path)];
	int err;

	if (!path) {
		err = kvc_default_socket(def, sizeof(def));
		if (err < 0)
			return err;
		path = def;
	}
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);

	struct kvc_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->kick_fd = -1;
	c->call_fd = -1;
	c->spin_us = KVC_SPIN_US_DEFAULT;
	c->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->sock < 0) {
		err = -errno;
		goto err_free;
	}
	if (connect(c->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		err = -errno;
		goto err_close;
	}

	struct kvd_hello_req req;
	int fds[KVC_MAX_FDS], n_fds;
	memset(&req, 0, sizeof(req));
	req.abi_version = KVD_ABI_VERSION;
	req.features = KVD_FEAT_ALL;
	err = kvc_rpc(c, &req, KVD_MSG_HELLO, sizeof(req), &c->info, sizeof(c->info),
		      fds, &n_fds);
	if (err)
		goto err_close;
	c->info.model_name[sizeof(c->info.model_name) - 1] = '\0';
	c->info.backend[sizeof(c->info.backend) - 1] = '\0';
	int want_fds = (c->info.flags & KVD_HELLOF_VOCAB) ? 1 : 0;
	if (c->info.abi_version != KVD_ABI_VERSION || (c->info.features & ~req.features) ||
	    n_fds != want_fds) {
		close_fds(fds, n_fds);
		err = -EPROTO;
		goto err_close;
	}
	if (want_fds) {
		err = kvc_map_vocab(c, fds[0]);
		close(fds[0]);	/* the mapping keeps the memfd alive */
		if (err)
			goto err_close;
	}
	*out = c;
	return 0;

err_close:
	kvc_close(c);
	return err;
err_free:
	free(c);
	return err;
}

void kvc_close(struct kvc_conn *c)
{
	if (!c)
		return;
	if (c->region)
		munmap(c->region, c->region_len);
	if (c->vocab)
		munmap((void *)c->vocab, c->vocab_len);
	if (c->kick_fd >= 0)
		close(c->kick_fd);
	if (c->call_fd >= 0)
		close(c->call_fd);
	if (c->sock >= 0)
		close(c->sock);
	free(c);
}

const struct kvd_hello_rep *kvc_info(const struct kvc_conn *c)
{
	return &c->info;
}

int kvc_socket_fd(const struct kvc_conn *c)
{
	return c->sock;
}

int kvc_call_fd(const struct kvc_conn *c)
{
	return c->call_fd;
}

static int is_pow2(uint32_t x)
{
	return x && !(x & (x - 1));
}

/*
 * Map the region the first SESSION_OPEN passed and find its parts, refusing
 * a layout that does not fit region_bytes: a bad reply must not make us
 * touch memory outside the mapping.
 */
static int kvc_map_region(struct kvc_conn *c, const struct kvd_session_open_rep *r, int fd)
{
	const uint64_t size = r->region_bytes;
	const uint64_t hdr = sizeof(struct kvd_ring_hdr);

	if (!is_pow2(r->sq_entries) || !is_pow2(r->cq_entries) || r->arena_bytes % 4 ||
	    size > SIZE_MAX ||
	    !in_bounds(r->sq_off, hdr, size) || !in_bounds(r->cq_off, hdr, size) ||
	    !in_bounds(r->sqes_off, (uint64_t)r->sq_entries * sizeof(struct kvd_sqe), size) ||
	    !in_bounds(r->cqes_off, (uint64_t)r->cq_entries * sizeof(struct kvd_cqe), size) ||
	    !in_bounds(r->arena_off, r->arena_bytes, size) ||
	    (r->sq_off | r->cq_off | r->sqes_off | r->cqes_off | r->arena_off) % 64)
		return -EPROTO;

	int err = 0;
	uint8_t *p = map_fd(fd, size, PROT_READ | PROT_WRITE, &err);
	if (!p)
		return err;
	struct kvd_ring_hdr *sq = (void *)(p + r->sq_off), *cq = (void *)(p + r->cq_off);
	if (sq->ring_entries != r->sq_entries || cq->ring_entries != r->cq_entries) {
		munmap(p, size);
		return -EPROTO;
	}
	c->region = p;
	c->region_len = size;
	c->sq = sq;
	c->cq = cq;
	c->sqes = (void *)(p + r->sqes_off);
	c->cqes = (void *)(p + r->cqes_off);
	c->sq_mask = r->sq_entries - 1;
	c->cq_mask = r->cq_entries - 1;
	/* A fresh region starts at 0, but take what is there to be safe. */
	c->sq_tail = __atomic_load_n(&sq->tail, __ATOMIC_RELAXED);
	c->cq_head = __atomic_load_n(&cq->head, __ATOMIC_RELAXED);
	c->arena = p + r->arena_off;
	c->arena_len = r->arena_bytes;
	c->arena_used = 0;
	return 0;
}

int kvc_session_open_ex(struct kvc_conn *c, uint32_t sq_entries, uint32_t cq_entries,
			uint32_t arena_bytes, uint32_t *session_id)
{
	struct kvd_session_open_req req;
	struct kvd_session_open_rep rep;
	int fds[KVC_MAX_FDS], n_fds;

	memset(&req, 0, sizeof(req));
	req.sq_entries = sq_entries;
	req.cq_entries = cq_entries;
	req.arena_bytes = arena_bytes;
	int err = kvc_rpc(c, &req, KVD_MSG_SESSION_OPEN, sizeof(req), &rep, sizeof(rep),
			  fds, &n_fds);
	if (err)
		return err;

	/* The first open passes exactly the region, kick and call fds; later ones nothing. */
	int first = c->region == NULL;
	if (!!(rep.flags & KVD_OPENF_FDS) != first || n_fds != (first ? 3 : 0)) {
		err = -EPROTO;
		goto err_fds;
	}
	if (first) {
		err = kvc_map_region(c, &rep, fds[0]);
		if (err)
			goto err_fds;
		close(fds[0]);
		c->kick_fd = fds[1];
		c->call_fd = fds[2];
	}
	*session_id = rep.session_id;
	return 0;

err_fds:
	/* The daemon counts the session open; closing it keeps both sides agreeing. */
	close_fds(fds, n_fds);
	kvc_session_close(c, rep.session_id);
	return err;
}

int kvc_session_open(struct kvc_conn *c, uint32_t *session_id)
{
	return kvc_session_open_ex(c, 0, 0, 0, session_id);
}

int kvc_session_close(struct kvc_conn *c, uint32_t session_id)
{
	struct kvd_session_close_req req;
	struct kvd_msg_hdr rep;

	memset(&req, 0, sizeof(req));
	req.session_id = session_id;
	return kvc_rpc_nofd(c, &req, KVD_MSG_SESSION_CLOSE, sizeof(req), &rep, sizeof(rep));
}

int kvc_stats(struct kvc_conn *c, struct kvd_stats_rep *out)
{
	struct kvd_msg_hdr req;

	memset(&req, 0, sizeof(req));
	return kvc_rpc_nofd(c, &req, KVD_MSG_STATS, sizeof(req), out, sizeof(*out));
}

uint8_t *kvc_arena(const struct kvc_conn *c, uint32_t *bytes)
{
	if (bytes)
		*bytes = c->arena_len;
	return c->arena;
}

int kvc_arena_alloc(struct kvc_conn *c, uint32_t bytes, uint32_t *off)
{
	if (!c->arena)
		return -ENOTCONN;
	uint64_t len = ((uint64_t)bytes + KVC_ARENA_ALIGN - 1) & ~(uint64_t)(KVC_ARENA_ALIGN - 1);
	if (len > c->arena_len - c->arena_used)
		return -ENOSPC;
	*off = c->arena_used;
	c->arena_used += (uint32_t)len;
	return 0;
}

void kvc_arena_reset(struct kvc_conn *c)
{
	c->arena_used = 0;
}

void kvc__arena_release(struct kvc_conn *c, uint32_t mark)
{
	if (mark <= c->arena_used)
		c->arena_used = mark;
}

/* Ring the kick doorbell. A full queue (-EAGAIN) has rung already. */
static void kvc_kick(struct kvc_conn *c)
{
	uint64_t one = 1;
	ssize_t n;
	do
		n = send(c->kick_fd, &one, sizeof(one), MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
}

int kvc_submit(struct kvc_conn *c, const struct kvd_sqe *sqe)
{
	if (!c->sq)
		return -ENOTCONN;
	uint32_t tail = c->sq_tail;
	if (kvring_space(c->sq, tail) == 0)
		return -EAGAIN;
	c->sqes[tail & c->sq_mask] = *sqe;
	c->sq_tail = ++tail;
	kvring_publish(c->sq, tail);
	/* The fence in kvring_needs_wakeup() orders the tail store before the
	 * flag load; it pairs with the daemon's kvring_set_need_wakeup(). */
	if (kvring_needs_wakeup(c->sq))
		kvc_kick(c);
	return 0;
}

int kvc_peek(struct kvc_conn *c, struct kvd_cqe *out)
{
	if (!c->cq)
		return -ENOTCONN;
	uint32_t head = c->cq_head;
	/* Acquire on the tail pairs with the daemon's release in kvring_publish(),
	 * so the CQE and the arena tokens it names are visible. */
	if (kvring_ready(c->cq, head) == 0)
		return -EAGAIN;
	*out = c->cqes[head & c->cq_mask];
	c->cq_head = ++head;
	kvring_consume(c->cq, head);
	/*
	 * Completions the CQ could not hold wait in the daemon, which flushes
	 * them when it next runs. Should it be asleep meanwhile, our consuming
	 * alone would not wake it: ring the doorbell then, as a submit would.
	 */
	if ((__atomic_load_n(&c->cq->flags, __ATOMIC_RELAXED) & KVD_RING_CQ_OVERFLOW ||
	     __atomic_load_n(&c->cq->overflow, __ATOMIC_RELAXED)) && kvring_needs_wakeup(c->sq))
		kvc_kick(c);
	return 0;
}

void kvc_set_spin(struct kvc_conn *c, unsigned int usec)
{
	c->spin_us = usec;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

/* The socket became readable or hung up while we waited: the daemon left (or broke protocol). */
static int kvc_sock_event(struct kvc_conn *c)
{
	char b;
	ssize_t n = recv(c->sock, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	return n > 0 ? -EPROTO : -ECONNRESET;
}

int kvc_arm(struct kvc_conn *c)
{
	if (!c->cq)
		return -ENOTCONN;
	/* The fence in kvring_set_need_wakeup() orders the flag store before
	 * the re-check; it pairs with the daemon's kvring_needs_wakeup(). */
	kvring_set_need_wakeup(c->cq);
	if (kvring_ready(c->cq, c->cq_head)) {
		kvring_clear_need_wakeup(c->cq);
		return 1;
	}
	return 0;
}

int kvc_ack(struct kvc_conn *c)
{
	if (!c->cq)
		return -ENOTCONN;
	kvring_clear_need_wakeup(c->cq);
	uint64_t v;
	while (recv(c->call_fd, &v, sizeof(v), MSG_DONTWAIT) > 0)
		;
	return 0;
}

int kvc_wait(struct kvc_conn *c, struct kvd_cqe *out, int timeout_ms)
{
	const uint64_t start = now_ns();
	const uint64_t deadline = timeout_ms < 0 ? UINT64_MAX :
				  start + (uint64_t)timeout_ms * 1000000u;
	const uint64_t spin_end = start + (uint64_t)c->spin_us * 1000u;

	for (;;) {
		int err = kvc_peek(c, out);
		if (err != -EAGAIN)
			return err;
		uint64_t t = now_ns();
		if (t >= deadline)
			return -ETIMEDOUT;
		if (t < spin_end) {
			cpu_relax();
			continue;
		}
		if (kvc_arm(c) == 1)
			continue;
		int ms = -1;
		if (deadline != UINT64_MAX)
			ms = (int)((deadline - t + 999999u) / 1000000u);
		struct pollfd p[2] = {
			{ .fd = c->call_fd, .events = POLLIN },
			{ .fd = c->sock, .events = POLLIN },
		};
		int n = poll(p, 2, ms);
		err = n < 0 ? -errno : 0;
		kvc_ack(c);
		if (err)
			return err;
		if (p[0].revents & (POLLERR | POLLNVAL))
			return -EIO;
		/* A daemon that drains before exiting posts its last CQEs, then hangs up:
		 * hand those out first. */
		if (p[1].revents) {
			err = kvc_peek(c, out);
			return err == -EAGAIN ? kvc_sock_event(c) : err;
		}
	}
}

const char *kvc_token_bytes(const struct kvc_conn *c, uint32_t id, uint32_t *len)
{
	if (!c->vocab || id >= c->n_tokens)
		return NULL;
	uint32_t a = c->tok_off[id], b = c->tok_off[id + 1];
	if (a > b || b > c->tok_bytes_len)
		return NULL;
	*len = b - a;
	return (const char *)c->tok_bytes + a;
}

int kvc_token_text(const struct kvc_conn *c, uint32_t id, char *buf, size_t cap)
{
	uint32_t len;
	if (!c->vocab)
		return -ENODATA;
	const char *p = kvc_token_bytes(c, id, &len);
	if (!p)
		return -ERANGE;
	if (cap == 0)
		return -ENOSPC;
	if (len >= cap || len > INT32_MAX) {
		buf[0] = '\0';
		return -ENOSPC;
	}
	memcpy(buf, p, len);
	buf[len] = '\0';
	return (int)len;
}

int kvc_token_flags(const struct kvc_conn *c, uint32_t id)
{
	if (!c->vocab)
		return -ENODATA;
	if (id >= c->n_tokens)
		return -ERANGE;
	return c->tok_flags[id];
}

/* Bytes of the UTF-8 sequence lead byte b starts; 1 for ASCII and invalid leads. */
static size_t utf8_seq_len(uint8_t b)
{
	if (b >= 0xf0 && b < 0xf8)
		return 4;
	if (b >= 0xe0)
		return b < 0xf0 ? 3 : 1;
	return b >= 0xc0 ? 2 : 1;
}

size_t kvc_utf8_feed(struct kvc_utf8 *u, const char *in, size_t len, char *out)
{
	size_t n = u->n;
	memcpy(out, u->held, n);
	memcpy(out + n, in, len);
	n += len;
	u->n = 0;

	/* Find the last lead byte among the final four; hold its sequence if short. */
	size_t i = n, k = 0;
	while (i > 0 && k < 3 && ((uint8_t)out[i - 1] & 0xc0) == 0x80) {
		i--;
		k++;
	}
	if (i > 0) {
		size_t lead = i - 1, have = n - lead;
		if (have < utf8_seq_len((uint8_t)out[lead])) {
			u->n = (uint8_t)have;
			memcpy(u->held, out + lead, have);
			n = lead;
		}
	}
	return n;
}

size_t kvc_utf8_flush(struct kvc_utf8 *u, char *out)
{
	size_t n = u->n;
	memcpy(out, u->held, n);
	u->n = 0;
	return n;
}

int kvc_messages_encode(const struct kvc_message *msgs, size_t n, void *out, size_t cap)
{
	uint64_t total = 0;

	if (!n || n > KVD_CHAT_MAX_MSGS || !msgs)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (msgs[i].role < KVD_ROLE_SYSTEM || msgs[i].role >= KVD_ROLE_LAST ||
		    (!msgs[i].text && msgs[i].len))
			return -EINVAL;
		if (msgs[i].len > UINT32_MAX)
			return -E2BIG;
		total += sizeof(struct kvd_chat_msg) + msgs[i].len;
		if (total > INT_MAX)
			return -E2BIG;
	}
	if (!out || total > cap)
		return (int)total;
	uint8_t *w = out;
	for (size_t i = 0; i < n; i++) {
		struct kvd_chat_msg h = { .role = msgs[i].role, .len = (uint32_t)msgs[i].len };

		memcpy(w, &h, sizeof(h));
		w += sizeof(h);
		if (msgs[i].len)
			memcpy(w, msgs[i].text, msgs[i].len);
		w += msgs[i].len;
	}
	return (int)total;
}
