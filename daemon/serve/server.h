/* server.h — kvd as a service: connections, sessions, requests, and the two threads that share them. */
#ifndef KVD_SERVER_H
#define KVD_SERVER_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include "uapi/kvd.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/kvpool.h"
#include "daemon/serve/loop.h"
#include "daemon/serve/server_config.h"

struct model;
struct tokenizer;
struct backend;
struct sampler;

#define SRV_RXBUF 1024		/* a control message is smaller */


enum req_phase { REQ_QUEUED, REQ_PREFILL, REQ_DECODE };

struct conn;
struct session;

/* One admitted SQE, copied out of shared memory and validated. */
struct request {
	struct request *next;		/* in its slot's queue */
	struct kvd_sqe sqe;		/* the copy every decision is made from */
	struct conn *c;
	struct session *s;
	uint32_t slot;
	enum req_phase phase;
	uint32_t *prompt;		/* (n_prompt,) to feed, pending token first */
	uint32_t n_prompt;
	uint32_t n_fed;			/* prompt tokens computed so far */
	uint32_t n_out;			/* tokens produced */
	uint32_t last;			/* the newest of them */
	uint32_t max_out;
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
	uint32_t *resume;		/* (n_resume,) tokens of a preempted idle sequence */
	uint32_t n_resume;
};

struct session {
	uint32_t id;
	int closing;			/* SESSION_CLOSE seen: the engine thread frees it */
	struct slot *slots;		/* (max_slots,) */
};

/* What one uid holds across its connections, for the per-uid limits. */
struct uid_usage {
	uid_t uid;
	uint32_t sessions;
	uint32_t inflight;
	uint64_t arena;
};

struct cqe_node {
	struct cqe_node *next;
	struct kvd_cqe cqe;
};

struct conn {
	struct server *srv;
	struct uid_usage *use;		/* its uid's totals */
	struct conn *next;
	int fd;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	struct loop_op recv_op;
	struct loop_op kick_op;
	struct msghdr msg;
	struct iovec iov;
	uint8_t rx[SRV_RXBUF];
	union {
		char buf[256];
		struct cmsghdr align;
	} cmsg;
	/* The shared region, once the first session is open. */
	int memfd;
	int kick_fd;
	int call_fd;
	uint8_t *region;
	size_t region_bytes;
	struct kvd_ring_hdr *sq;
	struct kvd_ring_hdr *cq;
	struct kvd_sqe *sqes;
	struct kvd_cqe *cqes;
	uint8_t *arena;
	uint32_t arena_bytes;
	uint32_t sq_entries;
	uint32_t cq_entries;
	uint32_t sq_head;		/* the daemon's head, published to sq->head */
	uint32_t cq_tail;		/* the daemon's tail, published to cq->tail */
	struct cqe_node *ovf_head, *ovf_tail;	/* completions the CQ had no room for */
	uint32_t n_ovf;
	int posted;			/* CQEs posted this step */
	struct session *sessions[SRV_MAX_SESSIONS];
	uint32_t n_sessions;
	uint32_t next_session;
	uint32_t inflight;		/* requests admitted and not completed */
	uint32_t step_rows;		/* prefill rows it got in the step being built */
	int dead;			/* hung up: the engine thread releases everything */
	int released;			/* ... and has: the loop thread frees it */
	int closing_ops;		/* loop ops being cancelled */
};

struct server {
	struct server_config cfg;
	struct model *m;
	struct tokenizer *tok;
	struct backend *be;
	struct kvpool *pool;
	struct engine *eng;
	struct loop *loop;
	int listen_fd;
	int signal_fd;
	int reap_fd;			/* engine -> loop: a connection is released */
	struct loop_op accept_op;
	struct loop_op signal_op;
	struct loop_op reap_op;
	struct loop_op watchdog_op;	/* pings systemd's watchdog from the loop */
	unsigned watchdog_ms;		/* its period; 0: no watchdog */
	int activated;			/* the socket came from systemd: not ours to unlink */
	char socket_name[108];		/* the path it listens on, for messages */
	struct loop_op accept_retry_op;	/* out of fds, spare included: accept again later */
	uint8_t sigbuf[128];
	uint64_t reap_val;
	int vocab_fd;
	uint32_t vocab_bytes;
	int spare_fd;			/* /dev/null, given up to refuse a client when out of fds */

	pthread_mutex_t lock;		/* guards everything below and the conns */
	pthread_cond_t work;		/* engine thread sleeps here when idle */
	pthread_t engine_thread;
	struct conn *conns;
	int stopping;			/* SIGTERM/SIGINT: drain, then exit */
	int engine_exited;
	uint64_t drain_deadline_ns;
	/* counters for STATS; pool figures copied by the engine thread after each step */
	uint64_t n_requests;
	uint64_t n_prefilled;
	uint64_t n_generated;
	struct kvpool_stats pool_stats;
	uint32_t n_conns;
	uint32_t n_sessions;
	uint64_t n_steps;
	uint64_t n_preemptions;
	uint64_t next_req_id;
	struct uid_usage *uids;		/* (n_uids,) */
	uint32_t n_uids;
	/* engine thread only */
	float *logits;			/* (logits_rows, vocab) of the current step */
	uint32_t logits_rows;
	struct engine_row *rows;	/* (max_batch_rows,) */
	struct request **row_req;	/* (max_batch_rows,) the request each row serves */
	struct cand *cands;		/* (cand_cap,) runnable requests of this step */
	uint32_t cand_cap;
};

/* server.c: the control plane, on the loop thread. */
int server_create(struct server **out, const struct server_config *cfg, struct model *m,
		  struct tokenizer *tok, struct backend *be, struct kvpool *pool);
int server_run(struct server *srv);	/* until SIGTERM/SIGINT; 0 on a clean drain */
void server_destroy(struct server *srv);
/* The usage record of uid (created on first use), or NULL when out of memory; lock held. */
struct uid_usage *server_uid(struct server *srv, uid_t uid);
/* Free everything of a connection the engine thread has released (loop thread). */
void server_conn_free(struct server *srv, struct conn *c);
/* Parse, act on and answer one control message of c (len <= SRV_RXBUF), as on_recv does. */
void server_handle_msg(struct server *srv, struct conn *c, const void *msg, size_t len);

/* admit.c: requests in, completions out, on the engine thread; lock held. */
void admit_drain_sq(struct server *srv, struct conn *c);
void admit_post(struct conn *c, uint64_t user_data, int32_t res, uint32_t flags, uint32_t token,
		uint32_t n_out, uint32_t slot);
void admit_flush_overflow(struct conn *c);
/* Pop r (the head of its slot), post its final completion, free it. */
void admit_finish(struct server *srv, struct request *r, int32_t res, uint32_t flags);
void admit_req_free(struct request *r);
void admit_slot_reset(struct server *srv, struct slot *sl);
/* Cancel every request of a session and give back its sequences; notify: post completions. */
void admit_session_release(struct server *srv, struct conn *c, struct session *s, int notify);
/* At a step boundary: release c's sessions marked closing (completions posted) and free them. */
void admit_close_sessions(struct server *srv, struct conn *c);
/* Release a dead connection's sessions and tell the loop thread to free it. */
void admit_conn_release(struct server *srv, struct conn *c);

/* Post a completion to c (overflow list when the CQ is full). */
void admit_post_cqe(struct conn *c, const struct kvd_cqe *cqe);
/* Ask the loop thread to look for released connections. */
void admit_kick_reaper(struct server *srv);

/* sched.c: the engine thread's loop. */
void *sched_thread(void *arg);

#endif
