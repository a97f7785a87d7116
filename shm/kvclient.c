/* kvclient.c — libkvclient: control messages, the shared rings and the vocabulary. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
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
#define KVC_ARENA_ALIGN 64
#define KVC_LOOK_NS 1000000u	/* kvc_peek() looks at the socket at most this often */

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

/*
 * Wait for the reply: 0 when there is one to read, -ETIMEDOUT, or -errno.
 * A reconnect bounds the wait by its own deadline too.
 */
static int wait_reply(const struct kvc_conn *c)
{
	struct pollfd p = { .fd = c->sock, .events = POLLIN };
	int ms = ctrl_timeout_ms(), n;
	if (c->rpc_deadline) {
		uint64_t t = kvc__now_ns();
		uint64_t left = c->rpc_deadline > t ? (c->rpc_deadline - t + 999999u) / 1000000u : 0;
		if (left < (uint64_t)ms)
			ms = (int)left;
	}
	do
		n = poll(&p, 1, ms);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n == 0 ? -ETIMEDOUT : 0;
}

int kvc__rpc(struct kvc_conn *c, void *req, uint16_t type, uint32_t req_len, void *rep,
	     uint32_t min_len, uint32_t rep_len, int *fds, int *n_fds)
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
	int err = wait_reply(c);
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
	err = kvc_msg_check_reply(&buf.hdr, (size_t)n, type, min_len, seq);
	if (!err && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
		err = -EPROTO;
	if (err) {
		close_fds(fds, got_fds);
		return err;
	}
	memset(rep, 0, rep_len);
	memcpy(rep, &buf, (size_t)n < rep_len ? (size_t)n : rep_len);
	*n_fds = got_fds;
	return 0;
}

/* A round trip whose reply must carry no fd. */
static int kvc_rpc_nofd(struct kvc_conn *c, void *req, uint16_t type, uint32_t req_len,
			void *rep, uint32_t rep_len)
{
	int fds[KVC_MAX_FDS], n_fds;
	int err = kvc__rpc(c, req, type, req_len, rep, rep_len, rep_len, fds, &n_fds);
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

/* The vocabulary at v checks out: lookups then need only bounds on ids. 0 or -EPROTO. */
static int vocab_check(const uint8_t *v, size_t len)
{
	const struct kvd_vocab_hdr *h = (const void *)v;
	if (len < sizeof(*h) || h->magic != KVD_VOCAB_MAGIC || h->n_tokens == 0 ||
	    h->offsets_off % sizeof(uint32_t) != 0 ||
	    !in_bounds(h->offsets_off, ((uint64_t)h->n_tokens + 1) * sizeof(uint32_t), len) ||
	    !in_bounds(h->bytes_off, h->bytes_len, len) ||
	    !in_bounds(h->flags_off, h->n_tokens, len))
		return -EPROTO;
	return 0;
}

static void vocab_use(struct kvc_conn *c, const uint8_t *v, size_t len)
{
	const struct kvd_vocab_hdr *h = (const void *)v;
	c->vocab = v;
	c->vocab_len = len;
	c->n_tokens = h->n_tokens;
	c->tok_off = (const uint32_t *)(v + h->offsets_off);
	c->tok_bytes = v + h->bytes_off;
	c->tok_bytes_len = h->bytes_len;
	c->tok_flags = v + h->flags_off;
}

/*
 * Keep a replaced vocabulary mapped until kvc_close(): kvc_token_bytes()
 * pointers into it stay valid. 0, or -ENOMEM (then it is unmapped).
 */
static int vocab_retire(struct kvc_conn *c)
{
	size_t n = c->n_old_vocab + 1;
	void **v = realloc(c->old_vocab, n * sizeof(*v));
	if (v)
		c->old_vocab = v;
	size_t *l = v ? realloc(c->old_vocab_len, n * sizeof(*l)) : NULL;
	if (!l) {
		munmap((void *)c->vocab, c->vocab_len);
		return -ENOMEM;
	}
	c->old_vocab_len = l;
	v[n - 1] = (void *)c->vocab;
	l[n - 1] = c->vocab_len;
	c->n_old_vocab = n;
	return 0;
}

/*
 * Map the vocabulary memfd of length len. A reconnect's goes over the old
 * one when the sizes agree (the same model: pointers into it stay valid),
 * else beside it (vocab_retire()).
 */
static int kvc_map_vocab(struct kvc_conn *c, int fd, size_t len)
{
	int err = 0;
	uint8_t *v = map_fd(fd, len, PROT_READ, &err);
	if (!v)
		return err;
	if ((err = vocab_check(v, len))) {
		munmap(v, len);
		return err;
	}
	if (c->vocab && c->vocab_len == len &&
	    mmap((void *)c->vocab, len, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) != MAP_FAILED) {
		munmap(v, len);
		v = (uint8_t *)c->vocab;
	} else if (c->vocab) {
		vocab_retire(c);
	}
	vocab_use(c, v, len);
	return 0;
}

/* Put fd in place of *slot, keeping the number callers may poll; takes fd. */
static void install_fd(int *slot, int fd)
{
	if (*slot >= 0 && dup3(fd, *slot, O_CLOEXEC) >= 0) {
		close(fd);
		return;
	}
	if (*slot >= 0)
		close(*slot);
	*slot = fd;
}

/* HELLO on c->sock; c->info changes only when it succeeds. */
static int kvc_hello(struct kvc_conn *c)
{
	struct kvd_hello_req req;
	struct kvd_hello_rep rep;
	int fds[KVC_MAX_FDS], n_fds;
	memset(&req, 0, sizeof(req));
	req.abi_version = KVD_ABI_VERSION;
	req.features = KVD_FEAT_ALL;
	int err = kvc__rpc(c, &req, KVD_MSG_HELLO, sizeof(req), &rep, sizeof(rep), sizeof(rep),
			   fds, &n_fds);
	if (err)
		return err;
	rep.model_name[sizeof(rep.model_name) - 1] = '\0';
	rep.backend[sizeof(rep.backend) - 1] = '\0';
	int want_fds = (rep.flags & KVD_HELLOF_VOCAB) ? 1 : 0;
	if (rep.abi_version != KVD_ABI_VERSION || (rep.features & ~req.features) ||
	    n_fds != want_fds) {
		close_fds(fds, n_fds);
		return -EPROTO;
	}
	if (want_fds) {
		err = kvc_map_vocab(c, fds[0], rep.vocab_bytes);
		close(fds[0]);	/* the mapping keeps the memfd alive */
		if (err)
			return err;
	}
	c->info = rep;
	return 0;
}

int kvc__dial(struct kvc_conn *c)
{
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	if (connect(s, (struct sockaddr *)&c->addr, sizeof(c->addr)) < 0) {
		int err = -errno;
		close(s);
		return err;
	}
	install_fd(&c->sock, s);
	return kvc_hello(c);
}

/* $KVD_RECONNECT_MS, a positive number of ms, else 0: the default of kvc_set_reconnect(). */
static int reconnect_ms_env(void)
{
	const char *s = getenv("KVD_RECONNECT_MS");
	char *end;
	long v = s && *s ? strtol(s, &end, 10) : 0;
	return s && *s && !*end && v > 0 && v <= INT32_MAX ? (int)v : 0;
}

int kvc_connect(struct kvc_conn **out, const char *path)
{
	char def[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int err;

	if (!path) {
		err = kvc_default_socket(def, sizeof(def));
		if (err < 0)
			return err;
		path = def;
	}
	if (strlen(path) >= sizeof(def))
		return -ENAMETOOLONG;

	struct kvc_conn *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	if ((err = -pthread_mutex_init(&c->lock, NULL))) {
		free(c);
		return err;
	}
	c->addr.sun_family = AF_UNIX;
	strcpy(c->addr.sun_path, path);
	c->sock = -1;
	c->kick_fd = -1;
	c->call_fd = -1;
	c->spin_us = KVC_SPIN_US_DEFAULT;
	c->reconnect_ms = reconnect_ms_env();
	if ((err = kvc__dial(c))) {
		kvc_close(c);
		return err;
	}
	*out = c;
	return 0;
}

void kvc_close(struct kvc_conn *c)
{
	if (!c)
		return;
	if (c->region)
		munmap(c->region, c->region_len);
	if (c->vocab)
		munmap((void *)c->vocab, c->vocab_len);
	for (size_t i = 0; i < c->n_old_vocab; i++)
		munmap(c->old_vocab[i], c->old_vocab_len[i]);
	free(c->old_vocab);
	free(c->old_vocab_len);
	if (c->kick_fd >= 0)
		close(c->kick_fd);
	if (c->call_fd >= 0)
		close(c->call_fd);
	if (c->sock >= 0)
		close(c->sock);
	free(c->fl);
	free(c->pend);
	pthread_mutex_destroy(&c->lock);
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

/* Find the parts of the region at p, r's layout; the cached ring indices are the headers'. */
static void region_use(struct kvc_conn *c, uint8_t *p, const struct kvd_session_open_rep *r)
{
	c->region = p;
	c->region_len = r->region_bytes;
	c->layout = *r;
	c->sq = (void *)(p + r->sq_off);
	c->cq = (void *)(p + r->cq_off);
	c->sqes = (void *)(p + r->sqes_off);
	c->cqes = (void *)(p + r->cqes_off);
	c->sq_mask = r->sq_entries - 1;
	c->cq_mask = r->cq_entries - 1;
	/* A fresh region starts at 0, but take what is there to be safe. */
	c->sq_tail = __atomic_load_n(&c->sq->tail, __ATOMIC_RELAXED);
	__atomic_store_n(&c->cq_head, __atomic_load_n(&c->cq->head, __ATOMIC_RELAXED),
			 __ATOMIC_RELAXED);
	c->arena = p + r->arena_off;
	c->arena_len = r->arena_bytes;
}

/* Map fd (r's region) and check its rings say the sizes r does. */
static uint8_t *region_map(const struct kvd_session_open_rep *r, int fd, int *err)
{
	uint8_t *p = map_fd(fd, r->region_bytes, PROT_READ | PROT_WRITE, err);
	if (!p)
		return NULL;
	struct kvd_ring_hdr *sq = (void *)(p + r->sq_off), *cq = (void *)(p + r->cq_off);
	if (sq->ring_entries != r->sq_entries || cq->ring_entries != r->cq_entries) {
		munmap(p, r->region_bytes);
		*err = -EPROTO;
		return NULL;
	}
	return p;
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
	uint8_t *p = region_map(r, fd, &err);
	if (!p)
		return err;
	region_use(c, p, r);
	c->arena_used = 0;
	return 0;
}

/* Two SESSION_OPEN replies lay their regions out alike: one's pointers serve the other. */
static int same_layout(const struct kvd_session_open_rep *a, const struct kvd_session_open_rep *b)
{
	return a->region_bytes == b->region_bytes && a->sq_entries == b->sq_entries &&
	       a->cq_entries == b->cq_entries && a->arena_bytes == b->arena_bytes &&
	       a->sq_off == b->sq_off && a->sqes_off == b->sqes_off && a->cq_off == b->cq_off &&
	       a->cqes_off == b->cqes_off && a->arena_off == b->arena_off;
}

/*
 * A new connection's region in place of the old, at the same address, so
 * that kvc_arena() pointers callers hold stay valid: mapped aside first,
 * the old arena's bytes (prompts about to be resubmitted) copied in, then
 * mapped over the old one, which replaces it in one step.
 */
static int region_remap(struct kvc_conn *c, const struct kvd_session_open_rep *r, int fd)
{
	int err = 0;
	uint8_t *p = region_map(r, fd, &err);
	if (!p)
		return err;
	memcpy(p + r->arena_off, c->arena, c->arena_len);
	if (mmap(c->region, c->region_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) ==
	    MAP_FAILED) {
		/* The old range may be gone: live on at the new address. */
		region_use(c, p, r);
		return 0;
	}
	munmap(p, r->region_bytes);
	region_use(c, c->region, r);
	return 0;
}

int kvc__opened(struct kvc_conn *c, const struct kvd_session_open_rep *rep, int *fds, int n_fds,
		int must_match)
{
	/* The first open passes exactly the region, kick and call fds; later ones nothing. */
	int first = !c->region_live, err = 0;
	if (!!(rep->flags & KVD_OPENF_FDS) != first || n_fds != (first ? 3 : 0)) {
		close_fds(fds, n_fds);
		return -EPROTO;
	}
	if (!first)
		return 0;
	if (c->region && same_layout(rep, &c->layout)) {
		err = region_remap(c, rep, fds[0]);
	} else if (c->region && must_match) {
		err = -EPROTO;
	} else {
		/* Other sizes than the lost region's: the caller asked for them. */
		if (c->region)
			munmap(c->region, c->region_len);
		c->region = NULL;
		err = kvc_map_region(c, rep, fds[0]);
	}
	if (err) {
		close_fds(fds, n_fds);
		return err;
	}
	close(fds[0]);
	install_fd(&c->kick_fd, fds[1]);
	install_fd(&c->call_fd, fds[2]);
	c->region_live = 1;
	return 0;
}

/* The reply of a SESSION_OPEN is longer with KVD_FEAT_RESUME: its token follows. */
uint32_t kvc__open_rep_len(const struct kvc_conn *c)
{
	return c->info.features & KVD_FEAT_RESUME ? sizeof(struct kvd_session_open_rep) :
	       KVC_OPEN_REP_V1;
}

int kvc__close_rpc(struct kvc_conn *c, uint32_t session_id)
{
	struct kvd_session_close_req req;
	struct kvd_msg_hdr rep;

	memset(&req, 0, sizeof(req));
	req.session_id = session_id;
	return kvc_rpc_nofd(c, &req, KVD_MSG_SESSION_CLOSE, sizeof(req), &rep, sizeof(rep));
}

int kvc_session_open_ex(struct kvc_conn *c, uint32_t sq_entries, uint32_t cq_entries,
			uint32_t arena_bytes, uint32_t *session_id)
{
	struct kvd_session_open_req req;
	struct kvd_session_open_rep rep;
	int fds[KVC_MAX_FDS], n_fds;

	/* After a restart that lost every session the old region stays mapped:
	 * its sizes again put the new one in its place (same arena address). */
	if (c->region && !c->region_live) {
		sq_entries = sq_entries ? sq_entries : c->layout.sq_entries;
		cq_entries = cq_entries ? cq_entries : c->layout.cq_entries;
		arena_bytes = arena_bytes ? arena_bytes : c->layout.arena_bytes;
	}
	memset(&req, 0, sizeof(req));
	req.sq_entries = sq_entries;
	req.cq_entries = cq_entries;
	req.arena_bytes = arena_bytes;
	int err = kvc__rpc(c, &req, KVD_MSG_SESSION_OPEN, sizeof(req), &rep, kvc__open_rep_len(c),
			   sizeof(rep), fds, &n_fds);
	if (err)
		return err;
	pthread_mutex_lock(&c->lock);
	err = kvc__opened(c, &rep, fds, n_fds, 0);
	if (!err)
		kvc__sess_record(c, &rep, NULL);
	pthread_mutex_unlock(&c->lock);
	if (err) {
		/* The daemon counts the session open; closing it keeps both sides agreeing. */
		kvc__close_rpc(c, rep.session_id);
		return err;
	}
	*session_id = rep.session_id;
	return 0;
}

int kvc_session_open(struct kvc_conn *c, uint32_t *session_id)
{
	return kvc_session_open_ex(c, 0, 0, 0, session_id);
}

int kvc_session_close(struct kvc_conn *c, uint32_t session_id)
{
	int err = kvc__close_rpc(c, session_id);
	/* Whatever the daemon said, a reconnect must not bring it back. */
	pthread_mutex_lock(&c->lock);
	kvc__sess_forget(c, session_id);
	pthread_mutex_unlock(&c->lock);
	return err;
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

int kvc__kick(struct kvc_conn *c)
{
	uint64_t one = 1;
	ssize_t n;
	do
		n = send(c->kick_fd, &one, sizeof(one), MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	/* A full queue (-EAGAIN) has rung already; a refusal means nobody holds the other end. */
	return n < 0 && (errno == ECONNREFUSED || errno == ENOTCONN || errno == EPIPE ||
			 errno == ECONNRESET) ? -EPIPE : 0;
}

int kvc__push(struct kvc_conn *c, const struct kvd_sqe *sqe)
{
	if (!c->region_live)
		return -ENOTCONN;
	uint32_t tail = c->sq_tail;
	if (kvring_space(c->sq, tail) == 0)
		return -EAGAIN;
	if (kvc__flight_add(c, sqe))
		return -ENOMEM;
	c->sqes[tail & c->sq_mask] = *sqe;
	c->sq_tail = ++tail;
	kvring_publish(c->sq, tail);
	return 0;
}

int kvc_submit(struct kvc_conn *c, const struct kvd_sqe *sqe)
{
	if (!c->sq)
		return -ENOTCONN;
	pthread_mutex_lock(&c->lock);
	int err = kvc__push(c, sqe);
	/* The fence in kvring_needs_wakeup() orders the tail store before the
	 * flag load; it pairs with the daemon's kvring_set_need_wakeup(). */
	if (!err && kvring_needs_wakeup(c->sq) && kvc__kick(c))
		err = kvc__submit_lost(c, sqe);
	pthread_mutex_unlock(&c->lock);
	return err;
}

int kvc__ring_take(struct kvc_conn *c, struct kvd_cqe *out)
{
	uint32_t head = c->cq_head;
	/* Acquire on the tail pairs with the daemon's release in kvring_publish(),
	 * so the CQE and the arena tokens it names are visible. */
	if (kvring_ready(c->cq, head) == 0)
		return -EAGAIN;
	*out = c->cqes[head & c->cq_mask];
	__atomic_store_n(&c->cq_head, head + 1, __ATOMIC_RELAXED);
	kvring_consume(c->cq, head + 1);
	/* A replay completes nothing sent on this connection. */
	if (!(out->flags & (KVD_CQE_MORE | KVD_CQE_REPLAY)))
		kvc__flight_done(c, out);
	return 0;
}

/* With c->lock held: the next CQE, the pending ones a reconnect made first. 0 or -EAGAIN. */
static int kvc_take(struct kvc_conn *c, struct kvd_cqe *out)
{
	return kvc__pend_take(c, out) ? kvc__ring_take(c, out) : 0;
}

/* The next CQE without blocking or looking at the socket: 0 or -EAGAIN. */
static int peek_once(struct kvc_conn *c, struct kvd_cqe *out)
{
	/* An empty CQ costs no lock: a spinning kvc_wait() leaves the submitter alone. */
	if (__atomic_load_n(&c->pend_head, __ATOMIC_RELAXED) ==
	    __atomic_load_n(&c->pend_tail, __ATOMIC_RELAXED) &&
	    kvring_ready(c->cq, __atomic_load_n(&c->cq_head, __ATOMIC_RELAXED)) == 0)
		return -EAGAIN;
	pthread_mutex_lock(&c->lock);
	int err = kvc_take(c, out);
	pthread_mutex_unlock(&c->lock);
	/*
	 * Completions the CQ could not hold wait in the daemon, which flushes
	 * them when it next runs. Should it be asleep meanwhile, our consuming
	 * alone would not wake it: ring the doorbell then, as a submit would.
	 */
	if (!err && (__atomic_load_n(&c->cq->flags, __ATOMIC_RELAXED) & KVD_RING_CQ_OVERFLOW ||
		     __atomic_load_n(&c->cq->overflow, __ATOMIC_RELAXED)) && kvring_needs_wakeup(c->sq))
		kvc__kick(c);
	return err;
}

/* The socket says the daemon hung up (not merely that it is quiet). */
int kvc__hung_up(struct kvc_conn *c)
{
	struct pollfd p = { .fd = c->sock, .events = POLLIN };
	char b;
	if (poll(&p, 1, 0) <= 0)
		return 0;
	return (p.revents & (POLLHUP | POLLERR)) ||
	       recv(c->sock, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Reconnecting is on: look whether the daemon went, at most every KVC_LOOK_NS. */
static int peek_look(struct kvc_conn *c, struct kvd_cqe *out)
{
	uint64_t t = kvc__now_ns();
	if (t < c->next_look)
		return -EAGAIN;
	c->next_look = t + KVC_LOOK_NS;
	uint32_t gen = __atomic_load_n(&c->gen, __ATOMIC_RELAXED);
	if (!kvc__hung_up(c))
		return -EAGAIN;
	int err = kvc__reconnect_gen(c, gen);
	return err ? err : peek_once(c, out);
}

int kvc_peek(struct kvc_conn *c, struct kvd_cqe *out)
{
	if (!c->cq)
		return -ENOTCONN;
	int err = peek_once(c, out);
	/* (Set under the lock by another thread, maybe: a stale look costs one more try.) */
	if (err == -EAGAIN && __atomic_load_n(&c->reconnect_ms, __ATOMIC_RELAXED) &&
	    !__atomic_load_n(&c->gone, __ATOMIC_RELAXED))
		err = peek_look(c, out);
	return err;
}

void kvc_set_spin(struct kvc_conn *c, unsigned int usec)
{
	c->spin_us = usec;
}

uint64_t kvc__now_ns(void)
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
	if (kvring_ready(c->cq, __atomic_load_n(&c->cq_head, __ATOMIC_RELAXED)) ||
	    __atomic_load_n(&c->pend_head, __ATOMIC_RELAXED) !=
	    __atomic_load_n(&c->pend_tail, __ATOMIC_RELAXED)) {
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

/*
 * The socket woke kvc_wait(): hand out what the daemon posted before it
 * left (a drain posts its last CQEs, then hangs up), then reconnect if
 * that is on. 0 with *out, 1 when a reconnect leaves more to wait for, or
 * -errno.
 */
static int wait_sock(struct kvc_conn *c, struct kvd_cqe *out, uint32_t gen)
{
	int err = peek_once(c, out);
	if (err != -EAGAIN)
		return err;
	err = kvc_sock_event(c);
	if (err == -ECONNRESET && !(err = kvc__reconnect_gen(c, gen)))
		return 1;
	return err;
}

int kvc_wait(struct kvc_conn *c, struct kvd_cqe *out, int timeout_ms)
{
	const uint64_t start = kvc__now_ns();
	const uint64_t deadline = timeout_ms < 0 ? UINT64_MAX :
				  start + (uint64_t)timeout_ms * 1000000u;
	const uint64_t spin_end = start + (uint64_t)c->spin_us * 1000u;

	if (!c->cq)
		return -ENOTCONN;
	for (;;) {
		uint32_t gen = __atomic_load_n(&c->gen, __ATOMIC_RELAXED);
		int err = peek_once(c, out);
		if (err != -EAGAIN)
			return err;
		uint64_t t = kvc__now_ns();
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
		if (p[1].revents && (err = wait_sock(c, out, gen)) != 1)
			return err;
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
