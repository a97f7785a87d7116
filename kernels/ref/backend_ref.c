/* backend_ref.c — the exact reference backend: f32 weights, unquantized activations, f64 sums. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/backend.h"
#include "kernels/ref/deq.h"
#include "kernels/ref/ref.h"

/*
 * Activation rows served together by one pass over a weight row, and weight
 * rows dequantized together: only cache reuse. Each output is still one
 * sum over the columns in order, whatever its neighbours.
 */
#define REF_TILE 8
#define REF_WROWS 32

int ref_grow(void **buf, size_t *cap, size_t n, size_t sz)
{
	if (n <= *cap)
		return 0;
	void *p = realloc(*buf, n * sz);
	if (!p)
		return -ENOMEM;
	*buf = p;
	*cap = n;
	return 0;
}

/* Whether w can be read: a known type and whole blocks per row. */
static int weight_ok(const struct kb_weight *w)
{
	uint32_t be;
	if (kb_type_block(w->type, &be, NULL))
		return -ENOTSUP;
	return w->cols % be ? -EINVAL : 0;
}

/* xt (tiles, cols, REF_TILE) = x (n, cols) in double, tile by tile; rows past n are 0. */
static void transpose_x(double *xt, const float *x, uint32_t n, uint32_t cols)
{
	for (uint32_t r0 = 0; r0 < n; r0 += REF_TILE) {
		double *t = xt + (size_t)(r0 / REF_TILE) * cols * REF_TILE;
		for (uint32_t i = 0; i < cols; i++)
			for (uint32_t k = 0; k < REF_TILE; k++)
				t[(size_t)i * REF_TILE + k] =
					r0 + k < n ? x[(size_t)(r0 + k) * cols + i] : 0.0;
	}
}

/*
 * acc[k] = sum over i of w[i] * xt[i][k], i ascending, for the nk (at most
 * REF_TILE) rows of a tile. Each product of two floats is exact in double;
 * only the running sum rounds. A short tile (a decode step's one row) does
 * only its own rows' work.
 */
static void dot_tile(double acc[REF_TILE], const float *w, const double *xt, uint32_t cols,
		     uint32_t nk)
{
	for (int k = 0; k < REF_TILE; k++)
		acc[k] = 0.0;
	if (nk == REF_TILE) {
		for (uint32_t i = 0; i < cols; i++) {
			double wi = w[i];
			for (int k = 0; k < REF_TILE; k++)
				acc[k] += wi * xt[(size_t)i * REF_TILE + k];
		}
		return;
	}
	for (uint32_t i = 0; i < cols; i++) {
		double wi = w[i];
		for (uint32_t k = 0; k < nk; k++)
			acc[k] += wi * xt[(size_t)i * REF_TILE + k];
	}
}

/* y (n, w->rows) = x @ W^T, x already in rb->xt. */
static int matmul_one(struct ref_backend *rb, float *y, const struct kb_weight *w, uint32_t n)
{
	const uint32_t cols = w->cols;
	for (uint32_t j0 = 0; j0 < w->rows; j0 += REF_WROWS) {
		uint32_t nj = w->rows - j0 < REF_WROWS ? w->rows - j0 : REF_WROWS;
		for (uint32_t j = 0; j < nj; j++) {
			const uint8_t *row = (const uint8_t *)w->data + (size_t)(j0 + j) * w->row_bytes;
			int rc = ref_dequantize_row(w->type, row, rb->wrows + (size_t)j * cols, cols);
			if (rc)
				return rc;
		}
		for (uint32_t r0 = 0; r0 < n; r0 += REF_TILE) {
			const double *xt = rb->xt + (size_t)(r0 / REF_TILE) * cols * REF_TILE;
			uint32_t nk = n - r0 < REF_TILE ? n - r0 : REF_TILE;
			for (uint32_t j = 0; j < nj; j++) {
				double acc[REF_TILE];
				dot_tile(acc, rb->wrows + (size_t)j * cols, xt, cols, nk);
				for (uint32_t k = 0; k < nk; k++)
					y[(size_t)(r0 + k) * w->rows + j0 + j] = (float)acc[k];
			}
		}
	}
	return 0;
}

static int ref_matmul_multi(struct backend *b, float *const *y, const struct kb_weight *const *w,
			    uint32_t count, const float *x, uint32_t n)
{
	struct ref_backend *rb = REF(b);
	if (n == 0)
		return 0;
	if (count == 0)
		return -EINVAL;
	const uint32_t cols = w[0]->cols;
	for (uint32_t i = 0; i < count; i++) {
		int rc = weight_ok(w[i]);
		if (rc)
			return rc;
		if (w[i]->cols != cols)
			return -EINVAL;
	}
	size_t tiles = (n + REF_TILE - 1) / REF_TILE;
	int rc = ref_grow((void **)&rb->xt, &rb->xt_cap, tiles * cols * REF_TILE, sizeof(double));
	if (!rc)
		rc = ref_grow((void **)&rb->wrows, &rb->wrows_cap, (size_t)REF_WROWS * cols,
			      sizeof(float));
	if (rc)
		return rc;
	transpose_x(rb->xt, x, n, cols);
	for (uint32_t i = 0; i < count && !rc; i++)
		rc = matmul_one(rb, y[i], w[i], n);
	return rc;
}

static int ref_matmul(struct backend *b, float *y, const struct kb_weight *w, const float *x,
		      uint32_t n)
{
	return ref_matmul_multi(b, &y, &w, 1, x, n);
}

static int ref_get_rows(struct backend *b, float *out, const struct kb_weight *w,
			const uint32_t *ids, uint32_t n)
{
	(void)b;
	int rc = weight_ok(w);
	if (rc)
		return rc;
	for (uint32_t r = 0; r < n; r++)
		if (ids[r] >= w->rows)
			return -ERANGE;
	for (uint32_t r = 0; r < n && !rc; r++)
		rc = ref_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)ids[r] * w->row_bytes,
					out + (size_t)r * w->cols, w->cols);
	return rc;
}

/* ---- memory: backend buffers are host memory ---- */

static int ref_buf_alloc(struct backend *b, void **out, size_t bytes)
{
	(void)b;
	void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
	if (!p)
		return -ENOMEM;
	*out = p;
	return 0;
}

static void ref_buf_free(struct backend *b, void *p)
{
	(void)b;
	free(p);
}

static int ref_memcpy(struct backend *b, void *dst, const void *src, size_t bytes)
{
	(void)b;
	if (bytes)
		memmove(dst, src, bytes);
	return 0;
}

static int ref_import(struct backend *b, const void **out, const void *src, size_t bytes)
{
	(void)b;
	(void)bytes;
	*out = src;
	return 0;
}

static void ref_unimport(struct backend *b, const void *p)
{
	(void)b;
	(void)p;
}

static void ref_destroy(struct backend *b)
{
	struct ref_backend *rb = REF(b);
	if (!rb)
		return;
	free(rb->xt);
	free(rb->wrows);
	free(rb->scores);
	free(rb);
}

static const struct backend_ops ref_ops = {
	.name = "ref",
	.destroy = ref_destroy,
	.matmul = ref_matmul,
	.matmul_multi = ref_matmul_multi,
	.get_rows = ref_get_rows,
	.rmsnorm = ref_rmsnorm,
	.rope = ref_rope,
	.swiglu = ref_swiglu,
	.add = ref_add,
	.write_kv_rows = ref_write_kv_rows,
	.attention_rows = ref_attention_rows,
	.add_rmsnorm = ref_add_rmsnorm,
	.argmax = ref_argmax,
	.buf_alloc = ref_buf_alloc,
	.buf_free = ref_buf_free,
	.upload = ref_memcpy,
	.download = ref_memcpy,
	.copy = ref_memcpy,
	.import = ref_import,
	.unimport = ref_unimport,
	.add_bias = ref_add_bias,
	.scale = ref_scale,
	.softcap = ref_softcap,
	.geglu = ref_geglu,
};

int backend_ref_create(struct backend **out, uint32_t n_threads)
{
	(void)n_threads;
	struct ref_backend *rb = calloc(1, sizeof(*rb));
	if (!rb)
		return -ENOMEM;
	rb->base.ops = &ref_ops;
	rb->base.n_threads = 1;
	rb->base.host_mem = 1;
	*out = &rb->base;
	return 0;
}
