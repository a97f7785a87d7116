/*
 * server.h — kvd as a service: connections and the server that holds them,
 * shared by the loop thread (server.c, ctrl.c) and the engine thread
 * (admit.c, release.c, sched.c) under srv->lock.
 */
#ifndef KVD_SERVER_H
#define KVD_SERVER_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include "uapi/kvd.h"
#include "daemon/engine/engine.h"
#include "daemon/serve/loop.h"
#include "daemon/serve/region.h"
#include "daemon/serve/server_config.h"
#include "daemon/serve/session.h"

struct model;
struct tokenizer;
struct backend;

#define SRV_RXBUF 1024		/* a control message is smaller */

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
	struct region rg;		/* the shared region, once the first session is open */
	struct session *sessions[SRV_MAX_SESSIONS];
	uint32_t n_sessions;
	uint32_t next_session;
	uint32_t inflight;		/* requests admitted and not completed */
	uint32_t step_rows;		/* prefill rows it got in the step being built */
	int dead;			/* hung up: the engine thread releases everything */
	int released;			/* ... and has: the loop thread frees it */
	int closing_ops;		/* loop ops being cancelled */
	int vocab_sent;			/* its HELLO reply carried the vocabulary fd */
	uint32_t features;		/* KVD_FEAT_* its last HELLO was granted */
};

struct server {
	struct server_config cfg;
	struct model *m;
	struct tokenizer *tok;
	struct backend *be;
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
	uint32_t max_token_bytes;	/* the longest text one token stands for: bounds a text prompt */
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
	struct uid_usage *uids;		/* the uids with connections, a list of n_uids */
	uint32_t n_uids;
	/* KV that survives a restart (persist.h); ps NULL: off */
	struct persist *ps;
	struct session *orphans;	/* restored at start, not reopened yet */
	uint32_t restored_sessions, restored_blocks, restored_prefixes, resumed_sessions;
	int pool_check;			/* $KVD_POOL_CHECK: kvpool_check at idle points, logged */
};

/* c's open session of that id, or NULL (closing sessions are gone for their clients). */
static inline struct session *conn_session(struct conn *c, uint32_t id)
{
	if ((id & 0xff) >= SRV_MAX_SESSIONS)
		return NULL;
	struct session *s = c->sessions[id & 0xff];
	return s && s->id == id && !s->closing ? s : NULL;
}

/*
 * The one walk over conn -> session -> slot: every slot of every open
 * session of the connections that have not hung up, from first on (only
 * first's when one is set).
 */
struct slot_iter {
	struct conn *c;
	struct session *s;		/* the session of the slot just returned */
	uint32_t i, k;
	int one;
};

static inline struct slot *slot_iter_next(struct slot_iter *it)
{
	for (; it->c; it->c = it->one ? NULL : it->c->next, it->i = it->k = 0) {
		if (it->c->dead)
			continue;
		for (; it->i < SRV_MAX_SESSIONS; it->i++, it->k = 0) {
			struct session *s = it->c->sessions[it->i];
			if (s && it->k < s->n_slots) {
				it->s = s;
				return &s->slots[it->k++];
			}
		}
	}
	return NULL;
}

#define srv_for_each_slot(srv, it, sl) \
	for (struct slot_iter it = { (srv)->conns, NULL, 0, 0, 0 }; ((sl) = slot_iter_next(&it));)
#define conn_for_each_slot(conn, it, sl) \
	for (struct slot_iter it = { (conn), NULL, 0, 0, 1 }; ((sl) = slot_iter_next(&it));)

/* server.c: listen, accept, reap, signals, on the loop thread. */
int server_create(struct server **out, const struct server_config *cfg, struct model *m,
		  struct tokenizer *tok, struct backend *be, struct kvpool *pool, struct persist *ps);
int server_run(struct server *srv);	/* until SIGTERM/SIGINT; 0 on a clean drain */
void server_destroy(struct server *srv);
/*
 * Block SIGTERM, SIGINT and SIGHUP in the calling thread (and the threads
 * it starts after): the daemon takes them through a signalfd. *out (may be
 * NULL) gets that set.
 */
void server_block_signals(sigset_t *out);
/* Lock held: the usage record of uid, or NULL when it has no connection. */
struct uid_usage *server_uid(struct server *srv, uid_t uid);
/* Lock held: uid's record (made on its first connection) with one more connection; NULL: no memory. */
struct uid_usage *server_uid_get(struct server *srv, uid_t uid);
/* Lock held: one connection of u fewer; its record goes with the last. */
void server_uid_put(struct server *srv, struct uid_usage *u);
/* Free everything of a connection the engine thread has released (loop thread). */
void server_conn_free(struct server *srv, struct conn *c);
/* Ask the loop thread to look for released connections. */
void server_kick_reaper(struct server *srv);
/* Watch c's kick eventfd from the loop (its region is made); 0 or -errno. */
int server_watch_kick(struct server *srv, struct conn *c);

/* ctrl.c: the control protocol. */
/* The sealed vocabulary memfd clients detokenize with; 0 or -errno. */
int ctrl_build_vocab(struct server *srv);
/* Parse, act on and answer one control message of c (len <= SRV_RXBUF). */
void ctrl_handle_msg(struct server *srv, struct conn *c, const void *msg, size_t len);
/* An error reply to req (NULL: seq 0); the loop never blocks on it. */
void ctrl_reply_error(struct conn *c, const struct kvd_msg_hdr *req, int type, int status);

/* release.c: requests, slots, sessions and connections given back; lock held. */
/* Queue r (admitted) at the tail of its slot and count it in flight for its connection and uid. */
void release_enqueue(struct request *r);
/* Post a completion to c. */
void release_post(struct conn *c, uint64_t user_data, int32_t res, uint32_t flags, uint32_t token,
		  uint32_t n_out, uint32_t slot, uint32_t aux);
/* Pop r (the head of its slot), post its final completion (aux: r->aux), free it. */
void release_request(struct server *srv, struct request *r, int32_t res, uint32_t flags);
void release_req_free(struct request *r);
/* Give back a slot's sequence and forget where decoding stood. */
void release_slot_reset(struct server *srv, struct slot *sl);
/*
 * Cancel every request of a session and give back its sequences. Their
 * final completions get cancel_flags (KVD_CQE_CANCELLED, with
 * KVD_CQE_SHUTDOWN for the drain; a request a CANCEL ended gets
 * KVD_CQE_CANCELLED alone); cancel_flags 0: none are posted.
 */
void release_session(struct server *srv, struct conn *c, struct session *s, uint32_t cancel_flags);
/* At a step boundary: release c's sessions marked closing (completions posted) and free them. */
void release_closed_sessions(struct server *srv, struct conn *c);
/* Release a dead connection's sessions and tell the loop thread to free it. */
void release_conn(struct server *srv, struct conn *c);

#endif
