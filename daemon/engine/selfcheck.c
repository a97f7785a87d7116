/* selfcheck.c — a device backend against the CPU backend on the model itself: layer 0 operation by operation, then a short prompt's distributions. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "daemon/engine/engine.h"
#include "daemon/engine/kvpool.h"
#include "daemon/engine/selfcheck.h"
#include "daemon/model/model.h"
#include "daemon/tokenizer/tokenizer.h"
#include "kernels/backend.h"

/*
 * Bounds. Each operation's relative L2 error against the CPU's result:
 * what both compute the same way (lookups, scaling, adds) to f32
 * rounding; norms, RoPE and activations to a few ulps of their
 * transcendental functions; matrix products against the exact product
 * of a sample of the weight's rows (the CPU's own rounds its activations
 * to int8 blocks, about 2e-2), to f16 rounding where a device takes its
 * GEMM path (about 5e-4). Then the distributions of the prompt's positions: KL(CPU ||
 * device), measured about 4e-3 per position on the default model on the
 * CUDA kernels' host simulation. A broken kernel is off by its whole
 * size: the rmsnorm whose seven warps in eight got no sum gave the end of
 * text token first on every prompt.
 */
#define ERR_EXACT 1e-5
#define ERR_ULPS 1e-3
#define ERR_MATMUL 1e-2
#define MM_SAMPLE 64
#define MEAN_KLD 0.05
#define MAX_KLD 0.5
/* An argmax the backends disagree on where the CPU's top two are this far apart is an error. */
#define CLEAR_GAP 1.0f
#define PROMPT_MAX 24
#define PROMPT_MIN 17	/* over 16 rows: the device's GEMM path, not its mat-vec one */
#define DECODE_STEPS 4	/* repeated shapes: a device records and replays the later ones */
#define MAX_ROWS 20
#define MAX_BUFS 48

static const char TEXT[] =
	"The committee met on a cold Tuesday morning to review the bridge, whose old iron "
	"frame had carried trains across the river for more than a hundred years.";

struct sc {
	const struct model *m;
	struct backend *dev, *cpu;
	struct selfcheck_report *r;
	char *why;
	size_t whylen;
	void *bufs[MAX_BUFS];		/* device buffers, freed at the end */
	const void *imps[MAX_BUFS];	/* device imports, undone at the end */
	int n_bufs, n_imps;
	float *tmp;			/* host scratch for downloads */
};

static int say(struct sc *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int say(struct sc *c, int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->why, c->whylen, fmt, ap);
	va_end(ap);
	return rc;
}

static int dev_buf(struct sc *c, void **out, size_t floats)
{
	void *p;
	if (c->n_bufs == MAX_BUFS)
		return -ENOMEM;
	int rc = c->dev->ops->buf_alloc(c->dev, &p, floats * sizeof(float));
	if (rc)
		return say(c, rc, "cannot allocate %zu bytes on the %s backend", floats * sizeof(float),
			   c->dev->ops->name);
	c->bufs[c->n_bufs++] = p;
	*out = p;
	return 0;
}

/* A device copy of bytes of host memory h. */
static int dev_copy(struct sc *c, void **out, const void *h, size_t bytes)
{
	int rc = dev_buf(c, out, (bytes + 3) / 4);
	if (!rc)
		rc = c->dev->ops->upload(c->dev, *out, h, bytes);
	return rc ? say(c, rc, "upload to the %s backend failed", c->dev->ops->name) : 0;
}

static int dev_import(struct sc *c, const void **out, const void *h, size_t bytes)
{
	*out = NULL;
	if (!h)
		return 0;
	if (c->n_imps == MAX_BUFS)
		return -ENOMEM;
	int rc = c->dev->ops->import(c->dev, out, h, bytes);
	if (rc)
		return say(c, rc, "cannot import %zu bytes of weights to the %s backend", bytes,
			   c->dev->ops->name);
	c->imps[c->n_imps++] = *out;
	return 0;
}

static int dev_weight(struct sc *c, struct kb_weight *out, const struct kb_weight *w)
{
	*out = *w;
	return dev_import(c, &out->data, w->data, (size_t)w->rows * w->row_bytes);
}

static void release(struct sc *c)
{
	for (int i = 0; i < c->n_bufs; i++)
		c->dev->ops->buf_free(c->dev, c->bufs[i]);
	for (int i = 0; i < c->n_imps; i++)
		c->dev->ops->unimport(c->dev, c->imps[i]);
	c->n_bufs = c->n_imps = 0;
}

/* got (count,) against want: -EPROTO past bound (relative L2 error). */
static int judge_host(struct sc *c, const char *op, uint32_t n, const float *got,
		      const float *want, size_t count, double bound)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < count; i++) {
		double e = (double)got[i] - want[i];
		num += e * e;
		den += (double)want[i] * want[i];
	}
	double err = den > 0 ? sqrt(num / den) : sqrt(num);
	if (!(err <= bound))	/* NaN fails too */
		return say(c, -EPROTO, "%s (layer 0, %u rows) differs from the CPU backend: relative error %.3g, bound %.0e",
			   op, n, err, bound);
	if (err / bound > c->r->worst_err || !c->r->worst_op[0]) {
		c->r->worst_err = err / bound;
		snprintf(c->r->worst_op, sizeof(c->r->worst_op), "%s (%u rows)", op, n);
	}
	return 0;
}

/* The device's d (count,) against the CPU's want. */
static int judge(struct sc *c, const char *op, uint32_t n, const float *d, const float *want,
		 size_t count, double bound)
{
	int rc = c->dev->ops->download(c->dev, c->tmp, d, count * sizeof(float));
	if (rc)
		return say(c, rc, "%s: download from the %s backend failed", op, c->dev->ops->name);
	return judge_host(c, op, n, c->tmp, want, count, bound);
}

/*
 * A matrix product judged against the exact one, not the CPU's (which
 * rounds its activations to int8): MM_SAMPLE of W's rows, spread over it,
 * decoded to f32 by the CPU's get_rows and dotted with x (n, cols) in
 * double; d is the device's y (n, W.rows).
 */
static int judge_matmul(struct sc *c, const char *op, uint32_t n, const float *d,
			const struct kb_weight *w, const float *x)
{
	const uint32_t s = w->rows < MM_SAMPLE ? w->rows : MM_SAMPLE;
	uint32_t ids[MM_SAMPLE];
	for (uint32_t j = 0; j < s; j++)
		ids[j] = (uint32_t)((uint64_t)j * w->rows / s);
	float *wr = malloc((size_t)s * w->cols * sizeof(float));
	float *y = malloc((size_t)n * w->rows * sizeof(float));
	float *got = malloc((size_t)n * s * sizeof(float)), *want = malloc((size_t)n * s * sizeof(float));
	int rc = wr && y && got && want ? 0 : say(c, -ENOMEM, "no memory for the check");
	if (!rc && (rc = c->cpu->ops->get_rows(c->cpu, wr, w, ids, s)))
		say(c, rc, "%s: the CPU backend cannot decode the weight: %s", op, strerror(-rc));
	if (!rc && (rc = c->dev->ops->download(c->dev, y, d, (size_t)n * w->rows * sizeof(float))))
		say(c, rc, "%s: download from the %s backend failed", op, c->dev->ops->name);
	for (uint32_t i = 0; !rc && i < n; i++)
		for (uint32_t j = 0; j < s; j++) {
			const float *a = x + (size_t)i * w->cols, *b = wr + (size_t)j * w->cols;
			double t = 0;
			for (uint32_t k = 0; k < w->cols; k++)
				t += (double)a[k] * b[k];
			want[(size_t)i * s + j] = (float)t;
			got[(size_t)i * s + j] = y[(size_t)i * w->rows + ids[j]];
		}
	if (!rc)
		rc = judge_host(c, op, n, got, want, (size_t)n * s, ERR_MATMUL);
	free(wr);
	free(y);
	free(got);
	free(want);
	return rc;
}

/* A backend call that must succeed: its error says which operation refused. */
#define RUN(side, call)                                                                      \
	do {                                                                                 \
		int rc_ = (call);                                                            \
		if (rc_)                                                                     \
			return say(c, rc_, "%s on the %s backend: %s", #call, (side)->ops->name, \
				   strerror(-rc_));                                          \
	} while (0)
#define TRY(call)                  \
	do {                       \
		int rc_ = (call);  \
		if (rc_)           \
			return rc_; \
	} while (0)

/* Host activations of layer 0, (n, width) each. */
struct acts {
	float *x, *xb, *q, *k, *v, *o, *g, *u;
};

/*
 * Layer 0 for n rows, each operation on the CPU (host buffers, the model's
 * own weights) and on the device (its copies, inputs uploaded from the
 * CPU's), judged one by one. Attention is left to the prompt below.
 */
static int layer0(struct sc *c, uint32_t n, struct acts *a)
{
	const struct model_hparams *hp = &c->m->hp;
	const struct model_layer *L = &c->m->layers[0];
	const struct backend_ops *C = c->cpu->ops, *D = c->dev->ops;
	struct backend *cb = c->cpu, *db = c->dev;
	const size_t nd = (size_t)n * hp->dim, nq = (size_t)n * hp->q_dim;
	const size_t nkv = (size_t)n * hp->kv_dim, nf = (size_t)n * hp->ffn_dim;
	uint32_t ids[MAX_ROWS], pos[MAX_ROWS];
	for (uint32_t i = 0; i < n; i++) {
		ids[i] = (uint32_t)(((uint64_t)i * 7919u + 11u) % hp->vocab);
		pos[i] = (uint32_t)(((uint64_t)i * 37u) % hp->ctx_len);
	}
	void *d_in, *d_out, *d_a, *d_b, *d_c, *d_ids, *d_pos;
	const void *dn, *dn2, *ff;
	struct kb_weight w[3];

	TRY(dev_copy(c, &d_ids, ids, n * sizeof(uint32_t)));
	TRY(dev_copy(c, &d_pos, pos, n * sizeof(uint32_t)));
	TRY(dev_weight(c, &w[0], &c->m->tok_embd));
	RUN(cb, C->get_rows(cb, a->x, &c->m->tok_embd, ids, n));
	TRY(dev_buf(c, &d_out, nd));
	RUN(db, D->get_rows(db, d_out, &w[0], d_ids, n));
	TRY(judge(c, "get_rows (token embedding)", n, d_out, a->x, nd, ERR_EXACT));
	if (hp->embd_scale != 0.0f) {
		TRY(dev_copy(c, &d_in, a->x, nd * 4));
		RUN(cb, C->scale(cb, a->x, hp->embd_scale, n, hp->dim));
		RUN(db, D->scale(db, d_in, hp->embd_scale, n, hp->dim));
		TRY(judge(c, "scale (embedding)", n, d_in, a->x, nd, ERR_EXACT));
	}

	TRY(dev_import(c, &dn, L->attn_norm, hp->dim * 4));
	TRY(dev_copy(c, &d_in, a->x, nd * 4));
	RUN(cb, C->rmsnorm(cb, a->xb, a->x, L->attn_norm, n, hp->dim, hp->norm_eps));
	RUN(db, D->rmsnorm(db, d_out, d_in, dn, n, hp->dim, hp->norm_eps));
	TRY(judge(c, "rmsnorm (attn_norm)", n, d_out, a->xb, nd, ERR_ULPS));

	/* Q, K, V in one call, as the engine makes it. */
	TRY(dev_weight(c, &w[0], &L->wq));
	TRY(dev_weight(c, &w[1], &L->wk));
	TRY(dev_weight(c, &w[2], &L->wv));
	TRY(dev_copy(c, &d_in, a->xb, nd * 4));
	TRY(dev_buf(c, &d_a, nq));
	TRY(dev_buf(c, &d_b, nkv));
	TRY(dev_buf(c, &d_c, nkv));
	{
		float *const hy[3] = { a->q, a->k, a->v }, *const dy[3] = { d_a, d_b, d_c };
		const struct kb_weight *const hw[3] = { &L->wq, &L->wk, &L->wv };
		const struct kb_weight *const dw[3] = { &w[0], &w[1], &w[2] };
		RUN(cb, C->matmul_multi(cb, hy, hw, 3, a->xb, n));
		RUN(db, D->matmul_multi(db, dy, dw, 3, d_in, n));
	}
	TRY(judge_matmul(c, "matmul (attn_q)", n, d_a, &L->wq, a->xb));
	TRY(judge_matmul(c, "matmul (attn_k)", n, d_b, &L->wk, a->xb));
	TRY(judge_matmul(c, "matmul (attn_v)", n, d_c, &L->wv, a->xb));
	const float *const bias[2] = { L->bq, L->bk };
	float *const hb[2] = { a->q, a->k };
	const uint32_t bw[2] = { hp->q_dim, hp->kv_dim };
	for (int i = 0; i < 2; i++) {
		if (!bias[i])
			continue;
		TRY(dev_import(c, &dn2, bias[i], bw[i] * 4));
		TRY(dev_copy(c, &d_in, hb[i], (size_t)n * bw[i] * 4));
		RUN(cb, C->add_bias(cb, hb[i], bias[i], n, bw[i]));
		RUN(db, D->add_bias(db, d_in, dn2, n, bw[i]));
		TRY(judge(c, i ? "add_bias (attn_k)" : "add_bias (attn_q)", n, d_in, hb[i],
			  (size_t)n * bw[i], ERR_EXACT));
	}

	/* RoPE: the engine's rotation, its factors on the device. */
	struct kb_rope rope = c->m->rope;
	TRY(dev_import(c, &ff, c->m->rope.h_freq_factors, hp->rot_dim / 2 * 4));
	rope.freq_factors = ff;
	struct kb_rope hrope = c->m->rope;
	hrope.freq_factors = c->m->rope.h_freq_factors;
	TRY(dev_copy(c, &d_in, a->q, nq * 4));
	RUN(cb, C->rope(cb, a->q, pos, n, hp->n_heads, hp->head_dim, &hrope));
	RUN(db, D->rope(db, d_in, d_pos, n, hp->n_heads, hp->head_dim, &rope));
	TRY(judge(c, "rope (Q)", n, d_in, a->q, nq, ERR_ULPS));
	TRY(dev_copy(c, &d_in, a->k, nkv * 4));
	RUN(cb, C->rope(cb, a->k, pos, n, hp->n_kv_heads, hp->head_dim, &hrope));
	RUN(db, D->rope(db, d_in, d_pos, n, hp->n_kv_heads, hp->head_dim, &rope));
	TRY(judge(c, "rope (K)", n, d_in, a->k, nkv, ERR_ULPS));

	/* The output projection, on Q standing in for attention's output (same shape). */
	TRY(dev_weight(c, &w[0], &L->wo));
	TRY(dev_copy(c, &d_in, a->q, nq * 4));
	RUN(cb, C->matmul(cb, a->o, &L->wo, a->q, n));
	RUN(db, D->matmul(db, d_out, &w[0], d_in, n));
	TRY(judge_matmul(c, "matmul (attn_output)", n, d_out, &L->wo, a->q));

	/* The residual add fused with the FFN's norm: both outputs. */
	TRY(dev_import(c, &dn, L->ffn_norm, hp->dim * 4));
	TRY(dev_copy(c, &d_in, a->x, nd * 4));
	TRY(dev_copy(c, &d_a, a->o, nd * 4));
	RUN(cb, C->add_rmsnorm(cb, a->xb, a->x, a->o, L->ffn_norm, n, hp->dim, hp->norm_eps));
	RUN(db, D->add_rmsnorm(db, d_out, d_in, d_a, dn, n, hp->dim, hp->norm_eps));
	TRY(judge(c, "add_rmsnorm (residual)", n, d_in, a->x, nd, ERR_EXACT));
	TRY(judge(c, "add_rmsnorm (ffn_norm)", n, d_out, a->xb, nd, ERR_ULPS));

	TRY(dev_weight(c, &w[0], &L->w_gate));
	TRY(dev_weight(c, &w[1], &L->w_up));
	TRY(dev_copy(c, &d_in, a->xb, nd * 4));
	TRY(dev_buf(c, &d_a, nf));
	TRY(dev_buf(c, &d_b, nf));
	{
		float *const hy[2] = { a->g, a->u }, *const dy[2] = { d_a, d_b };
		const struct kb_weight *const hw[2] = { &L->w_gate, &L->w_up };
		const struct kb_weight *const dw[2] = { &w[0], &w[1] };
		RUN(cb, C->matmul_multi(cb, hy, hw, 2, a->xb, n));
		RUN(db, D->matmul_multi(db, dy, dw, 2, d_in, n));
	}
	TRY(judge_matmul(c, "matmul (ffn_gate)", n, d_a, &L->w_gate, a->xb));
	TRY(judge_matmul(c, "matmul (ffn_up)", n, d_b, &L->w_up, a->xb));
	TRY(dev_copy(c, &d_a, a->g, nf * 4));
	TRY(dev_copy(c, &d_b, a->u, nf * 4));
	if (hp->act == MODEL_ACT_GELU) {
		RUN(cb, C->geglu(cb, a->g, a->g, a->u, n, hp->ffn_dim));
		RUN(db, D->geglu(db, d_a, d_a, d_b, n, hp->ffn_dim));
		TRY(judge(c, "geglu", n, d_a, a->g, nf, ERR_ULPS));
	} else {
		RUN(cb, C->swiglu(cb, a->g, a->g, a->u, n, hp->ffn_dim));
		RUN(db, D->swiglu(db, d_a, d_a, d_b, n, hp->ffn_dim));
		TRY(judge(c, "swiglu", n, d_a, a->g, nf, ERR_ULPS));
	}
	TRY(dev_weight(c, &w[0], &L->w_down));
	TRY(dev_copy(c, &d_in, a->g, nf * 4));
	RUN(cb, C->matmul(cb, a->o, &L->w_down, a->g, n));
	RUN(db, D->matmul(db, d_out, &w[0], d_in, n));
	return judge_matmul(c, "matmul (ffn_down)", n, d_out, &L->w_down, a->g);
}

/* The check prompt: TEXT through the model's tokenizer, else (or to reach PROMPT_MIN) spread ids. */
static uint32_t prompt_ids(const struct model *m, uint32_t *ids)
{
	struct tokenizer *t;
	char err[128];
	int n = 0;
	if (!tokenizer_for_model(&t, m, err, sizeof(err))) {
		n = tokenizer_encode(t, TEXT, sizeof(TEXT) - 1, tokenizer_add_bos(t), 0, ids, PROMPT_MAX);
		tokenizer_destroy(t);
	}
	if (n < 0)
		n = 0;
	if (n > PROMPT_MAX)
		n = PROMPT_MAX;
	for (; n < PROMPT_MIN; n++)
		ids[n] = (uint32_t)(((uint64_t)n * 7919u + 11u) % m->hp.vocab);
	return (uint32_t)n;
}

/* Top-1 minus top-2 of l (n,), and the top-1's index. */
static float top2_gap(const float *l, uint32_t n, uint32_t *top)
{
	float a = -INFINITY, b = -INFINITY;
	*top = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (l[i] > a) {
			b = a;
			a = l[i];
			*top = i;
		} else if (l[i] > b) {
			b = l[i];
		}
	}
	return a - b;
}

/* KL(p || q) of two rows of logits through log-softmax in double. */
static double kld(const float *p, const float *q, uint32_t n)
{
	double mp = p[0], mq = q[0], sp = 0, sq = 0, k = 0;
	for (uint32_t i = 1; i < n; i++) {
		mp = p[i] > mp ? p[i] : mp;
		mq = q[i] > mq ? q[i] : mq;
	}
	for (uint32_t i = 0; i < n; i++) {
		sp += exp(p[i] - mp);
		sq += exp(q[i] - mq);
	}
	double lp0 = mp + log(sp), lq0 = mq + log(sq);
	for (uint32_t i = 0; i < n; i++) {
		double lp = p[i] - lp0;
		k += exp(lp) * (lp - (q[i] - lq0));
	}
	return k;
}

/* Position rows (n,) of both sides' logits compared; the CPU's argmax of the last into *next. */
static void compare(struct sc *c, const float *lc, const float *ld, uint32_t n, uint32_t *next)
{
	const uint32_t vocab = c->m->hp.vocab;
	for (uint32_t i = 0; i < n; i++) {
		const float *p = lc + (size_t)i * vocab, *q = ld + (size_t)i * vocab;
		uint32_t tc, td;
		float gap = top2_gap(p, vocab, &tc);
		top2_gap(q, vocab, &td);
		double k = kld(p, q, vocab);
		if (!(k >= -1e-9))	/* NaN logits count as the worst divergence */
			k = INFINITY;
		c->r->mean_kld += k;
		c->r->max_kld = k > c->r->max_kld ? k : c->r->max_kld;
		c->r->clear_misses += tc != td && gap > CLEAR_GAP;
		c->r->positions++;
		*next = tc;
	}
}

struct side {
	struct kvpool *pool;
	struct engine *e;
	struct engine_seq seq;
};

static int side_open(struct sc *c, struct side *s, struct backend *be, uint32_t kv_type)
{
	struct kvpool_config pc = { .n_blocks = (PROMPT_MAX + DECODE_STEPS + 15) / 16 + 1,
				    .block_tokens = 16, .n_layers = c->m->hp.n_layers,
				    .kv_dim = c->m->hp.kv_dim, .kv_type = kv_type };
	int rc = kvpool_create_on(&s->pool, &pc, be);
	if (rc)
		return say(c, rc, "cannot reserve a KV pool on the %s backend: %s", be->ops->name,
			   strerror(-rc));
	rc = engine_create(&s->e, (struct model *)c->m, be, s->pool, PROMPT_MAX);
	if (rc)
		return say(c, rc, "cannot set the model up on the %s backend: %s", be->ops->name,
			   strerror(-rc));
	engine_seq_init(s->e, &s->seq, 0);
	return 0;
}

static void side_close(struct side *s)
{
	if (s->e) {
		engine_seq_release(s->e, &s->seq);
		engine_destroy(s->e);
	}
	if (s->pool)
		kvpool_destroy(s->pool);
}

static int forward(struct sc *c, struct side *s, struct backend *be, const struct engine_row *rows,
		   uint32_t n, float *logits, const char *what)
{
	int rc = engine_forward(s->e, rows, n, logits);
	if (rc)
		return say(c, rc, "the check prompt's %s failed on the %s backend: %s%s", what,
			   be->ops->name, strerror(-rc),
			   rc == -EINVAL || rc == -ENOTSUP ? " (an operation does not take this model's shapes)" : "");
	return 0;
}

/* The prompt's prefill (every position's distribution), then DECODE_STEPS steps on the CPU's tokens. */
static int prompt_check(struct sc *c, uint32_t kv_type)
{
	const uint32_t vocab = c->m->hp.vocab;
	uint32_t ids[PROMPT_MAX], n = prompt_ids(c->m, ids), next = 0;
	struct side sc = { 0 }, sd = { 0 };
	struct engine_row rows[PROMPT_MAX];
	float *lc = malloc((size_t)PROMPT_MAX * vocab * sizeof(float));
	float *ld = malloc((size_t)PROMPT_MAX * vocab * sizeof(float));
	int rc = lc && ld ? 0 : -ENOMEM;
	if (!rc)
		rc = side_open(c, &sc, c->cpu, kv_type);
	if (!rc)
		rc = side_open(c, &sd, c->dev, kv_type);
	for (uint32_t i = 0; !rc && i < n; i++)
		rows[i] = (struct engine_row){ &sc.seq, i, ids[i], 1 };
	if (!rc)
		rc = forward(c, &sc, c->cpu, rows, n, lc, "prefill");
	for (uint32_t i = 0; !rc && i < n; i++)
		rows[i].seq = &sd.seq;
	if (!rc)
		rc = forward(c, &sd, c->dev, rows, n, ld, "prefill");
	if (!rc)
		compare(c, lc, ld, n, &next);
	for (uint32_t t = 0; !rc && t < DECODE_STEPS; t++) {
		struct engine_row r = { &sc.seq, n + t, next, 1 };
		rc = forward(c, &sc, c->cpu, &r, 1, lc, "decode");
		r.seq = &sd.seq;
		if (!rc)
			rc = forward(c, &sd, c->dev, &r, 1, ld, "decode");
		if (!rc)
			compare(c, lc, ld, 1, &next);
	}
	side_close(&sd);
	side_close(&sc);
	free(lc);
	free(ld);
	if (rc)
		return rc;
	struct selfcheck_report *r = c->r;
	r->mean_kld /= r->positions;
	if (!(r->mean_kld <= MEAN_KLD) || !(r->max_kld <= MAX_KLD) || r->clear_misses)
		return say(c, -EPROTO,
			   "the next-token distributions of a %u-token prompt and %d decode steps differ from the CPU backend's: KL divergence mean %.3g (bound %.2g), max %.3g (bound %.2g); %u top tokens differ where the CPU's top two are over %.1f apart",
			   n, DECODE_STEPS, r->mean_kld, MEAN_KLD, r->max_kld, MAX_KLD, r->clear_misses,
			   (double)CLEAR_GAP);
	return 0;
}

int selfcheck_run(struct model *m, struct backend *dev, struct backend *cpu, uint32_t kv_type,
		  struct selfcheck_report *r, char *why, size_t whylen)
{
	const struct model_hparams *hp = &m->hp;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	memset(r, 0, sizeof(*r));
	snprintf(why, whylen, "no check ran");
	struct sc c = { .m = m, .dev = dev, .cpu = cpu, .r = r, .why = why, .whylen = whylen };
	size_t w = hp->dim > hp->q_dim ? hp->dim : hp->q_dim;
	w = w > hp->ffn_dim ? w : hp->ffn_dim;
	struct acts a;
	float **all[] = { &a.x, &a.xb, &a.q, &a.k, &a.v, &a.o, &a.g, &a.u };
	int rc = 0;
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		if (!(*all[i] = malloc((size_t)MAX_ROWS * w * sizeof(float))))
			rc = -ENOMEM;
	c.tmp = malloc((size_t)MAX_ROWS * w * sizeof(float));
	if (!c.tmp)
		rc = -ENOMEM;
	if (rc)
		say(&c, rc, "no memory for the check");
	/* 3 rows take a device's mat-vec path, 20 its GEMM path. */
	const uint32_t rows[2] = { 3, MAX_ROWS };
	for (int i = 0; !rc && i < 2; i++) {
		rc = layer0(&c, rows[i], &a);
		release(&c);
	}
	if (!rc)
		rc = prompt_check(&c, kv_type);
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		free(*all[i]);
	free(c.tmp);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	r->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
	if (!rc)
		snprintf(why, whylen, "passed");
	return rc;
}
