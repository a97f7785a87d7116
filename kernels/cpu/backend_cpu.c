/* backend_cpu.c — the CPU backend: the vtable, the threaded matmul driver and row-parallel ops. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kernels/backend.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/repack.h"
#include "kernels/cpu/threadpool.h"

/*
 * Everything a cos/sin table depends on, compared bit for bit; the
 * factors' values are compared too (in ff), so a caller may refill one
 * buffer between calls.
 */
struct rope_key {
	uint32_t rot_dim;
	uint32_t has_ff;
	float theta, freq_scale, ext_factor, attn_factor, corr_lo, corr_hi;
};

/* One cos/sin table: positions 0..npos-1 for one set of parameters. */
struct rope_tab {
	struct rope_key key;
	float *ff;		/* (rot_dim / 2,) the factors it was made with, when has_ff */
	float *cs;		/* (npos, rot_dim / 2, 2) */
	uint32_t npos;
	uint64_t used;		/* cpu_backend.rope_clock at the last call that used it */
};

/* Two tables: models whose layers alternate two RoPE settings rebuild neither. */
#define ROPE_TABS 2

struct cpu_backend {
	struct backend base;
	struct threadpool *tp;
	struct blk_q8x *xq;	/* (n, cols / QK) activation blocks of the current matmul */
	size_t xq_cap;		/* blocks */
	struct rp_cache rpc;	/* imported weights and their repacked forms */
	void *rp_tmp;		/* repacked copies of a matmul's weights that were not imported */
	size_t rp_tmp_cap;
	struct rope_tab rope[ROPE_TABS];
	uint64_t rope_clock;	/* stamps rope[].used */
};

#define CPU(b) ((struct cpu_backend *)(b))

/* ---- matmul ---- */

#define MM_MAX_MULTI 4

/* One weight of a (multi) matmul: its output and how its rows are cut into tasks. */
struct mm_part {
	const struct kb_weight *w;
	float *y;			/* (n, w->rows) */
	qgemm_fn gemm;			/* over rp, where this CPU has a kernel */
	qgemm_fn gemm16;		/* two whole groups at once, where it has one */
	const uint8_t *rp;		/* (ceil(rows / 8), rp_group) repacked rows */
	size_t rp_group;		/* bytes of eight repacked rows */
	fdot_fn fdot;
	uint32_t rows_per_task;
	uint32_t task0;			/* first task index of this part */
};

struct mm_job {
	struct mm_part part[MM_MAX_MULTI];
	uint32_t n_parts;
	const float *x;			/* (n, cols) */
	struct blk_q8x *xq;		/* (n, nblk) */
	uint32_t n;
	uint32_t cols;
	size_t nblk;
	uint8_t *rp_dst[MM_MAX_MULTI];	/* repacking target of each part, or NULL */
	size_t tmp_off[MM_MAX_MULTI];	/* where in cb->rp_tmp a part not imported goes */
	struct rp_ent *ent[MM_MAX_MULTI];	/* the cache entry a part's repacking fills */
	uint32_t rp_part;		/* the part mm_repack_task() works on */
	quantize_fn quantize;
};

static void mm_quantize_task(void *ctx, uint32_t t)
{
	struct mm_job *j = ctx;
	j->quantize(j->x + (size_t)t * j->cols, j->xq + (size_t)t * j->nblk, j->cols);
}

/*
 * Where a part has 16-row kernels, groups 2p and 2p + 1 are one pair
 * (rp_pack_pair()) when both are whole; the rest stand alone (rp_pack()).
 */
static int mm_paired(const struct mm_part *pt, uint32_t g)
{
	return pt->gemm16 && (g / 2 + 1) * 2 * RP_ROWS <= pt->w->rows;
}

/* Task g repacks group g (rows 8g..8g+7) of part j->rp_part: a pair's first task both groups. */
static void mm_repack_task(void *ctx, uint32_t g)
{
	struct mm_job *j = ctx;
	uint32_t pi = j->rp_part;
	const struct mm_part *pt = &j->part[pi];
	const struct kb_weight *w = pt->w;
	uint32_t r0 = g * RP_ROWS, nr = w->rows - r0 < RP_ROWS ? w->rows - r0 : RP_ROWS;
	const uint8_t *src = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
	uint8_t *dst = j->rp_dst[pi] + (size_t)g * pt->rp_group;
	if (!mm_paired(pt, g))
		rp_pack(w->type, src, w->row_bytes, nr, j->nblk, dst);
	else if (g % 2 == 0)
		rp_pack_pair(w->type, src, w->row_bytes, 2 * RP_ROWS, j->nblk, dst);
}

/*
 * Rows r0..r1 (r0 a multiple of 8) of a repacked part for activation rows
 * xt..xt+nr; pf for the first activation rows of a chunk, which read the
 * weights from memory (the rest find them in cache).
 */
static void mm_gemm_rows(const struct mm_job *j, const struct mm_part *pt, uint32_t xt, int nr,
			 uint32_t r0, uint32_t r1, int pf)
{
	const struct kb_weight *w = pt->w;
	const struct blk_q8x *xq = j->xq + (size_t)xt * j->nblk;
	float *y = pt->y + (size_t)xt * w->rows;
	for (uint32_t r = r0; r < r1; r += RP_ROWS) {
		const uint8_t *rp = pt->rp + (size_t)(r / RP_ROWS) * pt->rp_group;
		if (mm_paired(pt, r / RP_ROWS)) {
			/* a task's rows are whole sixteens (cpu_matmul_multi()): r starts a pair */
			pt->gemm16(rp, j->nblk, xq, j->nblk, nr, y + r, w->rows, pf);
			r += RP_ROWS;
			continue;
		}
		if (r + RP_ROWS <= w->rows) {
			pt->gemm(rp, j->nblk, xq, j->nblk, nr, y + r, w->rows, pf);
			continue;
		}
		float tmp[DOT_MAX_NR * RP_ROWS];	/* the last, partial group */
		pt->gemm(rp, j->nblk, xq, j->nblk, nr, tmp, RP_ROWS, pf);
		for (int i = 0; i < nr; i++)
			memcpy(y + (size_t)i * w->rows + r, tmp + i * RP_ROWS,
			       (w->rows - r) * sizeof(float));
	}
}

/* Activation rows one task serves at most: its rows' blocks stay in L2 while the weights stream. */
#define MM_X_CHUNK 64

/*
 * A task owns a run of one weight's rows and a chunk of activation rows,
 * DOT_MAX_NR of those at a time, so a weight row is read from memory once
 * per chunk. Large batches are cut into several chunks so that both
 * threads have enough tasks to stay balanced.
 */
static void mm_dot_task(void *ctx, uint32_t t)
{
	struct mm_job *j = ctx;
	uint32_t pi = 0;
	while (pi + 1 < j->n_parts && t >= j->part[pi + 1].task0)
		pi++;
	const struct mm_part *pt = &j->part[pi];
	const struct kb_weight *w = pt->w;
	uint32_t n_chunks = (j->n + MM_X_CHUNK - 1) / MM_X_CHUNK;
	uint32_t rt = (t - pt->task0) / n_chunks, xc = (t - pt->task0) % n_chunks;
	uint32_t r0 = rt * pt->rows_per_task;
	uint32_t r1 = r0 + pt->rows_per_task < w->rows ? r0 + pt->rows_per_task : w->rows;
	uint32_t x1 = (xc + 1) * MM_X_CHUNK < j->n ? (xc + 1) * MM_X_CHUNK : j->n;
	for (uint32_t xt = xc * MM_X_CHUNK; xt < x1; xt += DOT_MAX_NR) {
		int nr = x1 - xt < DOT_MAX_NR ? (int)(x1 - xt) : DOT_MAX_NR;
		float *y = pt->y + (size_t)xt * w->rows;
		if (pt->gemm) {
			mm_gemm_rows(j, pt, xt, nr, r0, r1, xt == xc * MM_X_CHUNK);
			continue;
		}
		for (uint32_t r = r0; r < r1; r++) {
			const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
			if (!pt->fdot)
				dot_q_generic(w->type, row, j->xq + (size_t)xt * j->nblk, j->nblk, nr,
					      j->nblk, y + r, w->rows);
			else
				pt->fdot(row, j->x + (size_t)xt * w->cols, w->cols, nr, w->cols,
					 y + r, w->rows);
		}
	}
}

/*
 * The repacked rows of a part with a SIMD kernel: an imported weight's are
 * made once and kept; any other weight is repacked into scratch for this
 * call (tests, mostly), at *tmp_off. Sets what mm_repack() is to do.
 */
static int mm_find_repacked(struct cpu_backend *cb, struct mm_job *j, uint32_t pi, size_t *tmp_off)
{
	struct mm_part *pt = &j->part[pi];
	const struct kb_weight *w = pt->w;
	size_t bytes = (size_t)((w->rows + RP_ROWS - 1) / RP_ROWS) * pt->rp_group;
	struct rp_ent *e = rp_cache_find(&cb->rpc, w->data);
	if (!e || e->bytes < (size_t)w->rows * w->row_bytes) {
		j->tmp_off[pi] = *tmp_off;
		*tmp_off += (bytes + 63) & ~(size_t)63;
		return 0;
	}
	int paired = pt->gemm16 != NULL;
	if (e->rp && (e->type != w->type || e->rows != w->rows || e->cols != w->cols ||
		      e->row_bytes != w->row_bytes || e->paired != paired)) {
		free(e->rp);
		e->rp = NULL;
		e->ready = 0;
	}
	if (!e->rp && !(e->rp = aligned_alloc(64, (bytes + 63) & ~(size_t)63)))
		return -ENOMEM;
	e->type = w->type, e->rows = w->rows, e->cols = w->cols, e->row_bytes = w->row_bytes;
	e->paired = paired;
	pt->rp = e->rp;
	if (!e->ready) {
		j->rp_dst[pi] = e->rp;
		j->ent[pi] = e;
	}
	return 0;
}

/* Repack what mm_find_repacked() left to do, in one parallel pass per part. */
static int mm_repack(struct cpu_backend *cb, struct mm_job *j, size_t tmp_bytes)
{
	if (tmp_bytes > cb->rp_tmp_cap) {
		void *p = aligned_alloc(64, tmp_bytes);
		if (!p)
			return -ENOMEM;
		free(cb->rp_tmp);
		cb->rp_tmp = p;
		cb->rp_tmp_cap = tmp_bytes;
	}
	for (uint32_t i = 0; i < j->n_parts; i++) {
		struct mm_part *pt = &j->part[i];
		if (!pt->gemm)
			continue;
		if (!pt->rp)
			pt->rp = j->rp_dst[i] = (uint8_t *)cb->rp_tmp + j->tmp_off[i];
		if (!j->rp_dst[i])
			continue;
		j->rp_part = i;
		threadpool_run(cb->tp, mm_repack_task, j, (pt->w->rows + RP_ROWS - 1) / RP_ROWS);
		if (j->ent[i])
			j->ent[i]->ready = 1;
	}
	return 0;
}

/* Quantize the activations once for every quantized part, into cb->xq. */
static int mm_quantize(struct cpu_backend *cb, struct mm_job *j)
{
	size_t need = (size_t)j->n * j->nblk;
	if (need > cb->xq_cap) {
		struct blk_q8x *p = realloc(cb->xq, need * sizeof(*p));
		if (!p)
			return -ENOMEM;
		cb->xq = p;
		cb->xq_cap = need;
	}
	j->xq = cb->xq;
	j->quantize = dot_select_quantize();
	threadpool_run(cb->tp, mm_quantize_task, j, j->n);
	return 0;
}

static int cpu_matmul_multi(struct backend *b, float *const *y, const struct kb_weight *const *w,
			    uint32_t count, const float *x, uint32_t n)
{
	struct cpu_backend *cb = CPU(b);
	struct mm_job j = { .x = x, .n = n, .n_parts = count };
	if (n == 0)
		return 0;
	if (count == 0 || count > MM_MAX_MULTI)
		return -EINVAL;
	j.cols = w[0]->cols;
	j.nblk = j.cols / QK;
	int any_q = 0, rc;
	size_t tmp_bytes = 0;
	uint32_t tasks = 0, nt = threadpool_size(cb->tp) * 8;
	for (uint32_t i = 0; i < count; i++) {
		struct mm_part *pt = &j.part[i];
		if (w[i]->cols != j.cols)
			return -EINVAL;
		pt->w = w[i];
		pt->y = y[i];
		if (type_is_quantized(w[i]->type)) {
			if (w[i]->cols % QK)
				return -EINVAL;
			pt->gemm = dot_select_gemm(w[i]->type, NULL);
			pt->gemm16 = pt->gemm ? dot_select_gemm16(w[i]->type) : NULL;
			pt->rp_group = (size_t)(j.cols / QK) * rp_blk_bytes(w[i]->type);
			if (pt->gemm && (rc = mm_find_repacked(cb, &j, i, &tmp_bytes)))
				return rc;
			any_q = 1;
		} else if (!(pt->fdot = dot_select_f(w[i]->type))) {
			return -ENOTSUP;
		}
		/*
		 * Enough tasks to balance the threads, few enough to keep overhead
		 * small; whole eights of rows for the repacked kernels (sixteens
		 * for the 16-row ones).
		 */
		uint32_t rpt = (w[i]->rows + nt - 1) / nt, unit = pt->gemm16 ? 16 : 8;
		rpt = rpt < unit ? unit : rpt > 64 ? 64 : rpt;
		pt->rows_per_task = (rpt + unit - 1) / unit * unit;
		pt->task0 = tasks;
		tasks += (w[i]->rows + pt->rows_per_task - 1) / pt->rows_per_task *
			 ((n + MM_X_CHUNK - 1) / MM_X_CHUNK);
	}
	if (any_q && ((rc = mm_repack(cb, &j, tmp_bytes)) || (rc = mm_quantize(cb, &j))))
		return rc;
	threadpool_run(cb->tp, mm_dot_task, &j, tasks);
	return 0;
}

static int cpu_matmul(struct backend *b, float *y, const struct kb_weight *w,
		      const float *x, uint32_t n)
{
	return cpu_matmul_multi(b, &y, &w, 1, x, n);
}

/* ---- row-parallel ops ---- */

struct row_job {
	float *out;
	uint32_t *idx;		/* argmax(): each row's */
	const float *x;
	const float *y;
	const float *g;
	const uint32_t *pos;
	const uint32_t *ids;
	const struct kb_weight *w;
	const struct kb_kv_view *kv;
	const struct kb_kv_rows *kvr;
	const struct kb_attn_shape *shape;
	uint32_t dim;
	uint32_t kv_per_task;	/* attention: kv heads of a row per task */
	uint32_t n_heads;
	uint32_t head_dim;
	uint32_t rot_dim;
	int neox;
	int failed;
	float eps;
	float s;		/* scale() factor or softcap() cap */
};

static void rmsnorm_task(void *ctx, uint32_t r)
{
	struct row_job *j = ctx;
	size_t o = (size_t)r * j->dim;
	ops_rmsnorm_row(j->out + o, j->x + o, j->g, j->dim, j->eps);
}

static int cpu_rmsnorm(struct backend *b, float *out, const float *x, const float *g,
		       uint32_t n, uint32_t dim, float eps)
{
	struct row_job j = { .out = out, .x = x, .g = g, .dim = dim, .eps = eps };
	threadpool_run(CPU(b)->tp, rmsnorm_task, &j, n);
	return 0;
}

static void swiglu_task(void *ctx, uint32_t r)
{
	struct row_job *j = ctx;
	size_t o = (size_t)r * j->dim;
	ops_swiglu_row(j->out + o, j->x + o, j->y + o, j->dim);
}

static int cpu_swiglu(struct backend *b, float *out, const float *gate, const float *up,
		      uint32_t n, uint32_t dim)
{
	struct row_job j = { .out = out, .x = gate, .y = up, .dim = dim };
	threadpool_run(CPU(b)->tp, swiglu_task, &j, n);
	return 0;
}

static int cpu_add(struct backend *b, float *x, const float *y, uint32_t n, uint32_t dim)
{
	(void)b;
	size_t total = (size_t)n * dim;
	for (size_t i = 0; i < total; i++)
		x[i] += y[i];
	return 0;
}

static void add_bias_task(void *ctx, uint32_t r)
{
	struct row_job *j = ctx;
	ops_add_bias_row(j->out + (size_t)r * j->dim, j->g, j->dim);
}

static int cpu_add_bias(struct backend *b, float *x, const float *bias, uint32_t n, uint32_t dim)
{
	struct row_job j = { .out = x, .g = bias, .dim = dim };
	threadpool_run(CPU(b)->tp, add_bias_task, &j, n);
	return 0;
}

static void scale_task(void *ctx, uint32_t r)
{
	struct row_job *j = ctx;
	ops_scale_row(j->out + (size_t)r * j->dim, j->s, j->dim);
}

static int cpu_scale(struct backend *b, float *x, float s, uint32_t n, uint32_t dim)
{
	struct row_job j = { .out = x, .s = s, .dim = dim };
	threadpool_run(CPU(b)->tp, scale_task, &j, n);
	return 0;
}

static void softcap_task(void *ctx, uint32_t r)
{
	struct row_job *j = ctx;
	ops_softcap_row(j->out + (size_t)r * j->dim, j->s, j->dim);
}

static int cpu_softcap(struct backend *b, float *x, float cap, uint32_t n, uint32_t dim)
{
	if (!(cap > 0.0f))
		return -EINVAL;
	struct row_job j = { .out = x, .s = cap, .dim = dim };
	threadpool_run(CPU(b)->tp, softcap_task, &j, n);
	return 0;
}

static void geglu_task(void *ctx, uint32_t r)
{
	struct row_job *j = ctx;
	size_t o = (size_t)r * j->dim;
	ops_geglu_row(j->out + o, j->x + o, j->y + o, j->dim);
}

static int cpu_geglu(struct backend *b, float *out, const float *gate, const float *up,
		     uint32_t n, uint32_t dim)
{
	struct row_job j = { .out = out, .x = gate, .y = up, .dim = dim };
	threadpool_run(CPU(b)->tp, geglu_task, &j, n);
	return 0;
}

/* The table for these parameters: a kept one that matches, else the least recently used, emptied. */
static int rope_find(struct cpu_backend *cb, const struct kb_rope *rope, const float *ff,
		     struct rope_tab **out)
{
	struct rope_key k = { .rot_dim = rope->rot_dim, .has_ff = ff != NULL, .theta = rope->theta,
			      .freq_scale = rope->freq_scale, .ext_factor = rope->ext_factor,
			      .attn_factor = rope->attn_factor, .corr_lo = rope->corr_lo,
			      .corr_hi = rope->corr_hi };
	size_t ffb = (size_t)(rope->rot_dim / 2) * sizeof(float);
	struct rope_tab *t = &cb->rope[0];
	for (int i = 0; i < ROPE_TABS; i++) {
		struct rope_tab *c = &cb->rope[i];
		if (c->npos && !memcmp(&c->key, &k, sizeof(k)) && (!ff || !memcmp(c->ff, ff, ffb))) {
			t = c;
			goto found;
		}
		if (c->used < t->used)
			t = c;
	}
	if (ff) {
		float *p = realloc(t->ff, ffb ? ffb : 1);
		if (!p)
			return -ENOMEM;
		t->ff = p;
		memcpy(t->ff, ff, ffb);
	}
	t->key = k;
	t->npos = 0;
found:
	t->used = ++cb->rope_clock;
	*out = t;
	return 0;
}

/* Grow table t to cover positions < npos. */
static int rope_grow(struct rope_tab *t, uint32_t npos, const struct kb_rope *rope)
{
	if (npos <= t->npos)
		return 0;
	uint32_t rot_dim = rope->rot_dim;
	uint32_t want = npos < 2 * t->npos ? 2 * t->npos : npos;
	float *p = realloc(t->cs, (size_t)want * rot_dim * sizeof(float) + 1);
	if (!p)
		return -ENOMEM;
	t->cs = p;
	for (uint32_t i = t->npos; i < want; i++)
		ops_rope_table(p + (size_t)i * rot_dim, i, rope, t->key.has_ff ? t->ff : NULL);
	t->npos = want;
	return 0;
}

static void rope_task(void *ctx, uint32_t r)
{
	struct row_job *j = ctx;
	ops_rope_row(j->out + (size_t)r * j->n_heads * j->head_dim,
		     j->g + (size_t)j->pos[r] * j->rot_dim, j->n_heads, j->head_dim, j->rot_dim,
		     j->neox);
}

static int cpu_rope(struct backend *b, float *x, const uint32_t *pos, uint32_t n,
		    uint32_t n_heads, uint32_t head_dim, const struct kb_rope *rope)
{
	struct cpu_backend *cb = CPU(b);
	uint32_t rot_dim = rope->rot_dim;
	if (rot_dim > head_dim || rot_dim % 2)
		return -EINVAL;
	if (!(rope->theta > 0.0f) || !(rope->freq_scale > 0.0f))
		return -EINVAL;
	/* A host backend's buffers are host memory: either pointer holds the factors. */
	const float *ff = rope->h_freq_factors ? rope->h_freq_factors : rope->freq_factors;
	uint32_t maxp = 0;
	for (uint32_t r = 0; r < n; r++)
		maxp = pos[r] > maxp ? pos[r] : maxp;
	struct rope_tab *t;
	int rc = rope_find(cb, rope, ff, &t);
	if (rc || (n && (rc = rope_grow(t, maxp + 1, rope))))
		return rc;
	struct row_job j = { .out = x, .pos = pos, .g = t->cs, .n_heads = n_heads,
			     .head_dim = head_dim, .rot_dim = rot_dim, .neox = rope->neox };
	threadpool_run(cb->tp, rope_task, &j, n);
	return 0;
}

static void get_rows_task(void *ctx, uint32_t r)
{
	struct row_job *j = ctx;
	const struct kb_weight *w = j->w;
	dequantize_row(w->type, (const uint8_t *)w->data + (size_t)j->ids[r] * w->row_bytes,
		       j->out + (size_t)r * w->cols, w->cols);
}

static int cpu_get_rows(struct backend *b, float *out, const struct kb_weight *w,
			const uint32_t *ids, uint32_t n)
{
	for (uint32_t r = 0; r < n; r++)
		if (ids[r] >= w->rows)
			return -ERANGE;
	if (kb_type_block(w->type, NULL, NULL))
		return -ENOTSUP;
	struct row_job j = { .out = out, .ids = ids, .w = w };
	threadpool_run(CPU(b)->tp, get_rows_task, &j, n);
	return 0;
}

/* Quantize one row to q8_0 blocks (f16 scale, 32 int8): x[i] ~ d * q[i]. */
static void row_to_q8_0(uint8_t *dst, const float *x, uint32_t n)
{
	for (uint32_t b = 0; b < n / QK; b++) {
		struct blk_q8_0 *y = (struct blk_q8_0 *)dst + b;
		const float *xb = x + b * QK;
		float amax = 0.0f;
		for (int i = 0; i < QK; i++)
			amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
		float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
		y->d = f32_to_fp16(d);
		for (int i = 0; i < QK; i++)
			y->qs[i] = (int8_t)nearbyintf(xb[i] * id);
	}
}

static void store_row(uint8_t *dst, uint32_t type, const float *x, uint32_t n)
{
	if (type == KB_F32) {
		memcpy(dst, x, n * sizeof(float));
	} else if (type == KB_Q8_0) {
		row_to_q8_0(dst, x, n);
	} else {
		ops_f16_row((uint16_t *)dst, x, n);
	}
}

static int kv_view_ok(const struct kb_kv_view *kv, uint32_t kv_dim)
{
	if (kv->type != KB_F32 && kv->type != KB_F16 && kv->type != KB_Q8_0)
		return -ENOTSUP;
	if (kv->block_tokens == 0 || (kv->block_tokens & (kv->block_tokens - 1)))
		return -EINVAL;
	if (kv->type == KB_Q8_0 && kv_dim % QK)
		return -EINVAL;
	return 0;
}

int backend_cpu_write_kv(struct backend *b, const struct kb_kv_view *kv, const uint32_t *pos,
			 uint32_t n, uint32_t kv_dim, const float *k, const float *v)
{
	(void)b;
	int rc = kv_view_ok(kv, kv_dim);
	if (rc)
		return rc;
	for (uint32_t r = 0; r < n; r++) {
		if (pos[r] >= kv->n_blocks * kv->block_tokens)
			return -ERANGE;
		store_row(kb_kv_row(kv, 0, pos[r]), kv->type, k + (size_t)r * kv_dim, kv_dim);
		store_row(kb_kv_row(kv, 1, pos[r]), kv->type, v + (size_t)r * kv_dim, kv_dim);
	}
	return 0;
}

/* Row r's own view of a batch's K/V: the geometry with its sequence's block table. */
static struct kb_kv_view row_view(const struct kb_kv_rows *kv, uint32_t r)
{
	struct kb_kv_view v = kv->geo;
	v.blocks = kv->tables + kv->tab_off[r];
	v.n_blocks = kv->tab_len[r];
	return v;
}

/*
 * One task of attention() (j->kv) or attention_rows() (j->kvr, a view per
 * row): j->kv_per_task of a row's kv heads, from kv head
 * (t % (n_kv_heads / kv_per_task)) * kv_per_task. Whole rows read each K
 * and V row once; heads apart keep the threads busy when rows are few.
 * Either way each head's result is the same.
 */
static void attention_task(void *ctx, uint32_t t)
{
	struct row_job *j = ctx;
	const struct kb_attn_shape *sh = j->shape;
	const uint32_t per = sh->n_kv_heads / j->kv_per_task;
	uint32_t r = t / per, kvh = t % per * j->kv_per_task;
	size_t qoff = (size_t)r * sh->n_heads * sh->head_dim +
		      (size_t)kvh * (sh->n_heads / sh->n_kv_heads) * sh->head_dim;
	struct kb_kv_view rv = j->kvr ? row_view(j->kvr, r) : *j->kv;
	if (ops_attention_heads(j->out + qoff, j->x + qoff, &rv, j->pos[r], kvh, j->kv_per_task, sh))
		__atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
}

/*
 * Run j over its n rows: a task takes a row's kv heads all together,
 * unless the rows are too few to share among the threads.
 */
static int attention_run(struct cpu_backend *cb, struct row_job *j, uint32_t n)
{
	const uint32_t kvh = j->shape->n_kv_heads;
	j->kv_per_task = n >= 2 * threadpool_size(cb->tp) ? kvh : 1;
	threadpool_run(cb->tp, attention_task, j, n * (kvh / j->kv_per_task));
	return j->failed ? -ENOMEM : 0;
}

/* The shapes and caches the attention kernels take. */
static int attention_ok(const struct kb_attn_shape *shape, const struct kb_kv_view *geo)
{
	if (shape->n_kv_heads == 0 || shape->n_heads % shape->n_kv_heads ||
	    shape->n_heads / shape->n_kv_heads > 16 || shape->head_dim > 256)
		return -EINVAL;
	if (!(shape->softcap >= 0.0f) || isinf(shape->softcap))
		return -EINVAL;
	int rc = kv_view_ok(geo, shape->n_kv_heads * shape->head_dim);
	if (rc)
		return rc;
	if (geo->type == KB_Q8_0 && shape->head_dim % QK)
		return -EINVAL;
	return 0;
}

int backend_cpu_attention(struct backend *b, float *out, const float *q,
			  const struct kb_kv_view *kv, const uint32_t *pos, uint32_t n,
			  const struct kb_attn_shape *shape)
{
	int rc = attention_ok(shape, kv);
	if (rc)
		return rc;
	for (uint32_t r = 0; r < n; r++)
		if (pos[r] >= kv->n_blocks * kv->block_tokens)
			return -ERANGE;
	struct row_job j = { .out = out, .x = q, .kv = kv, .pos = pos, .shape = shape };
	return attention_run(CPU(b), &j, n);
}

static int cpu_write_kv_rows(struct backend *b, const struct kb_kv_rows *kv, const uint32_t *pos,
			     uint32_t n, uint32_t kv_dim, const float *k, const float *v)
{
	for (uint32_t r = 0; r < n; r++) {
		struct kb_kv_view rv = row_view(kv, r);
		int rc = backend_cpu_write_kv(b, &rv, pos + r, 1, kv_dim, k + (size_t)r * kv_dim,
					      v + (size_t)r * kv_dim);
		if (rc)
			return rc;
	}
	return 0;
}

/* Every row's query groups in one parallel pass; each is exactly what backend_cpu_attention() computes. */
static int cpu_attention_rows(struct backend *b, float *out, const float *q,
			      const struct kb_kv_rows *kv, const uint32_t *pos, uint32_t n,
			      const struct kb_attn_shape *shape)
{
	int rc = attention_ok(shape, &kv->geo);
	if (rc)
		return rc;
	for (uint32_t r = 0; r < n; r++)
		if (pos[r] >= kv->tab_len[r] * kv->geo.block_tokens)
			return -ERANGE;
	struct row_job j = { .out = out, .x = q, .kvr = kv, .pos = pos, .shape = shape };
	return attention_run(CPU(b), &j, n);
}

/* Exactly add() then rmsnorm(): the CPU gains nothing from fusing the two. */
static int cpu_add_rmsnorm(struct backend *b, float *out, float *x, const float *y,
			   const float *g, uint32_t n, uint32_t dim, float eps)
{
	int rc = cpu_add(b, x, y, n, dim);
	return rc ? rc : cpu_rmsnorm(b, out, x, g, n, dim, eps);
}

static void argmax_task(void *ctx, uint32_t r)
{
	struct row_job *j = ctx;
	j->idx[r] = ops_argmax_row(j->x + (size_t)r * j->dim, j->dim);
}

static int cpu_argmax(struct backend *b, uint32_t *ids, const float *x, uint32_t n, uint32_t dim)
{
	if (dim == 0)
		return -EINVAL;
	struct row_job j = { .idx = ids, .x = x, .dim = dim };
	threadpool_run(CPU(b)->tp, argmax_task, &j, n);
	return 0;
}

/* ---- memory: backend buffers are plain host memory ---- */

static int cpu_buf_alloc(struct backend *b, void **out, size_t bytes)
{
	(void)b;
	/* 64-byte aligned, like the device's allocations are (and more) */
	void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
	if (!p)
		return -ENOMEM;
	*out = p;
	return 0;
}

static void cpu_buf_free(struct backend *b, void *p)
{
	(void)b;
	free(p);
}

static int cpu_memcpy(struct backend *b, void *dst, const void *src, size_t bytes)
{
	(void)b;
	if (bytes)
		memmove(dst, src, bytes);
	return 0;
}

/*
 * The buffer is src itself (get_rows and the float kernels read it as
 * stored); it is remembered so that the first matmul over it can keep a
 * repacked copy for the SIMD kernels.
 */
static int cpu_import(struct backend *b, const void **out, const void *src, size_t bytes)
{
	int rc = rp_cache_add(&CPU(b)->rpc, src, bytes);
	if (!rc)
		*out = src;
	return rc;
}

static void cpu_unimport(struct backend *b, const void *p)
{
	rp_cache_remove(&CPU(b)->rpc, p);
}

static void cpu_destroy(struct backend *b)
{
	struct cpu_backend *cb = CPU(b);
	if (!cb)
		return;
	threadpool_destroy(cb->tp);
	ops_thread_scratch_free();
	free(cb->xq);
	rp_cache_free(&cb->rpc);
	free(cb->rp_tmp);
	for (int i = 0; i < ROPE_TABS; i++) {
		free(cb->rope[i].cs);
		free(cb->rope[i].ff);
	}
	free(cb);
}

static const struct backend_ops cpu_ops = {
	.name = "cpu",
	.destroy = cpu_destroy,
	.matmul = cpu_matmul,
	.matmul_multi = cpu_matmul_multi,
	.get_rows = cpu_get_rows,
	.rmsnorm = cpu_rmsnorm,
	.rope = cpu_rope,
	.swiglu = cpu_swiglu,
	.add = cpu_add,
	.write_kv_rows = cpu_write_kv_rows,
	.attention_rows = cpu_attention_rows,
	.add_rmsnorm = cpu_add_rmsnorm,
	.argmax = cpu_argmax,
	.buf_alloc = cpu_buf_alloc,
	.buf_free = cpu_buf_free,
	.upload = cpu_memcpy,
	.download = cpu_memcpy,
	.copy = cpu_memcpy,
	.import = cpu_import,
	.unimport = cpu_unimport,
	.add_bias = cpu_add_bias,
	.scale = cpu_scale,
	.softcap = cpu_softcap,
	.geglu = cpu_geglu,
};

int backend_cpu_create(struct backend **out, uint32_t n_threads)
{
	if (n_threads == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		n_threads = n > 0 ? (uint32_t)n : 1;
	}
	struct cpu_backend *cb = calloc(1, sizeof(*cb));
	if (!cb)
		return -ENOMEM;
	int rc = threadpool_create(&cb->tp, n_threads);
	if (rc) {
		free(cb);
		return rc;
	}
	cb->base.ops = &cpu_ops;
	cb->base.n_threads = n_threads;
	cb->base.host_mem = 1;
	*out = &cb->base;
	return 0;
}
