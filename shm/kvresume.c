/* kvresume.c — libkvclient across a daemon restart: resume tokens, requests in flight, reconnecting. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "shm/kvclient.h"
#include "shm/kvclient_priv.h"
#include "shm/kvring.h"

#define KVC_BACKOFF_MIN_NS	20000000u	/* the first retry of a reconnect after 20 ms, */
#define KVC_BACKOFF_MAX_NS	500000000u	/* doubling up to 500 ms */
#define KVC_FLIGHT_MIN		64
#define KVC_ONCE_MS		30000		/* kvc_reconnect() with reconnecting off: one try's bound */

/* The fate of a request in flight when the daemon went, as a reconnect finds it. */
enum {
	FATE_LOST,		/* not applied: -ERESTART */
	FATE_REPLAYED,		/* a replay is its own final CQE */
	FATE_APPLIED,		/* a later request of its slot was replayed: applied, result lost */
};

/* A replay, with the session whose reopen brought it (a CQE does not say). */
struct replay {
	struct kvd_cqe		e;
	uint32_t		session_id;
};

struct replays {
	struct replay		*v;		/* (n,) */
	uint32_t		n, cap;
};

/* ---------------------------------------------------------------------- */
/* Sessions.                                                              */

/* A token, as uint64_t[2] or the uapi's __u64[2], is all zero: no token. */
static int token_zero(const void *t)
{
	static const uint64_t zero[2];
	return !memcmp(t, zero, sizeof(zero));
}

struct kvc_sess *kvc__sess(struct kvc_conn *c, uint32_t id)
{
	uint32_t i = id & 0xff;
	if (i >= KVC_MAX_SESSIONS || !c->sess[i].live || c->sess[i].id != id)
		return NULL;
	return &c->sess[i];
}

void kvc__sess_record(struct kvc_conn *c, const struct kvd_session_open_rep *rep,
		      const uint64_t token[2])
{
	uint32_t i = rep->session_id & 0xff;
	if (i >= KVC_MAX_SESSIONS)
		return;	/* beyond any daemon's table: it cannot be reopened by id anyway */
	struct kvc_sess *s = &c->sess[i];
	s->id = rep->session_id;
	s->live = 1;
	s->token[0] = s->token[1] = 0;
	/* A daemon without RESUME sends no token: the reply was zeroed past its end. */
	if (c->info.features & KVD_FEAT_RESUME)
		memcpy(s->token, rep->resume_token, sizeof(s->token));
	if (token_zero(s->token) && token)
		memcpy(s->token, token, sizeof(s->token));
}

void kvc__sess_forget(struct kvc_conn *c, uint32_t id)
{
	struct kvc_sess *s = kvc__sess(c, id);
	if (s)
		memset(s, 0, sizeof(*s));
}

int kvc_session_token(const struct kvc_conn *cc, uint32_t session_id, uint64_t token[2])
{
	struct kvc_conn *c = (struct kvc_conn *)cc;	/* for the lock alone */
	int err = -ENOENT;
	pthread_mutex_lock(&c->lock);
	const struct kvc_sess *s = kvc__sess(c, session_id);
	if (s && (!(c->info.features & KVD_FEAT_RESUME) || token_zero(s->token)))
		err = -EOPNOTSUPP;
	else if (s) {
		memcpy(token, s->token, sizeof(s->token));
		err = 0;
	}
	pthread_mutex_unlock(&c->lock);
	return err;
}

/* SESSION_OPEN with KVD_OPEN_RESUME and token, asking this connection's sizes. */
static int resume_rpc(struct kvc_conn *c, const uint64_t token[2], struct kvd_session_open_rep *rep,
		      int *fds, int *n_fds)
{
	struct kvd_session_open_req req;
	memset(&req, 0, sizeof(req));
	/* Sizes matter only to a connection's first open; a region we held says them. */
	if (c->region) {
		req.sq_entries = c->layout.sq_entries;
		req.cq_entries = c->layout.cq_entries;
		req.arena_bytes = c->layout.arena_bytes;
	}
	req.flags = KVD_OPEN_RESUME;
	memcpy(req.token, token, sizeof(req.token));
	return kvc__rpc(c, &req, KVD_MSG_SESSION_OPEN, sizeof(req), rep, sizeof(*rep), sizeof(*rep),
			fds, n_fds);
}

int kvc_session_resume(struct kvc_conn *c, const uint64_t token[2], uint32_t *session_id,
		       uint32_t *restored_slots, uint32_t *lost_slots)
{
	struct kvd_session_open_rep rep;
	int fds[KVC_MAX_FDS], n_fds;

	if (!(c->info.features & KVD_FEAT_RESUME))
		return -EOPNOTSUPP;
	if (!token || token_zero(token))
		return -EINVAL;
	int err = resume_rpc(c, token, &rep, fds, &n_fds);
	if (err)
		return err;
	pthread_mutex_lock(&c->lock);
	err = kvc__opened(c, &rep, fds, n_fds, 0);
	if (!err && !(rep.flags & KVD_OPENF_RESUMED))
		err = -EPROTO;	/* a new session where ours was asked for */
	if (!err)
		kvc__sess_record(c, &rep, token);
	pthread_mutex_unlock(&c->lock);
	if (err) {
		kvc__close_rpc(c, rep.session_id);
		return err;
	}
	*session_id = rep.session_id;
	if (restored_slots)
		*restored_slots = rep.restored_slots;
	if (lost_slots)
		*lost_slots = rep.lost_slots;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Requests in flight, oldest first.                                      */

/* Room for one more: the live entries moved to the front of a new array, twice their number. */
static int flight_grow(struct kvc_conn *c)
{
	uint32_t live = 0, cap = KVC_FLIGHT_MIN, k = 0;
	for (uint32_t i = c->fl_head; i != c->fl_tail; i++)
		live += !c->fl[i & c->fl_mask].done;
	while (cap < 2 * live + 2)
		cap *= 2;
	struct kvc_flight *n = malloc(cap * sizeof(*n));
	if (!n)
		return -ENOMEM;
	for (uint32_t i = c->fl_head; i != c->fl_tail; i++)
		if (!c->fl[i & c->fl_mask].done)
			n[k++] = c->fl[i & c->fl_mask];
	free(c->fl);
	c->fl = n;
	c->fl_mask = cap - 1;
	c->fl_head = 0;
	c->fl_tail = k;
	return 0;
}

int kvc__flight_add(struct kvc_conn *c, const struct kvd_sqe *sqe)
{
	if ((!c->fl || c->fl_tail - c->fl_head > c->fl_mask) && flight_grow(c))
		return -ENOMEM;
	c->fl[c->fl_tail++ & c->fl_mask] = (struct kvc_flight){
		.user_data = sqe->user_data, .session_id = sqe->session_id, .slot = sqe->slot,
		.opcode = sqe->opcode,
	};
	return 0;
}

/* Skip the head over entries whose final CQE was taken. */
static void flight_trim(struct kvc_conn *c)
{
	while (c->fl_head != c->fl_tail && c->fl[c->fl_head & c->fl_mask].done)
		c->fl_head++;
}

void kvc__flight_done(struct kvc_conn *c, const struct kvd_cqe *e)
{
	struct kvc_flight *any = NULL;
	for (uint32_t i = c->fl_head; i != c->fl_tail; i++) {
		struct kvc_flight *f = &c->fl[i & c->fl_mask];
		if (f->done || f->user_data != e->user_data)
			continue;
		/* The slot tells apart requests that share a user_data; the oldest wins. */
		if (f->slot == e->slot) {
			any = f;
			break;
		}
		if (!any)
			any = f;
	}
	if (any)
		any->done = 1;
	flight_trim(c);
}

/* ---------------------------------------------------------------------- */
/* CQEs a reconnect made, handed out before the CQ's.                     */

/* Room for n more at the tail; 0 or -ENOMEM. */
static int pend_reserve(struct kvc_conn *c, uint32_t n)
{
	uint32_t have = c->pend_tail - c->pend_head;
	if (c->pend_head) {
		memmove(c->pend, c->pend + c->pend_head, have * sizeof(*c->pend));
		__atomic_store_n(&c->pend_head, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&c->pend_tail, have, __ATOMIC_RELAXED);
	}
	if (have + n <= c->pend_cap)
		return 0;
	uint32_t cap = c->pend_cap ? c->pend_cap : 64;
	while (cap < have + n)
		cap *= 2;
	struct kvd_cqe *p = realloc(c->pend, cap * sizeof(*p));
	if (!p)
		return -ENOMEM;
	c->pend = p;
	c->pend_cap = cap;
	return 0;
}

/* After pend_reserve(): the tail store makes it visible to peek_once()'s unlocked look. */
static void pend_push(struct kvc_conn *c, const struct kvd_cqe *e)
{
	c->pend[c->pend_tail] = *e;
	__atomic_store_n(&c->pend_tail, c->pend_tail + 1, __ATOMIC_RELAXED);
}

int kvc__pend_take(struct kvc_conn *c, struct kvd_cqe *out)
{
	if (c->pend_head == c->pend_tail)
		return -EAGAIN;
	*out = c->pend[c->pend_head];
	__atomic_store_n(&c->pend_head, c->pend_head + 1, __ATOMIC_RELAXED);
	return 0;
}

/* What the dead daemon posted and nobody took yet: real completions, first in line. */
static int drain_old_cq(struct kvc_conn *c)
{
	if (!c->region_live)
		return 0;
	uint32_t n = kvring_ready(c->cq, c->cq_head);
	if (n > c->cq_mask + 1)
		n = 0;	/* a tail no daemon could have written: nothing there to trust */
	if (pend_reserve(c, n))
		return -ENOMEM;
	for (struct kvd_cqe e; n-- && !kvc__ring_take(c, &e);)
		pend_push(c, &e);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Reopening the sessions on a new connection.                            */

static int replays_add(struct replays *r, const struct kvd_cqe *e, uint32_t session_id)
{
	if (r->n == r->cap) {
		uint32_t cap = r->cap ? 2 * r->cap : 16;
		struct replay *v = realloc(r->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		r->v = v;
		r->cap = cap;
	}
	r->v[r->n++] = (struct replay){ .e = *e, .session_id = session_id };
	return 0;
}

/*
 * The replays a reopen of session_id posted before its reply, from the new
 * CQ. Some may wait in the daemon when the CQ is full: freeing room and
 * kicking it brings them, until the deadline.
 */
static int take_replays(struct kvc_conn *c, uint32_t session_id, struct replays *r,
			uint64_t deadline)
{
	for (;;) {
		/* Nothing else can be there yet: nothing was submitted here. */
		for (struct kvd_cqe e; !kvc__ring_take(c, &e);)
			if ((e.flags & KVD_CQE_REPLAY) && replays_add(r, &e, session_id))
				return -ENOMEM;
		if (!(__atomic_load_n(&c->cq->flags, __ATOMIC_RELAXED) & KVD_RING_CQ_OVERFLOW) &&
		    !__atomic_load_n(&c->cq->overflow, __ATOMIC_RELAXED))
			return 0;
		if (kvc__now_ns() >= deadline)
			return -ETIMEDOUT;
		if (kvring_needs_wakeup(c->sq))
			kvc__kick(c);
		poll(NULL, 0, 1);
	}
}

/* Errors of a reconnect attempt that another attempt may not meet. */
static int retryable(int err)
{
	return err == -ENOENT || err == -ECONNREFUSED || err == -ECONNRESET || err == -EPIPE ||
	       err == -ETIMEDOUT || err == -ESHUTDOWN || err == -EAGAIN || err == -EMFILE;
}

/* A transport failure of a reopen: the new daemon went too, so the attempt fails. */
static int conn_lost(int err)
{
	return err == -ECONNRESET || err == -EPIPE || err == -ETIMEDOUT || err == -ESHUTDOWN ||
	       err == -EPROTO || err == -ENOMEM;
}

/*
 * Reopen session s by its token. 0; -ESTALE and friends when the daemon
 * will not give it back (the caller forgets it); conn_lost() errors.
 */
static int reopen(struct kvc_conn *c, struct kvc_sess *s, struct replays *r, uint64_t deadline)
{
	struct kvd_session_open_rep rep;
	int fds[KVC_MAX_FDS], n_fds;
	int err = resume_rpc(c, s->token, &rep, fds, &n_fds);
	if (err)
		return err;
	/* The region comes with the first open, whatever became of the session. */
	if ((err = kvc__opened(c, &rep, fds, n_fds, 1)))
		return err;
	if (!(rep.flags & KVD_OPENF_RESUMED) || rep.session_id != s->id) {
		/* Not ours: SQEs in flight name the old id. */
		kvc__close_rpc(c, rep.session_id);
		return -ESTALE;
	}
	if (!token_zero(rep.resume_token))
		memcpy(s->token, rep.resume_token, sizeof(s->token));
	return take_replays(c, s->id, r, deadline);
}

/* One try: a new connection, HELLO, every session reopened. */
static int attempt(struct kvc_conn *c, struct replays *r, uint64_t deadline)
{
	int err = kvc__dial(c);
	if (err)
		return err;
	c->region_live = 0;	/* until this connection's first open passes it */
	r->n = 0;
	for (uint32_t i = 0; i < KVC_MAX_SESSIONS; i++) {
		struct kvc_sess *s = &c->sess[i];
		if (!s->live)
			continue;
		err = token_zero(s->token) ? -ESTALE : reopen(c, s, r, deadline);
		if (conn_lost(err))
			return err;
		if (err)
			memset(s, 0, sizeof(*s));	/* gone: its requests get -ERESTART */
	}
	return 0;
}

/* The in-flight request a replay is the final CQE of: the oldest of its slot with its user_data. */
static struct kvc_flight *replayed(struct kvc_conn *c, const struct replay *rp, uint32_t *at)
{
	for (uint32_t i = c->fl_head; i != c->fl_tail; i++) {
		struct kvc_flight *f = &c->fl[i & c->fl_mask];
		if (!f->done && f->fate == FATE_LOST && f->session_id == rp->session_id &&
		    f->slot == rp->e.slot && f->user_data == rp->e.user_data &&
		    f->opcode != KVD_OP_NOP && f->opcode != KVD_OP_CANCEL) {
			*at = i;
			return f;
		}
	}
	return NULL;
}

/*
 * Give every request in flight its fate from the replays: a slot runs its
 * requests in order, so those of the slot submitted before a replayed one
 * were applied too. A FATE_REPLAYED entry's replay names its replay.
 */
static void judge(struct kvc_conn *c, const struct replays *r)
{
	for (uint32_t i = c->fl_head; i != c->fl_tail; i++)
		c->fl[i & c->fl_mask].fate = FATE_LOST;
	for (uint32_t k = 0; k < r->n; k++) {
		uint32_t at;
		struct kvc_flight *f = replayed(c, &r->v[k], &at);
		if (!f)
			continue;	/* its completion was seen already */
		f->fate = FATE_REPLAYED;
		f->replay = k;
		for (uint32_t i = c->fl_head; i != at; i++) {
			struct kvc_flight *g = &c->fl[i & c->fl_mask];
			if (!g->done && g->fate == FATE_LOST && g->session_id == f->session_id &&
			    g->slot == f->slot && g->opcode != KVD_OP_NOP && g->opcode != KVD_OP_CANCEL)
				g->fate = FATE_APPLIED;
		}
	}
}

/* Every request in flight gets its final CQE, in submission order, from the pending queue. */
static int settle(struct kvc_conn *c, const struct replays *r)
{
	if (pend_reserve(c, c->fl_tail - c->fl_head))
		return -ENOMEM;
	judge(c, r);
	for (uint32_t i = c->fl_head; i != c->fl_tail; i++) {
		const struct kvc_flight *f = &c->fl[i & c->fl_mask];
		struct kvd_cqe e = { .user_data = f->user_data, .res = -ERESTART,
				     .flags = KVD_CQE_RESTARTED, .slot = f->slot };
		if (f->done)
			continue;
		if (f->fate == FATE_REPLAYED) {
			e = r->v[f->replay].e;
			e.flags |= KVD_CQE_RESTARTED;
		} else if (f->fate == FATE_APPLIED) {
			e.res = 0;
			e.flags = KVD_CQE_REPLAY | KVD_CQE_RESTARTED;
		}
		pend_push(c, &e);
	}
	c->fl_head = c->fl_tail;
	return 0;
}

/* Sleep ns, up to the deadline: 0, -ETIMEDOUT when none is left, -EINTR. */
static int backoff(uint64_t ns, uint64_t deadline)
{
	uint64_t t = kvc__now_ns();
	if (t >= deadline)
		return -ETIMEDOUT;
	if (ns > deadline - t)
		ns = deadline - t;
	struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000u),
			       .tv_nsec = (long)(ns % 1000000000u) };
	return nanosleep(&ts, NULL) ? -errno : 0;
}

/*
 * Reconnect with c->lock held: tries until deadline (one try when once),
 * the control replies bounded by it too; then the requests in flight
 * settle. 0 or -errno of the last try; -EINTR when a signal cut a wait short.
 */
static int reconnect(struct kvc_conn *c, uint64_t deadline, int once)
{
	struct replays r = { 0 };
	uint64_t wait = KVC_BACKOFF_MIN_NS;
	int err = drain_old_cq(c);
	if (err)
		return err;
	for (;;) {
		c->rpc_deadline = deadline;
		err = attempt(c, &r, deadline);
		c->rpc_deadline = 0;
		if (!err || once || !retryable(err))
			break;
		int b = backoff(wait, deadline);
		if (b) {
			err = b == -EINTR ? b : err;	/* out of time: the last try's error */
			break;
		}
		wait = wait * 2 < KVC_BACKOFF_MAX_NS ? wait * 2 : KVC_BACKOFF_MAX_NS;
	}
	if (!err)
		err = settle(c, &r);
	free(r.v);
	if (!err) {
		__atomic_store_n(&c->gen, c->gen + 1, __ATOMIC_RELAXED);
		c->gone = 0;
	}
	kvc__wake(c);	/* settled CQEs to take, or an error to see */
	return err;
}

int kvc__reconnect_locked(struct kvc_conn *c, uint32_t gen)
{
	if (__atomic_load_n(&c->gen, __ATOMIC_RELAXED) != gen)
		return 0;	/* the other thread did it */
	if (!c->reconnect_ms || c->gone)
		return -ECONNRESET;
	int err = reconnect(c, kvc__now_ns() + (uint64_t)c->reconnect_ms * 1000000u, 0);
	if (err == -EINTR)
		return err;
	if (err)
		c->gone = 1;	/* stop retrying on every call: kvc_reconnect() still may */
	return err ? -ECONNRESET : 0;
}

int kvc__reconnect_gen(struct kvc_conn *c, uint32_t gen)
{
	pthread_mutex_lock(&c->lock);
	int err = kvc__reconnect_locked(c, gen);
	pthread_mutex_unlock(&c->lock);
	return err;
}

int kvc__submit_lost(struct kvc_conn *c, const struct kvd_sqe *sqe)
{
	uint32_t gen = __atomic_load_n(&c->gen, __ATOMIC_RELAXED);
	if (kvc__reconnect_locked(c, gen)) {
		if (c->fl_tail != c->fl_head)
			c->fl_tail--;	/* ours, the newest: not sent after all */
		return -EPIPE;
	}
	/*
	 * Settled last, ours is the last pending CQE. Unless a replay covers
	 * it (the daemon saw it before it went), it never ran: send it again.
	 */
	struct kvd_cqe *e = &c->pend[c->pend_tail - 1];
	if (c->pend_tail == c->pend_head || e->user_data != sqe->user_data ||
	    e->res != -ERESTART || !kvc__sess(c, sqe->session_id) || !c->region_live)
		return 0;
	__atomic_store_n(&c->pend_tail, c->pend_tail - 1, __ATOMIC_RELAXED);
	int err = kvc__push(c, sqe);
	if (!err && kvring_needs_wakeup(c->sq))
		kvc__kick(c);	/* gone again: the socket will say so */
	return err;
}

/* ---------------------------------------------------------------------- */
/* The calls.                                                             */

void kvc_set_reconnect(struct kvc_conn *c, int max_ms)
{
	pthread_mutex_lock(&c->lock);
	c->reconnect_ms = max_ms > 0 ? max_ms : 0;
	c->gone = 0;
	pthread_mutex_unlock(&c->lock);
}

int kvc_reconnect(struct kvc_conn *c)
{
	pthread_mutex_lock(&c->lock);
	int err = -EISCONN, ms = c->reconnect_ms ? c->reconnect_ms : KVC_ONCE_MS;
	if (c->gone || kvc__hung_up(c))
		err = reconnect(c, kvc__now_ns() + (uint64_t)ms * 1000000u, !c->reconnect_ms);
	if (err && err != -EISCONN && err != -EINTR)
		c->gone = 1;
	pthread_mutex_unlock(&c->lock);
	return err;
}
