/* kvclient_priv.h — what libkvclient's own files share and the version script keeps local. */
#ifndef KVD_KVCLIENT_PRIV_H
#define KVD_KVCLIENT_PRIV_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>
#include "uapi/kvd.h"

#define KVC_MAX_FDS 4		/* more than any reply carries, so extras are seen and closed */
#define KVC_MAX_SESSIONS 64	/* the daemon's per-connection cap; a session's index is id & 0xff */
#define KVC_OPEN_REP_V1 offsetof(struct kvd_session_open_rep, resume_token) /* without RESUME */

/* A session this connection opened, as a reconnect reopens it. */
struct kvc_sess {
	uint32_t		id;		/* from SESSION_OPEN */
	int			live;		/* open: a reconnect reopens it */
	uint64_t		token[2];	/* its resume token; all zero: none was given */
};

/* A request published on the SQ whose final CQE was not taken yet. */
struct kvc_flight {
	uint64_t		user_data;
	uint32_t		session_id;
	uint32_t		slot;
	uint8_t			opcode;
	uint8_t			done;		/* its final CQE was taken: a hole the head skips */
	uint8_t			fate;		/* a reconnect's verdict on it (kvresume.c) */
	uint32_t		replay;		/* with that verdict: which replay is its CQE */
};

struct kvc_conn {
	int			sock;		/* AF_UNIX SOCK_SEQPACKET to the daemon */
	int			kick_fd;	/* doorbell, client -> daemon; -1 before the first session */
	int			call_fd;	/* doorbell, daemon -> client */
	int			wake_fd;	/* eventfd: a reconnect posted CQEs (kvc__wake()) */
	uint32_t		seq;		/* of the last control request */
	unsigned int		spin_us;
	struct kvd_hello_rep	info;
	struct sockaddr_un	addr;		/* where the daemon listens, to reconnect to */
	uint64_t		rpc_deadline;	/* ns; a reconnect's control replies wait no longer */

	/* The vocabulary memfd, read-only. */
	const uint8_t		*vocab;		/* (vocab_len,) */
	size_t			vocab_len;
	uint32_t		n_tokens;
	const uint32_t		*tok_off;	/* (n_tokens + 1,) into tok_bytes */
	const uint8_t		*tok_bytes;	/* (tok_bytes_len,) */
	uint64_t		tok_bytes_len;
	const uint8_t		*tok_flags;	/* (n_tokens,) KVD_TOKF_* */
	void			**old_vocab;	/* (n_old_vocab,) mappings a reconnect replaced */
	size_t			*old_vocab_len;
	size_t			n_old_vocab;

	/* The shared region, read-write. */
	uint8_t			*region;	/* (region_len,) */
	size_t			region_len;
	struct kvd_session_open_rep layout;	/* of the first open: a reopen must match it */
	int			region_live;	/* the daemon holds the other side (not after a
						 * reconnect that could reopen no session) */
	struct kvd_ring_hdr	*sq, *cq;
	struct kvd_sqe		*sqes;		/* (sq_mask + 1,) */
	struct kvd_cqe		*cqes;		/* (cq_mask + 1,) */
	uint32_t		sq_mask, cq_mask; /* from the reply, not the writable headers */
	uint32_t		sq_tail;	/* ours; the header's copy is only published */
	uint32_t		cq_head;	/* atomic: the fast path reads it unlocked */
	uint8_t			*arena;		/* (arena_len,) */
	uint32_t		arena_len;
	uint32_t		arena_used;

	/*
	 * What a restart needs. lock guards the SQ, the in-flight table, the
	 * pending CQEs and the CQ's consumer side, so a reconnect run from
	 * either the submitting or the consuming thread excludes the other.
	 */
	pthread_mutex_t		lock;
	struct kvc_sess		sess[KVC_MAX_SESSIONS];
	struct kvc_flight	*fl;		/* (fl_mask + 1,) ring, oldest at fl_head */
	uint32_t		fl_mask, fl_head, fl_tail;
	struct kvd_cqe		*pend;		/* (pend_cap,) CQEs a reconnect made, taken first */
	uint32_t		pend_cap, pend_head, pend_tail; /* pend_tail atomic, as cq_head */
	int			reconnect_ms;	/* 0: a hang-up is -ECONNRESET */
	int			gone;		/* a reconnect failed: the calls stop retrying */
	uint32_t		gen;		/* reconnects done, so racing callers run one */
	uint64_t		next_look;	/* ns: kvc_peek()'s next look at the socket */
};

/* [off, off + len) lies inside [0, size), without overflow. */
static inline int kvc__in_bounds(uint64_t off, uint64_t len, uint64_t size)
{
	return off <= size && len <= size - off;
}

void kvc__close_fds(int *fds, int n);

/* mmap fd's first len bytes after checking the file holds them; NULL and *err on failure. */
void *kvc__map_fd(int fd, size_t len, int prot, int *err);

/* Put fd in place of *slot, keeping the number callers may poll; takes fd. */
void kvc__install_fd(int *slot, int fd);

/*
 * Map the vocabulary memfd of length len (kvvocab.c). A reconnect's goes
 * over the old one when the sizes agree (the same model: pointers into it
 * stay valid), else beside it, the old one kept until kvc_close().
 */
int kvc__map_vocab(struct kvc_conn *c, int fd, size_t len);

/* Free the arena reservations made since kvc_arena_alloc(c, 0, &mark) gave mark. */
void kvc__arena_release(struct kvc_conn *c, uint32_t mark);

/*
 * Wake every kvc_wait() of c: a reconnect, in whichever thread, has posted
 * CQEs that no doorbell announces, or given up. A waiter that had looked
 * at the CQ just before would otherwise sleep out its timeout.
 */
void kvc__wake(struct kvc_conn *c);

/* CLOCK_MONOTONIC in ns. */
uint64_t kvc__now_ns(void);

/*
 * One control round trip: send req (its header is filled here), receive the
 * reply into rep (rep_len bytes; longer replies from a newer daemon are
 * cut, successful ones shorter than min_len refused, the rest of rep
 * zeroed) and any fds passed with it into fds (*n_fds; the caller owns
 * them). On failure no fd stays open.
 */
int kvc__rpc(struct kvc_conn *c, void *req, uint16_t type, uint32_t req_len, void *rep,
	     uint32_t min_len, uint32_t rep_len, int *fds, int *n_fds);

/* SESSION_CLOSE of session_id, nothing else: 0 or -errno. */
int kvc__close_rpc(struct kvc_conn *c, uint32_t session_id);

/* The least a SESSION_OPEN reply holds: the token only comes with KVD_FEAT_RESUME. */
uint32_t kvc__open_rep_len(const struct kvc_conn *c);

/*
 * Connect a new socket to c->addr and put it in c->sock's place (the number
 * stays, for callers that poll it), then say HELLO. 0 or -errno.
 */
int kvc__dial(struct kvc_conn *c);

/*
 * With c->lock held: the SESSION_OPEN reply rep and its fds (taken). On the
 * connection's first open, map the region; over the one a lost connection
 * left when the layout is the same (kvc_arena() pointers stay valid), else
 * in its place, which must_match refuses (-EPROTO). 0 or -errno; the
 * session itself is left to the caller.
 */
int kvc__opened(struct kvc_conn *c, const struct kvd_session_open_rep *rep, int *fds, int n_fds,
		int must_match);

/* Ring the kick doorbell: 0, or -EPIPE when the daemon's end is gone. */
int kvc__kick(struct kvc_conn *c);

/* Whether the socket says the daemon hung up. */
int kvc__hung_up(struct kvc_conn *c);

/*
 * With c->lock held: publish sqe on the SQ and record it in flight. 0,
 * -EAGAIN (SQ full), -ENOTCONN (no live region), -ENOMEM.
 */
int kvc__push(struct kvc_conn *c, const struct kvd_sqe *sqe);

/* With c->lock held: take the CQ's next CQE, ending its request in flight if final. 0 or -EAGAIN. */
int kvc__ring_take(struct kvc_conn *c, struct kvd_cqe *out);

/* With c->lock held: the in-flight table (kvresume.c). add: 0 or -ENOMEM. */
int kvc__flight_add(struct kvc_conn *c, const struct kvd_sqe *sqe);
void kvc__flight_done(struct kvc_conn *c, const struct kvd_cqe *e);

/* With c->lock held: the next CQE a reconnect made, 0 or -EAGAIN. */
int kvc__pend_take(struct kvc_conn *c, struct kvd_cqe *out);

/* The session table: its live entry for id or NULL; record an open (token when the reply has none). */
struct kvc_sess *kvc__sess(struct kvc_conn *c, uint32_t id);
void kvc__sess_record(struct kvc_conn *c, const struct kvd_session_open_rep *rep,
		      const uint64_t token[2]);
void kvc__sess_forget(struct kvc_conn *c, uint32_t id);

/*
 * With c->lock held: the daemon went (a hang-up). Reconnect, unless another
 * caller did since generation gen (0 then too). 0, -EINTR, or -ECONNRESET
 * when reconnecting is off or failed (the calls then stop trying).
 */
int kvc__reconnect_locked(struct kvc_conn *c, uint32_t gen);

/* The same, taking the lock. */
int kvc__reconnect_gen(struct kvc_conn *c, uint32_t gen);

/*
 * With c->lock held, from kvc_submit(): the kick doorbell found the daemon
 * gone after sqe was published. Reconnect and send sqe again on the new
 * connection if it never ran: 0; else -EPIPE (sqe taken back).
 */
int kvc__submit_lost(struct kvc_conn *c, const struct kvd_sqe *sqe);

#endif
