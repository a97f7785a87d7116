/*
 * admit.c — SQEs in, on the engine thread: each copied out of its ring
 * once, checked by the pure validate_sqe() and its session's limits, text
 * prompts tokenized, and queued on its slot as a request; anything else
 * gets an error completion and touches nothing.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/model/model.h"
#include "daemon/probes.h"
#include "daemon/engine/sampler.h"
#include "daemon/serve/admit.h"
#include "daemon/serve/server.h"
#include "daemon/tokenizer/tokenizer.h"
#include "uapi/kvd_pins.h"

/* ---- admission: one SQE, copied out of shared memory, checked, queued ---- */

static int range_ok(uint32_t arena_bytes, uint32_t off, uint64_t bytes, uint32_t align)
{
	return off % align == 0 && (uint64_t)off + bytes <= arena_bytes;
}

int validate_sqe_op(const struct kvd_sqe *q)
{
	static const __u64 resv_zero[sizeof(q->resv) / sizeof(q->resv[0])];
	/* PLAIN, SPECIAL, PROGRESS and system messages are in the ABI but not served yet. */
	const uint32_t served = KVD_SQE_FLAGS_ALL & ~(KVD_SQE_PLAIN | KVD_SQE_SPECIAL | KVD_SQE_PROGRESS);
	if (q->opcode >= KVD_OP_LAST || (q->flags & ~served) || q->system_off || q->system_len ||
	    q->priority > KVD_PRIO_BACKGROUND || memcmp(q->resv, resv_zero, sizeof(q->resv)))
		return -EINVAL;
	return 0;
}

int validate_sqe(const struct kvd_sqe *q, uint32_t arena_bytes)
{
	if (q->target_user_data)
		return -EINVAL;
	int has_prompt = q->opcode == KVD_OP_PREFILL || q->opcode == KVD_OP_GENERATE;
	int has_out = q->opcode == KVD_OP_DECODE || q->opcode == KVD_OP_GENERATE;
	int text = (q->flags & KVD_SQE_TEXT) != 0;
	if ((!has_prompt && (q->tokens_off || q->n_tokens)) || (!has_out && (q->out_off || q->max_tokens)))
		return -EINVAL;
	if ((q->flags & KVD_SQE_CHAT) && !text)
		return -EINVAL;
	if (q->top_p_e4 > 10000 || q->min_p_e4 > 10000)
		return -EINVAL;
	if (has_prompt && q->n_tokens == 0)
		return -EINVAL;
	if (has_prompt && !range_ok(arena_bytes, q->tokens_off, text ? q->n_tokens : 4ull * q->n_tokens,
				    text ? 1 : 4))
		return -EFAULT;
	if (has_out && (q->max_tokens == 0 || !range_ok(arena_bytes, q->out_off, 4ull * q->max_tokens, 4)))
		return q->max_tokens ? -EFAULT : -EINVAL;
	return 0;
}

/* Text prompts are tokenized here, once; TEXT|CHAT wraps them in the chat template. */
static int text_prompt(struct server *srv, struct conn *c, const struct kvd_sqe *q,
		       uint32_t **out, uint32_t *n)
{
	size_t len = q->n_tokens;
	char *text = malloc(len + 1);
	if (!text)
		return -ENOMEM;
	region_read(&c->rg, q->tokens_off, text, len);
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

static void cancel(struct conn *c, const struct kvd_sqe *q)
{
	struct slot *sl;
	conn_for_each_slot(c, it, sl)
		for (struct request *r = sl->head; r; r = r->next)
			if (r->sqe.user_data == q->target_user_data && !r->cancelled) {
				r->cancelled = 1;
				KVD_PROBE(cancel, r->id, c->uid);
				release_post(c, q->user_data, 0, 0, 0, 0, q->slot);
				return;
			}
	release_post(c, q->user_data, -ENOENT, 0, 0, 0, q->slot);
}

/*
 * One SQE taken from the ring, with everything done to it that needs no
 * lock: its own checks, its prompt read (and text tokenized), its sampler.
 * The results wait in order; admit() applies them under the lock, in the
 * order the checks have always had, so which error an SQE gets is the same.
 */
struct taken {
	struct kvd_sqe q;
	int op_rc;		/* validate_sqe_op() */
	int body_rc;		/* validate_sqe() */
	int prep_rc;		/* the prompt */
	int smp_rc;		/* the sampler */
	uint32_t *prompt;	/* (n_prompt,) */
	uint32_t n_prompt;
	struct sampler *smp;
};

#define ADMIT_BATCH 32	/* SQEs prepared per unlock */

static int has_prompt(const struct kvd_sqe *q)
{
	return q->opcode == KVD_OP_PREFILL || q->opcode == KVD_OP_GENERATE;
}

static int has_out(const struct kvd_sqe *q)
{
	return q->opcode == KVD_OP_DECODE || q->opcode == KVD_OP_GENERATE;
}

/* The prompt of t->q out of the arena: token ids read once and checked, or text tokenized. */
static int read_prompt(struct server *srv, struct conn *c, struct taken *t)
{
	const struct kvd_sqe *q = &t->q;
	if (q->flags & KVD_SQE_TEXT) {
		int rc = text_prompt(srv, c, q, &t->prompt, &t->n_prompt);
		if (rc)
			return rc;
	} else {
		t->prompt = malloc((size_t)q->n_tokens * sizeof(uint32_t));
		if (!t->prompt)
			return -ENOMEM;
		region_read(&c->rg, q->tokens_off, t->prompt, (size_t)q->n_tokens * 4);
		t->n_prompt = q->n_tokens;
	}
	/* Text too: a tokenizer may know ids the embedding has no row for. */
	for (uint32_t i = 0; i < t->n_prompt; i++)
		if (t->prompt[i] >= srv->m->hp.vocab)
			return -ERANGE;
	return 0;
}

/*
 * Whether text of n bytes could fit max_tokens with max_out more: every
 * token stands for at most max_token_bytes of it, so it is at least
 * n / max_token_bytes tokens. Checked before tokenizing, which is the work
 * a hostile prompt of megabytes would otherwise cost everyone.
 */
static int text_may_fit(uint64_t n, uint32_t max_out, uint32_t max_token_bytes, uint32_t max_tokens)
{
	uint64_t per = max_token_bytes ? max_token_bytes : 1;
	return (n + per - 1) / per + max_out <= max_tokens;
}

/* Without the lock: only the engine thread reads this ring and arena. max_tokens: the limit now. */
static void prepare(struct server *srv, struct conn *c, struct taken *t, uint32_t max_tokens)
{
	const struct kvd_sqe *q = &t->q;
	t->op_rc = validate_sqe_op(q);
	if (t->op_rc || q->opcode == KVD_OP_NOP || q->opcode == KVD_OP_CANCEL)
		return;
	t->body_rc = validate_sqe(q, c->rg.arena_bytes);
	if (t->body_rc)
		return;
	uint32_t max_out = has_out(q) ? q->max_tokens : 0;
	if (has_prompt(q) && (q->flags & KVD_SQE_TEXT) &&
	    !text_may_fit(q->n_tokens, max_out, srv->max_token_bytes, max_tokens))
		t->prep_rc = -E2BIG;
	else if (has_prompt(q))
		t->prep_rc = read_prompt(srv, c, t);
	if (!t->prep_rc && has_out(q))
		t->smp_rc = sampler_from_sqe(q, srv->m->hp.vocab, &t->smp);
}

static void taken_free(struct taken *t)
{
	sampler_destroy(t->smp);
	free(t->prompt);
	memset(t, 0, sizeof(*t));
}

/* Lock held. Returns 0 when t is queued, 1 when handled, else -errno for its error completion. */
static int admit(struct server *srv, struct conn *c, struct taken *t)
{
	const struct kvd_sqe *q = &t->q;
	if (t->op_rc)
		return t->op_rc;
	if (srv->stopping)
		return -ESHUTDOWN;
	if (q->opcode == KVD_OP_NOP)
		return 1;
	struct session *s = conn_session(c, q->session_id);
	if (!s || q->slot >= s->n_slots)
		return -ENOENT;
	if (q->opcode == KVD_OP_CANCEL) {
		cancel(c, q);
		return 1;
	}
	if (t->body_rc)
		return t->body_rc;
	if (c->inflight >= srv->cfg.max_inflight || c->use->inflight >= srv->cfg.max_uid_inflight)
		return -EBUSY;

	struct request *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->sqe = *q;
	r->c = c;
	r->s = s;
	r->sl = &s->slots[q->slot];
	r->max_out = has_out(q) ? q->max_tokens : 0;
	r->want_row = -1;
	r->prompt = t->prompt;
	r->n_prompt = t->n_prompt;
	r->smp = t->smp;
	t->prompt = NULL;
	t->smp = NULL;
	int rc = t->prep_rc;
	uint32_t bt = engine_pool_block_tokens(srv->eng);
	if (!rc && (uint64_t)r->n_prompt + r->max_out > srv->cfg.max_tokens)
		rc = -E2BIG;
	/* A request its uid's quota could never hold is refused now. */
	if (!rc && srv->cfg.kv_quota && ((uint64_t)r->n_prompt + r->max_out) / bt + 1 > srv->cfg.kv_quota)
		rc = -EDQUOT;
	/* A request the whole pool could never hold is refused now, not left waiting. */
	if (!rc && (uint64_t)r->n_prompt + r->max_out + bt > srv->pool_stats.blocks_total * bt)
		rc = -ENOSPC;
	r->id = ++srv->next_req_id;
	if (!rc)
		rc = t->smp_rc;
	if (rc) {
		release_req_free(r);
		return rc;
	}
	release_enqueue(r);
	KVD_PROBE(submit, r->id, q->session_id, c->uid, q->opcode, r->n_prompt, r->max_out);
	return 0;
}

void admit_drain_sq(struct server *srv, struct conn *c)
{
	struct taken batch[ADMIT_BATCH];
	memset(batch, 0, sizeof(batch));
	for (int more = 1; more;) {
		/*
		 * Take and prepare a batch without the lock, so the loop thread
		 * goes on accepting and answering while a prompt is tokenized;
		 * c stays allocated, since only this thread releases it.
		 */
		uint32_t max_tokens = srv->cfg.max_tokens;	/* SIGHUP may change it meanwhile */
		pthread_mutex_unlock(&srv->lock);
		int n = 0, bad_tail = 0;
		while (n < ADMIT_BATCH) {
			int got = region_next_sqe(&c->rg, &batch[n].q);
			if (got <= 0) {
				bad_tail = got < 0;
				more = 0;
				break;
			}
			prepare(srv, c, &batch[n++], max_tokens);
		}
		region_sq_done(&c->rg);
		pthread_mutex_lock(&srv->lock);
		for (int i = 0; i < n; i++) {
			const struct kvd_sqe *q = &batch[i].q;
			int rc = admit(srv, c, &batch[i]);
			if (rc < 0)
				release_post(c, q->user_data, rc, 0, 0, 0, q->slot);
			else if (rc > 0 && q->opcode == KVD_OP_NOP)
				release_post(c, q->user_data, 0, 0, 0, 0, q->slot);
			taken_free(&batch[i]);
		}
		/* A tail no producer could have written: said once, the ring skipped to it. */
		if (bad_tail)
			release_post(c, 0, -EINVAL, 0, 0, 0, 0);
	}
}
