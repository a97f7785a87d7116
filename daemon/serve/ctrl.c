/*
 * ctrl.c — the control protocol on the loop thread: HELLO (limits, model
 * facts, the vocabulary memfd), SESSION_OPEN (the region on the first one),
 * SESSION_CLOSE and STATS. Every message is checked whole before it acts,
 * and every reply is sent without blocking.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/model/model.h"
#include "daemon/serve/persist.h"
#include "daemon/serve/server.h"
#include "daemon/tokenizer/tokenizer.h"
#include "kernels/backend.h"

/* ---- the vocabulary memfd: token bytes for clients to detokenize locally ---- */

int ctrl_build_vocab(struct server *srv)
{
	uint32_t n = tokenizer_vocab_size(srv->tok);
	size_t bytes = 0;
	char buf[1024];
	for (uint32_t i = 0; i < n; i++) {
		int b = tokenizer_token_bytes(srv->tok, i, 0, buf, sizeof(buf));
		int s = tokenizer_token_bytes(srv->tok, i, 1, buf, sizeof(buf));
		if (b < 0)
			return b;
		bytes += (size_t)b;
		/* The most text one token stands for, a special token's spelling included. */
		uint32_t most = (uint32_t)(s > b ? s : b);
		srv->max_token_bytes = most > srv->max_token_bytes ? most : srv->max_token_bytes;
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

/* ---- replies ---- */

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

void ctrl_reply_error(struct conn *c, const struct kvd_msg_hdr *req, int type, int status)
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
		ctrl_reply_error(c, &rq->hdr, KVD_MSG_HELLO, -EPROTO);
		return;
	}
	if (!all_zero(rq->resv, sizeof(rq->resv))) {
		ctrl_reply_error(c, &rq->hdr, KVD_MSG_HELLO, -EINVAL);
		return;
	}
	struct kvd_hello_rep r;
	memset(&r, 0, sizeof(r));
	const struct model_hparams *hp = &srv->m->hp;
	r.hdr = (struct kvd_msg_hdr){ .magic = KVD_MAGIC, .type = KVD_MSG_HELLO, .seq = rq->hdr.seq };
	r.abi_version = KVD_ABI_VERSION;
	r.features = rq->features & KVD_FEAT_ALL;
	if (!srv->ps)
		r.features &= ~KVD_FEAT_RESUME;	/* nothing is kept across a restart */
	c->features = r.features;
	r.vocab_size = hp->vocab;
	r.ctx_len = hp->ctx_len;
	r.bos_id = tokenizer_bos(srv->tok);
	r.eos_id = tokenizer_eos(srv->tok);
	r.eot_id = tokenizer_eot(srv->tok);
	r.max_sessions = srv->cfg.max_sessions;
	r.max_sq_entries = REGION_MAX_SQ;
	r.max_cq_entries = REGION_MAX_CQ;
	r.max_arena_bytes = srv->cfg.max_arena_bytes;
	r.kv_block_tokens = engine_pool_block_tokens(srv->eng);
	r.kv_blocks_total = engine_pool_blocks(srv->eng);
	snprintf(r.model_name, sizeof(r.model_name), "%s", hp->name);
	snprintf(r.backend, sizeof(r.backend), "%s", srv->be->ops->name);
	r.max_tokens = srv->cfg.max_tokens;
	r.max_slots = srv->cfg.max_slots;
	r.daemon_pid = (uint32_t)getpid();
	/*
	 * The vocabulary fd goes to a connection once: every fd in an unread
	 * reply counts against the daemon's user in the kernel (SCM_RIGHTS
	 * in flight), so a client repeating HELLO must not pile them up.
	 */
	int rc, with_fd = (r.features & KVD_FEAT_VOCAB) && !c->vocab_sent;
	if (with_fd) {
		r.flags = KVD_HELLOF_VOCAB;
		r.vocab_bytes = srv->vocab_bytes;
		c->vocab_sent = 1;
	}
	if ((rc = send_reply(c, &r, sizeof(r), &srv->vocab_fd, with_fd)))
		log_msg(LOG_WARNING, "HELLO reply to pid %d not sent: %s", (int)c->pid, strerror(-rc));
}

/* ---- sessions ---- */

/* The region of c's first session, its kick eventfd watched by the loop. */
static int make_region(struct server *srv, struct conn *c, const struct kvd_session_open_req *rq)
{
	uint32_t sq = rq->sq_entries ? rq->sq_entries : srv->cfg.sq_entries;
	uint32_t cq = rq->cq_entries ? rq->cq_entries : srv->cfg.cq_entries;
	uint32_t arena = rq->arena_bytes ? rq->arena_bytes : srv->cfg.arena_bytes;
	if (arena > srv->cfg.max_arena_bytes)
		return -EINVAL;
	int rc = region_create(&c->rg, sq, cq, arena);
	if (!rc && (rc = server_watch_kick(srv, c)))
		region_destroy(&c->rg);
	return rc;
}

/* Two resume tokens equal? In constant time: how far a guess matched must not show. */
static int token_eq(const void *a, const void *b)
{
	const uint8_t *x = a, *y = b;
	uint8_t d = 0;
	for (int i = 0; i < 16; i++)
		d |= x[i] ^ y[i];
	return !d;
}

/* A session of uid's with that token open on some live connection? */
static int token_open(struct server *srv, uid_t uid, const void *token)
{
	for (struct conn *c = srv->conns; c; c = c->next)
		for (uint32_t i = 0; c->uid == uid && !c->dead && i < SRV_MAX_SESSIONS; i++)
			if (c->sessions[i] && token_eq(c->sessions[i]->token, token))
				return 1;
	return 0;
}

/*
 * KVD_OPEN_RESUME: the orphan of that token, taken off the list for c.
 * *idx is the table index its id names. -ESTALE: none, or another uid's
 * (the same answer, so a token's existence never shows to another uid);
 * -EBUSY: open on a connection of the uid, or its index is taken on this one.
 */
static int take_orphan(struct server *srv, struct conn *c, const void *token,
		       struct session **out, uint32_t *idx)
{
	static const uint8_t none[16];
	if (token_eq(token, none))
		return -ESTALE;	/* sessions that are not kept have no token */
	for (struct session **pp = &srv->orphans; *pp; pp = &(*pp)->next_orphan) {
		struct session *o = *pp;
		if (!token_eq(o->token, token))
			continue;
		if (o->uid != c->uid)
			return -ESTALE;
		*idx = o->id & 0xff;
		if (*idx >= srv->cfg.max_sessions || c->sessions[*idx])
			return -EBUSY;
		*pp = o->next_orphan;
		o->next_orphan = NULL;
		*out = o;
		return 0;
	}
	return token_open(srv, c->uid, token) ? -EBUSY : -ESTALE;
}

/* A resumed session's slots: how many came back, how many were lost; replays posted to c. */
static void resumed_slots(struct conn *c, struct session *s, uint32_t *restored, uint32_t *lost)
{
	*restored = *lost = 0;
	for (uint32_t k = 0; k < s->n_slots; k++) {
		struct slot *sl = &s->slots[k];
		*lost += sl->lost != 0;
		*restored += !sl->lost && (sl->live || sl->n_resume || sl->has_pending);
		if (sl->has_last) {
			struct kvd_cqe q = sl->last;
			q.flags |= KVD_CQE_REPLAY;
			region_post(&c->rg, &q);
		}
	}
}

static void do_session_open(struct server *srv, struct conn *c, const struct kvd_session_open_req *rq)
{
	int resume = rq->flags == KVD_OPEN_RESUME;
	if ((rq->flags && !resume) || (resume && !(c->features & KVD_FEAT_RESUME)) ||
	    (!resume && !all_zero(rq->token, sizeof(rq->token)))) {
		ctrl_reply_error(c, &rq->hdr, KVD_MSG_SESSION_OPEN, -EINVAL);
		return;
	}
	pthread_mutex_lock(&srv->lock);
	int rc = 0, first = !region_live(&c->rg);
	uint32_t idx = SRV_MAX_SESSIONS;
	if (c->n_sessions >= srv->cfg.max_sessions || c->use->sessions >= srv->cfg.max_uid_sessions)
		rc = -EMFILE;
	uint64_t want = rq->arena_bytes ? rq->arena_bytes : srv->cfg.arena_bytes;
	if (!rc && first && c->use->arena + want > srv->cfg.max_uid_arena)
		rc = -EDQUOT;
	struct session *s = NULL;
	if (!rc && resume) {
		rc = take_orphan(srv, c, rq->token, &s, &idx);
	} else {
		for (uint32_t i = 0; !rc && i < srv->cfg.max_sessions && idx == SRV_MAX_SESSIONS; i++)
			if (!c->sessions[i])
				idx = i;
		if (!rc && !(s = session_new(srv->cfg.max_slots)))
			rc = -ENOMEM;
	}
	if (!rc && first)
		rc = make_region(srv, c, rq);
	if (rc) {
		if (s && resume) {
			/* Still waiting for a client that can take it. */
			s->next_orphan = srv->orphans;
			srv->orphans = s;
			s = NULL;
		}
		pthread_mutex_unlock(&srv->lock);
		session_free(s);
		ctrl_reply_error(c, &rq->hdr, KVD_MSG_SESSION_OPEN, rc);
		return;
	}
	uint32_t restored = 0, lost = 0;
	if (resume) {
		/* The same id: the client's SQEs name it. The generation counter moves past it. */
		if (c->next_session < (s->id >> 8))
			c->next_session = s->id >> 8;
		resumed_slots(c, s, &restored, &lost);
		srv->resumed_sessions++;
		log_msg(LOG_INFO, "session %08x resumed by pid %d: %u slots back, %u lost", s->id,
			(int)c->pid, restored, lost);
	} else {
		/* Session ids carry their table index in the low bits and a generation above. */
		s->id = (++c->next_session << 8) | idx;
		persist_session_open(srv->ps, s, c->uid);
	}
	c->sessions[idx] = s;
	c->n_sessions++;
	c->use->sessions++;
	if (first)
		c->use->arena += c->rg.bytes;
	srv->n_sessions++;
	struct kvd_session_open_rep r;
	memset(&r, 0, sizeof(r));
	r.hdr = (struct kvd_msg_hdr){ .magic = KVD_MAGIC, .type = KVD_MSG_SESSION_OPEN,
				      .seq = rq->hdr.seq };
	r.session_id = s->id;
	r.flags = (first ? KVD_OPENF_FDS : 0) | (resume ? KVD_OPENF_RESUMED : 0);
	r.sq_entries = c->rg.sq_entries;
	r.cq_entries = c->rg.cq_entries;
	r.region_bytes = c->rg.bytes;
	r.sq_off = (uint64_t)((uint8_t *)c->rg.sq - c->rg.base);
	r.cq_off = (uint64_t)((uint8_t *)c->rg.cq - c->rg.base);
	r.sqes_off = (uint64_t)((uint8_t *)c->rg.sqes - c->rg.base);
	r.cqes_off = (uint64_t)((uint8_t *)c->rg.cqes - c->rg.base);
	r.arena_off = (uint64_t)(c->rg.arena - c->rg.base);
	r.arena_bytes = c->rg.arena_bytes;
	if (c->features & KVD_FEAT_RESUME) {
		memcpy(r.resume_token, s->token, sizeof(r.resume_token));
		r.restored_slots = restored;
		r.lost_slots = lost;
	}
	pthread_mutex_unlock(&srv->lock);
	int fds[3] = { c->rg.memfd, c->rg.peer_kick_fd, c->rg.peer_call_fd };
	int rc2 = send_reply(c, &r, sizeof(r), fds, first ? 3 : 0);
	if (rc2)
		log_msg(LOG_WARNING, "SESSION_OPEN reply to pid %d not sent: %s", (int)c->pid, strerror(-rc2));
	/* In flight to the client or lost with the reply: the daemon keeps only its own ends. */
	if (first)
		region_peer_fds_sent(&c->rg);
}

static void do_session_close(struct server *srv, struct conn *c, const struct kvd_session_close_req *rq)
{
	if (rq->resv) {
		ctrl_reply_error(c, &rq->hdr, KVD_MSG_SESSION_CLOSE, -EINVAL);
		return;
	}
	pthread_mutex_lock(&srv->lock);
	struct session *s = conn_session(c, rq->session_id);
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
	r.restored_sessions = srv->restored_sessions;
	r.restored_blocks = srv->restored_blocks;
	r.restored_prefixes = srv->restored_prefixes;
	r.resumed_sessions = srv->resumed_sessions;
	pthread_mutex_unlock(&srv->lock);
	send_reply(c, &r, sizeof(r), NULL, 0);
}

/* One control datagram: checked, dispatched, answered; the connection stays usable. */
static void handle_msg(struct server *srv, struct conn *c, size_t len)
{
	const struct kvd_msg_hdr *h = (const struct kvd_msg_hdr *)c->rx;
	if (len < sizeof(*h) || h->magic != KVD_MAGIC) {
		ctrl_reply_error(c, len >= sizeof(*h) ? h : NULL, KVD_MSG_ERROR, -EPROTO);
		return;
	}
	if (h->len != len || h->flags || h->status || h->resv) {
		ctrl_reply_error(c, h, KVD_MSG_ERROR, -EINVAL);
		return;
	}
	static const size_t sizes[KVD_MSG_LAST] = {
		[KVD_MSG_HELLO] = sizeof(struct kvd_hello_req),
		[KVD_MSG_SESSION_OPEN] = sizeof(struct kvd_session_open_req),
		[KVD_MSG_SESSION_CLOSE] = sizeof(struct kvd_session_close_req),
		[KVD_MSG_STATS] = sizeof(struct kvd_msg_hdr),
	};
	if (h->type >= KVD_MSG_LAST || !sizes[h->type]) {
		ctrl_reply_error(c, h, KVD_MSG_ERROR, -EINVAL);
		return;
	}
	if (len != sizes[h->type]) {
		ctrl_reply_error(c, h, h->type, -EINVAL);
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

void ctrl_handle_msg(struct server *srv, struct conn *c, const void *msg, size_t len)
{
	if (len > sizeof(c->rx)) {
		ctrl_reply_error(c, NULL, KVD_MSG_ERROR, -EMSGSIZE);
		return;
	}
	if (msg != c->rx)
		memcpy(c->rx, msg, len);
	handle_msg(srv, c, len);
}
