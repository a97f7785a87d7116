/* engine.c — Llama forward pass: prefill and decode are the same pass over a batch of rows. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/engine.h"
#include "daemon/model.h"
#include "kernels/backend.h"

struct engine {
	struct model *m;
	struct backend *be;
	uint32_t max_rows;
	/* Activations, each (max_rows, width): */
	float *x;		/* (, dim) residual stream */
	float *xb;		/* (, dim) normed input of a sub-layer */
	float *q;		/* (, n_heads * head_dim) */
	float *k;		/* (, kv_dim) */
	float *v;		/* (, kv_dim) */
	float *att;		/* (, n_heads * head_dim) attention output */
	float *o;		/* (, dim) sub-layer output */
	float *gate;		/* (, ffn_dim) */
	float *up;		/* (, ffn_dim) */
	uint32_t *pos;		/* (max_rows,) */
	uint32_t *tok;		/* (max_rows,) */
	uint32_t kv_type;	/* of new sequences */
};

int engine_create(struct engine **out, struct model *m, struct backend *be, uint32_t max_rows)
{
	if (max_rows == 0)
		return -EINVAL;
	struct engine *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	const struct model_hparams *hp = &m->hp;
	size_t r = max_rows, qd = (size_t)hp->n_heads * hp->head_dim;
	e->m = m;
	e->be = be;
	e->max_rows = max_rows;
	e->kv_type = KB_F16;
	e->x = malloc(r * hp->dim * sizeof(float));
	e->xb = malloc(r * hp->dim * sizeof(float));
	e->q = malloc(r * qd * sizeof(float));
	e->k = malloc(r * hp->kv_dim * sizeof(float));
	e->v = malloc(r * hp->kv_dim * sizeof(float));
	e->att = malloc(r * qd * sizeof(float));
	e->o = malloc(r * hp->dim * sizeof(float));
	e->gate = malloc(r * hp->ffn_dim * sizeof(float));
	e->up = malloc(r * hp->ffn_dim * sizeof(float));
	e->pos = malloc(r * sizeof(uint32_t));
	e->tok = malloc(r * sizeof(uint32_t));
	if (!e->x || !e->xb || !e->q || !e->k || !e->v || !e->att || !e->o || !e->gate ||
	    !e->up || !e->pos || !e->tok) {
		engine_destroy(e);
		return -ENOMEM;
	}
	*out = e;
	return 0;
}

void engine_destroy(struct engine *e)
{
	if (!e)
		return;
	free(e->x);
	free(e->xb);
	free(e->q);
	free(e->k);
	free(e->v);
	free(e->att);
	free(e->o);
	free(e->gate);
	free(e->up);
	free(e->pos);
	free(e->tok);
	free(e);
}

uint32_t engine_max_rows(const struct engine *e)
{
	return e->max_rows;
}

int engine_set_kv_type(struct engine *e, uint32_t kb_type)
{
	if (kb_type != KB_F16 && kb_type != KB_F32)
		return -ENOTSUP;
	e->kv_type = kb_type;
	return 0;
}

int engine_seq_init(struct engine *e, struct engine_seq *s, uint32_t n_ctx)
{
	const struct model_hparams *hp = &e->m->hp;
	if (n_ctx == 0)
		n_ctx = hp->ctx_len;
	size_t n = (size_t)hp->n_layers * n_ctx * hp->kv_dim;
	memset(s, 0, sizeof(*s));
	size_t elem = e->kv_type == KB_F32 ? sizeof(float) : sizeof(uint16_t);
	s->kv_type = e->kv_type;
	s->k = malloc(n * elem);
	s->v = malloc(n * elem);
	if (!s->k || !s->v) {
		engine_seq_release(s);
		return -ENOMEM;
	}
	s->n_ctx = n_ctx;
	return 0;
}

void engine_seq_release(struct engine_seq *s)
{
	free(s->k);
	free(s->v);
	memset(s, 0, sizeof(*s));
}

/* Check the batch before touching any state: a bad row fails the call, not the daemon. */
static int validate(const struct engine *e, const struct engine_row *rows, uint32_t n)
{
	if (n > e->max_rows)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		const struct engine_row *r = &rows[i];
		if (!r->seq || !r->seq->k)
			return -EINVAL;
		if (r->token >= e->m->hp.vocab)
			return -ERANGE;
		if (r->pos >= r->seq->n_ctx)
			return -ERANGE;
		int first = i == 0 || rows[i - 1].seq != r->seq;
		if (first) {
			if (r->pos > r->seq->n_pos)
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
		size_t elem = s->kv_type == KB_F32 ? sizeof(float) : sizeof(uint16_t);
		size_t layer_off = (size_t)l * s->n_ctx * hp->kv_dim * elem;
		struct kb_kv_view kv = { .k = (uint8_t *)s->k + layer_off,
					 .v = (uint8_t *)s->v + layer_off,
					 .n_ctx = s->n_ctx, .type = s->kv_type };
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
	for (uint32_t i = 0; i < n; i++) {
		e->pos[i] = rows[i].pos;
		e->tok[i] = rows[i].token;
	}
	TRY(op->get_rows(e->be, e->x, &e->m->tok_embd, e->tok, n));
	for (uint32_t l = 0; l < hp->n_layers; l++)
		TRY(forward_layer(e, l, rows, n));

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
	for (uint32_t i = 0; i < n; i++) {
		struct engine_seq *s = rows[i].seq;
		s->n_pos = rows[i].pos + 1;
	}
	if (nw == 0)
		return 0;
	TRY(op->rmsnorm(e->be, e->xb, e->x, e->m->output_norm, nw, hp->dim, hp->norm_eps));
	return op->matmul(e->be, logits, &e->m->output, e->xb, nw);
}
