/* test_paged.c — paged attention equals contiguous attention for random block placements. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <cmocka.h>

#include "kernels/backend.h"
#include "kernels/cpu/backend_cpu.h"
#include "tests/lib/rng.h"

#define HD 64
#define KVH 2
#define NPOS 150	/* positions cached */
#define NQ 6		/* query rows, the last positions */

static struct rng R;

static float rnd(void)
{
	return rng_sym(&R);
}

static uint32_t rnd_below(uint32_t n)
{
	return rng_below(&R, n);
}

static size_t row_bytes(uint32_t type)
{
	uint32_t kv_dim = KVH * HD;
	return type == KB_F32 ? kv_dim * 4 : type == KB_Q8_0 ? kv_dim / 32 * 34 : kv_dim * 2;
}

/*
 * The same K/V written through a paged view (blocks of bt tokens scattered
 * over a pool in random order, with unused blocks between) and through a
 * contiguous one; attention over both must agree to 1e-6 relative.
 */
static void check(struct backend *be, uint32_t type, uint32_t bt, uint32_t group)
{
	const uint32_t kv_dim = KVH * HD, nh = KVH * group, qd = nh * HD;
	const size_t row = row_bytes(type);
	const uint32_t nblk = (NPOS + bt - 1) / bt, pool_blocks = 2 * nblk + 3;
	const size_t bb = 2 * (size_t)bt * row;	/* one layer: K rows, then V rows */
	uint8_t *pool = calloc(pool_blocks, bb);
	uint32_t *table = malloc(nblk * sizeof(uint32_t)), *perm = malloc(pool_blocks * sizeof(uint32_t));
	uint32_t ctx = 1;
	while (ctx < NPOS)
		ctx <<= 1;
	uint8_t *flat = calloc(2, ctx * row);
	float *k = malloc(sizeof(float) * NPOS * kv_dim), *v = malloc(sizeof(float) * NPOS * kv_dim);
	float *q = malloc(sizeof(float) * NQ * qd);
	float *o1 = malloc(sizeof(float) * NQ * qd), *o2 = malloc(sizeof(float) * NQ * qd);
	uint32_t pos[NPOS];
	assert_true(pool && table && perm && flat && k && v && q && o1 && o2);
	for (uint32_t i = 0; i < pool_blocks; i++)
		perm[i] = i;
	for (uint32_t i = pool_blocks - 1; i > 0; i--) {
		uint32_t j = rnd_below(i + 1), t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	memcpy(table, perm, nblk * sizeof(uint32_t));
	for (uint32_t i = 0; i < NPOS * kv_dim; i++) {
		k[i] = rnd();
		v[i] = rnd();
	}
	for (uint32_t i = 0; i < NQ * qd; i++)
		q[i] = 2.0f * rnd();
	for (uint32_t p = 0; p < NPOS; p++)
		pos[p] = p;
	static const uint32_t zero = 0;
	struct kb_kv_view paged = { .base = pool, .blocks = table, .n_blocks = nblk,
				    .block_tokens = bt, .block_bytes = bb, .k_off = 0,
				    .v_off = bt * row, .row_bytes = row, .type = type };
	struct kb_kv_view contig = { .base = flat, .blocks = &zero, .n_blocks = 1,
				     .block_tokens = ctx, .block_bytes = 2 * ctx * row, .k_off = 0,
				     .v_off = ctx * row, .row_bytes = row, .type = type };
	struct kb_attn_shape sh = { .n_heads = nh, .n_kv_heads = KVH, .head_dim = HD,
				    .scale = 0.125f };
	/* Written in two uneven calls, as a prefill chunk and a decode would. */
	for (int w = 0; w < 2; w++) {
		const struct kb_kv_view *kv = w ? &contig : &paged;
		assert_int_equal(backend_cpu_write_kv(be, kv, pos, 97, kv_dim, k, v), 0);
		assert_int_equal(backend_cpu_write_kv(be, kv, pos + 97, NPOS - 97, kv_dim,
						      k + 97 * kv_dim, v + 97 * kv_dim), 0);
	}
	assert_int_equal(backend_cpu_attention(be, o1, q, &paged, pos + NPOS - NQ, NQ, &sh), 0);
	assert_int_equal(backend_cpu_attention(be, o2, q, &contig, pos + NPOS - NQ, NQ, &sh), 0);
	double num = 0, den = 0;
	for (uint32_t i = 0; i < NQ * qd; i++) {
		num += (double)(o1[i] - o2[i]) * (o1[i] - o2[i]);
		den += (double)o2[i] * o2[i];
	}
	if (sqrt(num / den) > 1e-6)
		fail_msg("type %u block %u group %u: paged vs contiguous relative error %g", type, bt,
			 group, sqrt(num / den));
	/* A position past the table is refused, not read. */
	uint32_t far = nblk * bt;
	assert_int_equal(backend_cpu_attention(be, o1, q, &paged, &far, 1, &sh), -ERANGE);
	free(pool);
	free(table);
	free(perm);
	free(flat);
	free(k);
	free(v);
	free(q);
	free(o1);
	free(o2);
}

static void test_paged_equals_contiguous(void **state)
{
	(void)state;
	struct backend *be;
	assert_int_equal(backend_cpu_create(&be, 2), 0);
	static const uint32_t types[] = { KB_F16, KB_F32, KB_Q8_0 };
	static const uint32_t bts[] = { 1, 16, 64 };
	static const uint32_t groups[] = { 1, 3, 8 };
	R.s = 99;
	for (size_t t = 0; t < 3; t++)
		for (size_t b = 0; b < 3; b++)
			for (size_t g = 0; g < 3; g++)
				check(be, types[t], bts[b], groups[g]);
	be->ops->destroy(be);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_paged_equals_contiguous),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
