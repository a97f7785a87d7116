/*
 * admit.c — requests in and completions out, on the engine thread: SQEs
 * copied out of the rings and checked, requests queued per sequence slot,
 * completions posted to the CQs (or held while a CQ is full), and the
 * release of what closed sessions and dead connections held.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/model/model.h"
#include "daemon/probes.h"
#include "daemon/engine/sampler.h"
#include "daemon/serve/server.h"
#include "daemon/tokenizer/tokenizer.h"
#include "shm/kvring.h"
#include "uapi/kvd_pins.h"

/* ---- completions ---- */

static int cq_push(struct conn *c, const struct kvd_cqe *cqe)
{
	/* Acquire pairs with the client's release of head: its slots are free to reuse. */
	uint32_t head = kvring_load_head(c->cq);
	if (c->cq_tail - head >= c->cq_entries)
		return -ENOSPC;
	c->cqes[c->cq_tail & (c->cq_entries - 1)] = *cqe;
	c->cq_tail++;
	/* Release pairs with the client's acquire of tail: the entry (and tokens) are visible. */
	kvring_publish(c->cq, c->cq_tail);
	c->posted = 1;
	return 0;
}

void admit_post_cqe(struct conn *c, const struct kvd_cqe *cqe)
{
	if (c->dead || !c->region)
		return;
	if (!c->ovf_head && !cq_push(c, cqe))
		return;
	/* A full CQ loses nothing: completions wait here in order, like io_uring's overflow list. */
	struct cqe_node *n = malloc(sizeof(*n));
	if (!n) {
		log_msg(LOG_ERR, "out of memory holding a completion for pid %d", (int)c->pid);
		return;
	}
	n->next = NULL;
	n->cqe = *cqe;
	if (c->ovf_tail)
		c->ovf_tail->next = n;
	else
		c->ovf_head = n;
	c->ovf_tail = n;
	c->n_ovf++;
	__atomic_store_n(&c->cq->overflow, c->n_ovf, __ATOMIC_RELAXED);
	__atomic_fetch_or(&c->cq->flags, KVD_RING_CQ_OVERFLOW, __ATOMIC_RELEASE);
}

void admit_flush_overflow(struct conn *c)
{
	while (c->ovf_head && !cq_push(c, &c->ovf_head->cqe)) {
		struct cqe_node *n = c->ovf_head;
		c->ovf_head = n->next;
		if (!c->ovf_head)
			c->ovf_tail = NULL;
		free(n);
		c->n_ovf--;
	}
	if (c->region) {
		__atomic_store_n(&c->cq->overflow, c->n_ovf, __ATOMIC_RELAXED);
		if (!c->n_ovf)
			__atomic_fetch_and(&c->cq->flags, ~KVD_RING_CQ_OVERFLOW, __ATOMIC_RELEASE);
	}
}

void admit_post(struct conn *c, uint64_t user_data, int32_t res, uint32_t flags, uint32_t token,
		 uint32_t n_out, uint32_t slot)
{
	struct kvd_cqe cqe = { .user_data = user_data, .res = res, .flags = flags,
			       .token = token, .n_out = n_out, .slot = slot };
	admit_post_cqe(c, &cqe);
}

void admit_kick_reaper(struct server *srv)
{
	uint64_t one = 1;
	if (write(srv->reap_fd, &one, sizeof(one)) < 0)
		log_msg(LOG_WARNING, "reap eventfd: write failed");
}

/* ---- slots and requests ---- */

void admit_slot_reset(struct server *srv, struct slot *sl)
{
	if (sl->live)
		engine_seq_release(srv->eng, &sl->seq);
	sl->live = 0;
	sl->has_logits = 0;
	sl->has_pending = 0;
	free(sl->resume);
	sl->resume = NULL;
	sl->n_resume = 0;
}

void admit_req_free(struct request *r)
{
	sampler_destroy(r->smp);
	free(r->prompt);
	free(r);
}

/* Pop r (the head of its slot) and post its final completion. */
void admit_finish(struct server *srv, struct request *r, int32_t res, uint32_t flags)
{
	struct slot *sl = &r->s->slots[r->slot];
	sl->head = r->next;
	if (!sl->head)
		sl->tail = NULL;
	KVD_PROBE(finish, r->id, r->c->uid, res, flags, r->n_out);
	admit_post(r->c, r->sqe.user_data, res, flags, r->last, r->n_out, r->slot);
	r->c->inflight--;
	r->c->use->inflight--;
	srv->n_requests++;
	admit_req_free(r);
}

void admit_close_sessions(struct server *srv, struct conn *c)
{
	for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++) {
		struct session *s = c->sessions[i];
		if (!s || !s->closing)
			continue;
		admit_session_release(srv, c, s, 1);
		c->sessions[i] = NULL;
		c->n_sessions--;
		c->use->sessions--;
		srv->n_sessions--;
		free(s->slots);
		free(s);
	}
}

/* Cancel every request of a session and give back its sequences; notify: post completions. */
void admit_session_release(struct server *srv, struct conn *c, struct session *s, int notify)
{
	for (uint32_t i = 0; i < srv->cfg.max_slots; i++) {
		struct slot *sl = &s->slots[i];
		while (sl->head) {
			struct request *r = sl->head;
			if (notify) {
				admit_finish(srv, r, (int32_t)r->n_out, KVD_CQE_CANCELLED);
			} else {
				KVD_PROBE(drop, r->id, c->uid);
				sl->head = r->next;
				c->inflight--;
				c->use->inflight--;
				admit_req_free(r);
			}
		}
		sl->tail = NULL;
		admit_slot_reset(srv, sl);
		free(sl->logits);
		sl->logits = NULL;
	}
}

void admit_conn_release(struct server *srv, struct conn *c)
{
	for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++)
		if (c->sessions[i])
			admit_session_release(srv, c, c->sessions[i], 0);
	c->released = 1;
	admit_kick_reaper(srv);
}

/* ---- admission: one SQE, copied out of shared memory, checked, queued ---- */

static int range_ok(const struct conn *c, uint32_t off, uint64_t bytes, uint32_t align)
{
	return off % align == 0 && (uint64_t)off + bytes <= c->arena_bytes;
}

static struct session *sqe_session(struct conn *c, uint32_t id)
{
	if ((id & 0xff) >= SRV_MAX_SESSIONS)
		return NULL;
	struct session *s = c->sessions[id & 0xff];
	return s && s->id == id && !s->closing ? s : NULL;
}

/* Text prompts are tokenized here, once; TEXT|CHAT wraps them in the chat template. */
static int text_prompt(struct server *srv, struct conn *c, const struct kvd_sqe *q,
		       uint32_t **out, uint32_t *n)
{
	size_t len = q->n_tokens;
	char *text = malloc(len + 1);
	if (!text)
		return -ENOMEM;
	memcpy(text, c->arena + q->tokens_off, len);
	text[len] = 0;
	if (memchr(text, 0, len)) {
		free(text);
		return -EINVAL;
	}
	if (q->flags & KVD_SQE_CHAT) {
		int need;
		if (q->flags & KVD_SQE_APPEND)
			need = tokenizer_chat_next_turn(srv->tok, text, NULL, 0);
		else
			need = tokenizer_chat_format(srv->tok, &(struct chat_msg){ "user", text }, 1, 1,
						     NULL, 0);
		char *chat = need >= 0 ? malloc((size_t)need + 1) : NULL;
		if (!chat) {
			free(text);
			return need < 0 ? need : -ENOMEM;
		}
		if (q->flags & KVD_SQE_APPEND)
			tokenizer_chat_next_turn(srv->tok, text, chat, (size_t)need + 1);
		else
			tokenizer_chat_format(srv->tok, &(struct chat_msg){ "user", text }, 1, 1, chat,
					      (size_t)need + 1);
		free(text);
		text = chat;
		len = (size_t)need;
	}
	int add_bos = !(q->flags & KVD_SQE_APPEND) && tokenizer_add_bos(srv->tok);
	int cnt = tokenizer_encode(srv->tok, text, len, add_bos, 1, NULL, 0);
	uint32_t *ids = cnt > 0 ? malloc((size_t)cnt * sizeof(uint32_t)) : NULL;
	if (cnt <= 0 || !ids) {
		free(text);
		free(ids);
		return cnt < 0 ? cnt : cnt == 0 ? -EINVAL : -ENOMEM;
	}
	tokenizer_encode(srv->tok, text, len, add_bos, 1, ids, (size_t)cnt);
	free(text);
	*out = ids;
	*n = (uint32_t)cnt;
	return 0;
}

static int sampler_from_sqe(const struct kvd_sqe *q, uint32_t vocab, struct sampler **out)
{
	struct sampler_params p;
	sampler_params_default(&p);
	p.temperature = (float)q->temperature_milli / 1000.0f;
	p.top_k = q->top_k;
	p.top_p = q->top_p_e4 ? (float)q->top_p_e4 / 10000.0f : 1.0f;
	p.min_p = (float)q->min_p_e4 / 10000.0f;
	p.repeat_penalty = q->repeat_penalty_milli ? (float)q->repeat_penalty_milli / 1000.0f : 1.0f;
	p.repeat_last_n = q->repeat_last_n ? q->repeat_last_n : 64;
	p.seed = q->seed;
	return sampler_create(out, &p, vocab);
}

static void cancel(struct server *srv, struct conn *c, const struct kvd_sqe *q)
{
	for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++) {
		struct session *s = c->sessions[i];
		for (uint32_t k = 0; s && k < srv->cfg.max_slots; k++)
			for (struct request *r = s->slots[k].head; r; r = r->next)
				if (r->sqe.user_data == q->target_user_data && !r->cancelled) {
					r->cancelled = 1;
					KVD_PROBE(cancel, r->id, c->uid);
					admit_post(c, q->user_data, 0, 0, 0, 0, q->slot);
					return;
				}
	}
	admit_post(c, q->user_data, -ENOENT, 0, 0, 0, q->slot);
}

/* Returns 0 when q is queued (or handled), else -errno for its error completion. */
static int admit(struct server *srv, struct conn *c, const struct kvd_sqe *q)
{
	const uint32_t vocab = srv->m->hp.vocab;
	static const __u64 resv_zero[sizeof(q->resv) / sizeof(q->resv[0])];
	if (q->opcode >= KVD_OP_LAST || (q->flags & ~KVD_SQE_FLAGS_ALL) ||
	    q->priority > KVD_PRIO_BACKGROUND || memcmp(q->resv, resv_zero, sizeof(q->resv)))
		return -EINVAL;
	if (srv->stopping)
		return -ESHUTDOWN;
	if (q->opcode == KVD_OP_NOP)
		return 1;
	struct session *s = sqe_session(c, q->session_id);
	if (!s)
		return -ENOENT;
	if (q->slot >= srv->cfg.max_slots)
		return -ENOENT;
	if (q->opcode == KVD_OP_CANCEL) {
		cancel(srv, c, q);
		return 1;
	}
	if (q->target_user_data)
		return -EINVAL;
	int has_prompt = q->opcode == KVD_OP_PREFILL || q->opcode == KVD_OP_GENERATE;
	int has_out = q->opcode == KVD_OP_DECODE || q->opcode == KVD_OP_GENERATE;
	if ((!has_prompt && (q->tokens_off || q->n_tokens)) || (!has_out && (q->out_off || q->max_tokens)))
		return -EINVAL;
	if ((q->flags & KVD_SQE_CHAT) && !(q->flags & KVD_SQE_TEXT))
		return -EINVAL;
	if (q->top_p_e4 > 10000 || q->min_p_e4 > 10000)
		return -EINVAL;
	if (has_prompt && q->n_tokens == 0)
		return -EINVAL;
	if (has_prompt && !range_ok(c, q->tokens_off,
				    (q->flags & KVD_SQE_TEXT) ? q->n_tokens : 4ull * q->n_tokens,
				    (q->flags & KVD_SQE_TEXT) ? 1 : 4))
		return -EFAULT;
	if (has_out && (q->max_tokens == 0 || !range_ok(c, q->out_off, 4ull * q->max_tokens, 4)))
		return q->max_tokens ? -EFAULT : -EINVAL;
	if (c->inflight >= srv->cfg.max_inflight || c->use->inflight >= srv->cfg.max_uid_inflight)
		return -EBUSY;

	struct request *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->sqe = *q;
	r->c = c;
	r->s = s;
	r->slot = q->slot;
	r->max_out = has_out ? q->max_tokens : 0;
	r->want_row = -1;
	int rc = 0;
	if (has_prompt && (q->flags & KVD_SQE_TEXT)) {
		rc = text_prompt(srv, c, q, &r->prompt, &r->n_prompt);
	} else if (has_prompt) {
		/* The ids are read from the arena once, here, and checked. */
		r->prompt = malloc((size_t)q->n_tokens * sizeof(uint32_t));
		if (!r->prompt)
			rc = -ENOMEM;
		else
			memcpy(r->prompt, c->arena + q->tokens_off, (size_t)q->n_tokens * 4);
		r->n_prompt = q->n_tokens;
		for (uint32_t i = 0; !rc && i < r->n_prompt; i++)
			if (r->prompt[i] >= vocab)
				rc = -ERANGE;
	}
	if (!rc && (uint64_t)r->n_prompt + r->max_out > srv->cfg.max_tokens)
		rc = -E2BIG;
	/* A request its uid's quota could never hold is refused now. */
	if (!rc && srv->cfg.kv_quota &&
	    ((uint64_t)r->n_prompt + r->max_out) / kvpool_config(srv->pool)->block_tokens + 1 >
		    srv->cfg.kv_quota)
		rc = -EDQUOT;
	/* A request the whole pool could never hold is refused now, not left waiting. */
	if (!rc && (uint64_t)r->n_prompt + r->max_out + kvpool_config(srv->pool)->block_tokens >
			   srv->pool_stats.blocks_total * kvpool_config(srv->pool)->block_tokens)
		rc = -ENOSPC;
	r->id = ++srv->next_req_id;
	if (!rc && has_out)
		rc = sampler_from_sqe(q, vocab, &r->smp);
	if (rc) {
		admit_req_free(r);
		return rc;
	}
	struct slot *sl = &s->slots[q->slot];
	if (sl->tail)
		sl->tail->next = r;
	else
		sl->head = r;
	sl->tail = r;
	c->inflight++;
	c->use->inflight++;
	KVD_PROBE(submit, r->id, q->session_id, c->uid, q->opcode, r->n_prompt, r->max_out);
	return 0;
}

void admit_drain_sq(struct server *srv, struct conn *c)
{
	/* Acquire pairs with the client's release of tail: the SQEs before it are written. */
	uint32_t tail = kvring_load_tail(c->sq);
	if (tail - c->sq_head > c->sq_entries) {
		/* A tail no producer could have written: skip to it, say so once. */
		admit_post(c, 0, -EINVAL, 0, 0, 0, 0);
		c->sq_head = tail;
		kvring_consume(c->sq, c->sq_head);
		return;
	}
	while (c->sq_head != tail) {
		struct kvd_sqe q;
		/* One copy out of shared memory; every check and use reads the copy. */
		memcpy(&q, &c->sqes[c->sq_head & (c->sq_entries - 1)], sizeof(q));
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
		c->sq_head++;
		int rc = admit(srv, c, &q);
		if (rc < 0)
			admit_post(c, q.user_data, rc, 0, 0, 0, q.slot);
		else if (rc > 0 && q.opcode == KVD_OP_NOP)
			admit_post(c, q.user_data, 0, 0, 0, 0, q.slot);
	}
	/* Release pairs with the client's acquire of head: those slots may be reused. */
	kvring_consume(c->sq, c->sq_head);
}
