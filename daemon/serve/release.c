/*
 * release.c — what requests, slots, sessions and dead connections hold,
 * given back on the engine thread under srv->lock: final completions
 * posted, sequences released, the loop thread told to free the rest.
 */
#include <stdlib.h>
#include "daemon/probes.h"
#include "daemon/engine/sampler.h"
#include "daemon/serve/persist.h"
#include "daemon/serve/server.h"

struct session *session_new(uint32_t n_slots)
{
	struct session *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->slots = calloc(n_slots, sizeof(struct slot));
	if (!s->slots) {
		free(s);
		return NULL;
	}
	s->n_slots = n_slots;
	return s;
}

void session_free(struct session *s)
{
	if (!s)
		return;
	for (uint32_t i = 0; i < s->n_slots; i++) {
		free(s->slots[i].logits);
		free(s->slots[i].resume);
	}
	free(s->slots);
	free(s);
}

void release_post(struct conn *c, uint64_t user_data, int32_t res, uint32_t flags, uint32_t token,
		  uint32_t n_out, uint32_t slot, uint32_t aux)
{
	struct kvd_cqe cqe = { .user_data = user_data, .res = res, .flags = flags,
			       .token = token, .n_out = n_out, .slot = slot, .aux = aux };
	region_post(&c->rg, &cqe);
}

void release_enqueue(struct request *r)
{
	struct slot *sl = r->sl;
	if (sl->tail)
		sl->tail->next = r;
	else
		sl->head = r;
	sl->tail = r;
	r->c->inflight++;
	r->c->use->inflight++;
}

void release_slot_reset(struct server *srv, struct slot *sl)
{
	if (sl->live)
		engine_seq_release(srv->eng, &sl->seq);
	sl->live = 0;
	sl->has_logits = 0;
	sl->has_pending = 0;
	free(sl->resume);
	sl->resume = NULL;
	sl->n_resume = 0;
	sl->resume_logits = 0;
	sl->lost = 0;	/* whatever was lost no longer matters */
}

void release_req_free(struct request *r)
{
	sampler_destroy(r->smp);
	free(r->prompt);
	free(r);
}

void release_request(struct server *srv, struct request *r, int32_t res, uint32_t flags)
{
	struct slot *sl = r->sl;
	sl->head = r->next;
	if (!sl->head)
		sl->tail = NULL;
	uint32_t aux = r->aux;
	/* KVD_FEAT_CACHED_COUNT: a prompt's reuse rides on its completion, never on an error's aux. */
	if (res >= 0 && r->cached) {
		flags |= KVD_CQE_PREFIX_HIT;
		aux = r->cached;
	}
	KVD_PROBE(finish, r->id, r->c->uid, res, flags, r->n_out);
	/*
	 * A request boundary: the slot's state and this CQE are kept before the
	 * client can see the CQE, so after a crash the client learns from the
	 * replayed CQE whether the request it saw no end of was applied.
	 */
	sl->last = (struct kvd_cqe){ .user_data = r->sqe.user_data, .res = res, .flags = flags,
				     .token = r->last, .n_out = r->n_out, .slot = r->sqe.slot, .aux = aux };
	sl->has_last = 1;
	persist_slot_save(srv->ps, r->s, r->sqe.slot);
	release_post(r->c, r->sqe.user_data, res, flags, r->last, r->n_out, r->sqe.slot, aux);
	r->c->inflight--;
	r->c->use->inflight--;
	srv->n_requests++;
	release_req_free(r);
}

void release_session(struct server *srv, struct conn *c, struct session *s, uint32_t cancel_flags)
{
	for (uint32_t i = 0; i < s->n_slots; i++) {
		struct slot *sl = &s->slots[i];
		while (sl->head) {
			struct request *r = sl->head;
			if (cancel_flags) {
				/* The client's own CANCEL came first: that is what ended it. */
				release_request(srv, r, (int32_t)r->n_out,
						r->cancelled ? KVD_CQE_CANCELLED : cancel_flags);
			} else {
				KVD_PROBE(drop, r->id, c->uid);
				sl->head = r->next;
				c->inflight--;
				c->use->inflight--;
				release_req_free(r);
			}
		}
		sl->tail = NULL;
		release_slot_reset(srv, sl);
		free(sl->logits);
		sl->logits = NULL;
	}
}

void release_closed_sessions(struct server *srv, struct conn *c)
{
	for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++) {
		struct session *s = c->sessions[i];
		if (!s || !s->closing)
			continue;
		release_session(srv, c, s, KVD_CQE_CANCELLED);
		persist_session_drop(srv->ps, s);
		c->sessions[i] = NULL;
		c->n_sessions--;
		c->use->sessions--;
		srv->n_sessions--;
		session_free(s);
	}
}

void release_conn(struct server *srv, struct conn *c)
{
	for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++)
		if (c->sessions[i]) {
			release_session(srv, c, c->sessions[i], 0);
			persist_session_drop(srv->ps, c->sessions[i]);	/* its client went: so does it */
		}
	c->released = 1;
	server_kick_reaper(srv);
}
