/*
 * fuzz_ring.c — SQE validation and ring index handling against a hostile
 * client: between the daemon's reads, the client writes arbitrary bytes
 * anywhere in its whole shared region (ring headers, indices, masks, SQEs,
 * CQEs, arena). The target plays the engine thread's step boundary (drain
 * the SQ, flush held completions, post and finish completions, free closed
 * sessions) on a real in-process server, and checks its own counts after
 * every step.
 */
#include <stddef.h>
#include "tests/fuzz/harness.h"
#include "daemon/serve/admit.h"
#include "shm/kvring.h"

static void open_session(struct server *srv, struct conn *c, int client, uint32_t sq, uint32_t cq)
{
	struct kvd_session_open_req rq = {
		.hdr = { .magic = KVD_MAGIC, .type = KVD_MSG_SESSION_OPEN, .len = sizeof(rq) },
		.sq_entries = sq, .cq_entries = cq, .arena_bytes = 256,
	};
	ctrl_handle_msg(srv, c, &rq, sizeof(rq));
	fz_drain_replies(client, NULL);
}

static void close_session(struct server *srv, struct conn *c, int client, uint32_t id)
{
	struct kvd_session_close_req rq = {
		.hdr = { .magic = KVD_MAGIC, .type = KVD_MSG_SESSION_CLOSE, .len = sizeof(rq) },
		.session_id = id,
	};
	ctrl_handle_msg(srv, c, &rq, sizeof(rq));
	fz_drain_replies(client, NULL);
}

/* The n-th open session's id (wrapping), or a made-up one when none is open. */
static uint32_t pick_session(const struct conn *c, uint32_t n)
{
	uint32_t want = c->n_sessions ? n % c->n_sessions : 0;
	for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++)
		if (c->sessions[i] && !want--)
			return c->sessions[i]->id;
	return n;
}

/* The counts the daemon keeps must match what it holds. */
static void check(const struct server *srv, const struct conn *c)
{
	uint32_t reqs = 0, ovf = 0;
	struct slot *sl;
	conn_for_each_slot((struct conn *)c, it, sl)
		for (struct request *r = sl->head; r; r = r->next)
			reqs++;
	for (const struct cqe_node *n = c->rg.ovf_head; n; n = n->next)
		ovf++;
	if (reqs != c->inflight || reqs != c->use->inflight)
		fz_die("in-flight count", "differs from the requests queued");
	if (ovf != c->rg.n_ovf)
		fz_die("overflow count", "differs from the completions held");
	if (c->inflight > srv->cfg.max_inflight)
		fz_die("in-flight count", "above the limit");
	if (c->rg.n_ovf > c->rg.cq_entries + c->rg.sq_entries + (uint32_t)srv->cfg.max_inflight * 2)
		fz_die("overflow list", "grows without bound");
}

/* Engine-thread stand-in: post a streamed token or finish each slot's head request. */
static void complete_some(struct server *srv, struct conn *c, uint32_t bits)
{
	struct slot *sl;
	conn_for_each_slot(c, it, sl) {
		struct request *r = sl->head;
		int post = bits & 1;
		bits >>= 1;
		if (!r)
			continue;
		if (post) {
			r->n_out++;
			release_post(c, r->sqe.user_data, (int32_t)r->n_out, KVD_CQE_MORE, 1, r->n_out,
				     r->sqe.slot, 0);
		} else {
			release_request(srv, r, (int32_t)r->n_out, KVD_CQE_LENGTH);
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct server *srv = fz_server();
	struct fz_in in = { data, size };
	int client;
	struct conn *c = fz_conn_new(srv, &client);
	uint32_t sizes = fz_take(&in, 1);
	open_session(srv, c, client, 1u << (sizes & 3), 1u << ((sizes >> 2) & 3));
	for (int ops = 0; in.left && ops < 4096; ops++) {
		uint32_t op = fz_take(&in, 1);
		if (!region_live(&c->rg) && op % 7 != 6)
			continue;
		switch (op % 7) {
		case 0: {	/* raw bytes anywhere in the region */
			size_t off = fz_take(&in, 2) % c->rg.bytes;
			size_t n = fz_take(&in, 1);
			n = n < in.left ? n : in.left;
			n = n < c->rg.bytes - off ? n : c->rg.bytes - off;
			memcpy(c->rg.base + off, in.p, n);
			in.p += n;
			in.left -= n;
			break;
		}
		case 1: {	/* an SQE of raw bytes at the client's tail */
			struct kvd_sqe q;
			memset(&q, 0, sizeof(q));
			/* resv stays zero, or nearly every SQE would stop at its check;
			 * raw writes into the SQ (case 0) still reach it. */
			const size_t body = offsetof(struct kvd_sqe, resv);
			size_t n = body < in.left ? body : in.left;
			memcpy(&q, in.p, n);
			in.p += n;
			in.left -= n;
			/* The top bit of priority asks for a live session id (raw writes cover the rest). */
			if (q.priority & 0x80) {
				q.priority &= 0x7f;
				q.session_id = pick_session(c, q.session_id);
			}
			uint32_t tail = __atomic_load_n(&c->rg.sq->tail, __ATOMIC_RELAXED);
			c->rg.sqes[tail & (c->rg.sq_entries - 1)] = q;
			kvring_publish(c->rg.sq, tail + 1);
			break;
		}
		case 2:		/* the engine thread's step boundary */
			pthread_mutex_lock(&srv->lock);
			release_closed_sessions(srv, c);
			region_flush_overflow(&c->rg);
			if (!region_backpressured(&c->rg))
				admit_drain_sq(srv, c);
			pthread_mutex_unlock(&srv->lock);
			break;
		case 3:
			pthread_mutex_lock(&srv->lock);
			complete_some(srv, c, fz_take(&in, 4));
			pthread_mutex_unlock(&srv->lock);
			break;
		case 4:		/* a well-behaved reader empties its CQ */
			kvring_consume(c->rg.cq, kvring_load_tail(c->rg.cq));
			break;
		case 5:
			close_session(srv, c, client, pick_session(c, fz_take(&in, 1)));
			break;
		case 6:
			open_session(srv, c, client, 0, 0);
			break;
		}
		check(srv, c);
	}
	pthread_mutex_lock(&srv->lock);
	release_closed_sessions(srv, c);
	pthread_mutex_unlock(&srv->lock);
	fz_conn_free(srv, c, client);
	return 0;
}
