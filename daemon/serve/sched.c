/*
 * sched.c — the scheduler, policy only (worker.c runs it): every step one batch of
 * decode rows and prefill chunks under a row budget, blocks reserved
 * (preempting when the pool is full), the forward pass, then tokens sampled
 * and posted. It reaches clients only through release.c and the region API.
 * Everything but the forward pass itself runs under srv->lock.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "daemon/log.h"
#include "daemon/model/model.h"
#include "daemon/probes.h"
#include "daemon/engine/sampler.h"
#include "daemon/serve/admit.h"
#include "daemon/serve/persist.h"
#include "daemon/serve/sched.h"
#include "daemon/serve/server.h"
#include "daemon/tokenizer/tokenizer.h"

/* One step's rows: n in all, n_logits of them want logits, n_decode are decodes. */
struct batch {
	uint32_t n;
	uint32_t n_logits;
	uint32_t n_decode;
};

/* The engine thread's scratch, private to this file. */
struct sched {
	struct server *srv;
	struct batch b;			/* the step planned */
	struct engine_row *rows;	/* (max_batch_rows,) */
	struct request **row_req;	/* (max_batch_rows,) the request each row serves */
	struct cand *cands;		/* (cand_cap,) runnable requests of this step */
	uint32_t cand_cap;
	float *logits;			/* (logits_rows, vocab) of the current step */
	uint32_t *toks;			/* (logits_rows,) decode rows' tokens, sampled unlocked */
	uint32_t logits_rows;
};

/* ---- the step ---- */

/* One token for r from logits (which it may change). */
static uint32_t sample(struct request *r, float *logits)
{
	const struct engine_seq *seq = &r->sl->seq;
	return sampler_sample(r->smp, logits, engine_seq_tokens(seq), engine_seq_len(seq));
}

/*
 * The log-probabilities of r's newest token (its sampler kept them), as
 * record r->n_out, before the CQE that tells of the token: the CQ tail's
 * release store publishes them with the token.
 */
static void put_logprobs(struct request *r)
{
	const struct sampler_logprob *lp;
	struct kvd_logprob rec[1 + KVD_MAX_TOP_LOGPROBS];
	uint32_t n = sampler_logprobs(r->smp, &lp);
	if (!(r->sqe.flags & KVD_SQE_LOGPROBS) || n != 1u + r->sqe.top_logprobs)
		return;
	for (uint32_t i = 0; i < n; i++) {
		rec[i].token = lp[i].id;
		memcpy(&rec[i].logprob, &lp[i].logprob, sizeof(rec[i].logprob));
	}
	uint32_t stride = n * (uint32_t)sizeof(rec[0]);	/* validate_sqe() placed max_tokens of them */
	region_write(&r->c->rg, r->sqe.logprobs_off + r->n_out * stride, rec, stride);
}

/* Post the token sampled for r; 1 if r finished. */
static int emit_token(struct server *srv, struct request *r, uint32_t tok)
{
	struct slot *sl = r->sl;
	put_logprobs(r);
	region_put_token(&r->c->rg, r->sqe.out_off, r->n_out++, tok);
	r->last = tok;
	srv->n_generated++;
	if (r->n_out == 1) KVD_PROBE(first_token, r->id, r->c->uid);
	KVD_PROBE(token, r->id, r->c->uid, tok, r->n_out);
	sl->has_logits = 0;
	sl->pending = tok;
	sl->has_pending = 1;
	int eos = tokenizer_is_eog(srv->tok, tok) && !(r->sqe.flags & KVD_SQE_IGNORE_EOS);
	int full = r->n_out >= r->max_out || engine_seq_len(&sl->seq) + 1 >= srv->m->hp.ctx_len;
	if (r->sqe.flags & KVD_SQE_STREAM && !eos && !full)
		release_post(r->c, r->sqe.user_data, (int32_t)r->n_out, KVD_CQE_MORE, tok, r->n_out, r->sqe.slot, 0);
	if (eos || full) {
		release_request(srv, r, (int32_t)r->n_out, eos ? KVD_CQE_EOS : KVD_CQE_LENGTH);
		return 1;
	}
	return 0;
}

/* r cannot fit the context: its final CQE says how many positions it would need. */
static void too_big(struct server *srv, struct request *r, uint64_t need)
{
	r->aux = need > UINT32_MAX ? UINT32_MAX : (uint32_t)need;
	release_request(srv, r, -E2BIG, 0);
}

/*
 * A prompt part-way in after a step: how far, if its client asked. Only
 * while the prompt goes in the first time (no token yet) and only forward
 * (a preempted prompt recomputes what it had).
 */
static void post_progress(struct request *r)
{
	uint32_t done = engine_seq_len(&r->sl->seq);
	if (!(r->sqe.flags & KVD_SQE_PROGRESS) || r->n_out || done <= r->progress)
		return;
	r->progress = done;
	release_post(r->c, r->sqe.user_data, (int32_t)done, KVD_CQE_MORE | KVD_CQE_PROGRESS, 0, 0,
		     r->sqe.slot, r->total);
}

static int emit(struct server *srv, struct request *r, float *logits)
{
	return emit_token(srv, r, sample(r, logits));
}

/* Move r out of QUEUED; returns 1 if it completed at once. */
static int start(struct server *srv, struct request *r)
{
	struct slot *sl = r->sl;
	const struct kvd_sqe *q = &r->sqe;
	KVD_PROBE(admit, r->id, r->c->uid, r->n_prompt);
	if (q->opcode == KVD_OP_RESET) {
		release_slot_reset(srv, sl);
		release_request(srv, r, 0, 0);
		return 1;
	}
	/* Restored without its KV: what would continue it cannot be served; a reset can. */
	if (sl->lost && (q->opcode == KVD_OP_DECODE || (q->flags & KVD_SQE_APPEND))) {
		release_request(srv, r, -ESTALE, 0);
		return 1;
	}
	if (q->opcode == KVD_OP_DECODE) {
		/* Its logits, its pending token, or the tokens to recompute the logits from. */
		if (!sl->has_logits && !sl->has_pending && !(sl->n_resume && sl->resume_logits)) {
			release_request(srv, r, -EINVAL, 0);
			return 1;
		}
		/* Its pending token goes in at position len: past the context, this request alone fails. */
		if (sl->has_pending && engine_seq_len(&sl->seq) >= srv->m->hp.ctx_len) {
			too_big(srv, r, (uint64_t)engine_seq_len(&sl->seq) + 1 + r->max_out);
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
		release_slot_reset(srv, sl);
	if (!sl->live) {
		engine_seq_init(srv->eng, &sl->seq, srv->cfg.prefix_global ? 0 : r->c->uid + 1);
		sl->live = 1;
	}
	if (sl->has_pending || sl->n_resume) {
		/* What the cache lost to preemption, then the last sampled token, go in first. */
		size_t n = (size_t)sl->n_resume + (sl->has_pending ? 1 : 0) + r->n_prompt;
		uint32_t *p = malloc(n * sizeof(uint32_t));
		if (!p) {
			release_request(srv, r, -ENOMEM, 0);
			return 1;
		}
		/* (A DECODE has no prompt, an unpreempted slot no resume: no memcpy from NULL.) */
		if (sl->n_resume)
			memcpy(p, sl->resume, (size_t)sl->n_resume * sizeof(uint32_t));
		if (sl->has_pending)
			p[sl->n_resume] = sl->pending;
		if (r->n_prompt)
			memcpy(p + n - r->n_prompt, r->prompt, (size_t)r->n_prompt * sizeof(uint32_t));
		free(r->prompt);
		free(sl->resume);
		sl->resume = NULL;
		sl->n_resume = 0;
		sl->resume_logits = 0;
		r->prompt = p;
		r->n_prompt = (uint32_t)n;
		sl->has_pending = 0;
	}
	sl->has_logits = 0;
	uint64_t need = (uint64_t)engine_seq_len(&sl->seq) + r->n_prompt + r->max_out;
	if (need > srv->m->hp.ctx_len) {
		too_big(srv, r, need);
		return 1;
	}
	r->total = engine_seq_len(&sl->seq) + r->n_prompt;	/* <= ctx_len: no overflow */
	if (engine_seq_len(&sl->seq) == 0 && !srv->cfg.no_prefix_cache) {
		int hit = engine_seq_attach_prefix(srv->eng, &sl->seq, r->prompt, r->n_prompt);
		r->n_fed = hit > 0 ? (uint32_t)hit : 0;
		/*
		 * Only the first lookup counts: what a preempted request finds again
		 * was computed for it, and a DECODE has no prompt to report on.
		 */
		if (q->opcode != KVD_OP_DECODE)
			r->cached = r->n_fed;
	}
	r->phase = REQ_PREFILL;
	return 0;
}

/* A runnable request of this step. */
struct cand {
	struct request *r;
	struct slot *sl;
	int decode;		/* 1: one decode row; 0: a prefill chunk */
};

static void add_row(struct sched *sc, struct batch *b, struct request *r, uint32_t tok, int want)
{
	struct slot *sl = r->sl;
	uint32_t pos = engine_seq_len(&sl->seq);
	/* Rows of one sequence are consecutive within a step. */
	if (b->n && sc->rows[b->n - 1].seq == &sl->seq)
		pos = sc->rows[b->n - 1].pos + 1;
	sc->rows[b->n] = (struct engine_row){ &sl->seq, pos, tok, (uint32_t)want };
	sc->row_req[b->n] = r;
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
	/* An idle restored sequence has tokens to recompute already: they follow its KV's. */
	size_t extra = !r ? sl->n_resume : r->phase == REQ_PREFILL ? (size_t)(r->n_prompt - r->n_fed) : (size_t)(sl->has_pending != 0);
	uint32_t *p = malloc(((size_t)engine_seq_len(&sl->seq) + extra + 1) * sizeof(uint32_t));
	if (!p)
		return -ENOMEM;
	size_t n = engine_seq_len(&sl->seq);
	memcpy(p, engine_seq_tokens(&sl->seq), n * sizeof(uint32_t));
	if (!r && sl->n_resume) {
		memcpy(p + n, sl->resume, (size_t)sl->n_resume * sizeof(uint32_t));
		n += sl->n_resume;
	} else if (r && r->phase == REQ_PREFILL) {
		memcpy(p + n, r->prompt + r->n_fed, extra * sizeof(uint32_t));
		n += extra;
	} else if (r && sl->has_pending) {
		p[n++] = sl->pending;
	}
	uint32_t ns = engine_seq_ns(&sl->seq);
	engine_seq_release(srv->eng, &sl->seq);
	engine_seq_init(srv->eng, &sl->seq, ns);
	/* An idle sequence's logits come back with its last token: a DECODE may still follow. */
	if (!r)
		sl->resume_logits = sl->has_logits || (sl->n_resume && sl->resume_logits);
	sl->has_logits = 0;
	srv->n_preemptions++;
	KVD_PROBE(preempt, r ? r->id : 0, engine_seq_ns(&sl->seq), (uint32_t)n);
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

/* A restored session's sequence nobody has reopened yet gives up its blocks first. */
static int preempt_orphan(struct server *srv)
{
	for (struct session *o = srv->orphans; o; o = o->next_orphan)
		for (uint32_t k = 0; k < o->n_slots; k++) {
			struct slot *sl = &o->slots[k];
			if (sl->live && engine_seq_blocks(&sl->seq))
				return preempt(srv, sl, NULL) == 0;
		}
	return 0;
}

/*
 * Find the sequence to preempt for r, the cheapest kind first: a restored
 * session's that nobody has reopened; an idle sequence holding blocks; then
 * one whose client is stalled (its CQ full: it cannot take a token, so it
 * must not hold blocks others wait for, whatever its rank or age); else
 * the newest request of the lowest class that ranks below r and has no row
 * in this step. Returns 1 if one was preempted.
 */
static int make_room(struct server *srv, struct request *r)
{
	enum { IDLE, STALLED, RANKED, NONE } kind = NONE;
	if (preempt_orphan(srv))
		return 1;
	struct slot *vs = NULL, *sl;
	struct request *vr = NULL;
	srv_for_each_slot(srv, it, sl) {
		if (!sl->live || !engine_seq_blocks(&sl->seq) || sl == r->sl)
			continue;
		struct request *h = sl->head;
		int stalled = region_backpressured(&it.c->rg);
		if (!h || (stalled && h->phase == REQ_QUEUED)) {
			if (kind > IDLE) {
				kind = IDLE;
				vs = sl;
				vr = NULL;
			}
			continue;
		}
		if (h->want_row >= 0 || h->phase == REQ_QUEUED)
			continue;
		if (stalled) {
			if (kind > STALLED) {
				kind = STALLED;
				vs = sl;
				vr = h;
			}
			continue;
		}
		if (kind < RANKED || !keep_rank_less(r, h))
			continue;
		if (!vr || keep_rank_less(vr, h)) {
			kind = RANKED;
			vs = sl;
			vr = h;
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
	struct slot *sl;
	srv_for_each_slot(srv, it, sl)
		if (it.c->uid == uid)
			n += engine_seq_blocks(&sl->seq);
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
		struct slot *vs = NULL, *sl;
		struct request *vr = NULL;
		srv_for_each_slot(srv, it, sl) {
			struct request *h = sl->head;
			if (it.c->uid != uid || sl == r->sl || !engine_seq_blocks(&sl->seq) ||
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
	struct slot *sl = r->sl;
	uint32_t len = engine_seq_len(&sl->seq);
	uint32_t bt = engine_pool_block_tokens(srv->eng);
	uint32_t have = engine_seq_blocks(&sl->seq), need = (len + n + bt - 1) / bt;
	if (need > have && !within_quota(srv, r, need - have))
		return -EDQUOT;
	for (;;) {
		int rc = engine_seq_prepare(srv->eng, &sl->seq, len, len + n);
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

/* Room for one more candidate; 0 or -ENOMEM. */
static int cand_room(struct sched *sc, uint32_t n)
{
	if (n < sc->cand_cap)
		return 0;
	uint32_t cap = n ? 2 * n : 64;
	struct cand *p = realloc(sc->cands, cap * sizeof(*p));
	if (!p)
		return -ENOMEM;
	sc->cands = p;
	sc->cand_cap = cap;
	return 0;
}

/* Start queued requests, sample where logits wait, and list what needs rows. */
static uint32_t collect(struct sched *sc)
{
	struct server *srv = sc->srv;
	uint32_t n = 0;
	struct slot *sl;
	srv_for_each_slot(srv, it, sl) {
		if (region_backpressured(&it.c->rg) || it.s->closing)
			continue;	/* back-pressure: its CQ is full */
		struct request *r;
		while ((r = sl->head)) {
			if (r->cancelled) {
				release_request(srv, r, (int32_t)r->n_out, KVD_CQE_CANCELLED);
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
		if (cand_room(sc, n))
			return n;
		sc->cands[n++] = (struct cand){ r, sl, r->phase == REQ_DECODE };
	}
	return n;
}

/*
 * A decode row for cd's request: its pending token, fed where the sequence
 * ends. Returns the rows it took (0 or 1).
 */
static uint32_t add_decode(struct sched *sc, struct batch *b, struct cand *cd)
{
	struct server *srv = sc->srv;
	struct request *r = cd->r;
	/* A row past the context would fail the whole step: this request alone ends. */
	if (engine_seq_len(&cd->sl->seq) >= srv->m->hp.ctx_len) {
		too_big(srv, r, (uint64_t)engine_seq_len(&cd->sl->seq) + 1 + (r->max_out - r->n_out));
		return 0;
	}
	int rc = reserve(srv, r, 1);
	if (rc) {
		log_msg(LOG_DEBUG, "request %llu waits: %s", (unsigned long long)r->id, strerror(-rc));
		return 0;	/* waits for blocks */
	}
	if (r->phase != REQ_DECODE || !cd->sl->has_pending)
		return 0;	/* preempted meanwhile: recomputed later */
	/* Feed the last token; its logits give the next one. */
	uint32_t t = cd->sl->pending;
	cd->sl->has_pending = 0;
	add_row(sc, b, r, t, 1);
	b->n_decode++;
	return 1;
}

/*
 * A chunk of cd's prompt, at most its client's share of the step's rows
 * (share) and what the budget has left. Returns the rows it took.
 */
static uint32_t add_prefill(struct sched *sc, struct batch *b, struct cand *cd, uint32_t share,
			    uint32_t budget)
{
	struct server *srv = sc->srv;
	struct request *r = cd->r;
	if (r->reattach && !srv->cfg.no_prefix_cache) {
		int hit = engine_seq_attach_prefix(srv->eng, &cd->sl->seq, r->prompt, r->n_prompt);
		r->n_fed = hit > 0 ? (uint32_t)hit : 0;
	}
	r->reattach = 0;
	if (r->c->step_rows >= share)
		return 0;
	share -= r->c->step_rows;
	share = share < budget ? share : budget;
	uint32_t left = r->n_prompt - r->n_fed;
	uint32_t take = left < share ? left : share;
	int rc = reserve(srv, r, take);
	if (rc == -ENOSPC) {
		struct kvpool_stats st;
		engine_pool_stats(srv->eng, &st);
		if (st.blocks_in_use <= engine_seq_blocks(&cd->sl->seq)) {
			release_request(srv, r, -ENOSPC, 0);	/* alone and still too big */
			return 0;
		}
	}
	if (rc || r->phase != REQ_PREFILL) {
		log_msg(LOG_DEBUG, "request %llu waits: %s", (unsigned long long)r->id, strerror(-rc));
		return 0;
	}
	for (uint32_t j = 0; j < take; j++)
		add_row(sc, b, r, r->prompt[r->n_fed + j], r->n_fed + j + 1 == r->n_prompt);
	KVD_PROBE(prefill_chunk, r->id, r->c->uid, r->n_fed, take);
	r->n_fed += take;
	r->c->step_rows += take;
	srv->n_prefilled += take;
	return take;
}

/* How many clients have prompts among the n candidates (their conns' step_rows left 0). */
static uint32_t prefill_clients(struct sched *sc, uint32_t n)
{
	uint32_t n_clients = 0;
	for (struct conn *c = sc->srv->conns; c; c = c->next)
		c->step_rows = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct conn *c = sc->cands[i].r->c;
		if (!sc->cands[i].decode && !c->step_rows) {
			c->step_rows = 1;
			n_clients++;
		}
	}
	for (struct conn *c = sc->srv->conns; c; c = c->next)
		c->step_rows = 0;
	return n_clients;
}

/*
 * One step's rows, interactive requests before background ones: in each
 * class every decode, then prefill chunks from what the budget has left,
 * split evenly between the clients that have prompts waiting (so one
 * client's long prompts cannot starve another's) and first come, first
 * served within a client. A request that finds the pool full preempts a
 * lower-ranked one.
 */
static void build(struct sched *sc, struct batch *b)
{
	struct server *srv = sc->srv;
	uint32_t n = collect(sc), budget = srv->cfg.max_batch_rows;
	if (n)	/* cands is NULL until the first candidate: qsort(NULL, 0) is undefined */
		qsort(sc->cands, n, sizeof(*sc->cands), cand_cmp);
	/* Clients with prompts to prefill share the rows evenly; each client's own go FCFS. */
	uint32_t n_clients = prefill_clients(sc, n);
	uint32_t bt = engine_pool_block_tokens(srv->eng);
	uint32_t share = srv->cfg.max_batch_rows / (n_clients ? n_clients : 1);
	share = share < bt ? bt : share;
	for (uint32_t i = 0; i < n && budget; i++) {
		struct cand *cd = &sc->cands[i];
		struct request *r = cd->r;
		if (r->want_row >= 0 || r->s->closing)
			continue;
		if (cd->decode)
			budget -= add_decode(sc, b, cd);
		else if (r->phase == REQ_PREFILL)
			budget -= add_prefill(sc, b, cd, share, budget);
	}
}

static int grow_logits(struct sched *sc, uint32_t rows)
{
	if (rows <= sc->logits_rows)
		return 0;
	float *p = realloc(sc->logits, (size_t)rows * sc->srv->m->hp.vocab * sizeof(float));
	if (!p)
		return -ENOMEM;
	sc->logits = p;
	uint32_t *t = realloc(sc->toks, rows * sizeof(*t));
	if (!t)
		return -ENOMEM;
	sc->toks = t;
	sc->logits_rows = rows;
	return 0;
}

/* After the forward pass: logits to their slots, tokens sampled, prefills completed. */
static void finish_step(struct sched *sc, const struct batch *b, int rc)
{
	struct server *srv = sc->srv;
	const uint32_t vocab = srv->m->hp.vocab;
	for (uint32_t i = 0; i < b->n; i++) {
		/* A request's rows are consecutive and only its last may want logits. */
		int last = i + 1 == b->n || sc->row_req[i + 1] != sc->row_req[i];
		if (!last)
			continue;
		struct request *r = sc->row_req[i];
		int row = r->want_row;
		r->want_row = -1;
		if (rc) {
			release_request(srv, r, rc, 0);
			continue;
		}
		if (row < 0) {
			post_progress(r);	/* a prefill chunk that did not finish its prompt */
			continue;
		}
		struct slot *sl = r->sl;
		float *lg = sc->logits + (size_t)row * vocab;
		if (r->phase == REQ_DECODE) {
			emit_token(srv, r, sc->toks[row]);
			continue;
		}
		/* The prompt is in: keep its last logits for the first sample. */
		if (!sl->logits && !(sl->logits = malloc(vocab * sizeof(float)))) {
			release_request(srv, r, -ENOMEM, 0);
			continue;
		}
		memcpy(sl->logits, lg, vocab * sizeof(float));
		sl->has_logits = 1;
		if (r->sqe.opcode == KVD_OP_PREFILL) {
			release_request(srv, r, (int32_t)engine_seq_len(&sl->seq), 0);
		} else {
			r->phase = REQ_DECODE;
			emit(srv, r, sl->logits);
		}
	}
}

/* Restored sessions nobody reopened in time: their blocks stay cached, their records go. */
static void expire_orphans(struct server *srv)
{
	uint64_t now = log_now_ns();
	for (struct session **pp = &srv->orphans; *pp;) {
		struct session *o = *pp;
		if (now < o->orphan_deadline_ns) {
			pp = &o->next_orphan;
			continue;
		}
		*pp = o->next_orphan;
		log_msg(LOG_INFO, "restored session %08x not reopened within %u s: let go", o->id,
			srv->cfg.resume_timeout_s);
		release_session(srv, NULL, o, 0);
		persist_session_drop(srv->ps, o);
		session_free(o);
	}
}

/* Bookkeeping at a step boundary: hang-ups, closed sessions, new SQEs, overflow. */
void sched_housekeeping(struct server *srv)
{
	if (srv->orphans)
		expire_orphans(srv);
	for (struct conn *c = srv->conns; c; c = c->next) {
		if (c->released)
			continue;
		if (c->dead) {
			release_conn(srv, c);
			continue;
		}
		release_closed_sessions(srv, c);
		if (!region_live(&c->rg))
			continue;
		region_flush_overflow(&c->rg);
		/* Back-pressure: while its CQ overflows, a client's SQ waits in shared memory. */
		if (!region_backpressured(&c->rg))
			admit_drain_sq(srv, c);
	}
}

/*
 * Decode rows' tokens, sampled after the forward pass before the lock is
 * taken again: only the engine thread touches a request's sampler, slot
 * and sequence. (A prompt's first token is sampled under the lock, in
 * finish_step, from the copy its slot keeps.)
 */
static void sample_decodes(struct sched *sc, const struct batch *b)
{
	const uint32_t vocab = sc->srv->m->hp.vocab;
	for (uint32_t i = 0; i < b->n; i++) {
		struct request *r = sc->row_req[i];
		if ((i + 1 == b->n || sc->row_req[i + 1] != r) && r->want_row >= 0 &&
		    r->phase == REQ_DECODE)
			sc->toks[r->want_row] = sample(r, sc->logits + (size_t)r->want_row * vocab);
	}
}

/* Rows to the engine, without the lock, then their results back under it. */
static void run_step(struct sched *sc, struct batch *b)
{
	struct server *srv = sc->srv;
	int rc = grow_logits(sc, b->n_logits);
	srv->n_steps++;
	pthread_mutex_unlock(&srv->lock);
	KVD_PROBE(step_begin, srv->n_steps, b->n, b->n - b->n_decode, b->n_decode);
	if (!rc)
		rc = engine_forward(srv->eng, sc->rows, b->n, sc->logits);
	KVD_PROBE(step_end, srv->n_steps, b->n, b->n - b->n_decode, b->n_decode, rc);
	if (!rc)
		sample_decodes(sc, b);
	pthread_mutex_lock(&srv->lock);
	if (rc)
		log_msg(LOG_WARNING, "engine step of %u rows failed: %s", b->n, strerror(-rc));
	finish_step(sc, b, rc);
}

int sched_create(struct sched **out, struct server *srv)
{
	struct sched *sc = calloc(1, sizeof(*sc));
	if (!sc)
		return -ENOMEM;
	sc->srv = srv;
	sc->rows = calloc(srv->cfg.max_batch_rows, sizeof(*sc->rows));
	sc->row_req = calloc(srv->cfg.max_batch_rows, sizeof(*sc->row_req));
	if (!sc->rows || !sc->row_req) {
		sched_destroy(sc);
		return -ENOMEM;
	}
	*out = sc;
	return 0;
}

void sched_destroy(struct sched *sc)
{
	if (!sc)
		return;
	free(sc->logits);
	free(sc->toks);
	free(sc->rows);
	free(sc->row_req);
	free(sc->cands);
	free(sc);
}

uint32_t sched_plan(struct sched *sc)
{
	sched_housekeeping(sc->srv);
	sc->b = (struct batch){ 0, 0, 0 };
	build(sc, &sc->b);
	return sc->b.n;
}

uint32_t sched_rows(const struct sched *sc, const struct engine_row **rows, struct request *const **reqs)
{
	if (rows)
		*rows = sc->rows;
	if (reqs)
		*reqs = sc->row_req;
	return sc->b.n;
}

void sched_run(struct sched *sc)
{
	if (sc->b.n)
		run_step(sc, &sc->b);
	sc->b = (struct batch){ 0, 0, 0 };
}
