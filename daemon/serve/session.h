/*
 * session.h — what a client holds in the daemon: sessions of sequence slots,
 * each slot a queue of admitted requests over one engine sequence, and the
 * totals of each uid for the per-uid limits. Owned by the engine thread once
 * admitted; the loop thread only creates sessions and marks them closing.
 */
#ifndef KVD_SESSION_H
#define KVD_SESSION_H

#include <stdint.h>
#include <sys/types.h>
#include "uapi/kvd.h"
#include "daemon/engine/engine.h"

struct conn;
struct sampler;
struct session;
struct slot;

enum req_phase { REQ_QUEUED, REQ_PREFILL, REQ_DECODE };

/* One admitted SQE, copied out of shared memory and validated. */
struct request {
	struct request *next;		/* in its slot's queue */
	struct kvd_sqe sqe;		/* the copy every decision is made from */
	struct conn *c;
	struct session *s;
	struct slot *sl;		/* &s->slots[sqe.slot] */
	enum req_phase phase;
	uint32_t *prompt;		/* (n_prompt,) to feed, pending token first */
	uint32_t n_prompt;
	uint32_t n_fed;			/* prompt tokens computed so far */
	uint32_t n_out;			/* tokens produced */
	uint32_t last;			/* the newest of them */
	uint32_t max_out;
	uint32_t total;			/* positions of the sequence once the prompt is in */
	uint32_t progress;		/* res of the last KVD_CQE_PROGRESS posted */
	uint32_t aux;			/* the final CQE's aux: for -E2BIG, positions needed */
	uint32_t cached;		/* PREFILL/GENERATE: positions the prefix cache supplied */
	struct sampler *smp;
	int cancelled;
	int want_row;			/* index of its logits row in this step, or -1 */
	int reattach;			/* preempted: look up its prefix before it runs */
	uint64_t id;			/* admission order, for FCFS and "newest" */
};

/* A sequence slot of a session: its KV blocks and where decoding stands. */
struct slot {
	struct engine_seq seq;
	int live;			/* seq initialised */
	float *logits;			/* (vocab,) of the last computed position */
	int has_logits;
	uint32_t pending;		/* sampled but not yet in the cache */
	int has_pending;
	struct request *head, *tail;	/* its requests, in order */
	uint32_t *resume;		/* (n_resume,) tokens of a preempted or restored sequence */
	uint32_t n_resume;
	int resume_logits;		/* the last of them had its logits: a DECODE may follow */
	int lost;			/* restored without its KV: APPEND and DECODE complete -ESTALE */
	uint32_t rec1;			/* its record in the kept state, plus one; 0: none */
	struct kvd_cqe last;		/* its last request's final CQE, replayed on resume */
	int has_last;
};

struct session {
	uint32_t id;			/* table index in the low 8 bits, a generation above */
	int closing;			/* SESSION_CLOSE seen: the engine thread frees it */
	uint32_t n_slots;		/* fixed when it opened, whatever SIGHUP changes later */
	struct slot *slots;		/* (n_slots,) */
	/* Surviving a restart (persist.h); token all zero: not kept. */
	uint64_t token[2];
	uid_t uid;
	uint64_t lost_mask;		/* slots whose state the kept state had no room for */
	struct session *next_orphan;	/* restored, waiting for its token: srv->orphans */
	uint64_t orphan_deadline_ns;	/* ... until then */
};

/*
 * What one uid holds across its connections, for the per-uid limits. One
 * record per uid with connections: it goes with the last of them.
 */
struct uid_usage {
	struct uid_usage *next;
	uid_t uid;
	uint32_t conns;
	uint32_t sessions;
	uint32_t inflight;
	uint64_t arena;
};

/* A session with n_slots empty slots, or NULL when out of memory. */
struct session *session_new(uint32_t n_slots);
/* Free s and its slots' buffers (its sequences must have been released). */
void session_free(struct session *s);

#endif
