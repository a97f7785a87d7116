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
#include "daemon/serve/msglist.h"
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
	if (q->opcode >= KVD_OP_LAST || (q->flags & ~KVD_SQE_FLAGS_ALL) ||
	    q->priority > KVD_PRIO_BACKGROUND || memcmp(q->resv, resv_zero, sizeof(q->resv)) ||
	    q->resv1 || q->resv2 || q->resv3)
		return -EINVAL;
	/* How a prompt is read means nothing to an op without one: refused, so it can mean something later. */
	const uint32_t prompt_flags = KVD_SQE_TEXT | KVD_SQE_CHAT | KVD_SQE_PLAIN | KVD_SQE_SPECIAL |
				      KVD_SQE_PROGRESS | KVD_SQE_MESSAGES | KVD_SQE_NO_GEN_PROMPT;
	int has_prompt = q->opcode == KVD_OP_PREFILL || q->opcode == KVD_OP_GENERATE;
	if (!has_prompt && ((q->flags & prompt_flags) || q->system_off || q->system_len))
		return -EINVAL;
	return 0;
}

/*
 * How a prompt is read: PLAIN and SPECIAL only with TEXT and not together,
 * PROGRESS and a system message only with a prompt, the system message only
 * with CHAT and inside the arena, MESSAGES only with CHAT and without a
 * system message (it goes in the list), NO_GEN_PROMPT only with MESSAGES
 * and without APPEND. 0, -EINVAL or -EFAULT.
 */
static int validate_text(const struct kvd_sqe *q, uint32_t arena_bytes, int has_prompt)
{
	uint32_t f = q->flags;
	if ((f & (KVD_SQE_PLAIN | KVD_SQE_SPECIAL)) && !(f & KVD_SQE_TEXT))
		return -EINVAL;
	if ((f & KVD_SQE_MESSAGES) && (!(f & KVD_SQE_CHAT) || q->system_len || q->system_off))
		return -EINVAL;
	if ((f & KVD_SQE_NO_GEN_PROMPT) && (!(f & KVD_SQE_MESSAGES) || (f & KVD_SQE_APPEND)))
		return -EINVAL;
	if ((f & KVD_SQE_PLAIN) && (f & KVD_SQE_SPECIAL))
		return -EINVAL;
	if ((f & KVD_SQE_PROGRESS) && !has_prompt)
		return -EINVAL;
	if (!q->system_len)
		return q->system_off ? -EINVAL : 0;
	if (!has_prompt || !(f & KVD_SQE_CHAT))
		return -EINVAL;
	return range_ok(arena_bytes, q->system_off, q->system_len, 1) ? 0 : -EFAULT;
}

/*
 * LOGPROBS only where tokens are sampled, at most KVD_MAX_TOP_LOGPROBS
 * alternatives, its records (max_tokens of them) inside the arena;
 * without it, its fields zero. 0, -EINVAL or -EFAULT.
 */
static int validate_logprobs(const struct kvd_sqe *q, uint32_t arena_bytes, int has_out)
{
	if (!(q->flags & KVD_SQE_LOGPROBS))
		return q->logprobs_off || q->top_logprobs ? -EINVAL : 0;
	if (!has_out || q->top_logprobs > KVD_MAX_TOP_LOGPROBS || !q->max_tokens)
		return -EINVAL;
	uint64_t bytes = (uint64_t)q->max_tokens * sizeof(struct kvd_logprob) * (1u + q->top_logprobs);
	return range_ok(arena_bytes, q->logprobs_off, bytes, 4) ? 0 : -EFAULT;
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
	int rc = validate_text(q, arena_bytes, has_prompt);
	if (rc)
		return rc;
	if (q->top_p_e4 > 10000 || q->min_p_e4 > 10000)
		return -EINVAL;
	/* OpenAI's range for both penalties, -2..2. */
	if (q->presence_milli < -2000 || q->presence_milli > 2000 || q->frequency_milli < -2000 ||
	    q->frequency_milli > 2000)
		return -EINVAL;
	rc = validate_logprobs(q, arena_bytes, has_out);
	if (rc)
		return rc;
	if (has_prompt && q->n_tokens == 0)
		return -EINVAL;
	if (has_prompt && !range_ok(arena_bytes, q->tokens_off, text ? q->n_tokens : 4ull * q->n_tokens,
				    text ? 1 : 4))
		return -EFAULT;
	if (has_out && (q->max_tokens == 0 || !range_ok(arena_bytes, q->out_off, 4ull * q->max_tokens, 4)))
		return q->max_tokens ? -EFAULT : -EINVAL;
	return 0;
}

/* len bytes of text at arena offset off (checked), NUL-terminated, in *out; -EINVAL if it holds a NUL. */
static int read_text(const struct conn *c, uint32_t off, uint32_t len, char **out)
{
	char *text = malloc((size_t)len + 1);
	if (!text)
		return -ENOMEM;
	region_read(&c->rg, off, text, len);
	text[len] = 0;
	if (memchr(text, 0, len)) {
		free(text);
		return -EINVAL;
	}
	*out = text;
	return 0;
}

/*
 * text (and the system message sys, or NULL) as token ids: TEXT alone is
 * encoded as it is, special tokens parsed unless PLAIN; TEXT|CHAT is
 * rendered with the chat template (the next turn with APPEND), whose
 * markers are control tokens while the messages' text is plain unless
 * SPECIAL.
 */
static int encode_text(const struct tokenizer *tok, const struct kvd_sqe *q, const char *text,
		       const char *sys, const struct msglist *ml, uint32_t **out, uint32_t *n)
{
	const struct chat_msg m[2] = { { "system", sys }, { "user", text } };
	const struct chat_msg *msgs = ml ? ml->msgs : sys ? m : m + 1;
	size_t n_msgs = ml ? ml->n : sys ? 2 : 1;
	unsigned flags = (q->flags & KVD_SQE_APPEND ? TOK_CHAT_NEXT_TURN : 0) |
			 (q->flags & KVD_SQE_SPECIAL ? TOK_CHAT_SPECIAL : 0) |
			 (q->flags & KVD_SQE_NO_GEN_PROMPT ? TOK_CHAT_NO_GEN_PROMPT : 0);
	int chat = (q->flags & KVD_SQE_CHAT) != 0, parse = !(q->flags & KVD_SQE_PLAIN);
	int add_bos = !(q->flags & KVD_SQE_APPEND) && tokenizer_add_bos(tok);
	size_t len = q->n_tokens;
	int cnt = chat ? tokenizer_chat_encode(tok, msgs, n_msgs, flags, NULL, 0)
		       : tokenizer_encode(tok, text, len, add_bos, parse, NULL, 0);
	if (cnt <= 0)
		return cnt < 0 ? cnt : -EINVAL;
	uint32_t *ids = malloc((size_t)cnt * sizeof(uint32_t));
	if (!ids)
		return -ENOMEM;
	/* The count was a dry run: the fill allocates too and may fail, leaving ids unwritten. */
	int got = chat ? tokenizer_chat_encode(tok, msgs, n_msgs, flags, ids, (size_t)cnt)
		       : tokenizer_encode(tok, text, len, add_bos, parse, ids, (size_t)cnt);
	if (got != cnt) {
		free(ids);
		return got < 0 ? got : -EIO;
	}
	*out = ids;
	*n = (uint32_t)cnt;
	return 0;
}

/* Text prompts are tokenized here, once; a message list (ml) was read and checked already. */
static int text_prompt(struct server *srv, struct conn *c, const struct kvd_sqe *q,
		       const struct msglist *ml, uint32_t **out, uint32_t *n)
{
	char *text = NULL, *sys = NULL;
	if (ml)
		return encode_text(srv->tok, q, NULL, NULL, ml, out, n);
	int rc = read_text(c, q->tokens_off, q->n_tokens, &text);
	if (!rc && q->system_len)
		rc = read_text(c, q->system_off, q->system_len, &sys);
	if (!rc)
		rc = encode_text(srv->tok, q, text, sys, NULL, out, n);
	free(text);
	free(sys);
	return rc;
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
	p.presence_penalty = (float)q->presence_milli / 1000.0f;
	p.frequency_penalty = (float)q->frequency_milli / 1000.0f;
	_Static_assert(SAMPLER_MAX_TOP == KVD_MAX_TOP_LOGPROBS, "the sampler keeps what the ABI asks");
	p.logprobs = (q->flags & KVD_SQE_LOGPROBS) != 0;
	p.top_logprobs = q->top_logprobs;
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
				release_post(c, q->user_data, 0, 0, 0, 0, q->slot, 0);
				return;
			}
	release_post(c, q->user_data, -ENOENT, 0, 0, 0, q->slot, 0);
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
	struct msglist ml;	/* KVD_SQE_MESSAGES: the list, checked */
	struct sampler *smp;
	uint32_t need;		/* -E2BIG: positions it needs, the CQE's aux */
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
		int rc = text_prompt(srv, c, q, q->flags & KVD_SQE_MESSAGES ? &t->ml : NULL, &t->prompt,
				     &t->n_prompt);
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
 * The fewest positions text of n bytes and max_out more can take: every
 * token stands for at most max_token_bytes of it, so it is at least
 * n / max_token_bytes tokens. Checked against the limit before tokenizing,
 * which is the work a hostile prompt of megabytes would otherwise cost
 * everyone.
 */
static uint64_t text_min_positions(uint64_t n, uint32_t max_out, uint32_t max_token_bytes)
{
	uint64_t per = max_token_bytes ? max_token_bytes : 1;
	return (n + per - 1) / per + max_out;
}

static uint32_t clamp_u32(uint64_t x)
{
	return x > UINT32_MAX ? UINT32_MAX : (uint32_t)x;
}

/* A message list copied out of the arena once (validate_sqe() placed it inside), then checked. */
static int read_msglist(const struct conn *c, const struct kvd_sqe *q, struct msglist *ml)
{
	uint8_t *buf = malloc(q->n_tokens);
	if (!buf)
		return -ENOMEM;
	region_read(&c->rg, q->tokens_off, buf, q->n_tokens);
	int rc = msglist_parse(buf, q->n_tokens, ml);
	free(buf);
	return rc;
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
	/* The system message counts: it is tokenized too. */
	uint64_t text_bytes = (uint64_t)q->n_tokens + q->system_len;
	if (q->flags & KVD_SQE_MESSAGES) {
		t->prep_rc = read_msglist(c, q, &t->ml);
		if (t->prep_rc)
			return;
		text_bytes = t->ml.content_bytes;	/* the records' headers are not tokenized */
	}
	uint64_t least = text_min_positions(text_bytes, max_out, srv->max_token_bytes);
	if (has_prompt(q) && (q->flags & KVD_SQE_TEXT) && least > max_tokens) {
		t->prep_rc = -E2BIG;
		t->need = clamp_u32(least);
	} else if (has_prompt(q))
		t->prep_rc = read_prompt(srv, c, t);
	if (!t->prep_rc && has_out(q))
		t->smp_rc = sampler_from_sqe(q, srv->m->hp.vocab, &t->smp);
}

static void taken_free(struct taken *t)
{
	msglist_free(&t->ml);
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
	if (!rc && (uint64_t)r->n_prompt + r->max_out > srv->cfg.max_tokens) {
		rc = -E2BIG;
		t->need = clamp_u32((uint64_t)r->n_prompt + r->max_out);
	}
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
				release_post(c, q->user_data, rc, 0, 0, 0, q->slot,
					     rc == -E2BIG ? batch[i].need : 0);
			else if (rc > 0 && q->opcode == KVD_OP_NOP)
				release_post(c, q->user_data, 0, 0, 0, 0, q->slot, 0);
			taken_free(&batch[i]);
		}
		/* A tail no producer could have written: said once, the ring skipped to it. */
		if (bad_tail)
			release_post(c, 0, -EINVAL, 0, 0, 0, 0, 0);
	}
}
