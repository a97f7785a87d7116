/* engine.c — Llama forward pass: prefill and decode are the same pass over a batch of rows. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/engine.h"
#include "daemon/model.h"
#include "kernels/backend.h"

/*
 * Activation scratch lives in one arena sized for the rows of the current
 * step: a long prefill grows it, and it shrinks back to KEEP_ROWS rows
 * afterwards, so decode runs on a few kilobytes and the big buffer goes
 * back to the system.
 */
#define KEEP_ROWS 16

struct engine {
	struct model *m;
	struct backend *be;
	struct kvpool *pool;	/* borrowed */
	uint32_t max_rows;
	uint32_t rows_cap;	/* rows the arena holds now */
	void *arena;
	size_t arena_bytes;
	/* Activations carved from the arena, each (rows_cap, width): */
	float *x;		/* (, dim) residual stream */
	float *xb;		/* (, dim) normed input of a sub-layer */
	float *q;		/* (, n_heads * head_dim) */
	float *k;		/* (, kv_dim) */
	float *v;		/* (, kv_dim) */
	float *att;		/* (, n_heads * head_dim) attention output */
	float *o;		/* (, dim) sub-layer output */
	float *gate;		/* (, ffn_dim) */
	float *up;		/* (, ffn_dim) */
	uint32_t *pos;		/* (rows_cap,) */
	uint32_t *tok;		/* (rows_cap,) */
};

static size_t row_bytes(const struct model_hparams *hp)
{
	size_t qd = (size_t)hp->n_heads * hp->head_dim;
	return (3 * (size_t)hp->dim + 2 * qd + 2 * (size_t)hp->kv_dim + 2 * (size_t)hp->ffn_dim) *
		       sizeof(float) + 2 * sizeof(uint32_t);
}

/* Make the arena hold exactly rows rows (contents are not kept). */
static int arena_resize(struct engine *e, uint32_t rows)
{
	const struct model_hparams *hp = &e->m->hp;
	size_t r = rows, qd = (size_t)hp->n_heads * hp->head_dim;
	size_t bytes = r * row_bytes(hp);
	void *a = malloc(bytes);
	if (!a)
		return -ENOMEM;
	free(e->arena);
	e->arena = a;
	e->arena_bytes = bytes;
	e->rows_cap = rows;
	float *f = a;
	e->x = f, f += r * hp->dim;
	e->xb = f, f += r * hp->dim;
	e->o = f, f += r * hp->dim;
	e->q = f, f += r * qd;
	e->att = f, f += r * qd;
	e->k = f, f += r * hp->kv_dim;
	e->v = f, f += r * hp->kv_dim;
	e->gate = f, f += r * hp->ffn_dim;
	e->up = f, f += r * hp->ffn_dim;
	e->pos = (uint32_t *)f;
	e->tok = e->pos + r;
	return 0;
}

int engine_create(struct engine **out, struct model *m, struct backend *be,
		  struct kvpool *pool, uint32_t max_rows)
{
	const struct kvpool_config *pc = kvpool_config(pool);
	if (max_rows == 0 || pc->n_layers != m->hp.n_layers || pc->kv_dim != m->hp.kv_dim)
		return -EINVAL;
	struct engine *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->m = m;
	e->be = be;
	e->pool = pool;
	e->max_rows = max_rows;
	int rc = arena_resize(e, max_rows < KEEP_ROWS ? max_rows : KEEP_ROWS);
	if (rc) {
		free(e);
		return rc;
	}
	*out = e;
	return 0;
}

void engine_destroy(struct engine *e)
{
	if (!e)
		return;
	free(e->arena);
	free(e);
}

uint32_t engine_max_rows(const struct engine *e)
{
	return e->max_rows;
}

struct kvpool *engine_pool(const struct engine *e)
{
	return e->pool;
}

size_t engine_scratch_bytes(const struct engine *e)
{
	return e->arena_bytes;
}

void engine_seq_init(struct engine *e, struct engine_seq *s, uint32_t ns)
{
	(void)e;
	kvseq_init(&s->kv, ns);
}

void engine_seq_release(struct engine *e, struct engine_seq *s)
{
	kvseq_release(e->pool, &s->kv);
}

int engine_seq_attach_prefix(struct engine *e, struct engine_seq *s, const uint32_t *tokens,
			     uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (tokens[i] >= e->m->hp.vocab)
			return -ERANGE;
	return kvseq_attach_prefix(e->pool, &s->kv, tokens, n);
}

/* Check the batch before touching any state: a bad row fails the call, not the daemon. */
static int validate(const struct engine *e, const struct engine_row *rows, uint32_t n)
{
	if (n > e->max_rows)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		const struct engine_row *r = &rows[i];
		if (!r->seq)
			return -EINVAL;
		if (r->token >= e->m->hp.vocab)
			return -ERANGE;
		if (r->pos >= e->m->hp.ctx_len)
			return -ERANGE;
		int first = i == 0 || rows[i - 1].seq != r->seq;
		if (first) {
			if (r->pos > engine_seq_len(r->seq))
				return -EINVAL;
			/* A sequence's rows are one contiguous run. */
			for (uint32_t j = 0; j + 1 < i; j++)
				if (rows[j].seq == r->seq)
					return -EINVAL;
		} else if (r->pos != rows[i - 1].pos + 1) {
			return -EINVAL;
		}
	}
	return 0;
}

#define TRY(call)                  \
	do {                       \
		int rc_ = (call);  \
		if (rc_)           \
			return rc_; \
	} while (0)

static int forward_layer(struct engine *e, uint32_t l, const struct engine_row *rows, uint32_t n)
{
	const struct model_hparams *hp = &e->m->hp;
	const struct model_layer *L = &e->m->layers[l];
	const struct backend_ops *op = e->be->ops;
	struct backend *be = e->be;
	const uint32_t qd = hp->n_heads * hp->head_dim;

	TRY(op->rmsnorm(be, e->xb, e->x, L->attn_norm, n, hp->dim, hp->norm_eps));
	float *const qkv_out[3] = { e->q, e->k, e->v };
	const struct kb_weight *const qkv[3] = { &L->wq, &L->wk, &L->wv };
	TRY(op->matmul_multi(be, qkv_out, qkv, 3, e->xb, n));
	TRY(op->rope(be, e->q, e->pos, n, hp->n_heads, hp->head_dim, hp->rot_dim,
		     hp->rope_theta, hp->rope_neox));
	TRY(op->rope(be, e->k, e->pos, n, hp->n_kv_heads, hp->head_dim, hp->rot_dim,
		     hp->rope_theta, hp->rope_neox));

	struct kb_attn_shape shape = {
		.n_heads = hp->n_heads, .n_kv_heads = hp->n_kv_heads,
		.head_dim = hp->head_dim, .scale = 1.0f / sqrtf((float)hp->head_dim),
	};
	for (uint32_t i = 0; i < n;) {
		struct engine_seq *s = rows[i].seq;
		uint32_t j = i;
		while (j < n && rows[j].seq == s)
			j++;
		const struct kvpool_config *pc = kvpool_config(e->pool);
		size_t row = kvpool_row_bytes(pc->kv_type, pc->kv_dim);
		struct kb_kv_view kv = {
			.base = kvpool_base(e->pool), .blocks = s->kv.blocks,
			.n_blocks = s->kv.n_blocks, .block_tokens = pc->block_tokens,
			.block_bytes = kvpool_block_bytes(e->pool),
			.k_off = (size_t)l * 2 * pc->block_tokens * row,
			.v_off = ((size_t)l * 2 + 1) * pc->block_tokens * row,
			.row_bytes = row, .type = pc->kv_type,
		};
		/* K (after RoPE) and V go into the sequence's cache; Q is never cached. */
		TRY(op->write_kv(be, &kv, e->pos + i, j - i, hp->kv_dim,
				 e->k + (size_t)i * hp->kv_dim, e->v + (size_t)i * hp->kv_dim));
		TRY(op->attention(be, e->att + (size_t)i * qd, e->q + (size_t)i * qd, &kv,
				  e->pos + i, j - i, &shape));
		i = j;
	}
	TRY(op->matmul(be, e->o, &L->wo, e->att, n));
	TRY(op->add(be, e->x, e->o, n, hp->dim));

	TRY(op->rmsnorm(be, e->xb, e->x, L->ffn_norm, n, hp->dim, hp->norm_eps));
	float *const gu_out[2] = { e->gate, e->up };
	const struct kb_weight *const gu[2] = { &L->w_gate, &L->w_up };
	TRY(op->matmul_multi(be, gu_out, gu, 2, e->xb, n));
	TRY(op->swiglu(be, e->gate, e->gate, e->up, n, hp->ffn_dim));
	TRY(op->matmul(be, e->o, &L->w_down, e->gate, n));
	TRY(op->add(be, e->x, e->o, n, hp->dim));
	return 0;
}

int engine_forward(struct engine *e, const struct engine_row *rows, uint32_t n, float *logits)
{
	const struct model_hparams *hp = &e->m->hp;
	const struct backend_ops *op = e->be->ops;
	if (n == 0)
		return 0;
	TRY(validate(e, rows, n));
	if (n > e->rows_cap)
		TRY(arena_resize(e, n));
	/* Blocks for every row first: running out fails the call before any compute. */
	for (uint32_t i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && rows[j].seq == rows[i].seq; j++)
			;
		TRY(kvseq_prepare(e->pool, &rows[i].seq->kv, rows[i].pos, rows[j - 1].pos + 1));
	}
	for (uint32_t i = 0; i < n; i++) {
		e->pos[i] = rows[i].pos;
		e->tok[i] = rows[i].token;
	}
	TRY(op->get_rows(e->be, e->x, &e->m->tok_embd, e->tok, n));
	for (uint32_t l = 0; l < hp->n_layers; l++)
		TRY(forward_layer(e, l, rows, n));
	for (uint32_t i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && rows[j].seq == rows[i].seq; j++)
			;
		TRY(kvseq_commit(e->pool, &rows[i].seq->kv, rows[i].pos, rows[j - 1].pos + 1,
				 e->tok + i));
	}

	/* Only rows that want logits pay for the LM head (in prefill, just the last). */
	uint32_t nw = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (!rows[i].want_logits)
			continue;
		if (nw != i)
			memcpy(e->x + (size_t)nw * hp->dim, e->x + (size_t)i * hp->dim,
			       hp->dim * sizeof(float));
		nw++;
	}
	int rc = 0;
	if (nw) {
		rc = op->rmsnorm(e->be, e->xb, e->x, e->m->output_norm, nw, hp->dim, hp->norm_eps);
		if (!rc)
			rc = op->matmul(e->be, logits, &e->m->output, e->xb, nw);
	}
	/* Give a prefill's scratch back; failing to shrink just keeps the big arena. */
	if (e->rows_cap > KEEP_ROWS && n <= KEEP_ROWS)
		arena_resize(e, KEEP_ROWS);
	return rc;
}
