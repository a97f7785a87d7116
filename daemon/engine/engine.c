/* engine.c — the one forward pass of every architecture (model.h): prefill and decode are the same pass over a batch of rows. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/engine/engine.h"
#include "daemon/log.h"
#include "daemon/model/model.h"
#include "kernels/backend.h"

/*
 * Activation scratch lives in one backend buffer sized for the rows of the
 * current step: a long prefill grows it, and on the CPU it shrinks back to
 * KEEP_ROWS rows afterwards, so decode runs on a few kilobytes and the big
 * buffer goes back to the system (a device keeps what it reserved).
 */
#define KEEP_ROWS 16
#define MAX_IMPORTS 4

struct engine {
	struct model *m;
	struct backend *be;
	struct kvpool *pool;	/* borrowed */
	uint32_t max_rows;
	uint32_t rows_cap;	/* rows the arena holds now */
	void *arena;		/* backend buffer */
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

	/*
	 * Per-step row metadata, built on the host and uploaded once per step
	 * (on the CPU d_meta is h_meta): pos (n,), tok (n,), tab_off (n,),
	 * tab_len (n,), tiles (n, 2), then the block tables of the step's
	 * sequences, concatenated.
	 */
	uint32_t *h_meta;
	uint32_t *d_meta;
	size_t meta_cap;	/* words */

	float *d_logits;	/* (logits_cap, vocab) backend buffer; NULL until needed */
	uint32_t logits_cap;
	const float *last_logits;	/* where the last step's logits are (backend buffer) */
	uint32_t last_nw;

	/* The weights as backend buffers (the mapping itself on the CPU). */
	struct model_layer *layers;	/* (n_layers,) */
	struct kb_rope rope;		/* the model's, with freq_factors imported */
	struct kb_weight tok_embd;
	struct kb_weight output;
	const float *output_norm;
};

static size_t row_bytes(const struct model_hparams *hp)
{
	size_t qd = (size_t)hp->n_heads * hp->head_dim;
	return (3 * (size_t)hp->dim + 2 * qd + 2 * (size_t)hp->kv_dim + 2 * (size_t)hp->ffn_dim) *
		       sizeof(float);
}

/* Make the arena hold exactly rows rows (contents are not kept). */
static int arena_resize(struct engine *e, uint32_t rows)
{
	const struct model_hparams *hp = &e->m->hp;
	size_t r = rows, qd = (size_t)hp->n_heads * hp->head_dim;
	size_t bytes = r * row_bytes(hp);
	void *a;
	int rc = e->be->ops->buf_alloc(e->be, &a, bytes);
	if (rc)
		return rc;
	if (e->arena)
		e->be->ops->buf_free(e->be, e->arena);
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
	e->up = f;
	return 0;
}

/* ---- weights as backend buffers ---- */

static int import_weight(struct engine *e, struct kb_weight *dst, const struct kb_weight *src)
{
	*dst = *src;
	return e->be->ops->import(e->be, &dst->data, src->data, (size_t)src->rows * src->row_bytes);
}

/* An F32 vector of n (norms, biases, frequency factors); NULL stays NULL. */
static int import_vec(struct engine *e, const float **dst, const float *src, uint32_t n)
{
	const void *p;
	if (!src) {
		*dst = NULL;
		return 0;
	}
	int rc = e->be->ops->import(e->be, &p, src, (size_t)n * sizeof(float));
	*dst = rc ? NULL : p;
	return rc;
}

static int import_norm(struct engine *e, const float **dst, const float *src)
{
	return import_vec(e, dst, src, e->m->hp.dim);
}

static void unimport(struct engine *e, const void *p)
{
	if (p)
		e->be->ops->unimport(e->be, p);
}

static void weights_release(struct engine *e)
{
	if (!e->layers)
		return;
	for (uint32_t l = 0; l < e->m->hp.n_layers; l++) {
		struct model_layer *L = &e->layers[l];
		unimport(e, L->attn_norm);
		unimport(e, L->wq.data);
		unimport(e, L->wk.data);
		unimport(e, L->wv.data);
		unimport(e, L->bq);
		unimport(e, L->bk);
		unimport(e, L->bv);
		unimport(e, L->wo.data);
		unimport(e, L->post_attn_norm);
		unimport(e, L->ffn_norm);
		unimport(e, L->w_gate.data);
		unimport(e, L->w_up.data);
		unimport(e, L->w_down.data);
		unimport(e, L->post_ffn_norm);
	}
	unimport(e, e->rope.freq_factors);
	unimport(e, e->tok_embd.data);
	if (e->output.data != e->tok_embd.data)
		unimport(e, e->output.data);
	unimport(e, e->output_norm);
	free(e->layers);
	e->layers = NULL;
}

/* One layer's weights; the views of a fused weight each import their own rows. */
static int layer_import(struct engine *e, struct model_layer *L, const struct model_layer *S)
{
	const struct model_hparams *hp = &e->m->hp;
	int rc;
	L->window = S->window;
	if ((rc = import_norm(e, &L->attn_norm, S->attn_norm)) ||
	    (rc = import_weight(e, &L->wq, &S->wq)) ||
	    (rc = import_weight(e, &L->wk, &S->wk)) ||
	    (rc = import_weight(e, &L->wv, &S->wv)) ||
	    (rc = import_vec(e, &L->bq, S->bq, hp->q_dim)) ||
	    (rc = import_vec(e, &L->bk, S->bk, hp->kv_dim)) ||
	    (rc = import_vec(e, &L->bv, S->bv, hp->kv_dim)) ||
	    (rc = import_weight(e, &L->wo, &S->wo)) ||
	    (rc = import_norm(e, &L->post_attn_norm, S->post_attn_norm)) ||
	    (rc = import_norm(e, &L->ffn_norm, S->ffn_norm)) ||
	    (rc = import_weight(e, &L->w_gate, &S->w_gate)) ||
	    (rc = import_weight(e, &L->w_up, &S->w_up)) ||
	    (rc = import_weight(e, &L->w_down, &S->w_down)))
		return rc;
	return import_norm(e, &L->post_ffn_norm, S->post_ffn_norm);
}

/* Weights go to the backend once, in their GGUF block formats; a tied LM head shares the embedding. */
static int weights_import(struct engine *e)
{
	const struct model *m = e->m;
	e->layers = calloc(m->hp.n_layers, sizeof(*e->layers));
	if (!e->layers)
		return -ENOMEM;
	e->rope = m->rope;
	int rc = import_vec(e, &e->rope.freq_factors, m->rope.h_freq_factors, m->hp.rot_dim / 2);
	if (!rc)
		rc = import_weight(e, &e->tok_embd, &m->tok_embd);
	if (!rc && m->output.data == m->tok_embd.data) {
		e->output = m->output;
		e->output.data = e->tok_embd.data;
	} else if (!rc) {
		rc = import_weight(e, &e->output, &m->output);
	}
	if (!rc)
		rc = import_norm(e, &e->output_norm, m->output_norm);
	for (uint32_t l = 0; !rc && l < m->hp.n_layers; l++)
		rc = layer_import(e, &e->layers[l], &m->layers[l]);
	return rc;
}

int engine_supports(const struct model *m, const struct backend *be, char *err, size_t errlen)
{
	const struct model_hparams *hp = &m->hp;
	const struct backend_ops *op = be->ops;
	const char *need = NULL;
	if (hp->qkv_bias && !op->add_bias)
		need = "add_bias (Q/K/V biases)";
	else if (hp->embd_scale != 0.0f && !op->scale)
		need = "scale (embedding scale)";
	else if (hp->act == MODEL_ACT_GELU && !op->geglu)
		need = "geglu (GELU-gated FFN)";
	else if (hp->final_softcap != 0.0f && !op->softcap)
		need = "softcap (final logit soft-capping)";
	else if (hp->attn_softcap != 0.0f && !op->scale)
		need = "scale (Q before soft-capped attention)";
	if (!need)
		return 0;
	return log_errf(err, errlen, -ENOTSUP,
			"backend '%s' has no %s operation, which architecture '%s' needs", op->name,
			need, hp->arch);
}

int engine_create(struct engine **out, struct model *m, struct backend *be,
		  struct kvpool *pool, uint32_t max_rows)
{
	const struct kvpool_config *pc = kvpool_config(pool);
	if (max_rows == 0 || pc->n_layers != m->hp.n_layers || pc->kv_dim != m->hp.kv_dim)
		return -EINVAL;
	/* The blocks must be where the backend computes: host memory, or this device's. */
	if (be->host_mem ? kvpool_backend(pool) != NULL : kvpool_backend(pool) != be)
		return -EINVAL;
	char why[160];
	int rc = engine_supports(m, be, why, sizeof(why));
	if (rc) {
		log_msg(LOG_ERR, "%s", why);
		return rc;
	}
	struct engine *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->m = m;
	e->be = be;
	e->pool = pool;
	e->max_rows = max_rows;
	rc = weights_import(e);
	if (!rc)
		rc = arena_resize(e, max_rows < KEEP_ROWS ? max_rows : KEEP_ROWS);
	if (rc) {
		engine_destroy(e);
		return rc;
	}
	*out = e;
	return 0;
}

static void meta_free(struct engine *e)
{
	if (e->d_meta && e->d_meta != e->h_meta)
		e->be->ops->buf_free(e->be, e->d_meta);
	free(e->h_meta);
	e->h_meta = e->d_meta = NULL;
	e->meta_cap = 0;
}

void engine_destroy(struct engine *e)
{
	if (!e)
		return;
	if (e->arena)
		e->be->ops->buf_free(e->be, e->arena);
	if (e->d_logits)
		e->be->ops->buf_free(e->be, e->d_logits);
	meta_free(e);
	weights_release(e);
	free(e);
}

uint32_t engine_max_rows(const struct engine *e)
{
	return e->max_rows;
}

const struct model *engine_model(const struct engine *e)
{
	return e->m;
}

uint32_t engine_pool_block_tokens(const struct engine *e)
{
	return kvpool_config(e->pool)->block_tokens;
}

uint32_t engine_pool_blocks(const struct engine *e)
{
	return kvpool_config(e->pool)->n_blocks;
}

void engine_pool_stats(const struct engine *e, struct kvpool_stats *out)
{
	kvpool_get_stats(e->pool, out);
}

int engine_pool_check(const struct engine *e, const struct kvseq *const *seqs, size_t n, char *err,
		      size_t errlen)
{
	return kvpool_check(e->pool, seqs, n, err, errlen);
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

int engine_seq_prepare(struct engine *e, struct engine_seq *s, uint32_t from, uint32_t to)
{
	return kvseq_prepare(e->pool, &s->kv, from, to);
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

/* One step's rows as the backend sees them: metadata arrays and each row's K/V. */
struct step {
	uint32_t n;
	uint32_t nw;		/* rows that want logits */
	const uint32_t *pos;	/* (n,) backend buffer */
	const uint32_t *tok;	/* (n,) backend buffer */
	struct kb_kv_rows kv;	/* geo.k_off / v_off set per layer */
};

/* Attention sub-layer: x's normed copy xb in, the residual added and the FFN's input normed into xb out. */
static int forward_attn(struct engine *e, uint32_t l, struct step *st)
{
	const struct model_hparams *hp = &e->m->hp;
	const struct model_layer *L = &e->layers[l];
	const struct backend_ops *op = e->be->ops;
	struct backend *be = e->be;
	const uint32_t n = st->n;

	float *const qkv_out[3] = { e->q, e->k, e->v };
	const struct kb_weight *const qkv[3] = { &L->wq, &L->wk, &L->wv };
	TRY(op->matmul_multi(be, qkv_out, qkv, 3, e->xb, n));
	if (L->bq)
		TRY(op->add_bias(be, e->q, L->bq, n, hp->q_dim));
	if (L->bk)
		TRY(op->add_bias(be, e->k, L->bk, n, hp->kv_dim));
	if (L->bv)
		TRY(op->add_bias(be, e->v, L->bv, n, hp->kv_dim));
	TRY(op->rope(be, e->q, st->pos, n, hp->n_heads, hp->head_dim, &e->rope));
	TRY(op->rope(be, e->k, st->pos, n, hp->n_kv_heads, hp->head_dim, &e->rope));

	struct kb_attn_shape shape = {
		.n_heads = hp->n_heads, .n_kv_heads = hp->n_kv_heads, .head_dim = hp->head_dim,
		.scale = hp->attn_scale, .softcap = hp->attn_softcap, .window = L->window,
	};
	/*
	 * Where llama.cpp scales Q before attention, so do we: the soft-cap
	 * then sees scaled scores (Gemma 2), and an f16 cache's rounding of Q
	 * happens after the scale. Without a scale op (only where no cap needs
	 * it) the attention applies the same factor.
	 */
	if (hp->q_prescale && op->scale) {
		TRY(op->scale(be, e->q, hp->attn_scale, n, hp->q_dim));
		shape.scale = 1.0f;
	}
	const size_t row = st->kv.geo.row_bytes, bt = st->kv.geo.block_tokens;
	st->kv.geo.k_off = (size_t)l * 2 * bt * row;
	st->kv.geo.v_off = ((size_t)l * 2 + 1) * bt * row;
	/* K (after RoPE) and V go into each row's sequence; Q is never cached. */
	TRY(op->write_kv_rows(be, &st->kv, st->pos, n, hp->kv_dim, e->k, e->v));
	TRY(op->attention_rows(be, e->att, e->q, &st->kv, st->pos, n, &shape));
	TRY(op->matmul(be, e->o, &L->wo, e->att, n));
	if (L->post_attn_norm)
		TRY(op->rmsnorm(be, e->o, e->o, L->post_attn_norm, n, hp->dim, hp->norm_eps));
	return op->add_rmsnorm(be, e->xb, e->x, e->o, L->ffn_norm, n, hp->dim, hp->norm_eps);
}

static int forward_layer(struct engine *e, uint32_t l, struct step *st)
{
	const struct model_hparams *hp = &e->m->hp;
	const struct model_layer *L = &e->layers[l];
	const struct backend_ops *op = e->be->ops;
	struct backend *be = e->be;
	const uint32_t n = st->n;

	/* Layer 0 norms the embeddings; every later layer's input norm came fused with the residual add. */
	if (l == 0)
		TRY(op->rmsnorm(be, e->xb, e->x, L->attn_norm, n, hp->dim, hp->norm_eps));
	TRY(forward_attn(e, l, st));

	float *const gu_out[2] = { e->gate, e->up };
	const struct kb_weight *const gu[2] = { &L->w_gate, &L->w_up };
	TRY(op->matmul_multi(be, gu_out, gu, 2, e->xb, n));
	if (hp->act == MODEL_ACT_GELU)
		TRY(op->geglu(be, e->gate, e->gate, e->up, n, hp->ffn_dim));
	else
		TRY(op->swiglu(be, e->gate, e->gate, e->up, n, hp->ffn_dim));
	TRY(op->matmul(be, e->o, &L->w_down, e->gate, n));
	if (L->post_ffn_norm)
		TRY(op->rmsnorm(be, e->o, e->o, L->post_ffn_norm, n, hp->dim, hp->norm_eps));
	if (l + 1 < hp->n_layers)
		TRY(op->add_rmsnorm(be, e->xb, e->x, e->o, e->layers[l + 1].attn_norm, n, hp->dim,
				    hp->norm_eps));
	else
		TRY(op->add(be, e->x, e->o, n, hp->dim));
	return 0;
}

/* Every backend operation of one step, embeddings to logits (into out, (nw, vocab)). */
static int forward_ops(struct engine *e, const struct engine_row *rows, struct step *st,
		       float *out)
{
	const struct model_hparams *hp = &e->m->hp;
	const struct backend_ops *op = e->be->ops;
	TRY(op->get_rows(e->be, e->x, &e->tok_embd, st->tok, st->n));
	if (hp->embd_scale != 0.0f)
		TRY(op->scale(e->be, e->x, hp->embd_scale, st->n, hp->dim));
	for (uint32_t l = 0; l < hp->n_layers; l++)
		TRY(forward_layer(e, l, st));
	if (!st->nw)
		return 0;
	/* Only rows that want logits pay for the LM head (in prefill, just the last). */
	uint32_t nw = 0;
	for (uint32_t i = 0; i < st->n; i++) {
		if (!rows[i].want_logits)
			continue;
		if (nw != i)
			TRY(op->copy(e->be, e->x + (size_t)nw * hp->dim, e->x + (size_t)i * hp->dim,
				     hp->dim * sizeof(float)));
		nw++;
	}
	TRY(op->rmsnorm(e->be, e->xb, e->x, e->output_norm, nw, hp->dim, hp->norm_eps));
	TRY(op->matmul(e->be, out, &e->output, e->xb, nw));
	return hp->final_softcap != 0.0f ? op->softcap(e->be, out, hp->final_softcap, nw, hp->vocab)
					 : 0;
}

/*
 * Lay out the step's metadata (see struct engine) and hand it to the
 * backend in one upload. Blocks must already be prepared.
 */
static int step_meta(struct engine *e, const struct engine_row *rows, uint32_t n, struct step *st)
{
	const struct kvpool_config *pc = kvpool_config(e->pool);
	size_t tables = 0;
	for (uint32_t i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && rows[j].seq == rows[i].seq; j++)
			;
		tables += rows[i].seq->kv.n_blocks;
	}
	size_t words = 6 * (size_t)n + tables;
	if (words > e->meta_cap) {
		size_t cap = words < 2 * e->meta_cap ? 2 * e->meta_cap : words;
		meta_free(e);
		e->h_meta = malloc(cap * sizeof(uint32_t));
		if (!e->h_meta)
			return -ENOMEM;
		if (e->be->host_mem) {
			e->d_meta = e->h_meta;
		} else {
			void *d;
			int rc = e->be->ops->buf_alloc(e->be, &d, cap * sizeof(uint32_t));
			if (rc) {
				free(e->h_meta);
				e->h_meta = NULL;
				return rc;
			}
			e->d_meta = d;
		}
		e->meta_cap = cap;
	}
	uint32_t *pos = e->h_meta, *tok = pos + n, *off = tok + n, *len = off + n;
	uint32_t *tiles = len + n, *tab = tiles + 2 * (size_t)n, t = 0, n_tiles = 0;
	for (uint32_t i = 0, j; i < n; i = j) {
		const struct kvseq *kv = &rows[i].seq->kv;
		for (j = i + 1; j < n && rows[j].seq == rows[i].seq; j++)
			;
		memcpy(tab + t, kv->blocks, (size_t)kv->n_blocks * sizeof(uint32_t));
		for (uint32_t r = i; r < j; r++) {
			pos[r] = rows[r].pos;
			tok[r] = rows[r].token;
			off[r] = t;
			len[r] = kv->n_blocks;
		}
		for (uint32_t r = i; r < j; r += KB_TILE_ROWS) {
			tiles[2 * n_tiles] = r;
			tiles[2 * n_tiles + 1] = j - r < KB_TILE_ROWS ? j - r : KB_TILE_ROWS;
			n_tiles++;
		}
		t += kv->n_blocks;
	}
	if (!e->be->host_mem)
		TRY(e->be->ops->upload(e->be, e->d_meta, e->h_meta, words * sizeof(uint32_t)));
	const uint32_t *d = e->d_meta;
	size_t row = kvpool_row_bytes(pc->kv_type, pc->kv_dim);
	st->n = n;
	st->pos = d;
	st->tok = d + n;
	st->kv = (struct kb_kv_rows){
		.geo = { .base = kvpool_base(e->pool), .block_tokens = pc->block_tokens,
			 .block_bytes = kvpool_block_bytes(e->pool), .row_bytes = row,
			 .type = pc->kv_type },
		.tables = d + 6 * (size_t)n, .tab_off = d + 2 * (size_t)n,
		.tab_len = d + 3 * (size_t)n, .tiles = d + 4 * (size_t)n,
		.h_tab_off = off, .h_tab_len = len, .h_tiles = tiles, .h_pos = pos,
		.n_tiles = n_tiles,
	};
	return 0;
}

/* Where this step's logits go: the caller's buffer on the CPU, else a backend buffer. */
static int logits_target(struct engine *e, uint32_t nw, float *logits, float **out)
{
	if (e->be->host_mem && logits) {
		*out = logits;
		return 0;
	}
	if (nw > e->logits_cap) {
		void *p;
		uint32_t cap = nw < e->max_rows ? (nw > 2 * e->logits_cap ? nw : 2 * e->logits_cap)
						: e->max_rows;
		cap = cap < nw ? nw : cap;
		TRY(e->be->ops->buf_alloc(e->be, &p, (size_t)cap * e->m->hp.vocab * sizeof(float)));
		if (e->d_logits)
			e->be->ops->buf_free(e->be, e->d_logits);
		e->d_logits = p;
		e->logits_cap = cap;
	}
	*out = e->d_logits;
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
	struct step st;
	TRY(step_meta(e, rows, n, &st));
	st.nw = 0;
	for (uint32_t i = 0; i < n; i++)
		st.nw += rows[i].want_logits != 0;
	float *out = NULL;
	if (st.nw)
		TRY(logits_target(e, st.nw, logits, &out));

	/* A device may record the step and replay it when the same shape comes again. */
	uint64_t key = 1 + ((uint64_t)n | (uint64_t)st.nw << 24 | (uint64_t)st.kv.n_tiles << 48);
	int rc;
	for (int attempt = 0;; attempt++) {
		rc = op->step_begin ? op->step_begin(e->be, attempt ? 0 : key) : 0;
		if (!rc)
			rc = forward_ops(e, rows, &st, out);
		if (op->step_end)
			rc = op->step_end(e->be, rc);
		if (rc != -EAGAIN || attempt)
			break;
	}
	e->last_logits = rc ? NULL : out;
	e->last_nw = rc ? 0 : st.nw;
	if (!rc && logits && out != logits)
		rc = op->download(e->be, logits, out, (size_t)st.nw * hp->vocab * sizeof(float));
	if (rc)
		return rc;
	for (uint32_t i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && rows[j].seq == rows[i].seq; j++)
			;
		TRY(kvseq_commit(e->pool, &rows[i].seq->kv, rows[i].pos, rows[j - 1].pos + 1,
				 e->h_meta + n + i));
	}
	/* Give a prefill's scratch back; failing to shrink just keeps the big arena. */
	if (e->be->host_mem && e->rows_cap > KEEP_ROWS && n <= KEEP_ROWS)
		arena_resize(e, KEEP_ROWS);
	return 0;
}

int engine_argmax(struct engine *e, uint32_t *ids)
{
	if (!e->last_logits)
		return -ENODATA;
	return e->be->ops->argmax(e->be, ids, e->last_logits, e->last_nw, e->m->hp.vocab);
}
