/* kvclient.c — libkvclient: control messages, connecting, HELLO and sessions. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "shm/kvclient.h"
#include "shm/kvclient_priv.h"
#include "uapi/kvd_pins.h"

#define KVC_SPIN_US_DEFAULT 50

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

void kvc__close_fds(int *fds, int n)
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
		kvc__close_fds(fds, got_fds);
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
		kvc__close_fds(fds, n_fds);
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

void *kvc__map_fd(int fd, size_t len, int prot, int *err)
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

void kvc__wake(struct kvc_conn *c)
{
	uint64_t one = 1;
	/* an eventfd's counter: a failed write (EAGAIN at 2^64 - 2) already has it readable */
	if (write(c->wake_fd, &one, sizeof(one)) < 0)
		return;
}

void kvc__install_fd(int *slot, int fd)
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
		kvc__close_fds(fds, n_fds);
		return -EPROTO;
	}
	if (want_fds) {
		err = kvc__map_vocab(c, fds[0], rep.vocab_bytes);
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
	kvc__install_fd(&c->sock, s);
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
	c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->wake_fd < 0) {
		err = -errno;
		kvc_close(c);
		return err;
	}
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
	if (c->wake_fd >= 0)
		close(c->wake_fd);
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
