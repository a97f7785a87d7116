/*
 * sched.c — the data plane on the engine thread: SQEs copied out of the
 * rings and checked, requests queued per sequence slot, every step one
 * batch of decode rows and prefill chunks, completions posted to the CQs.
 * Everything but the forward pass itself runs under srv->lock.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/model.h"
#include "daemon/sampler.h"
#include "daemon/server.h"
#include "daemon/tokenizer.h"
#include "shm/kvring.h"

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

void sched_post(struct conn *c, const struct kvd_cqe *cqe)
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

static void flush_overflow(struct conn *c)
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

static void post(struct conn *c, uint64_t user_data, int32_t res, uint32_t flags, uint32_t token,
		 uint32_t n_out, uint32_t slot)
{
	struct kvd_cqe cqe = { .user_data = user_data, .res = res, .flags = flags,
			       .token = token, .n_out = n_out, .slot = slot };
	sched_post(c, &cqe);
}

void sched_kick_reaper(struct server *srv)
{
	uint64_t one = 1;
	if (write(srv->reap_fd, &one, sizeof(one)) < 0)
		log_msg(LOG_WARNING, "reap eventfd: write failed");
}

/* ---- slots and requests ---- */

static void slot_reset(struct server *srv, struct slot *sl)
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

static void req_free(struct request *r)
{
	sampler_destroy(r->smp);
	free(r->prompt);
	free(r);
}

/* Pop r (the head of its slot) and post its final completion. */
static void req_finish(struct server *srv, struct request *r, int32_t res, uint32_t flags)
{
	struct slot *sl = &r->s->slots[r->slot];
	sl->head = r->next;
	if (!sl->head)
		sl->tail = NULL;
	post(r->c, r->sqe.user_data, res, flags, r->last, r->n_out, r->slot);
	r->c->inflight--;
	r->c->use->inflight--;
	srv->n_requests++;
	req_free(r);
}

/* Cancel every request of a session and give back its sequences; notify: post completions. */
static void session_release(struct server *srv, struct conn *c, struct session *s, int notify)
{
	for (uint32_t i = 0; i < srv->cfg.max_slots; i++) {
		struct slot *sl = &s->slots[i];
		while (sl->head) {
			struct request *r = sl->head;
			if (notify) {
				req_finish(srv, r, (int32_t)r->n_out, KVD_CQE_CANCELLED);
			} else {
				sl->head = r->next;
				c->inflight--;
				c->use->inflight--;
				req_free(r);
			}
		}
		sl->tail = NULL;
		slot_reset(srv, sl);
		free(sl->logits);
		sl->logits = NULL;
	}
}

static void conn_release(struct server *srv, struct conn *c)
{
	for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++)
		if (c->sessions[i])
			session_release(srv, c, c->sessions[i], 0);
	c->released = 1;
	sched_kick_reaper(srv);
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
					post(c, q->user_data, 0, 0, 0, 0, q->slot);
					return;
				}
	}
	post(c, q->user_data, -ENOENT, 0, 0, 0, q->slot);
}

/* Returns 0 when q is queued (or handled), else -errno for its error completion. */
static int admit(struct server *srv, struct conn *c, const struct kvd_sqe *q)
{
	const uint32_t vocab = srv->m->hp.vocab;
	if (q->opcode >= KVD_OP_LAST || (q->flags & ~KVD_SQE_FLAGS_ALL) ||
	    q->priority > KVD_PRIO_BACKGROUND)
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
		req_free(r);
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
	return 0;
}

static void drain_sq(struct server *srv, struct conn *c)
{
	/* Acquire pairs with the client's release of tail: the SQEs before it are written. */
	uint32_t tail = kvring_load_tail(c->sq);
	if (tail - c->sq_head > c->sq_entries) {
		/* A tail no producer could have written: skip to it, say so once. */
		post(c, 0, -EINVAL, 0, 0, 0, 0);
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
			post(c, q.user_data, rc, 0, 0, 0, q.slot);
		else if (rc > 0 && q.opcode == KVD_OP_NOP)
			post(c, q.user_data, 0, 0, 0, 0, q.slot);
	}
	/* Release pairs with the client's acquire of head: those slots may be reused. */
	kvring_consume(c->sq, c->sq_head);
}

/* ---- the step ---- */

/* Sample one token for r from logits; post what it produces; 1 if r finished. */
static int emit(struct server *srv, struct request *r, float *logits)
{
	struct slot *sl = &r->s->slots[r->slot];
	const struct kvseq *kv = &sl->seq.kv;
	uint32_t tok = sampler_sample(r->smp, logits, kv->tokens, kv->n_tokens);
	((uint32_t *)(r->c->arena + r->sqe.out_off))[r->n_out++] = tok;
	r->last = tok;
	srv->n_generated++;
	sl->has_logits = 0;
	sl->pending = tok;
	sl->has_pending = 1;
	int eos = tokenizer_is_eog(srv->tok, tok) && !(r->sqe.flags & KVD_SQE_IGNORE_EOS);
	int full = r->n_out >= r->max_out || engine_seq_len(&sl->seq) + 1 >= srv->m->hp.ctx_len;
	if (r->sqe.flags & KVD_SQE_STREAM && !eos && !full)
		post(r->c, r->sqe.user_data, (int32_t)r->n_out, KVD_CQE_MORE, tok, r->n_out, r->slot);
	if (eos || full) {
		req_finish(srv, r, (int32_t)r->n_out, eos ? KVD_CQE_EOS : KVD_CQE_LENGTH);
		return 1;
	}
	return 0;
}

/* Move r out of QUEUED; returns 1 if it completed at once. */
static int start(struct server *srv, struct request *r)
{
	struct slot *sl = &r->s->slots[r->slot];
	const struct kvd_sqe *q = &r->sqe;
	if (q->opcode == KVD_OP_RESET) {
		slot_reset(srv, sl);
		req_finish(srv, r, 0, 0);
		return 1;
	}
	if (q->opcode == KVD_OP_DECODE) {
		if (!sl->has_logits && !sl->has_pending) {
			req_finish(srv, r, -EINVAL, 0);
			return 1;
		}
		if (!sl->n_resume) {
			r->phase = REQ_DECODE;
			return 0;
		}
		/* A preempted sequence is recomputed first, then decoding goes on. */
	}
	/* PREFILL / GENERATE, or a DECODE resuming a preempted sequence */
	if (q->opcode != KVD_OP_DECODE && !(q->flags & KVD_SQE_APPEND))
		slot_reset(srv, sl);
	if (!sl->live) {
		engine_seq_init(srv->eng, &sl->seq, srv->cfg.prefix_global ? 0 : r->c->uid + 1);
		sl->live = 1;
	}
	if (sl->has_pending || sl->n_resume) {
		/* What the cache lost to preemption, then the last sampled token, go in first. */
		size_t n = (size_t)sl->n_resume + (sl->has_pending ? 1 : 0) + r->n_prompt;
		uint32_t *p = malloc(n * sizeof(uint32_t));
		if (!p) {
			req_finish(srv, r, -ENOMEM, 0);
			return 1;
		}
		memcpy(p, sl->resume, (size_t)sl->n_resume * sizeof(uint32_t));
		if (sl->has_pending)
			p[sl->n_resume] = sl->pending;
		memcpy(p + n - r->n_prompt, r->prompt, (size_t)r->n_prompt * sizeof(uint32_t));
		free(r->prompt);
		free(sl->resume);
		sl->resume = NULL;
		sl->n_resume = 0;
		r->prompt = p;
		r->n_prompt = (uint32_t)n;
		sl->has_pending = 0;
	}
	sl->has_logits = 0;
	if ((uint64_t)engine_seq_len(&sl->seq) + r->n_prompt + r->max_out > srv->m->hp.ctx_len) {
		req_finish(srv, r, -E2BIG, 0);
		return 1;
	}
	if (engine_seq_len(&sl->seq) == 0 && !srv->cfg.no_prefix_cache) {
		int hit = engine_seq_attach_prefix(srv->eng, &sl->seq, r->prompt, r->n_prompt);
		r->n_fed = hit > 0 ? (uint32_t)hit : 0;
	}
	r->phase = REQ_PREFILL;
	return 0;
}

struct batch {
	uint32_t n;
	uint32_t n_logits;
};

/* A runnable request of this step. */
struct cand {
	struct request *r;
	struct slot *sl;
	int decode;		/* 1: one decode row; 0: a prefill chunk */
};

static void add_row(struct server *srv, struct batch *b, struct request *r, uint32_t tok, int want)
{
	struct slot *sl = &r->s->slots[r->slot];
	uint32_t pos = engine_seq_len(&sl->seq);
	/* Rows of one sequence are consecutive within a step. */
	if (b->n && srv->rows[b->n - 1].seq == &sl->seq)
		pos = srv->rows[b->n - 1].pos + 1;
	srv->rows[b->n] = (struct engine_row){ &sl->seq, pos, tok, (uint32_t)want };
	srv->row_req[b->n] = r;
	if (want)
		r->want_row = (int)b->n_logits++;
	b->n++;
}

/*
 * Give up victim's KV blocks; it is recomputed from its tokens when it runs
 * again (its full blocks stay cached, so that is mostly prefix hits).
 */
static int preempt(struct server *srv, struct slot *sl, struct request *r)
{
	const struct kvseq *kv = &sl->seq.kv;
	size_t extra = !r ? 0 : r->phase == REQ_PREFILL ? (size_t)(r->n_prompt - r->n_fed) : (size_t)(sl->has_pending != 0);
	uint32_t *p = malloc(((size_t)kv->n_tokens + extra + 1) * sizeof(uint32_t));
	if (!p)
		return -ENOMEM;
	size_t n = kv->n_tokens;
	memcpy(p, kv->tokens, n * sizeof(uint32_t));
	if (r && r->phase == REQ_PREFILL) {
		memcpy(p + n, r->prompt + r->n_fed, extra * sizeof(uint32_t));
		n += extra;
	} else if (r && sl->has_pending) {
		p[n++] = sl->pending;
	}
	uint32_t ns = kv->ns;
	engine_seq_release(srv->eng, &sl->seq);
	engine_seq_init(srv->eng, &sl->seq, ns);
	sl->has_logits = 0;
	srv->n_preemptions++;
	if (!r) {
		/* An idle sequence: its tokens wait for the slot's next request. */
		free(sl->resume);
		sl->resume = p;
		sl->n_resume = (uint32_t)n;
		return 0;
	}
	sl->has_pending = 0;
	free(r->prompt);
	r->prompt = p;
	r->n_prompt = (uint32_t)n;
	r->n_fed = 0;
	r->phase = REQ_PREFILL;
	/* Its cached blocks are looked up when it runs again, not now: that would take them back. */
	r->reattach = 1;
	return 0;
}

/* Lower is more deserving of keeping its blocks: interactive before background, older first. */
static int keep_rank_less(const struct request *a, const struct request *b)
{
	if (a->sqe.priority != b->sqe.priority)
		return a->sqe.priority < b->sqe.priority;
	return a->id < b->id;
}

/*
 * Find the sequence to preempt for r: an idle sequence holding blocks
 * first, else the newest request of the lowest class that ranks below r
 * and has no row in this step. Returns 1 if one was preempted.
 */
static int make_room(struct server *srv, struct request *r)
{
	struct slot *vs = NULL;
	struct request *vr = NULL;
	for (struct conn *c = srv->conns; c; c = c->next)
		for (uint32_t i = 0; !c->dead && i < SRV_MAX_SESSIONS; i++) {
			struct session *s = c->sessions[i];
			for (uint32_t k = 0; s && k < srv->cfg.max_slots; k++) {
				struct slot *sl = &s->slots[k];
				if (!sl->live || !sl->seq.kv.n_blocks || sl == &r->s->slots[r->slot])
					continue;
				struct request *h = sl->head;
				if (!h) {
					if (!vs || vr) {
						vs = sl;
						vr = NULL;
					}
					continue;
				}
				if (h->want_row >= 0 || h->phase == REQ_QUEUED || !keep_rank_less(r, h))
					continue;
				if (vs && !vr)
					continue;	/* an idle victim is cheaper */
				if (!vr || keep_rank_less(vr, h)) {
					vs = sl;
					vr = h;
				}
			}
		}
	if (!vs)
		return 0;
	return preempt(srv, vs, vr) == 0;
}

/* KV blocks the sequences of uid's connections hold (a shared block counts for each holder). */
static uint64_t uid_blocks(struct server *srv, uid_t uid)
{
	uint64_t n = 0;
	for (struct conn *c = srv->conns; c; c = c->next)
		for (uint32_t i = 0; c->uid == uid && !c->dead && i < SRV_MAX_SESSIONS; i++)
			for (uint32_t k = 0; c->sessions[i] && k < srv->cfg.max_slots; k++)
				n += c->sessions[i]->slots[k].seq.kv.n_blocks;
	return n;
}

/*
 * A uid over its KV quota gives up its own newest sequence first; 1 if r
 * may grow by need blocks now.
 */
static int within_quota(struct server *srv, struct request *r, uint32_t need)
{
	if (!srv->cfg.kv_quota)
		return 1;
	uid_t uid = r->c->uid;
	while (uid_blocks(srv, uid) + need > srv->cfg.kv_quota) {
		struct slot *vs = NULL;
		struct request *vr = NULL;
		for (struct conn *c = srv->conns; c; c = c->next)
			for (uint32_t i = 0; c->uid == uid && !c->dead && i < SRV_MAX_SESSIONS; i++)
				for (uint32_t k = 0; c->sessions[i] && k < srv->cfg.max_slots; k++) {
					struct slot *sl = &c->sessions[i]->slots[k];
					struct request *h = sl->head;
					if (sl == &r->s->slots[r->slot] || !sl->seq.kv.n_blocks ||
					    (h && (h->want_row >= 0 || h->phase == REQ_QUEUED)))
						continue;
					if (!vs || (h && vr && keep_rank_less(vr, h)) || (!h && vr)) {
						vs = sl;
						vr = h;
					}
				}
		if (!vs || (vr && keep_rank_less(vr, r)) || preempt(srv, vs, vr))
			return 0;	/* the quota makes r wait */
	}
	return 1;
}

/* Blocks for positions [len, len + n) of r's sequence, preempting others if the pool is full. */
static int reserve(struct server *srv, struct request *r, uint32_t n)
{
	struct slot *sl = &r->s->slots[r->slot];
	uint32_t len = engine_seq_len(&sl->seq);
	uint32_t bt = kvpool_config(srv->pool)->block_tokens;
	uint32_t have = sl->seq.kv.n_blocks, need = (len + n + bt - 1) / bt;
	if (need > have && !within_quota(srv, r, need - have))
		return -EDQUOT;
	for (;;) {
		int rc = kvseq_prepare(srv->pool, &sl->seq.kv, len, len + n);
		if (rc != -ENOSPC)
			return rc;
		if (!make_room(srv, r))
			return -ENOSPC;
	}
}

/* Interactive before background; within a class decodes before prefills; then by age. */
static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->r->sqe.priority != y->r->sqe.priority)
		return (int)x->r->sqe.priority - (int)y->r->sqe.priority;
	if (x->decode != y->decode)
		return y->decode - x->decode;
	return x->r->id < y->r->id ? -1 : x->r->id > y->r->id;
}

/* Start queued requests, sample where logits wait, and list what needs rows. */
static uint32_t collect(struct server *srv)
{
	uint32_t n = 0;
	for (struct conn *c = srv->conns; c; c = c->next) {
		if (c->dead || c->n_ovf >= c->cq_entries)
			continue;	/* back-pressure: its CQ is full */
		for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++) {
			struct session *s = c->sessions[i];
			for (uint32_t k = 0; s && !s->closing && k < srv->cfg.max_slots; k++) {
				struct slot *sl = &s->slots[k];
				struct request *r;
				while ((r = sl->head)) {
					if (r->cancelled) {
						req_finish(srv, r, (int32_t)r->n_out, KVD_CQE_CANCELLED);
						continue;
					}
					if (r->phase == REQ_QUEUED && start(srv, r))
						continue;
					if (r->phase == REQ_DECODE && sl->has_logits && emit(srv, r, sl->logits))
						continue;
					break;
				}
				if (!r || (r->phase == REQ_DECODE && !sl->has_pending))
					continue;
				if (n == srv->cand_cap) {
					uint32_t cap = n ? 2 * n : 64;
					struct cand *p = realloc(srv->cands, cap * sizeof(*p));
					if (!p)
						return n;
					srv->cands = p;
					srv->cand_cap = cap;
				}
				srv->cands[n++] = (struct cand){ r, sl, r->phase == REQ_DECODE };
			}
		}
	}
	return n;
}

/*
 * One step's rows, interactive requests before background ones: in each
 * class every decode, then prefill chunks from what the budget has left,
 * split evenly between the clients that have prompts waiting (so one
 * client's long prompts cannot starve another's) and first come, first
 * served within a client. A request that finds the pool full preempts a
 * lower-ranked one.
 */
static void build(struct server *srv, struct batch *b)
{
	uint32_t n = collect(srv), budget = srv->cfg.max_batch_rows;
	qsort(srv->cands, n, sizeof(*srv->cands), cand_cmp);
	/* Clients with prompts to prefill share the rows evenly; each client's own go FCFS. */
	uint32_t n_clients = 0;
	for (struct conn *c = srv->conns; c; c = c->next)
		c->step_rows = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct conn *c = srv->cands[i].r->c;
		if (!srv->cands[i].decode && !c->step_rows) {
			c->step_rows = 1;
			n_clients++;
		}
	}
	for (struct conn *c = srv->conns; c; c = c->next)
		c->step_rows = 0;
	for (uint32_t i = 0; i < n && budget; i++) {
		struct cand *cd = &srv->cands[i];
		struct request *r = cd->r;
		if (r->want_row >= 0 || r->s->closing)
			continue;
		if (cd->decode) {
			int rc = reserve(srv, r, 1);
			if (rc) {
				log_msg(LOG_DEBUG, "request %llu waits: %s", (unsigned long long)r->id, strerror(-rc));
				continue;	/* waits for blocks */
			}
			if (r->phase != REQ_DECODE || !cd->sl->has_pending)
				continue;	/* preempted meanwhile: recomputed later */
			/* Feed the last token; its logits give the next one. */
			uint32_t t = cd->sl->pending;
			cd->sl->has_pending = 0;
			add_row(srv, b, r, t, 1);
			budget--;
			continue;
		}
		if (r->phase != REQ_PREFILL)
			continue;
		if (r->reattach && !srv->cfg.no_prefix_cache) {
			int hit = engine_seq_attach_prefix(srv->eng, &cd->sl->seq, r->prompt, r->n_prompt);
			r->n_fed = hit > 0 ? (uint32_t)hit : 0;
		}
		r->reattach = 0;
		uint32_t bt = kvpool_config(srv->pool)->block_tokens;
		uint32_t share = srv->cfg.max_batch_rows / (n_clients ? n_clients : 1);
		share = share < bt ? bt : share;
		if (r->c->step_rows >= share)
			continue;
		share -= r->c->step_rows;
		share = share < budget ? share : budget;
		uint32_t left = r->n_prompt - r->n_fed;
		uint32_t take = left < share ? left : share;
		int rc = reserve(srv, r, take);
		if (rc == -ENOSPC) {
			struct kvpool_stats st;
			kvpool_get_stats(srv->pool, &st);
			if (st.blocks_in_use <= cd->sl->seq.kv.n_blocks) {
				req_finish(srv, r, -ENOSPC, 0);	/* alone and still too big */
				continue;
			}
		}
		if (rc || r->phase != REQ_PREFILL) {
			log_msg(LOG_DEBUG, "request %llu waits: %s", (unsigned long long)r->id, strerror(-rc));
			continue;
		}
		for (uint32_t j = 0; j < take; j++)
			add_row(srv, b, r, r->prompt[r->n_fed + j], r->n_fed + j + 1 == r->n_prompt);
		r->n_fed += take;
		r->c->step_rows += take;
		budget -= take;
		srv->n_prefilled += take;
	}
}

static int grow_logits(struct server *srv, uint32_t rows)
{
	if (rows <= srv->logits_rows)
		return 0;
	float *p = realloc(srv->logits, (size_t)rows * srv->m->hp.vocab * sizeof(float));
	if (!p)
		return -ENOMEM;
	srv->logits = p;
	srv->logits_rows = rows;
	return 0;
}

/* After the forward pass: logits to their slots, tokens sampled, prefills completed. */
static void finish_step(struct server *srv, const struct batch *b, int rc)
{
	const uint32_t vocab = srv->m->hp.vocab;
	for (uint32_t i = 0; i < b->n; i++) {
		/* A request's rows are consecutive and only its last may want logits. */
		int last = i + 1 == b->n || srv->row_req[i + 1] != srv->row_req[i];
		if (!last)
			continue;
		struct request *r = srv->row_req[i];
		int row = r->want_row;
		r->want_row = -1;
		if (rc) {
			req_finish(srv, r, rc, 0);
			continue;
		}
		if (row < 0)
			continue;	/* a prefill chunk that did not finish its prompt */
		struct slot *sl = &r->s->slots[r->slot];
		float *lg = srv->logits + (size_t)row * vocab;
		if (r->phase == REQ_DECODE) {
			emit(srv, r, lg);
			continue;
		}
		/* The prompt is in: keep its last logits for the first sample. */
		if (!sl->logits && !(sl->logits = malloc(vocab * sizeof(float)))) {
			req_finish(srv, r, -ENOMEM, 0);
			continue;
		}
		memcpy(sl->logits, lg, vocab * sizeof(float));
		sl->has_logits = 1;
		if (r->sqe.opcode == KVD_OP_PREFILL) {
			req_finish(srv, r, (int32_t)engine_seq_len(&sl->seq), 0);
		} else {
			r->phase = REQ_DECODE;
			emit(srv, r, sl->logits);
		}
	}
}

static int any_work(struct server *srv)
{
	for (struct conn *c = srv->conns; c; c = c->next) {
		if (c->released)
			continue;	/* the loop thread frees it */
		if (c->dead)
			return 1;	/* to release */
		for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++) {
			struct session *s = c->sessions[i];
			if (s && s->closing)
				return 1;
			for (uint32_t k = 0; s && k < srv->cfg.max_slots; k++)
				if (s->slots[k].head)
					return 1;
		}
		if (c->region && kvring_ready(c->sq, c->sq_head) && c->n_ovf < c->cq_entries)
			return 1;
		/* Held completions for a CQ with room again. */
		if (c->n_ovf && c->cq_tail - kvring_load_head(c->cq) < c->cq_entries)
			return 1;
	}
	return 0;
}

/* Completions held for a full CQ: the client may free room without a kick, so look again soon. */
static int any_overflow(struct server *srv)
{
	for (struct conn *c = srv->conns; c; c = c->next)
		if (!c->dead && c->n_ovf)
			return 1;
	return 0;
}

static int any_new_sqe(struct server *srv)
{
	for (struct conn *c = srv->conns; c; c = c->next)
		if (c->region && !c->dead && kvring_ready(c->sq, c->sq_head))
			return 1;
	return 0;
}

static void set_need_wakeup(struct server *srv, int on)
{
	for (struct conn *c = srv->conns; c; c = c->next) {
		if (!c->region || c->dead)
			continue;
		if (on)
			kvring_set_need_wakeup(c->sq);
		else
			kvring_clear_need_wakeup(c->sq);
	}
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Bookkeeping at a step boundary: hang-ups, closed sessions, new SQEs, overflow. */
static void housekeeping(struct server *srv)
{
	for (struct conn *c = srv->conns; c; c = c->next) {
		if (c->released)
			continue;
		if (c->dead) {
			conn_release(srv, c);
			continue;
		}
		for (uint32_t i = 0; i < SRV_MAX_SESSIONS; i++) {
			struct session *s = c->sessions[i];
			if (s && s->closing) {
				session_release(srv, c, s, 1);
				c->sessions[i] = NULL;
				c->n_sessions--;
				c->use->sessions--;
				srv->n_sessions--;
				free(s->slots);
				free(s);
			}
		}
		if (!c->region)
			continue;
		flush_overflow(c);
		/* Back-pressure: while its CQ overflows, a client's SQ waits in shared memory. */
		if (c->n_ovf < c->cq_entries)
			drain_sq(srv, c);
	}
}

static void cancel_everything(struct server *srv)
{
	for (struct conn *c = srv->conns; c; c = c->next)
		for (uint32_t i = 0; !c->dead && i < SRV_MAX_SESSIONS; i++)
			if (c->sessions[i])
				session_release(srv, c, c->sessions[i], 1);
}

static void wake_clients(struct server *srv)
{
	for (struct conn *c = srv->conns; c; c = c->next) {
		if (!c->posted || c->dead)
			continue;
		c->posted = 0;
		/* At most one eventfd write per step per connection, and only to a sleeper. */
		if (kvring_needs_wakeup(c->cq)) {
			uint64_t one = 1;
			if (write(c->call_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
				log_msg(LOG_WARNING, "call eventfd of pid %d: %s", (int)c->pid, strerror(errno));
		}
	}
}

void *sched_thread(void *arg)
{
	struct server *srv = arg;
	srv->rows = calloc(srv->cfg.max_batch_rows, sizeof(*srv->rows));
	srv->row_req = calloc(srv->cfg.max_batch_rows, sizeof(*srv->row_req));
	pthread_mutex_lock(&srv->lock);
	kvpool_get_stats(srv->pool, &srv->pool_stats);	/* admission reads the pool's size */
	if (!srv->rows || !srv->row_req) {
		log_msg(LOG_ERR, "engine thread: out of memory");
		srv->stopping = 1;
	}
	for (;;) {
		housekeeping(srv);
		struct batch b = { 0, 0 };
		if (srv->rows && srv->row_req)
			build(srv, &b);
		wake_clients(srv);
		kvpool_get_stats(srv->pool, &srv->pool_stats);
		if (srv->stopping && (!any_work(srv) || now_ns() >= srv->drain_deadline_ns || !srv->rows)) {
			cancel_everything(srv);
			wake_clients(srv);
			break;
		}
		if (b.n == 0) {
			/*
			 * Nothing could run: idle, or waiting for KV blocks. Ask for
			 * kicks, look once more, then sleep until a client or the
			 * loop thread signals; work that waits for blocks is looked
			 * at again after a short while in any case.
			 */
			int waiting = any_work(srv) || any_overflow(srv);
			set_need_wakeup(srv, 1);
			if (!waiting || !any_new_sqe(srv)) {
				if (srv->stopping || waiting) {
					struct timespec ts = { 0, 0 };
					clock_gettime(CLOCK_REALTIME, &ts);
					ts.tv_nsec += waiting ? 2000000 : 50000000;
					if (ts.tv_nsec >= 1000000000) {
						ts.tv_sec++;
						ts.tv_nsec -= 1000000000;
					}
					pthread_cond_timedwait(&srv->work, &srv->lock, &ts);
				} else if (!any_new_sqe(srv)) {
					pthread_cond_wait(&srv->work, &srv->lock);
				}
			}
			set_need_wakeup(srv, 0);
			continue;
		}
		int rc = grow_logits(srv, b.n_logits);
		srv->n_steps++;
		pthread_mutex_unlock(&srv->lock);
		if (!rc)
			rc = engine_forward(srv->eng, srv->rows, b.n, srv->logits);
		pthread_mutex_lock(&srv->lock);
		if (rc)
			log_msg(LOG_WARNING, "engine step of %u rows failed: %s", b.n, strerror(-rc));
		finish_step(srv, &b, rc);
	}
	srv->engine_exited = 1;
	pthread_mutex_unlock(&srv->lock);
	sched_kick_reaper(srv);
	free(srv->logits);
	free(srv->rows);
	free(srv->row_req);
	free(srv->cands);
	return NULL;
}
