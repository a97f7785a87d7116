/* test_cuda.c — the CUDA backend: launch plans and backend choice (any host), every kernel against the CPU reference (with a GPU). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/kvpool.h"
#include "kernels/backend.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/plan.h"
#include "tests/devsim.h"


static struct backend *GPU;	/* NULL without a device */
static struct backend *CPU;
static char gpu_why[256];
static int simulated;	/* GPU is the CPU dressed as a device (KVD_TEST_DEVSIM=1) */

/* ---- helpers ---- */

static uint64_t rng_s;

static uint64_t rng_next(void)
{
	uint64_t z = (rng_s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi), never zero: an unwritten zero output cannot pass by luck. */
static float rng_f(float lo, float hi)
{
	float f;
	do
		f = lo + (hi - lo) * (float)((double)(rng_next() >> 11) * 0x1p-53);
	while (f == 0.0f);
	return f;
}

static void need_gpu(void)
{
	if (!GPU) {
		printf("skipped: no CUDA device (%s)\n", gpu_why);
		skip();
	}
}

/* A device copy of host bytes. */
static void *dev_from(const void *src, size_t bytes)
{
	void *d;
	assert_int_equal(GPU->ops->buf_alloc(GPU, &d, bytes), 0);
	assert_int_equal(GPU->ops->upload(GPU, d, src, bytes), 0);
	return d;
}

/* A device buffer of n floats, every one NaN, so an element a kernel skips fails the comparison. */
static float *dev_poisoned(size_t n)
{
	float *h = malloc(n * sizeof(float));
	assert_non_null(h);
	for (size_t i = 0; i < n; i++)
		h[i] = NAN;
	float *d = dev_from(h, n * sizeof(float));
	free(h);
	return d;
}

static float *host_from(const void *dev, size_t n)
{
	float *h = malloc(n * sizeof(float));
	assert_non_null(h);
	assert_int_equal(GPU->ops->download(GPU, h, dev, n * sizeof(float)), 0);
	return h;
}

/* ||got - want|| / ||want||; any NaN in got makes it infinite. */
static double rel_err(const float *got, const double *want, size_t n)
{
	double num = 0.0, den = 0.0;
	for (size_t i = 0; i < n; i++) {
		if (isnan(got[i]))
			return INFINITY;
		num += (got[i] - want[i]) * (got[i] - want[i]);
		den += want[i] * want[i];
	}
	return sqrt(num / den);
}

static double rel_err_f(const float *got, const float *want, size_t n)
{
	double *w = malloc(n * sizeof(double));
	assert_non_null(w);
	for (size_t i = 0; i < n; i++)
		w[i] = want[i];
	double e = rel_err(got, w, n);
	free(w);
	return e;
}

/* ---- launch plans (run everywhere) ---- */

static void test_plan_matvec(void **state)
{
	(void)state;
	struct cuda_mv_plan p;
	static const uint32_t want[17] = { 0, 1, 2, 4, 4, 8, 8, 8, 8, 16, 16, 16, 16, 16, 16, 16, 16 };
	for (uint32_t n = 1; n <= CUDA_MV_MAX_ROWS; n++) {
		assert_int_equal(cuda_plan_matvec(&p, 49152, 576, n), 0);
		assert_int_equal(p.rows_tmpl, want[n]);
		assert_int_equal(p.block, 32 * CUDA_MV_WARPS);
		assert_int_equal(p.grid_x, 49152 / CUDA_MV_WARPS);
	}
	assert_int_equal(cuda_plan_matvec(&p, 301, 64, 1), 0);
	assert_int_equal(p.grid_x, 76);	/* the last block has one row */
	assert_int_equal(cuda_plan_matvec(&p, 8, 48, 1), -EINVAL);	/* not whole sub-blocks */
	assert_int_equal(cuda_plan_matvec(&p, 8, 64, 0), -EINVAL);
	assert_int_equal(cuda_plan_matvec(&p, 8, 64, CUDA_MV_MAX_ROWS + 1), -EINVAL);
	assert_false(cuda_plan_use_gemm(1, KB_Q4_1));
	assert_false(cuda_plan_use_gemm(CUDA_MV_MAX_ROWS, KB_Q4_1));
	assert_true(cuda_plan_use_gemm(CUDA_MV_MAX_ROWS + 1, KB_F16));
	assert_int_equal(cuda_plan_blocks(0, 256, 100), 1);
	assert_int_equal(cuda_plan_blocks(257, 256, 100), 2);
	assert_int_equal(cuda_plan_blocks(1u << 30, 256, 65535), 65535);
}

/* Splits cover the context exactly: none empty, every token in one. */
static void check_splits(const struct cuda_attn_plan *p, uint32_t max_ctx)
{
	assert_int_equal(p->chunk % CUDA_ATT_KV_TILE, 0);
	assert_true((uint64_t)p->chunk * p->n_splits >= max_ctx);
	assert_true((uint64_t)p->chunk * (p->n_splits - 1) < max_ctx);
	assert_int_equal(p->grid_z, p->n_splits);
	assert_true(p->rows_per_block * p->group <= CUDA_ATT_QUERIES);
	assert_true(p->smem <= 227 * 1024);
}

static void test_plan_attention(void **state)
{
	(void)state;
	struct cuda_attn_plan p;
	/* Decode, batch 32 at 32k tokens, SmolLM2 heads on an H200: split until ~8 blocks per SM. */
	assert_int_equal(cuda_plan_attention(&p, 32, 1, 32768, 9, 3, 64, 132), 0);
	check_splits(&p, 32768);
	assert_int_equal(p.group, 3);
	assert_int_equal(p.rows_per_block, 1);
	assert_int_equal(p.grid_x, 32);
	assert_int_equal(p.grid_y, 3);
	assert_true((uint64_t)p.grid_x * p.grid_y * p.grid_z >= 8 * 132);
	/* Batch 256 at a short context: few splits; one token of context: one split. */
	assert_int_equal(cuda_plan_attention(&p, 256, 1, 100, 9, 3, 64, 132), 0);
	check_splits(&p, 100);
	assert_true(p.n_splits <= 4);
	assert_int_equal(cuda_plan_attention(&p, 1, 1, 1, 9, 3, 64, 132), 0);
	check_splits(&p, 1);
	assert_int_equal(p.n_splits, 1);
	/* Prefill of 4096 rows: 256 tiles of 16 rows, cut in two (10 rows x 3 heads per block). */
	assert_int_equal(cuda_plan_attention(&p, 256, 16, 4096, 9, 3, 64, 132), 0);
	check_splits(&p, 4096);
	assert_int_equal(p.rows_per_block, 10);
	assert_int_equal(p.sub, 2);
	assert_int_equal(p.grid_x, 512);
	assert_int_equal(p.n_splits, 1);
	/* Llama-like: 32 heads over 8, head_dim 128; no GQA at head_dim 256. */
	assert_int_equal(cuda_plan_attention(&p, 3, 16, 5000, 32, 8, 128, 108), 0);
	check_splits(&p, 5000);
	assert_int_equal(p.rows_per_block, 8);
	assert_int_equal(p.sub, 2);
	assert_int_equal(cuda_plan_attention(&p, 2, 5, 70, 8, 8, 256, 132), 0);
	check_splits(&p, 70);
	assert_int_equal(p.rows_per_block, 5);
	assert_int_equal(p.sub, 1);
	assert_true(p.part_floats >= (size_t)p.grid_x * p.grid_y * p.grid_z * CUDA_ATT_QUERIES * 258);
	/* Shapes the kernel cannot take are refused, not mis-run. */
	assert_int_equal(cuda_plan_attention(&p, 1, 1, 10, 9, 3, 80, 132), -EINVAL);
	assert_int_equal(cuda_plan_attention(&p, 1, 1, 10, 64, 1, 64, 132), -EINVAL);
	assert_int_equal(cuda_plan_attention(&p, 1, 1, 10, 10, 3, 64, 132), -EINVAL);
	assert_int_equal(cuda_plan_attention(&p, 1, 17, 10, 9, 3, 64, 132), -EINVAL);
	assert_int_equal(cuda_plan_attention(&p, 0, 1, 10, 9, 3, 64, 132), -EINVAL);
}

/* ---- backend choice (run everywhere) ---- */

static void test_backend_choose(void **state)
{
	(void)state;
	char why[128];
	enum kb_kind k;
	assert_int_equal(backend_parse("auto", &k), 0);
	assert_int_equal(k, KB_BACKEND_AUTO);
	assert_int_equal(backend_parse("cpu", &k), 0);
	assert_int_equal(k, KB_BACKEND_CPU);
	assert_int_equal(backend_parse("cuda", &k), 0);
	assert_int_equal(k, KB_BACKEND_CUDA);
	assert_int_equal(backend_parse("gpu", &k), -EINVAL);
	assert_int_equal(backend_parse("", &k), -EINVAL);

	assert_int_equal(backend_choose(KB_BACKEND_AUTO, 1, 2, why, sizeof(why)), KB_BACKEND_CUDA);
	assert_non_null(strstr(why, "2 CUDA devices"));
	assert_int_equal(backend_choose(KB_BACKEND_AUTO, 1, 0, why, sizeof(why)), KB_BACKEND_CPU);
	assert_non_null(strstr(why, "no CUDA device"));
	assert_int_equal(backend_choose(KB_BACKEND_AUTO, 0, 1, why, sizeof(why)), KB_BACKEND_CPU);
	assert_non_null(strstr(why, "without CUDA"));
	assert_int_equal(backend_choose(KB_BACKEND_CPU, 1, 4, why, sizeof(why)), KB_BACKEND_CPU);
	assert_int_equal(backend_choose(KB_BACKEND_CUDA, 0, 0, why, sizeof(why)), KB_BACKEND_CUDA);
	assert_non_null(strstr(why, "requested"));
}

/* What this machine gets: the CPU without a device; cuda demanded without one fails cleanly. */
static void test_backend_create(void **state)
{
	(void)state;
	char why[512], r[128];
	struct backend *b = NULL;
	int n = backend_cuda_devices(r, sizeof(r));
	assert_int_equal(backend_create(&b, KB_BACKEND_AUTO, 1, why, sizeof(why)), 0);
	printf("auto: %s\n", why);
	assert_string_equal(b->ops->name, n > 0 ? "cuda" : "cpu");
	b->ops->destroy(b);
	assert_int_equal(backend_create(&b, KB_BACKEND_CPU, 1, why, sizeof(why)), 0);
	assert_string_equal(b->ops->name, "cpu");
	assert_int_equal(b->host_mem, 1);
	b->ops->destroy(b);
	int rc = backend_create(&b, KB_BACKEND_CUDA, 1, why, sizeof(why));
	printf("cuda: %s (%d)\n", why, rc);
	if (n > 0) {
		assert_int_equal(rc, 0);
		assert_string_equal(b->ops->name, "cuda");
		assert_int_equal(b->host_mem, 0);
		b->ops->destroy(b);
	} else {
		assert_true(rc == -ENODEV || rc == -ENOSYS);
		assert_non_null(strstr(why, "cannot start"));
	}
}

/* ---- matmul ---- */

static uint16_t f16_in(float lo, float hi)
{
	return f32_to_fp16(rng_f(lo, hi));
}

static void put16(uint8_t *p, uint16_t v)
{
	memcpy(p, &v, 2);
}

/*
 * 1 when the CPU backend decodes type (the reference the device tests
 * compare with); the new types come to the CPU on another line of work.
 */
static int cpu_decodes(uint32_t type)
{
	uint32_t be, bb;
	if (kb_type_block(type, &be, &bb) || 256 % be)
		return 0;
	uint8_t blk[256 / 32 * 64] = { 0 };	/* zero scales: any 256 elements decode to 0 */
	float out[256];
	return 256 / be * bb <= sizeof(blk) && dequantize_row(type, blk, out, 256) == 0;
}

/* A random weight (rows, cols) of type with sane scales: random quants, small f16 scales. */
static uint8_t *rand_weight(uint32_t type, uint32_t rows, uint32_t cols, size_t *row_bytes)
{
	uint32_t be, bb;
	assert_int_equal(kb_type_block(type, &be, &bb), 0);
	*row_bytes = (size_t)cols / be * bb;
	size_t nb = (size_t)rows * cols / be, total = (size_t)rows * *row_bytes;
	uint8_t *w = malloc(total);
	assert_non_null(w);
	for (size_t i = 0; i < total; i++)
		w[i] = (uint8_t)rng_next();
	for (size_t b = 0; b < nb; b++) {
		uint8_t *p = w + b * bb;
		switch (type) {
		case KB_F32:
			((float *)p)[0] = rng_f(-1.0f, 1.0f);
			break;
		case KB_F16:
			((uint16_t *)p)[0] = f16_in(-1.0f, 1.0f);
			break;
		case KB_BF16: {
			float f = rng_f(-1.0f, 1.0f);
			uint32_t u;
			memcpy(&u, &f, 4);
			((uint16_t *)p)[0] = (uint16_t)(u >> 16);
			break;
		}
		case KB_Q4_0:
		case KB_Q8_0:
			((struct blk_q8_0 *)p)->d = f16_in(0.001f, 0.02f);
			break;
		case KB_Q4_1:
			((struct blk_q4_1 *)p)->d = f16_in(0.001f, 0.02f);
			((struct blk_q4_1 *)p)->m = f16_in(-0.1f, 0.1f);
			break;
		case KB_Q4_K:
			((struct blk_q4_k *)p)->d = f16_in(0.0001f, 0.002f);
			((struct blk_q4_k *)p)->dmin = f16_in(0.0001f, 0.002f);
			break;
		case KB_Q6_K:
			((struct blk_q6_k *)p)->d = f16_in(0.0001f, 0.002f);
			break;
		case KB_Q5_0:
		case KB_IQ4_NL:
			put16(p, f16_in(0.001f, 0.02f));
			break;
		case KB_Q5_1:
			put16(p, f16_in(0.001f, 0.02f));
			put16(p + 2, f16_in(-0.1f, 0.1f));
			break;
		case KB_Q2_K:	/* d, dmin after 16 scale bytes and 64 of quants */
			put16(p + 80, f16_in(0.0001f, 0.002f));
			put16(p + 82, f16_in(0.0001f, 0.002f));
			break;
		case KB_Q3_K:	/* d last, after hmask, quants and scales */
			put16(p + 108, f16_in(0.0001f, 0.002f));
			break;
		case KB_Q5_K:
			put16(p, f16_in(0.0001f, 0.002f));
			put16(p + 2, f16_in(0.0001f, 0.002f));
			break;
		case KB_IQ4_XS:
			put16(p, f16_in(0.0001f, 0.002f));
			break;
		}
	}
	/* Element types carry a value in every element, not only the first of a "block". */
	if (type == KB_F32)
		for (size_t i = 0; i < (size_t)rows * cols; i++)
			((float *)w)[i] = rng_f(-1.0f, 1.0f);
	if (type == KB_F16)
		for (size_t i = 0; i < (size_t)rows * cols; i++)
			((uint16_t *)w)[i] = f16_in(-1.0f, 1.0f);
	return w;
}

static const uint32_t mm_types[] = { KB_Q4_1, KB_Q8_0, KB_Q4_K, KB_Q6_K, KB_F16, KB_Q4_0,
				     KB_F32, KB_BF16, KB_Q5_0, KB_Q5_1, KB_Q5_K, KB_Q3_K,
				     KB_Q2_K, KB_IQ4_NL, KB_IQ4_XS };

static void test_matmul(void **state)
{
	(void)state;
	need_gpu();
	static const uint32_t ns[] = { 1, 3, 16, 37 };
	const uint32_t rows = 301, cols = 768;
	rng_s = 11;
	for (size_t t = 0; t < sizeof(mm_types) / sizeof(mm_types[0]); t++) {
		uint32_t type = mm_types[t];
		size_t rb;
		if (!cpu_decodes(type)) {
			printf("matmul type %2u: not compared, the CPU does not decode it\n", type);
			continue;
		}
		uint8_t *w = rand_weight(type, rows, cols, &rb);
		float *wf = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * 40 * cols);
		double *ref = malloc(sizeof(double) * 40 * rows);
		assert_true(wf && x && ref);
		for (uint32_t r = 0; r < rows; r++)
			assert_int_equal(dequantize_row(type, w + r * rb, wf + (size_t)r * cols, cols), 0);
		for (uint32_t i = 0; i < 40 * cols; i++)
			x[i] = rng_f(-1.0f, 1.0f);
		struct kb_weight kw = { .type = type, .rows = rows, .cols = cols, .row_bytes = rb };
		assert_int_equal(GPU->ops->import(GPU, &kw.data, w, rows * rb), 0);
		float *dx = dev_from(x, sizeof(float) * 40 * cols);
		for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
			uint32_t n = ns[k];
			for (uint32_t i = 0; i < n; i++)
				for (uint32_t r = 0; r < rows; r++) {
					double s = 0.0;
					for (uint32_t c = 0; c < cols; c++)
						s += (double)x[(size_t)i * cols + c] * wf[(size_t)r * cols + c];
					ref[(size_t)i * rows + r] = s;
				}
			float *dy = dev_poisoned((size_t)n * rows);
			assert_int_equal(GPU->ops->matmul(GPU, dy, &kw, dx, n), 0);
			float *y = host_from(dy, (size_t)n * rows);
			double e = rel_err(y, ref, (size_t)n * rows);
			/* f16 enters on the GEMM path (x and the dequantized W rounded to f16) */
			double tol = cuda_plan_use_gemm(n, type) && type != KB_F32 ? 1e-2 : 1e-3;
			/* The CPU rounds activations to 8 bits for quantized weights. */
			if (simulated && type != KB_F32 && type != KB_F16 && type != KB_BF16)
				tol = 1e-2;
			printf("matmul type %2u n %2u: rel err %.3g (%s)\n", type, n, e,
			       cuda_plan_use_gemm(n, type) ? "gemm" : "mat-vec");
			if (!(e <= tol))
				fail_msg("matmul type %u n %u: relative error %g over %g", type, n, e, tol);
			free(y);
			GPU->ops->buf_free(GPU, dy);
		}
		/* get_rows: the embedding lookup dequantizes exactly what dequantize_row does. */
		uint32_t ids[3] = { 0, rows - 1, 17 };
		uint32_t *did = dev_from(ids, sizeof(ids));
		float *dg = dev_poisoned(3 * (size_t)cols);
		assert_int_equal(GPU->ops->get_rows(GPU, dg, &kw, did, 3), 0);
		float *g = host_from(dg, 3 * (size_t)cols);
		for (int i = 0; i < 3; i++)
			assert_true(rel_err_f(g + (size_t)i * cols, wf + (size_t)ids[i] * cols, cols) <= 1e-6);
		free(g);
		GPU->ops->buf_free(GPU, dg);
		GPU->ops->buf_free(GPU, did);
		GPU->ops->buf_free(GPU, dx);
		GPU->ops->unimport(GPU, kw.data);
		free(w);
		free(wf);
		free(x);
		free(ref);
	}
}

/*
 * The kernels' block decoder, compiled for the host, against the CPU's
 * dequantize_row: the same operations in the same order, so the same
 * values (up to the sign of a zero).
 * Needs nvcc at build time, not a GPU.
 */
static void test_decoder_on_host(void **state)
{
	(void)state;
#ifdef KVD_HAVE_CUDA
	char why[768];
	const struct kb_cuda_api *api = backend_cuda_load(why, sizeof(why), NULL);
	if (!api)
		fail_msg("the CUDA backend's object: %s", why);
	const uint32_t cols = 768;
	rng_s = 5;
	for (size_t t = 0; t < sizeof(mm_types) / sizeof(mm_types[0]); t++) {
		size_t rb;
		if (!cpu_decodes(mm_types[t])) {
			printf("decoder type %2u: not compared, the CPU does not decode it\n", mm_types[t]);
			continue;
		}
		uint8_t *w = rand_weight(mm_types[t], 3, cols, &rb);
		float want[768], got[32];
		for (uint32_t r = 0; r < 3; r++) {
			assert_int_equal(dequantize_row(mm_types[t], w + r * rb, want, cols), 0);
			for (uint32_t k = 0; k < cols / 32; k++) {
				assert_int_equal(api->host_deq32(mm_types[t], w + r * rb, k, got), 0);
				for (int i = 0; i < 32; i++)
					if (got[i] != want[32 * k + i])	/* == : -0 and +0 agree */
						fail_msg("type %u row %u element %u: the kernels' decoder gives %a, dequantize_row %a",
							 mm_types[t], r, 32 * k + i, (double)got[i],
							 (double)want[32 * k + i]);
			}
		}
		free(w);
	}
	float out[32];
	assert_int_equal(api->host_deq32(KB_Q4_0 + 1000, out, 0, out), -ENOTSUP);
#else
	printf("skipped: built without nvcc, the decoder is not compiled\n");
	skip();
#endif
}

/* ---- the new block types on hand-made blocks (host, needs nvcc at build time only) ---- */

#ifdef KVD_HAVE_CUDA
static const int iq4_levels[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
				    1, 13, 25, 38, 53, 69, 89, 113 };

/* Sub-block k of row through the kernels' decoder against want (32 values worked out by hand). */
static void hand_check(const struct kb_cuda_api *api, uint32_t type, const uint8_t *row,
		       uint32_t k, const float *want)
{
	float got[32];
	assert_int_equal(api->host_deq32(type, row, k, got), 0);
	for (int i = 0; i < 32; i++)
		if (got[i] != want[i])
			fail_msg("type %u sub-block %u element %d: decoded %g, by hand %g", type, k, i,
				 (double)got[i], (double)want[i]);
}

/* Q5_0, Q5_1, IQ4_NL: two 32-element blocks, the hand-made one second. */
static void hand_small(const struct kb_cuda_api *api)
{
	uint8_t row[2 * 24] = { 0 };
	float want[32];
	/* Q5_0, d 0.5; nibbles j | (15 - j) << 4; fifth bits set for elements 0..15 only. */
	uint8_t *b = row + 22;
	put16(b, 0x3800);
	put16(b + 2, 0xffff);
	put16(b + 4, 0x0000);
	for (int j = 0; j < 16; j++)
		b[6 + j] = (uint8_t)(j | (15 - j) << 4);
	for (int j = 0; j < 16; j++) {
		want[j] = 0.5f * (float)j;		/* (j | 16) - 16 */
		want[16 + j] = 0.5f * (float)(-1 - j);	/* (15 - j) - 16 */
	}
	hand_check(api, KB_Q5_0, row, 1, want);
	/* Q5_1, d 0.5, m -2; fifth bits set for elements 16..31 only. */
	memset(row, 0, sizeof(row));
	b = row + 24;
	put16(b, 0x3800);
	put16(b + 2, 0xc000);
	put16(b + 4, 0x0000);
	put16(b + 6, 0xffff);
	for (int j = 0; j < 16; j++)
		b[8 + j] = (uint8_t)(j | (15 - j) << 4);
	for (int j = 0; j < 16; j++) {
		want[j] = 0.5f * (float)j - 2.0f;
		want[16 + j] = 0.5f * (float)(31 - j) - 2.0f;
	}
	hand_check(api, KB_Q5_1, row, 1, want);
	/* IQ4_NL, d 0.5: the levels in order, then reversed. */
	memset(row, 0, sizeof(row));
	b = row + 18;
	put16(b, 0x3800);
	for (int j = 0; j < 16; j++)
		b[2 + j] = (uint8_t)(j | (15 - j) << 4);
	for (int j = 0; j < 16; j++) {
		want[j] = 0.5f * (float)iq4_levels[j];
		want[16 + j] = 0.5f * (float)iq4_levels[15 - j];
	}
	hand_check(api, KB_IQ4_NL, row, 1, want);
}

/* Quant bytes alternate 0xe4 (fields 0 1 2 3 from the low bits) and 0x1b (3 2 1 0). */
static void fill_2bit(uint8_t *q, int n)
{
	for (int l = 0; l < n; l++)
		q[l] = l % 2 ? 0x1b : 0xe4;
}

static void hand_q2_q3(const struct kb_cuda_api *api)
{
	uint8_t row[2 * 110] = { 0 };
	float want[32];
	/* Q2_K, d 1, dmin 0.5, scale byte i = i | (15 - i) << 4 (scale i, min 15 - i). */
	uint8_t *b = row + 84;
	for (int i = 0; i < 16; i++)
		b[i] = (uint8_t)(i | (15 - i) << 4);
	fill_2bit(b + 16, 64);
	put16(b + 80, 0x3c00);
	put16(b + 82, 0x3800);
	/* Sub-block 5: second half, field 1; scales 10 and 11, mins 5 and 4; quants 1 (even) and 2 (odd). */
	for (int e = 0; e < 32; e++)
		want[e] = e < 16 ? (e % 2 ? 20.0f - 2.5f : 10.0f - 2.5f) : (e % 2 ? 22.0f - 2.0f : 11.0f - 2.0f);
	hand_check(api, KB_Q2_K, row, 8 + 5, want);
	/* Sub-block 0: scales 0 and 1, mins 15 and 14, quants 0 (even) and 3 (odd). */
	for (int e = 0; e < 32; e++)
		want[e] = e < 16 ? (e % 2 ? 0.0f - 7.5f : -7.5f) : (e % 2 ? 3.0f - 7.0f : -7.0f);
	hand_check(api, KB_Q2_K, row, 8 + 0, want);

	/* Q3_K, d 0.5; hmask 0x55 (even elements), 0xaa (odd). */
	memset(row, 0, sizeof(row));
	b = row + 110;
	for (int e = 0; e < 32; e++)
		b[e] = e % 2 ? 0xaa : 0x55;
	fill_2bit(b + 32, 64);
	static const uint8_t sc[12] = { 0x21, 0x43, 0x65, 0x87, 0xa9, 0xcb,
					0xed, 0x0f, 0xe4, 0x1b, 0x00, 0xff };
	memcpy(b + 96, sc, 12);
	put16(b + 108, 0x3800);
	/*
	 * Sub-block 6 (second half, field 2, hmask bit 6): scales 12 = 0xa | 3 << 4
	 * = 58 - 32 = 26 and 13 = 0xc | 0 << 4 = 12 - 32 = -20. Even elements: 2
	 * with the bit set; odd: 1 without it, 1 - 4 = -3.
	 */
	for (int e = 0; e < 32; e++)
		want[e] = 0.5f * (e < 16 ? 26.0f : -20.0f) * (e % 2 ? -3.0f : 2.0f);
	hand_check(api, KB_Q3_K, row, 8 + 6, want);
	/*
	 * Sub-block 1 (first half, field 1, hmask bit 1): scales 2 = 5 | 0 << 4 =
	 * -27 and 3 = 7 | 3 << 4 = 55 - 32 = 23. Even: 1 without the bit, -3;
	 * odd: 2 with it.
	 */
	for (int e = 0; e < 32; e++)
		want[e] = 0.5f * (e < 16 ? -27.0f : 23.0f) * (e % 2 ? 2.0f : -3.0f);
	hand_check(api, KB_Q3_K, row, 8 + 1, want);
}

static void hand_q5k_iq4xs(const struct kb_cuda_api *api)
{
	uint8_t row[2 * 176] = { 0 };
	float want[32];
	/* Q5_K, d 1, dmin 0.5. */
	uint8_t *b = row + 176;
	put16(b, 0x3c00);
	put16(b + 2, 0x3800);
	static const uint8_t sc[12] = { 0x41, 0xc2, 0x03, 0x84, 0x05, 0x46,
					0x87, 0xc8, 0x9a, 0xbc, 0xde, 0xf1 };
	memcpy(b + 4, sc, 12);
	for (int e = 0; e < 32; e++)	/* fifth bit: bit 2 for elements 0..15, bit 5 for 16..31 */
		b[16 + e] = e < 16 ? 0x04 : 0x20;
	for (int l = 0; l < 128; l++)
		b[48 + l] = (uint8_t)(l % 16 | (15 - l % 16) << 4);
	/* Sub-block 2: scale 0x03 = 3, min 0x87 & 63 = 7; low nibbles e % 16, fifth bit below 16. */
	for (int e = 0; e < 32; e++)
		want[e] = 3.0f * (float)(e % 16 + (e < 16 ? 16 : 0)) - 3.5f;
	hand_check(api, KB_Q5_K, row, 8 + 2, want);
	/* Sub-block 5: scale 0xc | 3 << 4 = 60, min 0xb | 1 << 4 = 27; high nibbles 15 - e % 16. */
	for (int e = 0; e < 32; e++)
		want[e] = 60.0f * (float)(15 - e % 16 + (e < 16 ? 0 : 16)) - 13.5f;
	hand_check(api, KB_Q5_K, row, 8 + 5, want);

	/* IQ4_XS, d 0.25; sub-block 3: 5 | 3 << 4 = 53 - 32 = 21; sub-block 4: 0xa | 2 << 4 = 42 - 32 = 10. */
	memset(row, 0, sizeof(row));
	b = row + 136;
	put16(b, 0x3400);
	put16(b + 2, 0x02c0);
	b[4 + 1] = 0x50;
	b[4 + 2] = 0x0a;
	for (int l = 0; l < 128; l++)
		b[8 + l] = (uint8_t)(l % 16 | (15 - l % 16) << 4);
	for (int j = 0; j < 16; j++) {
		want[j] = 0.25f * 21.0f * (float)iq4_levels[j];
		want[16 + j] = 0.25f * 21.0f * (float)iq4_levels[15 - j];
	}
	hand_check(api, KB_IQ4_XS, row, 8 + 3, want);
	for (int j = 0; j < 16; j++) {
		want[j] = 0.25f * 10.0f * (float)iq4_levels[j];
		want[16 + j] = 0.25f * 10.0f * (float)iq4_levels[15 - j];
	}
	hand_check(api, KB_IQ4_XS, row, 8 + 4, want);
}
#endif

static void test_decoder_hand(void **state)
{
	(void)state;
#ifdef KVD_HAVE_CUDA
	char why[768];
	const struct kb_cuda_api *api = backend_cuda_load(why, sizeof(why), NULL);
	if (!api)
		fail_msg("the CUDA backend's object: %s", why);
	hand_small(api);
	hand_q2_q3(api);
	hand_q5k_iq4xs(api);
#else
	printf("skipped: built without nvcc, the decoder is not compiled\n");
	skip();
#endif
}

/* The decoders' alignment needs, and what the backend checks before any launch. */
static void test_plan_weight(void **state)
{
	(void)state;
	static const uint32_t a16[] = { KB_F32, KB_F16, KB_BF16 };
	static const uint32_t a4[] = { KB_Q4_1, KB_Q5_1, KB_Q2_K, KB_Q4_K, KB_Q5_K, KB_IQ4_XS };
	static const uint32_t a2[] = { KB_Q4_0, KB_Q5_0, KB_Q8_0, KB_Q3_K, KB_Q6_K, KB_IQ4_NL };
	for (size_t i = 0; i < 3; i++)
		assert_int_equal(cuda_plan_block_align(a16[i]), 16);
	for (size_t i = 0; i < 6; i++) {
		assert_int_equal(cuda_plan_block_align(a4[i]), 4);
		assert_int_equal(cuda_plan_block_align(a2[i]), 2);
	}
	assert_int_equal(cuda_plan_block_align(99), 0);
	/* Every alignment divides its block size, so whole rows keep every block aligned. */
	for (size_t i = 0; i < sizeof(mm_types) / sizeof(mm_types[0]); i++) {
		uint32_t be, bb, t = mm_types[i];
		if (kb_type_block(t, &be, &bb)) {
			assert_int_equal(cuda_plan_weight(t, 256, 4096, 64), -ENOTSUP);
			continue;
		}
		if (t != KB_F32 && t != KB_F16 && t != KB_BF16)
			assert_int_equal(bb % cuda_plan_block_align(t), 0);
		size_t rb = (size_t)768 / be * bb;
		assert_int_equal(cuda_plan_weight(t, 768, rb, 4096), 0);
		assert_int_equal(cuda_plan_weight(t, 768, rb, 4097), -EINVAL);
		assert_int_equal(cuda_plan_weight(t, 768, rb - 1, 4096), -EINVAL);
	}
	assert_int_equal(cuda_plan_weight(KB_Q4_K, 128, 72, 4096), -EINVAL);	/* half a block */
	assert_int_equal(cuda_plan_weight(99, 64, 64, 4096), -ENOTSUP);
}

/* ---- row ops ---- */

static void test_row_ops(void **state)
{
	(void)state;
	need_gpu();
	const uint32_t n = 7, dim = 576, nh = 9, hd = 64;
	const size_t nd = (size_t)n * dim;
	rng_s = 23;
	float *x = malloc(nd * 4), *y = malloc(nd * 4), *g = malloc(dim * 4), *o = malloc(nd * 4);
	float *x2 = malloc(nd * 4);
	assert_true(x && y && g && o && x2);
	for (size_t i = 0; i < nd; i++) {
		x[i] = rng_f(-3.0f, 3.0f);
		y[i] = rng_f(-3.0f, 3.0f);
	}
	for (uint32_t i = 0; i < dim; i++)
		g[i] = rng_f(-2.0f, 2.0f);
	float *dx = dev_from(x, nd * 4), *dy = dev_from(y, nd * 4), *dg = dev_from(g, dim * 4);

	/* rmsnorm */
	float *dout = dev_poisoned(nd);
	assert_int_equal(GPU->ops->rmsnorm(GPU, dout, dx, dg, n, dim, 1e-5f), 0);
	float *got = host_from(dout, nd);
	assert_int_equal(CPU->ops->rmsnorm(CPU, o, x, g, n, dim, 1e-5f), 0);
	assert_true(rel_err_f(got, o, nd) <= 1e-5);
	free(got);

	/* add_rmsnorm: both the new residual and the normed output */
	GPU->ops->buf_free(GPU, dout);
	dout = dev_poisoned(nd);
	memcpy(x2, x, nd * 4);
	assert_int_equal(GPU->ops->add_rmsnorm(GPU, dout, dx, dy, dg, n, dim, 1e-5f), 0);
	assert_int_equal(CPU->ops->add_rmsnorm(CPU, o, x2, y, g, n, dim, 1e-5f), 0);
	got = host_from(dout, nd);
	assert_true(rel_err_f(got, o, nd) <= 1e-5);
	free(got);
	got = host_from(dx, nd);
	assert_true(rel_err_f(got, x2, nd) == 0.0);	/* one f32 add each: exact */
	free(got);

	/* add, swiglu */
	assert_int_equal(GPU->ops->add(GPU, dx, dy, n, dim), 0);
	assert_int_equal(CPU->ops->add(CPU, x2, y, n, dim), 0);
	got = host_from(dx, nd);
	assert_true(rel_err_f(got, x2, nd) == 0.0);
	free(got);
	GPU->ops->buf_free(GPU, dout);
	dout = dev_poisoned(nd);
	assert_int_equal(GPU->ops->swiglu(GPU, dout, dx, dy, n, dim), 0);
	assert_int_equal(CPU->ops->swiglu(CPU, o, x2, y, n, dim), 0);
	got = host_from(dout, nd);
	assert_true(rel_err_f(got, o, nd) <= 1e-5);
	free(got);

	/* rope, both pair layouts, positions up to 8k */
	uint32_t pos[7];
	for (uint32_t i = 0; i < n; i++)
		pos[i] = (uint32_t)(rng_next() % 8192);
	uint32_t *dpos = dev_from(pos, sizeof(pos));
	for (int neox = 0; neox < 2; neox++) {
		for (size_t i = 0; i < (size_t)n * nh * hd; i++)
			x[i] = rng_f(-2.0f, 2.0f);
		GPU->ops->upload(GPU, dx, x, (size_t)n * nh * hd * 4);
		assert_int_equal(GPU->ops->rope(GPU, dx, dpos, n, nh, hd, &KB_ROPE_PLAIN(hd, 100000.0f, neox)), 0);
		assert_int_equal(CPU->ops->rope(CPU, x, pos, n, nh, hd, &KB_ROPE_PLAIN(hd, 100000.0f, neox)), 0);
		got = host_from(dx, (size_t)n * nh * hd);
		double e = rel_err_f(got, x, (size_t)n * nh * hd);
		printf("rope neox %d: rel err %.3g\n", neox, e);
		assert_true(e <= 1e-5);
		free(got);
	}
	/* argmax: lowest index on a tie */
	for (size_t i = 0; i < nd; i++)
		x[i] = rng_f(-1.0f, 1.0f);
	x[5] = x[300] = 7.0f;
	x[dim + dim - 1] = 9.0f;
	GPU->ops->upload(GPU, dx, x, nd * 4);
	uint32_t ids[7], want[7];
	assert_int_equal(GPU->ops->argmax(GPU, ids, dx, n, dim), 0);
	assert_int_equal(CPU->ops->argmax(CPU, want, x, n, dim), 0);
	assert_memory_equal(ids, want, sizeof(ids));
	assert_int_equal(ids[0], 5);
	assert_int_equal(ids[1], dim - 1);

	GPU->ops->buf_free(GPU, dout);
	GPU->ops->buf_free(GPU, dx);
	GPU->ops->buf_free(GPU, dy);
	GPU->ops->buf_free(GPU, dg);
	GPU->ops->buf_free(GPU, dpos);
	free(x);
	free(x2);
	free(y);
	free(g);
	free(o);
}

/* ---- the optional ops (Qwen2's biases, Gemma's scale, soft-cap and GeGLU) ---- */

/* GELU as ggml's CPU has it for f32 (GGML_GELU_FP16): through f16, from the table's formula. */
static float gelu_ggml_host(float x)
{
	if (x <= -10.0f)
		return 0.0f;
	if (x >= 10.0f)
		return x;
	float h = fp16_round(x);
	float g = 0.5f * h * (1.0f + tanhf(0.79788456080286535587989211986876f * h *
					   (1.0f + 0.044715f * h * h)));
	return fp16_round(g);
}

/* got against the test's own values and, where the CPU has the op, the CPU's. */
static void check_op(const char *what, const float *got, const float *want, const float *cpu,
		     size_t n, double tol)
{
	double e = rel_err_f(got, want, n);
	printf("%s: rel err %.3g against the definition", what, e);
	if (cpu)
		printf(", %.3g against the CPU", rel_err_f(got, cpu, n));
	printf("\n");
	if (!(e <= tol))
		fail_msg("%s: relative error %g over %g", what, e, tol);
	if (cpu && !(rel_err_f(got, cpu, n) <= tol))
		fail_msg("%s: relative error %g against the CPU, over %g", what,
			 rel_err_f(got, cpu, n), tol);
}

/* The CPU's result of an optional op into cpu, or NULL when it does not have the op yet. */
#define CPU_OP(op, cpu, x0, n, ...)                                                   \
	(CPU->ops->op && (memcpy(cpu, x0, (n) * 4), CPU->ops->op(CPU, __VA_ARGS__) == 0) \
		 ? cpu : NULL)

static void test_new_ops(void **state)
{
	(void)state;
	need_gpu();
	if (simulated && !GPU->ops->geglu) {
		printf("skipped: the simulation's CPU lacks the optional ops yet\n");
		skip();
	}
	assert_non_null(GPU->ops->add_bias);
	assert_non_null(GPU->ops->scale);
	assert_non_null(GPU->ops->softcap);
	assert_non_null(GPU->ops->geglu);
	const uint32_t n = 5, dim = 576;
	const size_t nd = (size_t)n * dim;
	rng_s = 29;
	float *x = malloc(nd * 4), *u = malloc(nd * 4), *bias = malloc(dim * 4);
	float *want = malloc(nd * 4), *cpu = malloc(nd * 4);
	assert_true(x && u && bias && want && cpu);
	for (size_t i = 0; i < nd; i++) {
		x[i] = rng_f(-12.0f, 12.0f);	/* past GELU's +-10 clamps on both sides */
		u[i] = rng_f(-2.0f, 2.0f);
	}
	for (uint32_t i = 0; i < dim; i++)
		bias[i] = rng_f(-1.0f, 1.0f);
	float *dx = dev_from(x, nd * 4), *du = dev_from(u, nd * 4), *db = dev_from(bias, dim * 4);

	/* add_bias: one f32 add each, exact */
	for (size_t i = 0; i < nd; i++)
		want[i] = x[i] + bias[i % dim];
	assert_int_equal(GPU->ops->add_bias(GPU, dx, db, n, dim), 0);
	float *got = host_from(dx, nd);
	check_op("add_bias", got, want, CPU_OP(add_bias, cpu, x, nd, cpu, bias, n, dim), nd, 0.0);
	free(got);

	/* scale: one f32 multiply each, exact */
	GPU->ops->upload(GPU, dx, x, nd * 4);
	for (size_t i = 0; i < nd; i++)
		want[i] = x[i] * 4.8989794f;
	assert_int_equal(GPU->ops->scale(GPU, dx, 4.8989794f, n, dim), 0);
	got = host_from(dx, nd);
	check_op("scale", got, want, CPU_OP(scale, cpu, x, nd, cpu, 4.8989794f, n, dim), nd, 0.0);
	free(got);

	/* softcap at 30 (Gemma 2's final logits): x * (1/30), tanh, * 30 */
	GPU->ops->upload(GPU, dx, x, nd * 4);
	for (size_t i = 0; i < nd; i++)
		want[i] = (float)(30.0 * tanh((double)(x[i] * (1.0f / 30.0f))));
	assert_int_equal(GPU->ops->softcap(GPU, dx, 30.0f, n, dim), 0);
	got = host_from(dx, nd);
	check_op("softcap", got, want, CPU_OP(softcap, cpu, x, nd, cpu, 30.0f, n, dim), nd, 1e-6);
	free(got);

	/* geglu, out aliasing gate; an f16 rounding a tanhf ulp flips moves one element by 2^-11 */
	GPU->ops->upload(GPU, dx, x, nd * 4);
	for (size_t i = 0; i < nd; i++)
		want[i] = gelu_ggml_host(x[i]) * u[i];
	assert_int_equal(GPU->ops->geglu(GPU, dx, dx, du, n, dim), 0);
	got = host_from(dx, nd);
	check_op("geglu", got, want, CPU_OP(geglu, cpu, x, nd, cpu, cpu, u, n, dim), nd, 1e-4);
	free(got);

	GPU->ops->buf_free(GPU, dx);
	GPU->ops->buf_free(GPU, du);
	GPU->ops->buf_free(GPU, db);
	free(x);
	free(u);
	free(bias);
	free(want);
	free(cpu);
}

/* ---- rope with every parameter ---- */

/* x (n, nh, hd) rotated by the definition in backend.h: f32 angles as ggml walks them, f64 trig. */
static void rope_def(float *x, const uint32_t *pos, uint32_t n, uint32_t nh, uint32_t hd,
		     const struct kb_rope *rp)
{
	uint32_t half = rp->rot_dim / 2;
	float step = powf(rp->theta, -2.0f / (float)rp->rot_dim);
	double ms = rp->attn_factor;
	if (rp->ext_factor != 0.0f)
		ms *= 1.0 + 0.1 * log(1.0 / rp->freq_scale);
	for (uint32_t r = 0; r < n; r++) {
		float a = (float)pos[r];
		for (uint32_t i = 0; i < half; i++, a *= step) {
			float te = rp->h_freq_factors ? a / rp->h_freq_factors[i] : a;
			float t = rp->freq_scale * te;
			if (rp->ext_factor != 0.0f) {
				float y = ((float)i - rp->corr_lo) / fmaxf(0.001f, rp->corr_hi - rp->corr_lo);
				float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * rp->ext_factor;
				t = t * (1.0f - mix) + te * mix;
			}
			double c = cos((double)t) * ms, s = sin((double)t) * ms;
			for (uint32_t h = 0; h < nh; h++) {
				float *v = x + ((size_t)r * nh + h) * hd;
				uint32_t ia = rp->neox ? i : 2 * i, ib = rp->neox ? i + half : 2 * i + 1;
				double x0 = v[ia], x1 = v[ib];
				v[ia] = (float)(x0 * c - x1 * s);
				v[ib] = (float)(x0 * s + x1 * c);
			}
		}
	}
}

static void test_rope_params(void **state)
{
	(void)state;
	need_gpu();
	const uint32_t n = 7, nh = 8, hd = 128, nx = n * nh * hd;
	rng_s = 31;
	float ff[64];
	for (int i = 0; i < 64; i++)	/* Llama 3's factors run from 1 to 8 */
		ff[i] = i < 20 ? 1.0f : i < 40 ? rng_f(1.0f, 8.0f) : 8.0f;
	float *dff = dev_from(ff, sizeof(ff));
	uint32_t pos[7] = { 0, 1, 17, 1000, 4095, 8191, 31999 };
	uint32_t *dpos = dev_from(pos, sizeof(pos));
	struct {
		const char *name;
		struct kb_rope r;
	} cases[] = {
		{ "plain, rot 64 of 128", KB_ROPE_PLAIN(64, 10000.0f, 0) },
		{ "freq factors", KB_ROPE_PLAIN(128, 500000.0f, 0) },
		{ "linear 1/4", KB_ROPE_PLAIN(128, 10000.0f, 1) },
		{ "yarn 1/4", KB_ROPE_PLAIN(128, 1000000.0f, 1) },
		{ "attn_factor", KB_ROPE_PLAIN(128, 10000.0f, 0) },
	};
	cases[1].r.freq_factors = dff;
	cases[1].r.h_freq_factors = ff;
	cases[2].r.freq_scale = 0.25f;
	cases[3].r.freq_scale = 0.25f;
	cases[3].r.ext_factor = 1.0f;
	cases[3].r.corr_lo = 20.3f;
	cases[3].r.corr_hi = 45.7f;
	cases[4].r.attn_factor = 0.7f;
	float *x = malloc(nx * 4), *want = malloc(nx * 4), *cpu = malloc(nx * 4);
	assert_true(x && want && cpu);
	float *dx = dev_poisoned(nx);
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		for (int neox = 0; neox < 2; neox++) {
			struct kb_rope rp = cases[c].r;
			rp.neox = neox;
			for (uint32_t i = 0; i < nx; i++)
				x[i] = rng_f(-2.0f, 2.0f);
			memcpy(want, x, nx * 4);
			memcpy(cpu, x, nx * 4);
			rope_def(want, pos, n, nh, hd, &rp);
			GPU->ops->upload(GPU, dx, x, nx * 4);
			int grc = GPU->ops->rope(GPU, dx, dpos, n, nh, hd, &rp);
			if (simulated && grc == -ENOTSUP) {
				printf("rope %s: the simulation's CPU lacks it yet\n", cases[c].name);
				continue;
			}
			assert_int_equal(grc, 0);
			struct kb_rope rc = rp;
			rc.freq_factors = rp.h_freq_factors;	/* the CPU's buffers are host memory */
			int crc = CPU->ops->rope(CPU, cpu, pos, n, nh, hd, &rc);
			float *got = host_from(dx, nx);
			char what[64];
			snprintf(what, sizeof(what), "rope %s, neox %d", cases[c].name, neox);
			/* f32 angles up to 32k: sin/cos of the same angle differ by ulps of it */
			check_op(what, got, want, crc == 0 ? cpu : NULL, nx, 1e-5);
			free(got);
		}
	}
	GPU->ops->buf_free(GPU, dx);
	GPU->ops->buf_free(GPU, dff);
	GPU->ops->buf_free(GPU, dpos);
	free(x);
	free(want);
	free(cpu);
}

/* ---- paged K/V and attention ---- */

#define AT_SEQS 6
#define AT_BT 16
#define AT_KVH 3

/* Head slice e0 .. e0 + hd - 1 of a cached row as floats (f32, f16 or q8_0 rows). */
static void kv_slice(uint32_t type, const uint8_t *row, uint32_t e0, uint32_t hd, float *out)
{
	size_t off = type == KB_F32 ? (size_t)e0 * 4 : type == KB_F16 ? (size_t)e0 * 2 : (size_t)e0 / 32 * 34;
	assert_int_equal(dequantize_row(type, row + off, out, hd), 0);
}

/*
 * Attention by the definition in backend.h, in f64: row r sees positions
 * p - window < t <= p, score s = softcap * tanh(q.k / softcap), then times scale.
 * Q is rounded to f16 for an f16 cache as the CPU does; the softmax weights
 * are not, which the f16 tolerance covers.
 */
static void attn_def(float *out, const float *q, const struct kb_kv_rows *kv, uint32_t n,
		     const struct kb_attn_shape *sh)
{
	const uint32_t hd = sh->head_dim, g = sh->n_heads / sh->n_kv_heads;
	float *kr = malloc(hd * 4), *vr = malloc(hd * 4);
	double *acc = malloc(hd * 8), *sc = malloc(((size_t)kv->h_pos[0] + 4096) * 8);
	assert_true(kr && vr && acc && sc);
	for (uint32_t r = 0; r < n; r++) {
		uint32_t p = kv->h_pos[r], lo = sh->window && p >= sh->window ? p - sh->window + 1 : 0;
		struct kb_kv_view v = kv->geo;
		v.blocks = kv->tables + kv->h_tab_off[r];
		v.n_blocks = kv->h_tab_len[r];
		sc = realloc(sc, ((size_t)p + 1) * 8);
		assert_non_null(sc);
		for (uint32_t h = 0; h < sh->n_heads; h++) {
			const float *qh = q + ((size_t)r * sh->n_heads + h) * hd;
			uint32_t e0 = (h / g) * hd;
			double mx = -INFINITY, l = 0.0;
			for (uint32_t t = lo; t <= p; t++) {
				kv_slice(v.type, kb_kv_row(&v, 0, t), e0, hd, kr);
				double s = 0.0;
				for (uint32_t d = 0; d < hd; d++)
					s += (double)(v.type == KB_F16 ? fp16_round(qh[d]) : qh[d]) * kr[d];
				if (sh->softcap != 0.0f)
					s = sh->softcap * tanh(s / sh->softcap);
				s *= sh->scale;
				sc[t] = s;
				mx = s > mx ? s : mx;
			}
			memset(acc, 0, hd * 8);
			for (uint32_t t = lo; t <= p; t++) {
				double w = exp(sc[t] - mx);
				l += w;
				kv_slice(v.type, kb_kv_row(&v, 1, t), e0, hd, vr);
				for (uint32_t d = 0; d < hd; d++)
					acc[d] += w * vr[d];
			}
			for (uint32_t d = 0; d < hd; d++)
				out[((size_t)r * sh->n_heads + h) * hd + d] = (float)(acc[d] / l);
		}
	}
	free(kr);
	free(vr);
	free(acc);
	free(sc);
}

static void attention_compare(const float *got, const float *want, size_t n, uint32_t type,
			      uint32_t group, uint32_t hd, float softcap, uint32_t window)
{
	double e = rel_err_f(got, want, n);
	double tol = type == KB_F32 ? 1e-3 : 1e-2;
	printf("attention cache type %u group %u head_dim %u softcap %g window %u: rel err %.3g\n",
	       type, group, hd, (double)softcap, window, e);
	if (!(e <= tol))
		fail_msg("attention type %u group %u hd %u softcap %g window %u: relative error %g over %g",
			 type, group, hd, (double)softcap, window, e, tol);
}

/*
 * AT_SEQS sequences with scattered block tables in one pool; K/V of every
 * position written through write_kv_rows on both backends (the bytes must
 * be identical), then attention for decode rows (each sequence's last
 * position) and a 40-row prefill run of the longest.
 */
static void attention_case(uint32_t type, uint32_t group, uint32_t hd, float softcap,
			   uint32_t window)
{
	const uint32_t kv_dim = AT_KVH * hd, nh = AT_KVH * group, qd = nh * hd;
	const uint32_t lens[AT_SEQS] = { 1, 17, 300, 1000, 64, 2500 };
	const size_t row = kvpool_row_bytes(type, kv_dim), bb = 2 * (size_t)AT_BT * row;
	uint32_t nblk[AT_SEQS], total_blk = 0, total_pos = 0;
	for (int s = 0; s < AT_SEQS; s++) {
		nblk[s] = (lens[s] + AT_BT - 1) / AT_BT;
		total_blk += nblk[s];
		total_pos += lens[s];
	}
	const uint32_t pool_blocks = total_blk + 7;
	uint32_t *perm = malloc(pool_blocks * 4), *tables = malloc(total_blk * 4);
	for (uint32_t i = 0; i < pool_blocks; i++)
		perm[i] = i;
	for (uint32_t i = pool_blocks - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(rng_next() % (i + 1)), t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	memcpy(tables, perm, total_blk * 4);
	/* Rows: every position of every sequence (for the writes). */
	uint32_t n = total_pos, *pos = malloc(n * 4), *off = malloc(n * 4), *len = malloc(n * 4);
	uint32_t *tiles = malloc(2 * n * 4), n_tiles = 0, r = 0, t0 = 0;
	for (int s = 0; s < AT_SEQS; s++) {
		for (uint32_t p = 0; p < lens[s]; p++, r++) {
			pos[r] = p;
			off[r] = t0;
			len[r] = nblk[s];
			if (p % KB_TILE_ROWS == 0) {
				tiles[2 * n_tiles] = r;
				tiles[2 * n_tiles + 1] = lens[s] - p < KB_TILE_ROWS ? lens[s] - p : KB_TILE_ROWS;
				n_tiles++;
			}
		}
		t0 += nblk[s];
	}
	float *k = malloc((size_t)n * kv_dim * 4), *v = malloc((size_t)n * kv_dim * 4);
	for (size_t i = 0; i < (size_t)n * kv_dim; i++) {
		k[i] = rng_f(-1.0f, 1.0f);
		v[i] = rng_f(-1.0f, 1.0f);
	}
	uint8_t *hpool = calloc(pool_blocks, bb);
	struct kb_kv_rows hk = {
		.geo = { .base = hpool, .block_tokens = AT_BT, .block_bytes = bb, .k_off = 0,
			 .v_off = AT_BT * row, .row_bytes = row, .type = type },
		.tables = tables, .tab_off = off, .tab_len = len, .tiles = tiles,
		.h_tab_off = off, .h_tab_len = len, .h_tiles = tiles, .h_pos = pos, .n_tiles = n_tiles,
	};
	struct kb_kv_rows dk = hk;
	void *dpool;
	assert_int_equal(GPU->ops->buf_alloc(GPU, &dpool, pool_blocks * bb), 0);
	dk.geo.base = dpool;
	dk.tables = dev_from(tables, total_blk * 4);
	dk.tab_off = dev_from(off, n * 4);
	dk.tab_len = dev_from(len, n * 4);
	dk.tiles = dev_from(tiles, 2 * n_tiles * 4);
	uint32_t *dpos = dev_from(pos, n * 4);
	float *dkx = dev_from(k, (size_t)n * kv_dim * 4), *dvx = dev_from(v, (size_t)n * kv_dim * 4);
	assert_int_equal(CPU->ops->write_kv_rows(CPU, &hk, pos, n, kv_dim, k, v), 0);
	assert_int_equal(GPU->ops->write_kv_rows(GPU, &dk, dpos, n, kv_dim, dkx, dvx), 0);
	/* The written rows, bit for bit (unwritten slots of partial blocks are not compared). */
	uint8_t *back = malloc(pool_blocks * bb);
	assert_int_equal(GPU->ops->download(GPU, back, dpool, pool_blocks * bb), 0);
	for (uint32_t i = 0; i < n; i++)
		for (int which = 0; which < 2; which++) {
			struct kb_kv_view hv = hk.geo, dv = hk.geo;
			hv.blocks = tables + off[i];
			hv.n_blocks = len[i];
			dv = hv;
			dv.base = back;
			if (memcmp(kb_kv_row(&hv, which, pos[i]), kb_kv_row(&dv, which, pos[i]), row))
				fail_msg("type %u: %s row of position %u differs from the CPU's",
					 type, which ? "V" : "K", pos[i]);
		}

	/* Query rows: each sequence's last position, then 40 prefill rows of the longest. */
	uint32_t qn = AT_SEQS + 40, qpos[AT_SEQS + 40], qoff[AT_SEQS + 40], qlen[AT_SEQS + 40];
	uint32_t qtiles[2 * (AT_SEQS + 40)], qnt = 0;
	t0 = 0;
	for (int s = 0; s < AT_SEQS; s++) {
		qpos[s] = lens[s] - 1;
		qoff[s] = t0;
		qlen[s] = nblk[s];
		qtiles[2 * qnt] = s;
		qtiles[2 * qnt + 1] = 1;
		qnt++;
		if (s + 1 < AT_SEQS)
			t0 += nblk[s];
	}
	for (uint32_t i = 0; i < 40; i++) {
		qpos[AT_SEQS + i] = lens[AT_SEQS - 1] - 40 + i;
		qoff[AT_SEQS + i] = t0;
		qlen[AT_SEQS + i] = nblk[AT_SEQS - 1];
		if (i % KB_TILE_ROWS == 0) {
			qtiles[2 * qnt] = AT_SEQS + i;
			qtiles[2 * qnt + 1] = 40 - i < KB_TILE_ROWS ? 40 - i : KB_TILE_ROWS;
			qnt++;
		}
	}
	struct kb_kv_rows hq = hk, dq = dk;
	hq.tab_off = hq.h_tab_off = qoff;
	hq.tab_len = hq.h_tab_len = qlen;
	hq.tiles = hq.h_tiles = qtiles;
	hq.h_pos = qpos;
	hq.n_tiles = qnt;
	dq.h_tab_off = qoff;
	dq.h_tab_len = qlen;
	dq.h_tiles = qtiles;
	dq.h_pos = qpos;
	dq.n_tiles = qnt;
	dq.tab_off = dev_from(qoff, sizeof(qoff));
	dq.tab_len = dev_from(qlen, sizeof(qlen));
	dq.tiles = dev_from(qtiles, 2 * qnt * 4);
	uint32_t *dqpos = dev_from(qpos, sizeof(qpos));
	float *q = malloc((size_t)qn * qd * 4), *want = malloc((size_t)qn * qd * 4);
	for (size_t i = 0; i < (size_t)qn * qd; i++)
		q[i] = rng_f(-2.0f, 2.0f);
	float *dqx = dev_from(q, (size_t)qn * qd * 4), *dout = dev_poisoned((size_t)qn * qd);
	const struct kb_attn_shape sh = { .n_heads = nh, .n_kv_heads = AT_KVH, .head_dim = hd,
					  .scale = 1.0f / sqrtf((float)hd), .softcap = softcap,
					  .window = window };
	int crc = CPU->ops->attention_rows(CPU, want, q, &hq, qpos, qn, &sh);
	if (crc == -ENOTSUP && (softcap != 0.0f || window)) {
		printf("(the CPU lacks soft-cap or window yet: against the definition)\n");
		attn_def(want, q, &hq, qn, &sh);
	} else {
		assert_int_equal(crc, 0);
	}
	if (type == KB_F32 && softcap == 0.0f && !window) {
		/* The definition the soft-cap and window cases may fall back on, checked on the CPU. */
		float *def = malloc((size_t)qn * qd * 4);
		assert_non_null(def);
		attn_def(def, q, &hq, qn, &sh);
		double de = rel_err_f(def, want, (size_t)qn * qd);
		printf("attention by the definition against the CPU: rel err %.3g\n", de);
		assert_true(de <= 1e-5);
		free(def);
	}
	float *got = NULL;
	int grc = GPU->ops->attention_rows(GPU, dout, dqx, &dq, dqpos, qn, &sh);
	if (simulated && grc == -ENOTSUP) {
		printf("attention softcap %g window %u: the simulation's CPU lacks it yet\n",
		       (double)softcap, window);
	} else {
		assert_int_equal(grc, 0);
		got = host_from(dout, (size_t)qn * qd);
		attention_compare(got, want, (size_t)qn * qd, type, group, hd, softcap, window);
		/* A position past a row's table is refused before any launch. */
		uint32_t saved = qpos[0];
		qpos[0] = qlen[0] * AT_BT;
		GPU->ops->upload(GPU, dqpos, qpos, sizeof(qpos));
		assert_int_equal(GPU->ops->attention_rows(GPU, dout, dqx, &dq, dqpos, qn, &sh),
				 -ERANGE);
		qpos[0] = saved;
	}

	void *bufs[] = { dpool, (void *)dk.tables, (void *)dk.tab_off, (void *)dk.tab_len,
			 (void *)dk.tiles, dpos, dkx, dvx, (void *)dq.tab_off, (void *)dq.tab_len,
			 (void *)dq.tiles, dqpos, dqx, dout };
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		GPU->ops->buf_free(GPU, bufs[i]);
	free(got);
	free(q);
	free(want);
	free(back);
	free(hpool);
	free(k);
	free(v);
	free(pos);
	free(off);
	free(len);
	free(tiles);
	free(perm);
	free(tables);
}

static void test_attention(void **state)
{
	(void)state;
	need_gpu();
	rng_s = 37;
	attention_case(KB_F16, 3, 64, 0.0f, 0);
	attention_case(KB_F32, 3, 64, 0.0f, 0);
	attention_case(KB_Q8_0, 3, 64, 0.0f, 0);
	attention_case(KB_F16, 4, 128, 0.0f, 0);
	attention_case(KB_F16, 1, 256, 0.0f, 0);
	attention_case(KB_F32, 8, 96, 0.0f, 0);
}

/*
 * Gemma 2's soft-cap (50 on scores scaled to about +-1 would never bite, so
 * a cap of 0.5) and sliding windows shorter than, equal to and longer than
 * a K/V tile, on decode and prefill rows; the longest sequence (2500) runs
 * far past every window.
 */
static void test_attention_cap_window(void **state)
{
	(void)state;
	need_gpu();
	rng_s = 41;
	attention_case(KB_F32, 3, 64, 0.5f, 0);
	attention_case(KB_F16, 4, 128, 0.5f, 0);
	attention_case(KB_F32, 3, 64, 0.0f, 1);
	attention_case(KB_F32, 3, 64, 0.0f, 32);
	attention_case(KB_F16, 3, 64, 0.0f, 100);
	attention_case(KB_Q8_0, 8, 96, 0.0f, 4096);
	attention_case(KB_F16, 2, 256, 0.5f, 1000);
}

/* Failures come back as errors and leave the backend usable. */
static void test_errors(void **state)
{
	(void)state;
	need_gpu();
	void *p = NULL;
	/* (not on the simulation: a sanitizer's malloc aborts instead of failing) */
	if (!simulated)
		assert_int_equal(GPU->ops->buf_alloc(GPU, &p, (size_t)1 << 50), -ENOMEM);
	struct kb_weight bad = { .data = NULL, .type = 99, .rows = 4, .cols = 32, .row_bytes = 64 };
	float *y = dev_poisoned(4), *x = dev_poisoned(32);
	assert_int_equal(GPU->ops->matmul(GPU, y, &bad, x, 1), -ENOTSUP);
	assert_int_equal(GPU->ops->buf_alloc(GPU, &p, 4096), 0);
	GPU->ops->buf_free(GPU, p);
	GPU->ops->buf_free(GPU, y);
	GPU->ops->buf_free(GPU, x);
}

static int setup(void **state)
{
	(void)state;
	if (backend_cpu_create(&CPU, 0))
		return -1;
	/*
	 * KVD_TEST_DEVSIM=1 runs the device tests against the CPU dressed as a
	 * device, which checks the tests themselves on machines without a GPU.
	 */
	const char *sim = getenv("KVD_TEST_DEVSIM");
	if (sim && !strcmp(sim, "1")) {
		if (devsim_create(&GPU, 0))
			return -1;
		simulated = 1;
		snprintf(gpu_why, sizeof(gpu_why), "simulated on the CPU");
	} else if (backend_cuda_create(&GPU, 0, gpu_why, sizeof(gpu_why))) {
		GPU = NULL;
	}
	else
		printf("device: %s\n", gpu_why);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (GPU)
		GPU->ops->destroy(GPU);
	CPU->ops->destroy(CPU);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plan_matvec),
		cmocka_unit_test(test_plan_attention),
		cmocka_unit_test(test_backend_choose),
		cmocka_unit_test(test_backend_create),
		cmocka_unit_test(test_decoder_on_host),
		cmocka_unit_test(test_decoder_hand),
		cmocka_unit_test(test_plan_weight),
		cmocka_unit_test(test_matmul),
		cmocka_unit_test(test_row_ops),
		cmocka_unit_test(test_new_ops),
		cmocka_unit_test(test_rope_params),
		cmocka_unit_test(test_attention),
		cmocka_unit_test(test_attention_cap_window),
		cmocka_unit_test(test_errors),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
