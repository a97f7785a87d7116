/* test_kernels.c — CPU kernels against double-precision references: f16, block formats, dots, matmul, row ops, attention, pool. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/repack.h"
#include "kernels/cpu/threadpool.h"
#include "tests/lib/wait.h"


/* ---- helpers ---- */

static uint64_t rng_s;

static void rng_seed(uint64_t seed)
{
	rng_s = seed;
}

/* splitmix64: fixed seeds make every failure reproducible. */
static uint64_t rng_next(void)
{
	uint64_t z = (rng_s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double rng_unit(void)
{
	return (double)(rng_next() >> 11) * 0x1p-53;
}

/* Uniform in [lo, hi), never exactly zero. */
static float rng_f(float lo, float hi)
{
	float f;
	do
		f = lo + (hi - lo) * (float)rng_unit();
	while (f == 0.0f);
	return f;
}

/* Magnitude uniform in [lo, hi), random sign. */
static float rng_mag(float lo, float hi)
{
	float f = rng_f(lo, hi);
	return rng_next() & 1 ? -f : f;
}

static uint32_t rng_below(uint32_t n)
{
	return (uint32_t)(rng_next() % n);
}

static uint32_t fbits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float bits_f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* A half decoded from its definition: (-1)^s 2^(e-15) 1.m, subnormal 2^-14 0.m. */
static double half_ref(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	double v;
	if (e == 31)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp(m, -24);
	else
		v = ldexp(1024 + m, e - 25);
	return h >> 15 ? -v : v;
}

/* A bfloat16 decoded from its definition: 8 exponent bits, 7 mantissa bits. */
static double bf16_ref(uint16_t h)
{
	int e = (h >> 7) & 255, m = h & 127;
	double v = e ? ldexp(128 + m, e - 134) : ldexp(m, -133);
	return h >> 15 ? -v : v;
}

static size_t row_bytes_of(uint32_t type, uint32_t cols)
{
	uint32_t be, bb;
	assert_int_equal(kb_type_block(type, &be, &bb), 0);
	return (size_t)(cols / be) * bb;
}

static const uint32_t qtypes[] = { KB_Q4_0, KB_Q4_1, KB_Q8_0, KB_Q4_K, KB_Q6_K };
#define N_QTYPES (sizeof(qtypes) / sizeof(qtypes[0]))

static const char *type_name(uint32_t t)
{
	switch (t) {
	case KB_F32: return "F32";
	case KB_F16: return "F16";
	case KB_BF16: return "BF16";
	case KB_Q4_0: return "Q4_0";
	case KB_Q4_1: return "Q4_1";
	case KB_Q8_0: return "Q8_0";
	case KB_Q4_K: return "Q4_K";
	case KB_Q6_K: return "Q6_K";
	default: return "?";
	}
}

/* ---- 1. fp16 ---- */

static void test_fp16_decode_all(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 65536; h++) {
		double want = half_ref((uint16_t)h);
		float got = fp16_to_f32((uint16_t)h);
		if (isnan(want)) {
			if (!isnan(got) || !signbit(got) != !(h >> 15))
				fail_msg("half 0x%04x: got %a, want a NaN of that sign", h, (double)got);
		} else if (fbits(got) != fbits((float)want)) {
			fail_msg("half 0x%04x: got %a want %a", h, (double)got, want);
		}
	}
}

static void test_fp16_encode(void **state)
{
	(void)state;
	static const struct { float f; uint16_t h; } cases[] = {
		{ 0.0f, 0x0000 }, { -0.0f, 0x8000 }, { 1.0f, 0x3c00 }, { -2.0f, 0xc000 },
		{ 0x1.002p0f, 0x3c00 },		/* tie between 1 and 1+2^-10: even (down) */
		{ 0x1.006p0f, 0x3c02 },		/* tie between 1+2^-10 and 1+2^-9: even (up) */
		{ 0x1.002002p0f, 0x3c01 },	/* just above the tie */
		{ 0x1.001ffep0f, 0x3c00 },	/* just below the tie */
		{ 2046.5f, 0x67fe }, { 2047.5f, 0x6800 },	/* ties; the second carries into the exponent */
		{ 65504.0f, 0x7bff }, { 65519.0f, 0x7bff },
		{ 65520.0f, 0x7c00 },		/* tie between 65504 and 2^16: even, which overflows */
		{ 1e6f, 0x7c00 }, { -1e6f, 0xfc00 }, { FLT_MAX, 0x7c00 },
		{ INFINITY, 0x7c00 }, { -INFINITY, 0xfc00 },
		{ 0x1p-14f, 0x0400 },		/* smallest normal */
		{ 0x1p-15f, 0x0200 }, { 0x1p-24f, 0x0001 }, { -0x1p-24f, 0x8001 },
		{ 0x3ffp-24f, 0x03ff },		/* largest subnormal */
		{ 0x7ffp-25f, 0x0400 },		/* tie between it and the smallest normal: even */
		{ 0x1p-25f, 0x0000 },		/* tie between 0 and 2^-24: even */
		{ 0x1.000002p-25f, 0x0001 }, { 0x3p-25f, 0x0002 }, { 0x5p-25f, 0x0002 },
		{ 0x1p-26f, 0x0000 }, { -0x1p-26f, 0x8000 }, { 1e-30f, 0x0000 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint16_t got = f32_to_fp16(cases[i].f);
		if (got != cases[i].h)
			fail_msg("f32_to_fp16(%a) = 0x%04x, want 0x%04x", (double)cases[i].f, got,
				 cases[i].h);
	}
	static const uint32_t nans[] = { 0x7fc00000u, 0x7f800001u, 0xffc00000u, 0x7fbfffffu,
					 0xff800001u, 0x7fffe000u };
	for (size_t i = 0; i < sizeof(nans) / sizeof(nans[0]); i++) {
		uint16_t h = f32_to_fp16(bits_f(nans[i]));
		if ((h & 0x7c00) != 0x7c00 || !(h & 0x3ff) || (h >> 15) != (nans[i] >> 31))
			fail_msg("NaN 0x%08x became 0x%04x", nans[i], h);
	}
	/* Every finite half (and both infinities) survives the round trip. */
	for (uint32_t h = 0; h < 65536; h++) {
		if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
			continue;
		uint16_t back = f32_to_fp16(fp16_to_f32((uint16_t)h));
		if (back != h)
			fail_msg("half 0x%04x round-trips to 0x%04x", h, back);
	}
	/* Random floats in range: the result is a nearest half, the even one on a tie. */
	rng_seed(11);
	for (int n = 0; n < 1000000; n++) {
		float f = bits_f((uint32_t)rng_next());
		if (!(fabsf(f) < 65520.0f))
			continue;
		uint16_t h = f32_to_fp16(f);
		uint16_t hm = h & 0x7fff;
		double d = fabs(fabs((double)f) - half_ref(hm));
		if (f != 0.0f && (h >> 15) != (fbits(f) >> 31))
			fail_msg("f32_to_fp16(%a) = 0x%04x: wrong sign", (double)f, h);
		for (int side = -1; side <= 1; side += 2) {
			if ((side < 0 && hm == 0) || (side > 0 && hm == 0x7bff))
				continue;
			double dn = fabs(fabs((double)f) - half_ref((uint16_t)(hm + side)));
			if (dn < d || (dn == d && (hm & 1)))
				fail_msg("f32_to_fp16(%a) = 0x%04x, but 0x%04x is nearer or even",
					 (double)f, h, (hm + side) | (h & 0x8000));
		}
	}
}

/*
 * ops_f16_row() (F16C where the CPU has it) against f32_to_fp16() bit for
 * bit: every float with low byte 0 (ties and the halfway cases among
 * them), every float near the subnormal, normal and overflow edges, and
 * rows whose NaNs (any payload) sit at each place of an eight and a tail.
 */
static void test_f16_row(void **state)
{
	(void)state;
	enum { N = 4096 };
	static float x[N + 7];
	static uint16_t h[N + 7];
	uint64_t checked = 0;
	static const uint32_t edges[] = { 0x33000000u, 0x38800000u, 0x477ff000u, 0x7f800000u,
					  0x3f800000u };
	for (uint64_t base = 0; base < (1ull << 32); base += (uint64_t)N << 8) {
		for (uint32_t i = 0; i < N; i++)
			x[i] = bits_f((uint32_t)(base + ((uint64_t)i << 8)));
		ops_f16_row(h, x, N);
		for (uint32_t i = 0; i < N; i++)
			if (h[i] != f32_to_fp16(x[i]))
				fail_msg("ops_f16_row(%a [0x%08x]) = 0x%04x, want 0x%04x", (double)x[i],
					 fbits(x[i]), h[i], f32_to_fp16(x[i]));
		checked += N;
	}
	for (size_t e = 0; e < sizeof(edges) / sizeof(edges[0]); e++)
		for (uint32_t sign = 0; sign < 2; sign++) {
			for (uint32_t i = 0; i < N; i++)
				x[i] = bits_f((edges[e] - N / 2 + i) | sign << 31);
			ops_f16_row(h, x, N);
			for (uint32_t i = 0; i < N; i++)
				if (h[i] != f32_to_fp16(x[i]))
					fail_msg("ops_f16_row(0x%08x) = 0x%04x, want 0x%04x",
						 fbits(x[i]), h[i], f32_to_fp16(x[i]));
			checked += N;
		}
	static const uint32_t nans[] = { 0x7fc00000u, 0x7f800001u, 0xffc00000u, 0x7fbfffffu };
	for (uint32_t n = 1; n <= 27; n++)
		for (uint32_t at = 0; at < n; at++) {
			for (uint32_t i = 0; i < n; i++)
				x[i] = (float)i * 0.37f - 3.0f;
			x[at] = bits_f(nans[(n + at) % 4]);
			memset(h, 0, sizeof(h));
			ops_f16_row(h, x, n);
			for (uint32_t i = 0; i < n; i++)
				if (h[i] != f32_to_fp16(x[i]))
					fail_msg("row of %u, NaN at %u: element %u 0x%04x, want 0x%04x", n,
						 at, i, h[i], f32_to_fp16(x[i]));
			if (h[n] != 0)
				fail_msg("row of %u: wrote past its end", n);
		}
	printf("ops_f16_row: %llu floats checked\n", (unsigned long long)checked);
}

/* ---- 2. dequantization of hand-made blocks ---- */

static void pack_q4_0(struct blk_q4_0 *b, uint16_t d, const uint8_t nib[QK])
{
	b->d = d;
	for (int i = 0; i < QK / 2; i++)
		b->qs[i] = (uint8_t)(nib[i] | nib[i + QK / 2] << 4);
}

static void pack_q4_1(struct blk_q4_1 *b, uint16_t d, uint16_t m, const uint8_t nib[QK])
{
	b->d = d;
	b->m = m;
	for (int i = 0; i < QK / 2; i++)
		b->qs[i] = (uint8_t)(nib[i] | nib[i + QK / 2] << 4);
}

/*
 * Q4_K scales[12]: bytes 0-3 hold the 6-bit scales of sub-blocks 0-3 and the
 * top 2 bits of scales 4-7; bytes 4-7 the mins 0-3 and the top bits of mins
 * 4-7; bytes 8-11 the low nibbles of scale (low) and min (high) 4-7.
 */
static void pack_q4_k(struct blk_q4_k *b, uint16_t d, uint16_t dmin, const uint8_t sc[8],
		      const uint8_t mn[8], const uint8_t q[QK_K])
{
	b->d = d;
	b->dmin = dmin;
	for (int j = 0; j < 4; j++) {
		b->scales[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
		b->scales[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
		b->scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
	}
	for (int c = 0; c < 4; c++)
		for (int i = 0; i < 32; i++)
			b->qs[32 * c + i] = (uint8_t)(q[64 * c + i] | q[64 * c + 32 + i] << 4);
}

/* Q6_K: element l + 32g of half h: ql[64h + l + 32(g&1)] nibble (g&2 ? high : low), qh[32h + l] bits 2g..2g+1. */
static void pack_q6_k(struct blk_q6_k *b, uint16_t d, const int8_t sc[16], const uint8_t q[QK_K])
{
	memset(b, 0, sizeof(*b));
	b->d = d;
	memcpy(b->scales, sc, 16);
	for (int h = 0; h < 2; h++)
		for (int g = 0; g < 4; g++)
			for (int l = 0; l < 32; l++) {
				uint8_t v = q[128 * h + 32 * g + l];
				b->ql[64 * h + l + 32 * (g & 1)] |= (uint8_t)((v & 15) << ((g & 2) ? 4 : 0));
				b->qh[32 * h + l] |= (uint8_t)((v >> 4) << (2 * g));
			}
}

#define DQ_N 512	/* two super-blocks, sixteen small blocks */

/*
 * Expected values are exact in double; scales are chosen so that products
 * are exact in f32 too and the one possible rounding (adding the min) is a
 * single f32 rounding of the exact sum, so the comparison is bitwise.
 */
static void check_row(uint32_t type, const void *src, const double *want, size_t n)
{
	float got[DQ_N];
	assert_int_equal(dequantize_row(type, src, got, n), 0);
	for (size_t i = 0; i < n; i++)
		if (got[i] != (float)want[i])
			fail_msg("%s element %zu: got %a want %a", type_name(type), i,
				 (double)got[i], want[i]);
}

static uint16_t rand_half(float lo, float hi)
{
	return f32_to_fp16(rng_mag(lo, hi));
}

static void test_dequant_small(void **state)
{
	(void)state;
	struct blk_q4_0 b40[DQ_N / QK];
	struct blk_q4_1 b41[DQ_N / QK];
	struct blk_q8_0 b80[DQ_N / QK];
	double w40[DQ_N], w41[DQ_N], w80[DQ_N];
	rng_seed(21);
	for (int k = 0; k < DQ_N / QK; k++) {
		uint8_t nib[QK];
		for (int i = 0; i < QK; i++)
			nib[i] = (uint8_t)rng_below(16);
		nib[0] = 0;
		nib[QK - 1] = 15;
		uint16_t d = rand_half(1e-3f, 1.0f), m = rand_half(1e-3f, 8.0f);
		pack_q4_0(&b40[k], d, nib);
		pack_q4_1(&b41[k], d, m, nib);
		for (int i = 0; i < QK; i++) {
			w40[k * QK + i] = half_ref(d) * (nib[i] - 8);
			w41[k * QK + i] = half_ref(d) * nib[i] + half_ref(m);
		}
		b80[k].d = d;
		for (int i = 0; i < QK; i++) {
			b80[k].qs[i] = (int8_t)(i == 0 ? -128 : i == 1 ? 127 : (int)rng_below(256) - 128);
			w80[k * QK + i] = half_ref(d) * b80[k].qs[i];
		}
	}
	check_row(KB_Q4_0, b40, w40, DQ_N);
	check_row(KB_Q4_1, b41, w41, DQ_N);
	check_row(KB_Q8_0, b80, w80, DQ_N);
}

static void test_dequant_k(void **state)
{
	(void)state;
	struct blk_q4_k b4[DQ_N / QK_K];
	struct blk_q6_k b6[DQ_N / QK_K];
	double w4[DQ_N], w6[DQ_N];
	rng_seed(22);
	for (int s = 0; s < DQ_N / QK_K; s++) {
		uint8_t sc[8], mn[8], q4[QK_K], q6[QK_K];
		int8_t sc6[16];
		for (int j = 0; j < 8; j++) {
			sc[j] = (uint8_t)rng_below(64);
			mn[j] = (uint8_t)rng_below(64);
		}
		/* Extremes, with every sub-block's 6 bits distinct from its neighbours'. */
		sc[0] = 63, mn[0] = 0, sc[5] = 63, mn[5] = 63, sc[7] = 48, mn[7] = 17;
		for (int i = 0; i < QK_K; i++) {
			q4[i] = (uint8_t)rng_below(16);
			q6[i] = (uint8_t)rng_below(64);
		}
		q6[0] = 0, q6[127] = 63, q6[200] = 63, q6[255] = 0;
		for (int j = 0; j < 16; j++)
			sc6[j] = (int8_t)((int)rng_below(256) - 128);
		sc6[3] = -128, sc6[12] = 127;
		uint16_t d = f32_to_fp16(rng_f(1e-3f, 1e-1f)), dmin = f32_to_fp16(rng_f(1e-3f, 1e-1f));
		uint16_t d6 = rand_half(1e-3f, 1e-1f);
		pack_q4_k(&b4[s], d, dmin, sc, mn, q4);
		pack_q6_k(&b6[s], d6, sc6, q6);
		for (int i = 0; i < QK_K; i++) {
			int sub = i / 32, h = i / 128, g = (i % 128) / 32, l = i % 32;
			w4[s * QK_K + i] = half_ref(d) * sc[sub] * q4[i] - half_ref(dmin) * mn[sub];
			w6[s * QK_K + i] = half_ref(d6) * sc6[8 * h + l / 16 + 2 * g] * (q6[i] - 32);
		}
	}
	check_row(KB_Q4_K, b4, w4, DQ_N);
	check_row(KB_Q6_K, b6, w6, DQ_N);
}

static void test_dequant_float(void **state)
{
	(void)state;
	uint16_t h16[DQ_N], hb[DQ_N];
	float f32[DQ_N], got[DQ_N];
	double w16[DQ_N], wb[DQ_N];
	rng_seed(23);
	for (int i = 0; i < DQ_N; i++) {
		do
			h16[i] = (uint16_t)rng_next();
		while ((h16[i] & 0x7c00) == 0x7c00);
		do
			hb[i] = (uint16_t)rng_next();
		while ((hb[i] & 0x7f80) == 0x7f80);
		w16[i] = half_ref(h16[i]);
		wb[i] = bf16_ref(hb[i]);
		f32[i] = bits_f((uint32_t)rng_next() & 0xbf7fffffu);	/* finite */
	}
	check_row(KB_F16, h16, w16, DQ_N);
	check_row(KB_BF16, hb, wb, DQ_N);
	assert_int_equal(dequantize_row(KB_F32, f32, got, DQ_N), 0);
	assert_memory_equal(got, f32, sizeof(f32));
	assert_int_equal(dequantize_row(KB_Q4_0, h16, got, 48), -EINVAL);
	assert_int_equal(dequantize_row(9, h16, got, 32), -EINVAL);
}

/* ---- 3. quantized dot products ---- */

/* A random weight row: random bytes, then sane random f16 scales in place. */
static void rand_wrow(uint32_t type, void *row, uint32_t cols)
{
	size_t nb = row_bytes_of(type, cols);
	uint8_t *p = row;
	for (size_t i = 0; i < nb; i++)
		p[i] = (uint8_t)rng_next();
	for (uint32_t k = 0; k < cols / QK; k++) {
		switch (type) {
		case KB_Q4_0:
			((struct blk_q4_0 *)row)[k].d = rand_half(2e-3f, 2e-2f);
			break;
		case KB_Q4_1: {
			struct blk_q4_1 *b = (struct blk_q4_1 *)row + k;
			float d = rng_f(2e-3f, 2e-2f);
			b->d = f32_to_fp16(d);
			b->m = f32_to_fp16(-8.0f * d * rng_f(0.5f, 1.5f));
			break;
		}
		case KB_Q8_0:
			((struct blk_q8_0 *)row)[k].d = rand_half(1e-4f, 1e-3f);
			break;
		case KB_Q4_K:
			if (k % 8 == 0) {
				((struct blk_q4_k *)row)[k / 8].d = f32_to_fp16(rng_f(1e-4f, 1e-3f));
				((struct blk_q4_k *)row)[k / 8].dmin = f32_to_fp16(rng_f(1e-4f, 1e-3f));
			}
			break;
		case KB_Q6_K:
			if (k % 8 == 0)
				((struct blk_q6_k *)row)[k / 8].d = rand_half(1e-5f, 1e-4f);
			break;
		}
	}
	for (uint32_t i = 0; i < cols; i++) {
		if (type == KB_F32)
			((float *)row)[i] = rng_f(-1.0f, 1.0f);
		else if (type == KB_F16)
			((uint16_t *)row)[i] = f32_to_fp16(rng_f(-1.0f, 1.0f));
		else if (type == KB_BF16)
			((uint16_t *)row)[i] = (uint16_t)(fbits(rng_f(-1.0f, 1.0f)) >> 16);
	}
}

/* Activation row r of a test batch: plain, large, small, and one with an outlier. */
static void rand_xrow(float *x, uint32_t cols, uint32_t r)
{
	static const float scale[4] = { 1.0f, 100.0f, 1e-2f, 1.0f };
	for (uint32_t i = 0; i < cols; i++)
		x[i] = rng_f(-1.0f, 1.0f) * scale[r % 4];
	if (r % 4 == 3)
		x[rng_below(cols)] = 50.0f;
}

/* The min coefficient the format adds to every element of sub-block k, from the bytes. */
static double min_of(uint32_t type, const void *row, size_t k)
{
	if (type == KB_Q4_1)
		return half_ref(((const struct blk_q4_1 *)row)[k].m);
	if (type == KB_Q4_K) {
		const struct blk_q4_k *b = (const struct blk_q4_k *)row + k / 8;
		int j = (int)(k % 8);
		int m = j < 4 ? b->scales[j + 4] & 63 : (b->scales[j + 4] >> 4) | (b->scales[j] >> 6) << 4;
		return -half_ref(b->dmin) * m;
	}
	return 0.0;
}

struct dot_ref {
	double q;	/* sum dequant(w) * dequant(xq) */
	double q_tol;	/* f32 rounding in the kernel, plus the f16 rounding of s in min terms */
	double x;	/* sum dequant(w) * x */
	double x_tol;	/* a bound on the activation quantization error */
	double abs;	/* sum |w x| */
};

/*
 * With e = max |x_i - d q_i| over a block (known from the data: half a step
 * of the unrounded scale amax/127 plus 127 times the f16 rounding of d), the
 * kernel's min-split sum dw dx sum(v q) + mw s differs from sum w x by at most
 * sum |w_i - mw| e + |mw| (|s - d sum q| + 32 e): a rigorous bound.
 */
static void dot_reference(uint32_t type, const void *row, const float *x,
			  const struct blk_q8x *xq, uint32_t cols, struct dot_ref *r)
{
	float *w = malloc(cols * sizeof(float));
	double abs_q = 0.0, s_err = 0.0;
	assert_non_null(w);
	assert_int_equal(dequantize_row(type, row, w, cols), 0);
	memset(r, 0, sizeof(*r));
	for (uint32_t k = 0; k < cols / QK; k++) {
		const struct blk_q8x *b = &xq[k];
		const float *xk = x + k * QK, *wk = w + k * QK;
		double mw = min_of(type, row, k), amax = 0.0, sumq = 0.0;
		for (int i = 0; i < QK; i++) {
			amax = fmax(amax, fabs(xk[i]));
			sumq += b->qs[i];
		}
		double dt = amax / 127.0;
		double e = dt * (0.5 + 1e-4) + fabs((double)b->d - dt) * 127.0;
		double serr = fabs((double)b->s - (double)b->d * sumq);
		for (int i = 0; i < QK; i++) {
			double qi = (double)b->d * b->qs[i];
			r->q += wk[i] * qi;
			abs_q += fabs(wk[i] * qi);
			r->x += wk[i] * (double)xk[i];
			r->abs += fabs(wk[i] * (double)xk[i]);
			r->x_tol += fabs(wk[i] - mw) * e;
		}
		s_err += fabs(mw) * serr;
		r->x_tol += fabs(mw) * (serr + QK * e);
	}
	r->q_tol = 1e-5 * abs_q + s_err;
	r->x_tol += 1e-5 * r->abs;
	free(w);
}

#define DOT_COLS 1024
#define DOT_WROWS 6

static const char *const simd_isas[] = { "avx2", "avx512vnni" };
#define N_SIMD 2

/*
 * The portable kernel against the double references, alone and with nr
 * activation rows (a row's result never depends on nr); then every SIMD
 * kernel this CPU runs, over the repacked rows, bitwise the portable one.
 */
static void test_qdot(void **state)
{
	(void)state;
	float x[DOT_MAX_NR][DOT_COLS];
	struct blk_q8x xq[DOT_MAX_NR][DOT_COLS / QK];
	const size_t nblk = DOT_COLS / QK;
	double worst_q = 0.0, worst_x = 0.0, worst_rel = 0.0;
	int n_simd = 0;
	rng_seed(31);
	for (int r = 0; r < DOT_MAX_NR; r++) {
		rand_xrow(x[r], DOT_COLS, (uint32_t)r);
		quantize_row_q8x(x[r], xq[r], DOT_COLS);
	}
	for (size_t t = 0; t < N_QTYPES; t++) {
		uint32_t type = qtypes[t];
		size_t rb = row_bytes_of(type, DOT_COLS);
		uint8_t *rows = malloc(rb * DOT_WROWS);
		float base[DOT_WROWS][DOT_MAX_NR];
		assert_non_null(rows);
		for (int wr = 0; wr < DOT_WROWS; wr++) {
			const uint8_t *row = rows + wr * rb;
			float out[2 * DOT_MAX_NR];
			rand_wrow(type, rows + wr * rb, DOT_COLS);
			for (int r = 0; r < DOT_MAX_NR; r++)
				dot_q_generic(type, row, xq[r], nblk, 1, nblk, &base[wr][r], 1);
			for (int nr = 1; nr <= DOT_MAX_NR; nr++) {
				/* out_stride 2: the odd slots must stay untouched */
				for (int i = 0; i < 2 * DOT_MAX_NR; i++)
					out[i] = -7.0f;
				dot_q_generic(type, row, xq[0], nblk, nr, nblk, out, 2);
				for (int r = 0; r < DOT_MAX_NR; r++) {
					float want = r < nr ? base[wr][r] : -7.0f;
					if (fbits(out[2 * r]) != fbits(want) || out[2 * r + 1] != -7.0f)
						fail_msg("%s row %d: nr %d gives %a, alone %a", type_name(type),
							 r, nr, (double)out[2 * r], (double)want);
				}
			}
			for (int r = 0; r < DOT_MAX_NR; r++) {
				struct dot_ref ref;
				dot_reference(type, row, x[r], xq[r], DOT_COLS, &ref);
				double eq = fabs(base[wr][r] - ref.q), ex = fabs(base[wr][r] - ref.x);
				if (eq > ref.q_tol || ex > ref.x_tol)
					fail_msg("%s wrow %d xrow %d: got %.9g, ref(xq) %.9g tol %.3g, ref(x) %.9g bound %.3g",
						 type_name(type), wr, r, (double)base[wr][r], ref.q, ref.q_tol,
						 ref.x, ref.x_tol);
				/* Typical rows (plain and outlier): the quantization error is tiny. */
				if (ex > 1e-2 * ref.abs)
					fail_msg("%s wrow %d xrow %d: |err| %.3g > 1e-2 sum|wx| %.3g",
						 type_name(type), wr, r, ex, ref.abs);
				/* Against the kernel's own inputs, f32 rounding alone: 1e-3 of sum|wx| at most. */
				if (eq > 1e-3 * ref.abs)
					fail_msg("%s wrow %d xrow %d: |err| vs xq ref %.3g > 1e-3 sum|wx| %.3g",
						 type_name(type), wr, r, eq, ref.abs);
				worst_q = fmax(worst_q, eq / ref.abs);
				worst_x = fmax(worst_x, ex / ref.x_tol);
				if (r % 2 == 0)
					worst_rel = fmax(worst_rel, ex / fabs(ref.x));
			}
		}
		/* Six rows repacked: a partial group of eight, its last two lanes padding. */
		uint8_t *rp = malloc(nblk * rp_blk_bytes(type));
		assert_non_null(rp);
		rp_pack(type, rows, rb, DOT_WROWS, nblk, rp);
		for (int f = 0; f < N_SIMD; f++) {
			qgemm_fn fn = dot_select_gemm_isa(type, simd_isas[f]);
			float out[DOT_MAX_NR * 8];
			if (!fn)
				continue;
			n_simd += t == 0;
			fn(rp, nblk, xq[0], nblk, DOT_MAX_NR, out, 8, 0);
			for (int r = 0; r < DOT_MAX_NR; r++)
				for (int i = 0; i < DOT_WROWS; i++)
					if (fbits(out[r * 8 + i]) != fbits(base[i][r]))
						fail_msg("%s %s wrow %d xrow %d: %a, portable %a", type_name(type),
							 simd_isas[f], i, r, (double)out[r * 8 + i],
							 (double)base[i][r]);
		}
		free(rp);
		free(rows);
	}
	printf("dot: %d SIMD kernel sets of avx2/avx512vnni on this CPU; max |err|/sum|wx| vs xq ref %.2g; "
	       "max err/bound vs x ref %.2f; max rel err vs x ref (plain rows) %.2g\n", n_simd,
	       worst_q, worst_x, worst_rel);
}

/*
 * The activation quantizer the matmul uses is quantize_row_q8x() bit for
 * bit: rows of every scale (f16-subnormal and overflowing scales
 * included), an all-zero block, ties at half steps.
 */
static void test_quantize_simd(void **state)
{
	(void)state;
	static const float scales[] = { 1.0f, 1e-6f, 1e-9f, 3e5f, 1e8f, 0.0f };
	enum { N = 256 };
	float x[N];
	struct blk_q8x want[N / QK], got[N / QK];
	quantize_fn f = dot_select_quantize();
	rng_seed(59);
	for (int it = 0; it < 200; it++) {
		float sc = scales[it % 6];
		for (int i = 0; i < N; i++)
			x[i] = rng_f(-1.0f, 1.0f) * sc;
		if (it % 7 == 1)	/* exact half steps: 127 / amax * x lands on k + 0.5 */
			for (int i = 0; i < N; i++)
				x[i] = i % QK == 0 ? 127.0f : (float)(int)(rng_below(254) - 127) + 0.5f;
		memset(x + QK, 0, QK * sizeof(float));
		memset(want, 0x55, sizeof(want));
		memset(got, 0x55, sizeof(got));
		quantize_row_q8x(x, want, N);
		f(x, got, N);
		for (int k = 0; k < N / QK; k++)
			if (memcmp(&want[k], &got[k], sizeof(want[k])))
				fail_msg("quantizer: row %d block %d differs (d %a / %a, s %a / %a, sum %d / %d)",
					 it, k, (double)want[k].d, (double)got[k].d, (double)want[k].s,
					 (double)got[k].s, want[k].qsum, got[k].qsum);
	}
}

/*
 * The repacked kernels: out[r][i] = row_i . x_r, bitwise the portable
 * result, for every count of rows in a group (the rest padding), every
 * activation count, with the output stride respected (the column after
 * the kernel's rows stays untouched). The 16-row kernels get a pair
 * (rp_pack_pair()) packed over garbage, so its padding must be written.
 * Random bytes cover the extremes (nibbles 0 and 15, int8 -128 and 127,
 * Q6_K scales -128..127).
 */
static void test_qgemm(void **state)
{
	(void)state;
	static const struct { const char *isa; uint32_t lanes; } kern[] = {
		{ "avx2", RP_ROWS }, { "avx512vnni", RP_ROWS }, { "avx512", 2 * RP_ROWS },
	};
	enum { W = 2 * RP_ROWS, OS = W + 1 };
	struct blk_q8x xq[DOT_MAX_NR][DOT_COLS / QK];
	float x[DOT_COLS];
	const size_t nblk = DOT_COLS / QK;
	int checked = 0;
	rng_seed(47);
	for (int r = 0; r < DOT_MAX_NR; r++) {
		rand_xrow(x, DOT_COLS, (uint32_t)r);
		quantize_row_q8x(x, xq[r], DOT_COLS);
	}
	for (size_t t = 0; t < N_QTYPES; t++) {
		uint32_t type = qtypes[t];
		size_t rb = row_bytes_of(type, DOT_COLS), pair = 2 * nblk * rp_blk_bytes(type);
		uint8_t *rows = malloc(rb * W), *rp = malloc(pair);
		float base[W][DOT_MAX_NR], out[DOT_MAX_NR * OS];
		assert_true(rows && rp);
		for (int i = 0; i < W; i++) {
			rand_wrow(type, rows + i * rb, DOT_COLS);
			for (int r = 0; r < DOT_MAX_NR; r++)
				dot_q_generic(type, rows + i * rb, xq[r], nblk, 1, nblk, &base[i][r], 1);
		}
		for (size_t f = 0; f < sizeof(kern) / sizeof(kern[0]); f++) {
			qgemm_fn fn = dot_select_gemm_isa(type, kern[f].isa);
			uint32_t lanes = kern[f].lanes;
			if (!fn)
				continue;
			for (uint32_t nw = 1; nw <= lanes; nw++) {
				memset(rp, 0xa5, pair);
				if (lanes == RP_ROWS)
					rp_pack(type, rows, rb, nw, nblk, rp);
				else
					rp_pack_pair(type, rows, rb, nw, nblk, rp);
				for (int nr = 1; nr <= DOT_MAX_NR; nr++) {
					for (int i = 0; i < DOT_MAX_NR * OS; i++)
						out[i] = -7.0f;
					fn(rp, nblk, xq[0], nblk, nr, out, OS, nr % 2);
					for (int r = 0; r < DOT_MAX_NR; r++)
						for (uint32_t i = 0; i < OS; i++) {
							if (r < nr && i >= nw && i < lanes)
								continue;	/* padding lanes: anything */
							float want = r < nr && i < lanes ? base[i][r] : -7.0f;
							if (fbits(out[r * OS + i]) != fbits(want))
								fail_msg("%s %s: %u rows, nr %d, xrow %d, wrow %u: %a, want %a",
									 type_name(type), kern[f].isa, nw, nr, r,
									 i, (double)out[r * OS + i], (double)want);
						}
				}
			}
			checked++;
		}
		free(rp);
		free(rows);
	}
	printf("repacked kernels checked: %d (type, isa) pairs of avx2/avx512vnni/avx512 on this CPU\n",
	       checked);
}

/* ---- 4. backend matmul ---- */

#define MM_COLS 512
#define MM_N 64
#define MM_TYPES 8

static const uint32_t mm_types[MM_TYPES] = { KB_Q4_0, KB_Q4_1, KB_Q8_0, KB_Q4_K, KB_Q6_K,
					     KB_F32, KB_F16, KB_BF16 };

/* Per type: rows 70, 61, ... 7, none a multiple of the task size (a partial last task). */
static struct {
	struct kb_weight w;
	float *y;		/* (MM_N, w.rows) in one batch of 64, two threads */
} mm[MM_TYPES];

/* Row r of y (n, w.rows) checked against the portable kernel and the double reference. */
static void mm_check_row(const struct kb_weight *w, const float *xr, const float *yr)
{
	struct blk_q8x xq[MM_COLS / QK];
	float wrow[MM_COLS];
	uint32_t type = w->type;
	if (type_is_quantized(type))
		quantize_row_q8x(xr, xq, MM_COLS);
	for (uint32_t o = 0; o < w->rows; o++) {
		const uint8_t *row = (const uint8_t *)w->data + o * w->row_bytes;
		if (type_is_quantized(type)) {
			struct dot_ref ref;
			float want;
			dot_q_generic(type, row, xq, 0, 1, MM_COLS / QK, &want, 1);
			if (fbits(yr[o]) != fbits(want))
				fail_msg("%s [%u]: %a, portable dot %a", type_name(type), o,
					 (double)yr[o], (double)want);
			dot_reference(type, row, xr, xq, MM_COLS, &ref);
			if (fabs(yr[o] - ref.x) > ref.x_tol)
				fail_msg("%s [%u]: %.9g, ref %.9g bound %.3g", type_name(type), o,
					 (double)yr[o], ref.x, ref.x_tol);
		} else {
			double ref = 0.0, abs = 0.0;
			assert_int_equal(dequantize_row(type, row, wrow, MM_COLS), 0);
			for (uint32_t i = 0; i < MM_COLS; i++) {
				ref += (double)wrow[i] * xr[i];
				abs += fabs((double)wrow[i] * xr[i]);
			}
			/* 8 lanes of 64 f32 fmas then a 3-level tree: < 70 ulps of sum|wx| */
			if (fabs(yr[o] - ref) > 1e-5 * abs)
				fail_msg("%s [%u]: %.9g, ref %.9g", type_name(type), o, (double)yr[o], ref);
		}
	}
}

static void test_matmul(void **state)
{
	(void)state;
	static const uint32_t ns[] = { 1, 3, 7, 64 };
	struct backend *be[2];
	float *x = malloc(sizeof(float) * MM_N * MM_COLS);
	float *y = malloc(sizeof(float) * MM_N * 70);
	assert_true(x && y);
	assert_int_equal(backend_cpu_create(&be[0], 1), 0);
	assert_int_equal(backend_cpu_create(&be[1], 2), 0);
	rng_seed(41);
	for (uint32_t r = 0; r < MM_N; r++)
		rand_xrow(x + r * MM_COLS, MM_COLS, r);
	for (int t = 0; t < MM_TYPES; t++) {
		uint32_t type = mm_types[t], rows = 70 - 9 * (uint32_t)t;
		size_t rb = row_bytes_of(type, MM_COLS);
		uint8_t *wd = malloc(rb * rows);
		struct kb_weight *w = &mm[t].w;
		assert_non_null(wd);
		for (uint32_t o = 0; o < rows; o++)
			rand_wrow(type, wd + o * rb, MM_COLS);
		*w = (struct kb_weight){ .data = wd, .type = type, .rows = rows, .cols = MM_COLS,
					 .row_bytes = rb };
		mm[t].y = malloc(sizeof(float) * MM_N * rows);
		assert_non_null(mm[t].y);
		assert_int_equal(be[1]->ops->matmul(be[1], mm[t].y, w, x, MM_N), 0);
		/* Every row, in every batch size and thread count, is the batch-of-64 row. */
		for (int b = 0; b < 2; b++)
			for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
				memset(y, 0xff, sizeof(float) * MM_N * rows);
				for (uint32_t s = 0; s < MM_N; s += ns[ni]) {
					uint32_t m = MM_N - s < ns[ni] ? MM_N - s : ns[ni];
					assert_int_equal(be[b]->ops->matmul(be[b], y + s * rows, w,
									    x + s * MM_COLS, m), 0);
				}
				if (memcmp(y, mm[t].y, sizeof(float) * MM_N * rows))
					fail_msg("%s: %u thread(s), batches of %u differ from one batch of 64",
						 type_name(type), be[b]->n_threads, ns[ni]);
			}
		for (uint32_t r = 0; r < MM_N; r++)
			mm_check_row(w, x + r * MM_COLS, mm[t].y + r * rows);
		/* get_rows is dequantize_row, and checks ids. */
		uint32_t ids[3] = { 5, 0, rows - 1 };
		float *g = malloc(sizeof(float) * 3 * MM_COLS), wrow[MM_COLS];
		assert_non_null(g);
		assert_int_equal(be[1]->ops->get_rows(be[1], g, w, ids, 3), 0);
		for (int i = 0; i < 3; i++) {
			assert_int_equal(dequantize_row(type, wd + ids[i] * rb, wrow, MM_COLS), 0);
			assert_memory_equal(g + i * MM_COLS, wrow, sizeof(wrow));
		}
		ids[1] = rows;
		assert_int_equal(be[1]->ops->get_rows(be[1], g, w, ids, 3), -ERANGE);
		free(g);
	}
	/* matmul_multi, mixing types and row counts: each output is matmul's, bitwise. */
	static const int groups[][4] = { { 0, 1, 2, -1 }, { 3, 5, -1 }, { 6, 4, 7, 0 }, { 2, -1 } };
	for (size_t gi = 0; gi < sizeof(groups) / sizeof(groups[0]); gi++) {
		const struct kb_weight *ws[4];
		float *ys[4];
		uint32_t count = 0;
		while (count < 4 && groups[gi][count] >= 0) {
			int t = groups[gi][count];
			ws[count] = &mm[t].w;
			ys[count] = malloc(sizeof(float) * MM_N * mm[t].w.rows);
			assert_non_null(ys[count]);
			count++;
		}
		for (int b = 0; b < 2; b++)
			for (size_t ni = 0; ni < sizeof(ns) / sizeof(ns[0]); ni++) {
				for (uint32_t s = 0; s < MM_N; s += ns[ni]) {
					uint32_t m = MM_N - s < ns[ni] ? MM_N - s : ns[ni];
					float *yo[4];
					for (uint32_t i = 0; i < count; i++)
						yo[i] = ys[i] + s * ws[i]->rows;
					assert_int_equal(be[b]->ops->matmul_multi(be[b], yo, ws, count,
										  x + s * MM_COLS, m), 0);
				}
				for (uint32_t i = 0; i < count; i++)
					if (memcmp(ys[i], mm[groups[gi][i]].y,
						   sizeof(float) * MM_N * ws[i]->rows))
						fail_msg("matmul_multi group %zu: %s output differs from matmul (%u threads, batches of %u)",
							 gi, type_name(ws[i]->type), be[b]->n_threads, ns[ni]);
			}
		for (uint32_t i = 0; i < count; i++)
			free(ys[i]);
	}
	/* Refused shapes: cols not in whole blocks, cols that differ, too many weights. */
	struct kb_weight bad = { .data = x, .type = KB_Q8_0, .rows = 1, .cols = 48,
				 .row_bytes = 34 };
	assert_int_equal(be[0]->ops->matmul(be[0], y, &bad, x, 1), -EINVAL);
	const struct kb_weight *mixed[2] = { &mm[0].w, &bad }, *five[5];
	float *yo[5] = { y, y, y, y, y };
	assert_int_equal(be[0]->ops->matmul_multi(be[0], yo, mixed, 2, x, 1), -EINVAL);
	for (int i = 0; i < 5; i++)
		five[i] = &mm[0].w;
	assert_int_equal(be[0]->ops->matmul_multi(be[0], yo, five, 5, x, 1), -EINVAL);
	for (int t = 0; t < MM_TYPES; t++) {
		free((void *)mm[t].w.data);
		free(mm[t].y);
	}
	be[0]->ops->destroy(be[0]);
	be[1]->ops->destroy(be[1]);
	free(x);
	free(y);
}

/*
 * Batch invariance of the tiles: every row computed alone (one thread) is
 * bitwise the same inside batches of 1..33 rows at every position (two
 * threads), for every type, through an imported weight (repacked once and
 * kept) and a plain one (repacked per call). An imported weight released
 * and changed is repacked anew.
 */
#define INV_COLS 256
#define INV_ROWS 21	/* two groups of eight and a partial one */
#define INV_X 40

static void inv_check(struct backend *b1, struct backend *b2, const struct kb_weight *w,
		      const float *x, float *alone, float *y, const char *how)
{
	for (uint32_t r = 0; r < INV_X; r++)
		assert_int_equal(b1->ops->matmul(b1, alone + r * INV_ROWS, w, x + r * INV_COLS, 1), 0);
	for (uint32_t n = 1; n <= 33; n++)
		for (uint32_t s = 0; s + n <= INV_X; s++) {
			assert_int_equal(b2->ops->matmul(b2, y, w, x + s * INV_COLS, n), 0);
			if (memcmp(y, alone + s * INV_ROWS, sizeof(float) * n * INV_ROWS))
				fail_msg("%s (%s): a batch of %u from row %u differs from its rows alone",
					 type_name(w->type), how, n, s);
		}
}

static void test_matmul_invariance(void **state)
{
	(void)state;
	struct backend *b1, *b2;
	float *x = malloc(sizeof(float) * INV_X * INV_COLS);
	float *alone = malloc(sizeof(float) * INV_X * INV_ROWS);
	float *y = malloc(sizeof(float) * INV_X * INV_ROWS);
	float *first = malloc(sizeof(float) * INV_ROWS);
	assert_true(x && alone && y && first);
	assert_int_equal(backend_cpu_create(&b1, 1), 0);
	assert_int_equal(backend_cpu_create(&b2, 2), 0);
	rng_seed(53);
	for (uint32_t r = 0; r < INV_X; r++)
		rand_xrow(x + r * INV_COLS, INV_COLS, r);
	for (int t = 0; t < MM_TYPES; t++) {
		uint32_t type = mm_types[t];
		size_t rb = row_bytes_of(type, INV_COLS), bytes = rb * INV_ROWS;
		uint8_t *wd = malloc(bytes);
		assert_non_null(wd);
		for (uint32_t o = 0; o < INV_ROWS; o++)
			rand_wrow(type, wd + o * rb, INV_COLS);
		struct kb_weight w = { .data = wd, .type = type, .rows = INV_ROWS, .cols = INV_COLS,
				       .row_bytes = rb };
		inv_check(b1, b2, &w, x, alone, y, "plain");
		memcpy(first, alone, sizeof(float) * INV_ROWS);
		const void *p1, *p2;
		assert_int_equal(b1->ops->import(b1, &p1, wd, bytes), 0);
		assert_int_equal(b2->ops->import(b2, &p2, wd, bytes), 0);
		assert_ptr_equal(p1, wd);
		assert_ptr_equal(p2, wd);
		inv_check(b1, b2, &w, x, alone, y, "imported");
		assert_memory_equal(first, alone, sizeof(float) * INV_ROWS);
		/* Released, changed, imported again: the new bytes count, not a kept copy. */
		b1->ops->unimport(b1, wd);
		for (uint32_t o = 0; o < INV_ROWS; o++)
			rand_wrow(type, wd + o * rb, INV_COLS);
		assert_int_equal(b1->ops->import(b1, &p1, wd, bytes), 0);
		assert_int_equal(b1->ops->matmul(b1, y, &w, x, 1), 0);
		if (type_is_quantized(type))
			for (uint32_t o = 0; o < INV_ROWS; o++) {
				struct blk_q8x xq[INV_COLS / QK];
				float want;
				quantize_row_q8x(x, xq, INV_COLS);
				dot_q_generic(type, wd + o * rb, xq, 0, 1, INV_COLS / QK, &want, 1);
				if (fbits(y[o]) != fbits(want))
					fail_msg("%s: row %u after re-import %a, portable %a",
						 type_name(type), o, (double)y[o], (double)want);
			}
		b1->ops->unimport(b1, wd);
		b2->ops->unimport(b2, wd);
		free(wd);
	}
	b1->ops->destroy(b1);
	b2->ops->destroy(b2);
	free(x);
	free(alone);
	free(y);
	free(first);
}

/* ---- 5. row ops ---- */

static void test_rmsnorm(void **state)
{
	(void)state;
	static const uint32_t dims[] = { 7, 64, 576, 1000 };
	struct backend *be;
	const float eps = 1e-5f;
	assert_int_equal(backend_cpu_create(&be, 2), 0);
	rng_seed(51);
	for (size_t di = 0; di < sizeof(dims) / sizeof(dims[0]); di++) {
		const uint32_t dim = dims[di], n = 5;
		float *x = malloc(sizeof(float) * n * dim), *g = malloc(sizeof(float) * dim);
		float *out = malloc(sizeof(float) * n * dim), *row = malloc(sizeof(float) * dim);
		assert_true(x && g && out && row);
		for (uint32_t i = 0; i < dim; i++)
			g[i] = rng_mag(0.5f, 1.5f);
		for (uint32_t r = 0; r < n; r++)
			for (uint32_t i = 0; i < dim; i++)	/* row 4 is small enough for eps to matter */
				x[r * dim + i] = rng_f(-2.0f, 2.0f) * (r == 4 ? 1e-3f : 1.0f);
		assert_int_equal(be->ops->rmsnorm(be, out, x, g, n, dim, eps), 0);
		for (uint32_t r = 0; r < n; r++) {
			const float *xr = x + r * dim;
			double ss = 0.0;
			for (uint32_t i = 0; i < dim; i++)
				ss += (double)xr[i] * xr[i];
			double scale = 1.0 / sqrt(ss / dim + (double)eps);
			for (uint32_t i = 0; i < dim; i++) {
				double want = xr[i] * scale * g[i];
				/*
				 * f32 roundings on the way (the sum of squares is double):
				 * mean, + eps, sqrt, 1/x (halved through the root where they
				 * precede it), x * scale, * g: < 5.5 ulps = 3.3e-7.
				 */
				if (fabs(out[r * dim + i] - want) > 4e-7 * fabs(want))
					fail_msg("rmsnorm dim %u row %u [%u]: %.9g want %.9g", dim, r, i,
						 (double)out[r * dim + i], want);
			}
			ops_rmsnorm_row(row, xr, g, dim, eps);
			assert_memory_equal(row, out + r * dim, sizeof(float) * dim);
		}
		/* In place gives the same bits. */
		assert_int_equal(be->ops->rmsnorm(be, x, x, g, n, dim, eps), 0);
		assert_memory_equal(x, out, sizeof(float) * n * dim);
		free(x);
		free(g);
		free(out);
		free(row);
	}
	be->ops->destroy(be);
}

static void test_swiglu(void **state)
{
	(void)state;
	enum { N = 3, DIM = 1531 };
	static float gate[N * DIM], up[N * DIM], out[N * DIM];
	struct backend *be;
	assert_int_equal(backend_cpu_create(&be, 2), 0);
	rng_seed(52);
	for (int i = 0; i < N * DIM; i++) {
		gate[i] = rng_f(-20.0f, 20.0f);
		up[i] = rng_f(-2.0f, 2.0f);
	}
	assert_int_equal(be->ops->swiglu(be, out, gate, up, N, DIM), 0);
	for (int i = 0; i < N * DIM; i++) {
		double g = gate[i], want = g / (1.0 + exp(-g)) * up[i];
		/* e^x within 3e-7 (see test_fast_expf), then 1 +, /, *: 3 roundings */
		if (fabs(out[i] - want) > 5e-7 * fabs(want))
			fail_msg("swiglu(%a, %a) = %.9g want %.9g", (double)gate[i], (double)up[i],
				 (double)out[i], want);
	}
	float row[DIM];
	ops_swiglu_row(row, gate + DIM, up + DIM, DIM);
	assert_memory_equal(row, out + DIM, sizeof(row));
	/* the SIMD path against the portable one, bit for bit, with NaN, infinities and the clamp edges */
	static const float edge[] = { NAN, INFINITY, -INFINITY, 88.3f, -88.3f, 87.3f, -87.3f, 100.0f,
				      -100.0f, 0.0f, -0.0f, 1e-30f, -1e-30f, 1e-45f };
	for (unsigned e = 0; e < sizeof(edge) / sizeof(edge[0]); e++)
		gate[DIM + 7 * e] = edge[e];
	float rc[DIM];
	ops_swiglu_row(row, gate + DIM, up + DIM, DIM);
	ops_swiglu_row_c(rc, gate + DIM, up + DIM, DIM);
	for (int i = 0; i < DIM; i++)
		if (fbits(row[i]) != fbits(rc[i]))
			fail_msg("swiglu(%a): %a, portable %a", (double)gate[DIM + i], (double)row[i],
				 (double)rc[i]);
	ops_swiglu_row(out + DIM, gate + DIM, up + DIM, DIM);
	assert_int_equal(be->ops->swiglu(be, gate, gate, up, N, DIM), 0);
	assert_memory_equal(gate, out, sizeof(out));
	be->ops->destroy(be);
}

/* ---- 5b. the optional row ops: add_bias, scale, softcap, geglu ---- */

enum { SO_N = 6, SO_DIM = 1531 };

/* Which optional op so_run() calls. */
enum so_op { SO_BIAS, SO_SCALE, SO_SOFTCAP, SO_GEGLU };

/* out (n, SO_DIM) = op over rows in (n, SO_DIM) (gate for geglu), p the bias/up rows or s the factor. */
static void so_run(struct backend *be, enum so_op op, float *out, const float *in, const float *p,
		   float s, uint32_t n)
{
	memcpy(out, in, sizeof(float) * n * SO_DIM);
	switch (op) {
	case SO_BIAS: assert_int_equal(be->ops->add_bias(be, out, p, n, SO_DIM), 0); break;
	case SO_SCALE: assert_int_equal(be->ops->scale(be, out, s, n, SO_DIM), 0); break;
	case SO_SOFTCAP: assert_int_equal(be->ops->softcap(be, out, s, n, SO_DIM), 0); break;
	case SO_GEGLU: assert_int_equal(be->ops->geglu(be, out, out, p, n, SO_DIM), 0); break;
	}
}

/* Each row alone, on 1 and on 2 threads, gives the bits the whole batch gave it. */
static void so_invariant(struct backend *const be[2], enum so_op op, const float *in,
			 const float *p, float s, const float *batch)
{
	float *one = malloc(sizeof(float) * SO_DIM);
	assert_non_null(one);
	for (int b = 0; b < 2; b++)
		for (uint32_t r = 0; r < SO_N; r++) {
			const float *pr = op == SO_GEGLU ? p + (size_t)r * SO_DIM : p;
			so_run(be[b], op, one, in + (size_t)r * SO_DIM, pr, s, 1);
			if (memcmp(one, batch + (size_t)r * SO_DIM, sizeof(float) * SO_DIM))
				fail_msg("op %d row %u alone on %u threads differs from the batch", op, r,
					 be[b]->n_threads);
		}
	free(one);
}

static void test_bias_scale_softcap(void **state)
{
	(void)state;
	static float x[SO_N * SO_DIM], out[SO_N * SO_DIM], bias[SO_DIM];
	struct backend *be[2];
	assert_int_equal(backend_cpu_create(&be[0], 1), 0);
	assert_int_equal(backend_cpu_create(&be[1], 2), 0);
	rng_seed(55);
	for (int i = 0; i < SO_N * SO_DIM; i++)	/* wide enough for tanh to saturate */
		x[i] = rng_f(-60.0f, 60.0f);
	for (int i = 0; i < SO_DIM; i++)
		bias[i] = rng_f(-3.0f, 3.0f);
	/* add_bias and scale are one f32 rounding each: exact. */
	so_run(be[1], SO_BIAS, out, x, bias, 0, SO_N);
	for (int i = 0; i < SO_N * SO_DIM; i++)
		if (out[i] != (float)((double)x[i] + bias[i % SO_DIM]))
			fail_msg("add_bias [%d]: %a + %a = %a", i, (double)x[i], (double)bias[i % SO_DIM],
				 (double)out[i]);
	so_invariant(be, SO_BIAS, x, bias, 0, out);
	const float s = 24.0f / 1.0e3f;	/* Gemma's sqrt(dim) is no power of two either */
	so_run(be[1], SO_SCALE, out, x, NULL, s, SO_N);
	for (int i = 0; i < SO_N * SO_DIM; i++)
		if (out[i] != (float)((double)x[i] * s))
			fail_msg("scale [%d]: %a * %a = %a", i, (double)x[i], (double)s, (double)out[i]);
	so_invariant(be, SO_SCALE, x, NULL, s, out);
	static const float caps[] = { 30.0f, 50.0f, 7.5f };
	for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
		const float cap = caps[c], inv = 1.0f / cap;
		so_run(be[1], SO_SOFTCAP, out, x, NULL, cap, SO_N);
		for (int i = 0; i < SO_N * SO_DIM; i++) {
			double want = cap * tanh(x[i] / (double)cap);
			/* ggml's steps: x * (1/cap), tanhf, * cap; 1/cap and three roundings, tanhf ~1 ulp */
			float steps = tanhf(x[i] * inv) * cap;
			if (fbits(out[i]) != fbits(steps))
				fail_msg("softcap %g [%d]: %a, tanhf(x * (1/cap)) * cap is %a", (double)cap, i,
					 (double)out[i], (double)steps);
			if (fabs(out[i] - want) > 5e-7 * fabs(want) + 1e-30)
				fail_msg("softcap %g (%a) = %.9g want %.9g", (double)cap, (double)x[i],
					 (double)out[i], want);
		}
		so_invariant(be, SO_SOFTCAP, x, NULL, cap, out);
	}
	assert_int_equal(be[1]->ops->softcap(be[1], out, 0.0f, 1, SO_DIM), -EINVAL);
	assert_int_equal(be[1]->ops->softcap(be[1], out, -30.0f, 1, SO_DIM), -EINVAL);
	be[0]->ops->destroy(be[0]);
	be[1]->ops->destroy(be[1]);
}

/* GELU's tanh form in double. */
static double gelu_ref(double x)
{
	return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * x * (1.0 + 0.044715 * x * x)));
}

/*
 * geglu follows ggml's f32 CPU kernel: 0 at gate <= -10, gate * up at
 * gate >= 10, else the f16 table of GELU at the gate's f16. Checked
 * against that recipe bit for bit, and against the formula in double
 * within what the two f16 roundings allow.
 */
static void test_geglu(void **state)
{
	(void)state;
	static float gate[SO_N * SO_DIM], up[SO_N * SO_DIM], out[SO_N * SO_DIM];
	struct backend *be[2];
	double worst = 0.0;
	assert_int_equal(backend_cpu_create(&be[0], 1), 0);
	assert_int_equal(backend_cpu_create(&be[1], 2), 0);
	rng_seed(56);
	for (int i = 0; i < SO_N * SO_DIM; i++) {
		gate[i] = i % 97 == 0 ? (i % 2 ? 10.0f : -10.0f) : rng_f(-12.0f, 12.0f);
		up[i] = rng_f(-2.0f, 2.0f);
	}
	gate[1] = 1e-6f;	/* a subnormal f16 */
	gate[2] = -3e-8f;
	so_run(be[1], SO_GEGLU, out, gate, up, 0, SO_N);
	for (int i = 0; i < SO_N * SO_DIM; i++) {
		float g = gate[i], steps;
		if (g <= -10.0f)
			steps = 0.0f;
		else if (g >= 10.0f)
			steps = g * up[i];
		else
			steps = fp16_round(ops_gelu_f32(fp16_round(g))) * up[i];
		if (fbits(out[i]) != fbits(steps))
			fail_msg("geglu(%a, %a) = %a, ggml's recipe gives %a", (double)g, (double)up[i],
				 (double)out[i], (double)steps);
		double want = gelu_ref(g) * up[i];
		/* the gate's f16 (GELU' < 1.13), the result's f16 (2^-24 apart when subnormal), one f32 product */
		double tol = (1.13 * fabs(g) * 0x1p-11 + fabs(gelu_ref(g)) * 0x1p-11 + 0x1p-24) *
			     fabs(up[i]);
		if (fabs(out[i] - want) > tol)
			fail_msg("geglu(%a, %a) = %.9g want %.9g", (double)g, (double)up[i],
				 (double)out[i], want);
		if (fabs(gelu_ref(g)) > 1e-3)	/* not the cancelled tail of negative gates */
			worst = fmax(worst, fabs(out[i] - want) / fabs(want));
	}
	/*
	 * The formula the table holds, in f32: a few ulps of the double one,
	 * but 1 + tanh cancels for negative gates (an ulp of 1 times |x| / 2).
	 */
	for (int i = 0; i < 20000; i++) {
		float g = rng_f(-10.0f, 10.0f);
		double want = gelu_ref(g);
		if (fabs(ops_gelu_f32(g) - want) > 1e-6 * fabs(want) + fabs(g) * 0x1p-24)
			fail_msg("gelu_f32(%a) = %.9g want %.9g", (double)g, (double)ops_gelu_f32(g), want);
	}
	so_invariant(be, SO_GEGLU, gate, up, 0, out);
	/* Out of place gives what in place gave. */
	static float sep[SO_N * SO_DIM];
	assert_int_equal(be[0]->ops->geglu(be[0], sep, gate, up, SO_N, SO_DIM), 0);
	assert_memory_equal(sep, out, sizeof(sep));
	printf("geglu: max relative error against the formula in double %.3g where |gelu| > 1e-3 (f16 table)\n",
	       worst);
	be[0]->ops->destroy(be[0]);
	be[1]->ops->destroy(be[1]);
}

static void test_fast_expf(void **state)
{
	(void)state;
	double worst = 0.0, at = 0.0;
	rng_seed(53);
	for (int i = 0; i <= 3200000; i++) {
		float x = i < 1600001 ? (float)(-80.0 + i * 1e-4) : rng_f(-80.0f, 80.0f);
		double want = exp((double)x), e = fabs(fast_expf(x) - want) / want;
		if (e > worst)
			worst = e, at = x;
	}
	printf("fast_expf: max relative error %.3g at %g\n", worst, at);
	if (worst >= 3e-7)
		fail_msg("fast_expf relative error %.3g at %a", worst, at);
	assert_true(fast_expf(0.0f) == 1.0f);
	/* Clamped outside the range: tiny and huge, never inf, nan or negative. */
	assert_true(fast_expf(-1000.0f) >= 0.0f && fast_expf(-1000.0f) < 1e-37f);
	assert_true(isfinite(fast_expf(1000.0f)) && fast_expf(1000.0f) > 1e38f);
}

/*
 * The cos/sin angle is pos * step^i, advanced in f32 as llama.cpp does; each
 * multiplication rounds, so the angle's absolute error grows with pos
 * (~8e-8 pos measured): allow 1e-5 plus 1e-7 per position.
 */
static double rope_tol(uint32_t pos)
{
	return 1e-5 + 1e-7 * pos;
}

static void test_rope(void **state)
{
	(void)state;
	enum { NH = 3, HD = 64, N = 12 };
	static const struct { uint32_t rot; float theta; int neox; } cfg[] = {
		{ 64, 10000.0f, 0 }, { 64, 100000.0f, 0 },	/* theta alone changes */
		{ 64, 10000.0f, 1 }, { 32, 10000.0f, 0 },	/* rot_dim alone changes */
		{ 32, 10000.0f, 1 }, { 48, 500000.0f, 1 },
		{ 64, 10000.0f, 0 },	/* back to the first: the cos/sin cache must follow */
	};
	struct backend *be;
	float x[N * NH * HD], x0[N * NH * HD], cs[HD];
	uint32_t pos[N];
	assert_int_equal(backend_cpu_create(&be, 2), 0);
	rng_seed(54);
	for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
		const uint32_t rot = cfg[c].rot, half = rot / 2;
		for (int r = 0; r < N; r++)	/* small first, then growing, one large */
			pos[r] = r < 4 ? (uint32_t)r : r == N - 1 ? 4000 : rng_below(300);
		for (int i = 0; i < N * NH * HD; i++)
			x0[i] = x[i] = rng_f(-1.0f, 1.0f);
		assert_int_equal(be->ops->rope(be, x, pos, N, NH, HD, &KB_ROPE_PLAIN(rot, cfg[c].theta, cfg[c].neox)), 0);
		for (int r = 0; r < N; r++) {
			ops_rope_table(cs, pos[r], &KB_ROPE_PLAIN(rot, cfg[c].theta, cfg[c].neox), NULL);
			for (uint32_t i = 0; i < half; i++) {
				double a = pos[r] * pow(cfg[c].theta, -2.0 * i / rot);
				if (fabs(cs[2 * i] - cos(a)) > rope_tol(pos[r]) ||
				    fabs(cs[2 * i + 1] - sin(a)) > rope_tol(pos[r]))
					fail_msg("rope table pos %u pair %u: (%.9g, %.9g) want (%.9g, %.9g)",
						 pos[r], i, (double)cs[2 * i], (double)cs[2 * i + 1],
						 cos(a), sin(a));
			}
			for (int h = 0; h < NH; h++) {
				const float *in = x0 + (r * NH + h) * HD;
				const float *out = x + (r * NH + h) * HD;
				for (uint32_t i = 0; i < half; i++) {
					uint32_t ia = cfg[c].neox ? i : 2 * i;
					uint32_t ib = cfg[c].neox ? i + half : 2 * i + 1;
					/*
					 * Exactly the documented rounding on any CPU: the first
					 * product of each rotation fused, the second rounded
					 * (volatile keeps the compiler from fusing it here).
					 */
					volatile float m1 = in[ib] * cs[2 * i + 1], m3 = in[ib] * cs[2 * i];
					float fa = fmaf(in[ia], cs[2 * i], -m1);
					float fb = fmaf(in[ia], cs[2 * i + 1], m3);
					if (fbits(out[ia]) != fbits(fa) || fbits(out[ib]) != fbits(fb))
						fail_msg("rope rot %u neox %d pos %u head %d pair %u: (%a, %a), fma(x0, c, -x1 s) gives (%a, %a)",
							 rot, cfg[c].neox, pos[r], h, i, (double)out[ia],
							 (double)out[ib], (double)fa, (double)fb);
					double a = pos[r] * pow(cfg[c].theta, -2.0 * i / rot);
					double wa = in[ia] * cos(a) - in[ib] * sin(a);
					double wb = in[ia] * sin(a) + in[ib] * cos(a);
					double tol = rope_tol(pos[r]) * (fabs(in[ia]) + fabs(in[ib]));
					if (fabs(out[ia] - wa) > tol || fabs(out[ib] - wb) > tol)
						fail_msg("rope rot %u neox %d pos %u head %d pair %u: (%.9g, %.9g) want (%.9g, %.9g)",
							 rot, cfg[c].neox, pos[r], h, i, (double)out[ia],
							 (double)out[ib], wa, wb);
				}
				/* Dimensions past rot_dim are not touched. */
				assert_memory_equal(out + rot, in + rot, sizeof(float) * (HD - rot));
			}
		}
	}
	assert_int_equal(be->ops->rope(be, x, pos, 1, NH, HD, &KB_ROPE_PLAIN(HD + 2, 10000.0f, 0)), -EINVAL);
	assert_int_equal(be->ops->rope(be, x, pos, 1, NH, HD, &KB_ROPE_PLAIN(31, 10000.0f, 0)), -EINVAL);
	be->ops->destroy(be);
}

/*
 * ggml's rope by hand, in double: pair i's angle pos * theta^(-2i / rot)
 * over its factor, times freq_scale, mixed back toward the unscaled angle
 * by ext_factor times YaRN's ramp (1 below corr_lo, 0 above corr_hi); cos
 * and sin times attn_factor, and with YaRN times 1 + 0.1 ln(1 / freq_scale).
 */
static void rope_want(double *c, double *s, uint32_t pos, uint32_t i, const struct kb_rope *rp)
{
	double e = pos * pow(rp->theta, -2.0 * i / rp->rot_dim), m = rp->attn_factor;
	if (rp->h_freq_factors)
		e /= rp->h_freq_factors[i];
	double a = rp->freq_scale * e;
	if (rp->ext_factor != 0.0f) {
		double y = (i - (double)rp->corr_lo) / fmax(0.001, (double)rp->corr_hi - rp->corr_lo);
		double mix = (1.0 - fmin(1.0, fmax(0.0, y))) * rp->ext_factor;
		a = a * (1.0 - mix) + e * mix;
		m *= 1.0 + 0.1 * log(1.0 / rp->freq_scale);
	}
	*c = cos(a) * m;
	*s = sin(a) * m;
}

enum { RS_NH = 2, RS_HD = 64, RS_N = 9 };

/* x (RS_N, RS_NH, RS_HD) turned by rp on a backend of its own (a cold cos/sin table). */
static void rope_fresh(float *x, const uint32_t *pos, const struct kb_rope *rp)
{
	struct backend *be;
	assert_int_equal(backend_cpu_create(&be, 1), 0);
	assert_int_equal(be->ops->rope(be, x, pos, RS_N, RS_NH, RS_HD, rp), 0);
	be->ops->destroy(be);
}

/* in turned by rp on be equals the hand computation, and a fresh backend's result bit for bit. */
static void rope_check(struct backend *be, const float *in, const uint32_t *pos,
		       const struct kb_rope *rp, const char *what)
{
	static float x[RS_N * RS_NH * RS_HD], y[RS_N * RS_NH * RS_HD];
	const uint32_t half = rp->rot_dim / 2;
	memcpy(x, in, sizeof(x));
	memcpy(y, in, sizeof(y));
	assert_int_equal(be->ops->rope(be, x, pos, RS_N, RS_NH, RS_HD, rp), 0);
	rope_fresh(y, pos, rp);
	if (memcmp(x, y, sizeof(x)))
		fail_msg("rope %s: a warm table differs from a fresh one", what);
	for (int r = 0; r < RS_N; r++)
		for (int h = 0; h < RS_NH; h++) {
			const float *a = in + (r * RS_NH + h) * RS_HD, *o = x + (r * RS_NH + h) * RS_HD;
			for (uint32_t i = 0; i < half; i++) {
				uint32_t i0 = rp->neox ? i : 2 * i, i1 = rp->neox ? i + half : 2 * i + 1;
				double c, s;
				rope_want(&c, &s, pos[r], i, rp);
				double w0 = a[i0] * c - a[i1] * s, w1 = a[i0] * s + a[i1] * c;
				/* the f32 running angle (rope_tol), then scaled by at most 1; f32 magnitudes */
				double tol = (rope_tol(pos[r]) + 1e-6) * (fabs(a[i0]) + fabs(a[i1])) *
					     fmax(1.0, sqrt(c * c + s * s));
				if (fabs(o[i0] - w0) > tol || fabs(o[i1] - w1) > tol)
					fail_msg("rope %s pos %u head %d pair %u: (%.9g, %.9g) want (%.9g, %.9g)",
						 what, pos[r], h, i, (double)o[i0], (double)o[i1], w0, w1);
			}
			assert_memory_equal(o + rp->rot_dim, a + rp->rot_dim,
					    sizeof(float) * (RS_HD - rp->rot_dim));
		}
}

/*
 * Frequency factors, linear and YaRN scaling against the hand computation;
 * the cos/sin table follows a change of any one parameter (a warm backend
 * must give a cold one's bits), the factors' values at the same pointer
 * included; rows alone and on either thread count give the batch's bits.
 */
static void test_rope_scaled(void **state)
{
	(void)state;
	static float in[RS_N * RS_NH * RS_HD], x[RS_N * RS_NH * RS_HD], one[RS_NH * RS_HD];
	static const uint32_t pos[RS_N] = { 0, 1, 2, 9, 100, 511, 2047, 4000, 8191 };
	float ff[RS_HD / 2];
	struct backend *be[2];
	assert_int_equal(backend_cpu_create(&be[0], 1), 0);
	assert_int_equal(backend_cpu_create(&be[1], 2), 0);
	rng_seed(57);
	for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++)
		in[i] = rng_f(-1.0f, 1.0f);
	for (int i = 0; i < RS_HD / 2; i++)	/* Llama 3's shape: 1 for high frequencies, up to 8 */
		ff[i] = i < 12 ? 1.0f : i < 20 ? 1.0f + (float)(i - 12) : 8.0f;
	struct kb_rope base = KB_ROPE_PLAIN(48, 500000.0f, 0);
	rope_check(be[1], in, pos, &base, "plain");
	struct kb_rope r = base;
	r.freq_factors = r.h_freq_factors = ff;
	rope_check(be[1], in, pos, &r, "factors");
	ff[20] = 3.5f;	/* the same buffer, one factor changed */
	rope_check(be[1], in, pos, &r, "factors changed in place");
	r.freq_scale = 0.25f;
	rope_check(be[1], in, pos, &r, "factors + linear");
	r = base;
	r.freq_scale = 0.25f;
	r.neox = 1;
	rope_check(be[1], in, pos, &r, "linear neox");
	/* YaRN: pairs below corr_lo keep the unscaled angle, pairs above corr_hi are interpolated. */
	r.ext_factor = 1.0f;
	r.corr_lo = 5.0f;
	r.corr_hi = 13.0f;
	rope_check(be[1], in, pos, &r, "yarn");
	struct { float *f; float v; const char *what; } steps[] = {
		{ &r.ext_factor, 0.6f, "yarn ext_factor" }, { &r.attn_factor, 0.9f, "yarn attn_factor" },
		{ &r.corr_lo, 3.0f, "yarn corr_lo" }, { &r.corr_hi, 20.0f, "yarn corr_hi" },
		{ &r.freq_scale, 0.125f, "yarn freq_scale" }, { &r.theta, 10000.0f, "yarn theta" },
	};
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		*steps[i].f = steps[i].v;
		rope_check(be[1], in, pos, &r, steps[i].what);
	}
	r.freq_factors = r.h_freq_factors = ff;
	rope_check(be[1], in, pos, &r, "yarn + factors");
	r.rot_dim = 64;
	rope_check(be[1], in, pos, &r, "yarn + factors, rot_dim 64");
	/* Two settings in turn (layers that alternate), then a third: every table still right. */
	for (int k = 0; k < 3; k++) {
		rope_check(be[1], in, pos, &base, "alternating, plain");
		rope_check(be[1], in, pos, &r, "alternating, yarn");
	}
	ff[3] = 0.5f;
	rope_check(be[1], in, pos, &r, "alternating, factors changed in place");
	rope_check(be[1], in, pos, &base, "alternating, plain again");
	/* Batch invariance: each row alone, on 1 and 2 threads. */
	memcpy(x, in, sizeof(x));
	assert_int_equal(be[1]->ops->rope(be[1], x, pos, RS_N, RS_NH, RS_HD, &r), 0);
	for (int b = 0; b < 2; b++)
		for (int i = RS_N - 1; i >= 0; i--) {
			memcpy(one, in + i * RS_NH * RS_HD, sizeof(one));
			assert_int_equal(be[b]->ops->rope(be[b], one, pos + i, 1, RS_NH, RS_HD, &r), 0);
			if (memcmp(one, x + i * RS_NH * RS_HD, sizeof(one)))
				fail_msg("rope yarn: row %d alone on %u threads differs from the batch", i,
					 be[b]->n_threads);
		}
	r.freq_scale = 0.0f;
	assert_int_equal(be[1]->ops->rope(be[1], x, pos, 1, RS_NH, RS_HD, &r), -EINVAL);
	be[0]->ops->destroy(be[0]);
	be[1]->ops->destroy(be[1]);
}

/* ---- 6. attention ---- */

#define AT_KVH 2
#define AT_CTX 512	/* one block holding every position: a contiguous cache */
#define AT_P 300	/* positions cached */
#define AT_N 8		/* query rows per call */

/*
 * head_dim 64 takes the SIMD kernel where the CPU has one; 36 (not a
 * multiple of 8) the portable one. An f16 cache rounds Q and the softmax
 * weights to f16 (2^-11 relative each): 2e-3 of sum w|v| is allowed; an f32
 * cache rounds nothing beyond f32 arithmetic: 1e-5.
 */
static const struct { uint32_t group, hd, type; double tol; } at_cfg[] = {
	{ 1, 64, KB_F16, 2e-3 }, { 3, 64, KB_F16, 2e-3 }, { 8, 64, KB_F16, 2e-3 },
	{ 3, 36, KB_F16, 2e-3 }, { 3, 64, KB_F32, 1e-5 }, { 2, 36, KB_F32, 1e-5 },
};

/*
 * Row r, head h against the double reference softmax(q . K * scale) V, with
 * K and V (kd, vd: (AT_P, AT_KVH, hd)) as the cache holds them and q as
 * given. Returns the worst error relative to sum w |v|.
 */
static double at_check_head(const float *qh, const float *oh, const double *kd,
			    const double *vd, uint32_t pos, uint32_t kvh, uint32_t hd, float scale,
			    double tol, double *wts)
{
	const uint32_t np = pos + 1;
	double mx = -INFINITY, sum = 0.0, worst = 0.0;
	for (uint32_t p = 0; p < np; p++) {
		const double *k = kd + (p * AT_KVH + kvh) * hd;
		double s = 0.0;
		for (uint32_t i = 0; i < hd; i++)
			s += qh[i] * k[i];
		wts[p] = s * scale;
		mx = fmax(mx, wts[p]);
	}
	for (uint32_t p = 0; p < np; p++)
		sum += (wts[p] = exp(wts[p] - mx));
	for (uint32_t i = 0; i < hd; i++) {
		double want = 0.0, mag = 0.0;
		for (uint32_t p = 0; p < np; p++) {
			double v = vd[(p * AT_KVH + kvh) * hd + i];
			want += wts[p] / sum * v;
			mag += wts[p] / sum * fabs(v);
		}
		if (fabs(oh[i] - want) > tol * mag)
			fail_msg("head_dim %u pos %u kv head %u [%u]: %.9g want %.9g (sum w|v| %.3g)",
				 hd, pos, kvh, i, (double)oh[i], want, mag);
		worst = fmax(worst, fabs(oh[i] - want) / mag);
		/* Position 0 attends to itself alone: V itself. */
		if (pos == 0 && fbits(oh[i]) != fbits((float)vd[kvh * hd + i]))
			fail_msg("head_dim %u pos 0 [%u]: %a is not V", hd, i, (double)oh[i]);
	}
	return worst;
}

typedef int (*att_heads_fn)(float *out, const float *q, const struct kb_kv_view *kv, uint32_t pos,
			    uint32_t kvh0, uint32_t nkv, const struct kb_attn_shape *sh);

/*
 * The SIMD attention kernels against the portable one, bit for bit: every
 * position count from 1 to 100 (whole and partial blocks of eight and runs
 * of 32), head sizes of 64 and 80 (whole and partial 64-element chunks), an
 * f16 and an f32 cache in 16-token blocks in a scrambled order, head groups
 * of 1 to 5 (the AVX-512 kernel takes three heads a pass: 4 and 5 leave one
 * and two), one kv head at a time and all at once; ops_attention_heads()
 * and each instruction set's kernel this CPU runs.
 */
static void test_attention_paths(void **state)
{
	(void)state;
	enum { MAXHD = 80, KVH = 2, CTX = 112, BT = 16, NB = CTX / BT, MAXG = 5 };
	static const uint32_t table[NB] = { 5, 2, 6, 0, 3, 1, 4 };
	static float k[CTX * KVH * MAXHD], v[CTX * KVH * MAXHD];
	float q[KVH * MAXG * MAXHD], a[KVH * MAXG * MAXHD], b[MAXG * MAXHD];
	uint32_t pos[CTX];
	struct backend *be;
	int compared = 0;
	struct { const char *name; att_heads_fn fn; } kern[3] = { { "ops_attention_heads", ops_attention_heads } };
	int n_kern = 1;
#if defined(__x86_64__)
	if (ops_have_avx2())
		kern[n_kern++] = (typeof(kern[0])){ "avx2", ops_attention_heads_avx2 };
	if (ops_have_avx512())
		kern[n_kern++] = (typeof(kern[0])){ "avx512", ops_attention_heads_avx512 };
#endif
	assert_int_equal(backend_cpu_create(&be, 1), 0);
	rng_seed(67);
	for (uint32_t p = 0; p < CTX; p++)
		pos[p] = p;
	for (uint32_t i = 0; i < CTX * KVH * MAXHD; i++) {
		k[i] = rng_f(-2.0f, 2.0f);
		v[i] = rng_f(-1.0f, 1.0f);
	}
	for (int c = 0; c < 4; c++) {
		const uint32_t hd = c & 1 ? 80 : 64, type = c & 2 ? KB_F32 : KB_F16;
		size_t esz = c & 2 ? sizeof(float) : sizeof(uint16_t), row = esz * KVH * hd;
		size_t block = 2 * BT * row;
		uint8_t *cache = malloc(NB * block);
		struct kb_kv_view kv = { .base = cache, .blocks = table, .n_blocks = NB,
					 .block_tokens = BT, .block_bytes = block, .k_off = 0,
					 .v_off = BT * row, .row_bytes = row, .type = type };
		assert_non_null(cache);
		assert_int_equal(backend_cpu_write_kv(be, &kv, pos, CTX, KVH * hd, k, v), 0);
		for (uint32_t group = 1; group <= MAXG; group++) {
			struct kb_attn_shape sh = { .n_heads = group * KVH, .n_kv_heads = KVH,
						    .head_dim = hd, .scale = 0.125f };
			const uint32_t per = group * hd;
			for (uint32_t p = 0; p < 100; p++) {
				for (uint32_t i = 0; i < KVH * per; i++)
					q[i] = rng_f(-3.0f, 3.0f);
				for (int f = 0; f < n_kern; f++) {
					assert_int_equal(kern[f].fn(a, q, &kv, p, 0, KVH, &sh), 0);
					for (uint32_t h = 0; h < KVH; h++) {
						assert_int_equal(ops_attention_group_c(b, q + h * per, &kv, p, h, &sh), 0);
						for (int one = 0; one < 2; one++) {
							float g[MAXG * MAXHD];
							const float *x = a + h * per;
							if (one) {
								assert_int_equal(kern[f].fn(g, q + h * per, &kv, p, h, 1, &sh), 0);
								x = g;
							}
							for (uint32_t i = 0; i < per; i++)
								if (fbits(x[i]) != fbits(b[i]))
									fail_msg("%s: %s cache, head size %u, group %u, pos %u, kv head %u%s, element %u: %a, portable %a",
										 kern[f].name, c & 2 ? "f32" : "f16", hd,
										 group, p, h, one ? " alone" : "", i,
										 (double)x[i], (double)b[i]);
							compared++;
						}
					}
				}
			}
		}
		free(cache);
	}
	be->ops->destroy(be);
	printf("attention: %d results identical to the portable kernel (%d kernels:", compared, n_kern);
	for (int f = 0; f < n_kern; f++)
		printf(" %s", kern[f].name);
	printf(")\n");
}

static void test_attention(void **state)
{
	(void)state;
	struct backend *be[2];
	uint32_t pos[AT_P];
	double worst[2] = { 0.0, 0.0 };
	double *wts = malloc(sizeof(double) * AT_P);
	assert_non_null(wts);
	assert_int_equal(backend_cpu_create(&be[0], 1), 0);
	assert_int_equal(backend_cpu_create(&be[1], 2), 0);
	for (uint32_t p = 0; p < AT_P; p++)
		pos[p] = p;
	rng_seed(61);
	for (size_t c = 0; c < sizeof(at_cfg) / sizeof(at_cfg[0]); c++) {
		const uint32_t hd = at_cfg[c].hd, kv_dim = AT_KVH * hd, f32 = at_cfg[c].type == KB_F32;
		const uint32_t nh = at_cfg[c].group * AT_KVH, qd = nh * hd;
		const size_t esz = f32 ? sizeof(float) : sizeof(uint16_t);
		const struct kb_attn_shape sh = { .n_heads = nh, .n_kv_heads = AT_KVH,
						  .head_dim = hd, .scale = 1.0f / sqrtf((float)hd) };
		uint8_t *kvbuf = malloc(2 * esz * AT_CTX * kv_dim);
		void *kc = kvbuf, *vc = kvbuf + esz * AT_CTX * kv_dim;
		float *k = malloc(sizeof(float) * AT_P * kv_dim), *v = malloc(sizeof(float) * AT_P * kv_dim);
		double *kd = malloc(sizeof(double) * AT_P * kv_dim);
		double *vd = malloc(sizeof(double) * AT_P * kv_dim);
		float *q = malloc(sizeof(float) * AT_N * qd), *out = malloc(sizeof(float) * AT_N * qd);
		float *one = malloc(sizeof(float) * qd);
		static const uint32_t one_block = 0;
		struct kb_kv_view kv = { .base = kvbuf, .blocks = &one_block, .n_blocks = 1,
					 .block_tokens = AT_CTX, .block_bytes = 2 * esz * AT_CTX * kv_dim,
					 .k_off = 0, .v_off = esz * AT_CTX * kv_dim,
					 .row_bytes = esz * kv_dim, .type = at_cfg[c].type };
		assert_true(kvbuf && k && v && kd && vd && q && out && one);
		for (uint32_t i = 0; i < AT_P * kv_dim; i++) {
			k[i] = rng_f(-1.0f, 1.0f);
			v[i] = rng_f(-1.0f, 1.0f);
		}
		/* Written in uneven chunks; the cache holds exactly each value in its type, in place. */
		for (uint32_t p = 0; p < AT_P; p += 37) {
			uint32_t m = AT_P - p < 37 ? AT_P - p : 37;
			assert_int_equal(backend_cpu_write_kv(be[1], &kv, pos + p, m, kv_dim,
							      k + p * kv_dim, v + p * kv_dim), 0);
		}
		for (uint32_t i = 0; i < AT_P * kv_dim; i++) {
			if (f32) {
				kd[i] = ((const float *)kc)[i];
				vd[i] = ((const float *)vc)[i];
				if (kd[i] != k[i] || vd[i] != v[i])
					fail_msg("write_kv f32: element %u is not its input", i);
			} else {
				uint16_t kh = ((const uint16_t *)kc)[i], vh = ((const uint16_t *)vc)[i];
				if (kh != f32_to_fp16(k[i]) || vh != f32_to_fp16(v[i]))
					fail_msg("write_kv f16: element %u is not the f16 of its input", i);
				kd[i] = half_ref(kh);
				vd[i] = half_ref(vh);
			}
		}
		/* Consecutive rows at the end of the cache, then the first positions with a peakier softmax. */
		for (int si = 0; si < 2; si++) {
			const uint32_t *qp = pos + (si ? 0 : AT_P - AT_N);
			for (uint32_t i = 0; i < AT_N * qd; i++)
				q[i] = rng_f(-1.0f, 1.0f) * (si ? 3.0f : 1.0f);
			assert_int_equal(backend_cpu_attention(be[1], out, q, &kv, qp, AT_N, &sh), 0);
			for (uint32_t r = 0; r < AT_N; r++) {
				/* One row per call, either thread count: the same bits. */
				for (int b = 0; b < 2; b++) {
					assert_int_equal(backend_cpu_attention(be[b], one, q + r * qd, &kv,
									       qp + r, 1, &sh), 0);
					if (memcmp(one, out + r * qd, sizeof(float) * qd))
						fail_msg("group %u head_dim %u pos %u: row alone (%u threads) differs from the batch",
							 at_cfg[c].group, hd, qp[r], be[b]->n_threads);
				}
				for (uint32_t h = 0; h < nh; h++)
					worst[f32] = fmax(worst[f32],
							  at_check_head(q + r * qd + h * hd,
									out + r * qd + h * hd, kd, vd,
									qp[r], h / at_cfg[c].group, hd,
									sh.scale, at_cfg[c].tol, wts));
			}
		}
		/* Out of range positions, bad shapes and cache types are refused. */
		uint32_t far = AT_CTX;
		struct kb_attn_shape bad = sh;
		struct kb_kv_view badkv = kv;
		assert_int_equal(backend_cpu_attention(be[1], out, q, &kv, &far, 1, &sh), -ERANGE);
		assert_int_equal(backend_cpu_write_kv(be[1], &kv, &far, 1, kv_dim, k, v), -ERANGE);
		bad.n_heads = AT_KVH * 3 + 1;
		assert_int_equal(backend_cpu_attention(be[1], out, q, &kv, pos, 1, &bad), -EINVAL);
		bad.n_heads = AT_KVH * 17;
		assert_int_equal(backend_cpu_attention(be[1], out, q, &kv, pos, 1, &bad), -EINVAL);
		badkv.type = KB_Q4_1;
		assert_int_equal(backend_cpu_attention(be[1], out, q, &badkv, pos, 1, &sh), -ENOTSUP);
		assert_int_equal(backend_cpu_write_kv(be[1], &badkv, pos, 1, kv_dim, k, v), -ENOTSUP);
		free(kvbuf);
		free(k);
		free(v);
		free(kd);
		free(vd);
		free(q);
		free(out);
		free(one);
	}
	printf("attention: max |err| / sum w|v|: f16 cache %.3g, f32 cache %.3g\n", worst[0],
	       worst[1]);
	be[0]->ops->destroy(be[0]);
	be[1]->ops->destroy(be[1]);
	free(wts);
}

/* ---- 6b. sliding window and soft-capping ---- */

#define WC_P 80		/* positions cached, every one queried */
#define WC_BT 16	/* block tokens: the window crosses blocks */
#define WC_KVH 2

/* Element e of position p's K (which 0) or V (1) row, exactly as the cache holds it. */
static double wc_elem(const struct kb_kv_view *kv, int which, uint32_t p, uint32_t e)
{
	const uint8_t *row = kb_kv_row(kv, which, p);
	if (kv->type == KB_F32)
		return ((const float *)row)[e];
	if (kv->type == KB_F16)
		return half_ref(((const uint16_t *)row)[e]);
	const struct blk_q8_0 *b = (const struct blk_q8_0 *)row + e / QK;
	return half_ref(b->d) * b->qs[e % QK];
}

/*
 * Row at pos, one query head (kv head kvh) against the double formula: the
 * positions pos - window < q <= pos, scores cap * tanh(q.k / cap) * scale
 * (the cap on the raw product, the scale after, as llama.cpp's graph
 * does), softmax, weighted V. Returns the error relative to sum w|v|.
 */
static double wc_check_head(const float *q, const float *o, const struct kb_kv_view *kv,
			    uint32_t pos, uint32_t kvh, const struct kb_attn_shape *sh, double tol)
{
	const uint32_t hd = sh->head_dim;
	const uint32_t p0 = sh->window && pos + 1 > sh->window ? pos + 1 - sh->window : 0;
	double w[WC_P], mx = -INFINITY, sum = 0.0, worst = 0.0;
	for (uint32_t p = p0; p <= pos; p++) {
		double d = 0.0;
		for (uint32_t i = 0; i < hd; i++)	/* Q as the f16 and q8_0 caches take it */
			d += (kv->type == KB_F32 ? q[i] : fp16_round(q[i])) * wc_elem(kv, 0, p, kvh * hd + i);
		if (sh->softcap != 0.0f)
			d = sh->softcap * tanh(d / sh->softcap);
		w[p] = d * sh->scale;
		mx = fmax(mx, w[p]);
	}
	for (uint32_t p = p0; p <= pos; p++)
		sum += (w[p] = exp(w[p] - mx));
	for (uint32_t i = 0; i < hd; i++) {
		double want = 0.0, mag = 0.0, vsum = 0.0;
		for (uint32_t p = p0; p <= pos; p++) {
			double v = wc_elem(kv, 1, p, kvh * hd + i);
			want += w[p] / sum * v;
			mag += w[p] / sum * fabs(v);
			vsum += fabs(v);
		}
		/* f16 weights below 2^-14 are subnormal: 2^-25 absolute each */
		double sub = kv->type == KB_F32 ? 0.0 : 0x1p-25 * vsum;
		if (fabs(o[i] - want) > tol * mag + sub + 1e-30)
			fail_msg("window %u cap %g type %u hd %u pos %u [%u]: %.9g want %.9g", sh->window,
				 (double)sh->softcap, kv->type, hd, pos, i, (double)o[i], want);
		worst = fmax(worst, fmax(0.0, fabs(o[i] - want) - sub) / mag);
	}
	return worst;
}

/* One cache of type, (WC_P / WC_BT) blocks of WC_BT positions, its table in reverse. */
struct wc_cache {
	uint8_t *pool;
	uint32_t table[WC_P / WC_BT];
	struct kb_kv_view kv;
};

static void wc_cache_make(struct wc_cache *c, struct backend *be, uint32_t type, uint32_t kv_dim,
			  const float *k, const float *v)
{
	size_t row = type == KB_F32 ? 4 * kv_dim : type == KB_F16 ? 2 * kv_dim : kv_dim / QK * 34;
	uint32_t nb = WC_P / WC_BT, pos[WC_P];
	c->pool = malloc(nb * 2 * WC_BT * row);
	assert_non_null(c->pool);
	for (uint32_t b = 0; b < nb; b++)
		c->table[b] = nb - 1 - b;
	c->kv = (struct kb_kv_view){ .base = c->pool, .blocks = c->table, .n_blocks = nb,
				     .block_tokens = WC_BT, .block_bytes = 2 * WC_BT * row,
				     .k_off = 0, .v_off = WC_BT * row, .row_bytes = row, .type = type };
	for (uint32_t p = 0; p < WC_P; p++)
		pos[p] = p;
	assert_int_equal(backend_cpu_write_kv(be, &c->kv, pos, WC_P, kv_dim, k, v), 0);
}

/*
 * The batched paged form, a row alone on 1 and 2 threads, and the
 * portable kernel (where the SIMD one ran) all give the batch's bits.
 */
static void wc_same_bits(struct backend *const be[2], const struct wc_cache *c, const float *q,
			 const float *out, const uint32_t *pos, const struct kb_attn_shape *sh)
{
	const uint32_t qd = sh->n_heads * sh->head_dim, group = sh->n_heads / sh->n_kv_heads;
	float *o = malloc(sizeof(float) * WC_P * qd);
	uint32_t off[WC_P] = { 0 }, len[WC_P];
	assert_non_null(o);
	for (uint32_t r = 0; r < WC_P; r++)
		len[r] = c->kv.n_blocks;
	struct kb_kv_rows kr = { .geo = c->kv, .tables = c->table, .tab_off = off, .tab_len = len,
				 .h_tab_off = off, .h_tab_len = len, .h_pos = pos };
	assert_int_equal(be[1]->ops->attention_rows(be[1], o, q, &kr, pos, WC_P, sh), 0);
	if (memcmp(o, out, sizeof(float) * WC_P * qd))
		fail_msg("window %u cap %g: attention_rows differs from backend_cpu_attention",
			 sh->window, (double)sh->softcap);
	for (int b = 0; b < 2; b++)
		for (uint32_t r = 0; r < WC_P; r += 7) {
			assert_int_equal(backend_cpu_attention(be[b], o, q + r * qd, &c->kv, pos + r, 1, sh), 0);
			if (memcmp(o, out + r * qd, sizeof(float) * qd))
				fail_msg("window %u cap %g pos %u: alone on %u threads differs from the batch",
					 sh->window, (double)sh->softcap, r, be[b]->n_threads);
		}
	for (uint32_t r = 0; r < WC_P; r++)
		for (uint32_t h = 0; h < WC_KVH; h++) {
			size_t qo = r * qd + h * group * sh->head_dim;
			assert_int_equal(ops_attention_group_c(o, q + qo, &c->kv, r, h, sh), 0);
			if (memcmp(o, out + qo, sizeof(float) * group * sh->head_dim))
				fail_msg("window %u cap %g pos %u kv head %u: the portable kernel differs",
					 sh->window, (double)sh->softcap, r, h);
		}
	free(o);
}

static void test_attention_window_cap(void **state)
{
	(void)state;
	static const struct { uint32_t type, group, hd; double tol; } cfg[] = {
		{ KB_F16, 1, 64, 2e-3 }, { KB_F16, 3, 64, 2e-3 }, { KB_F32, 3, 64, 1e-5 },
		{ KB_F32, 2, 36, 1e-5 }, { KB_Q8_0, 3, 64, 2e-3 }, { KB_Q8_0, 1, 32, 2e-3 },
	};
	/* The scale and the cap both matter: capping q.k * scale instead would miss by far. */
	static const struct { uint32_t window; float cap, scale; } wc[] = {
		{ 0, 0.0f, 0.125f }, { 1, 0.0f, 0.125f }, { 7, 0.0f, 0.125f }, { 33, 0.0f, 0.125f },
		{ 0, 2.0f, 0.125f }, { 7, 2.0f, 0.5f }, { 33, 50.0f, 1.0f }, { 100, 3.0f, 0.25f },
	};
	struct backend *be[2];
	double worst[3] = { 0 };
	assert_int_equal(backend_cpu_create(&be[0], 1), 0);
	assert_int_equal(backend_cpu_create(&be[1], 2), 0);
	uint32_t pos[WC_P];
	for (uint32_t p = 0; p < WC_P; p++)
		pos[p] = p;
	rng_seed(68);
	for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
		const uint32_t hd = cfg[c].hd, kvd = WC_KVH * hd, nh = cfg[c].group * WC_KVH;
		const uint32_t qd = nh * hd;
		float *k = malloc(sizeof(float) * WC_P * kvd), *v = malloc(sizeof(float) * WC_P * kvd);
		float *q = malloc(sizeof(float) * WC_P * qd), *out = malloc(sizeof(float) * WC_P * qd);
		assert_true(k && v && q && out);
		for (uint32_t i = 0; i < WC_P * kvd; i++) {
			k[i] = rng_f(-1.0f, 1.0f);
			v[i] = rng_f(-1.0f, 1.0f);
		}
		for (uint32_t i = 0; i < WC_P * qd; i++)
			q[i] = rng_f(-2.0f, 2.0f);
		struct wc_cache cache;
		wc_cache_make(&cache, be[1], cfg[c].type, kvd, k, v);
		for (size_t w = 0; w < sizeof(wc) / sizeof(wc[0]); w++) {
			struct kb_attn_shape sh = { .n_heads = nh, .n_kv_heads = WC_KVH, .head_dim = hd,
						    .scale = wc[w].scale, .softcap = wc[w].cap,
						    .window = wc[w].window };
			assert_int_equal(backend_cpu_attention(be[1], out, q, &cache.kv, pos, WC_P, &sh), 0);
			for (uint32_t r = 0; r < WC_P; r++)
				for (uint32_t h = 0; h < nh; h++) {
					double e = wc_check_head(q + r * qd + h * hd, out + r * qd + h * hd,
								 &cache.kv, r, h / cfg[c].group, &sh,
								 cfg[c].tol);
					int t = cfg[c].type == KB_F32 ? 0 : cfg[c].type == KB_F16 ? 1 : 2;
					worst[t] = fmax(worst[t], e);
				}
			wc_same_bits(be, &cache, q, out, pos, &sh);
		}
		struct kb_attn_shape bad = { .n_heads = nh, .n_kv_heads = WC_KVH, .head_dim = hd,
					     .scale = 1.0f, .softcap = -1.0f };
		assert_int_equal(backend_cpu_attention(be[1], out, q, &cache.kv, pos, 1, &bad), -EINVAL);
		free(cache.pool);
		free(k);
		free(v);
		free(q);
		free(out);
	}
	printf("attention with window/softcap: max |err| / sum w|v|: f32 %.3g, f16 %.3g, q8_0 %.3g\n",
	       worst[0], worst[1], worst[2]);
	be[0]->ops->destroy(be[0]);
	be[1]->ops->destroy(be[1]);
}

/* ---- 7. thread pool ---- */

struct tp_count {
	uint32_t *hits;		/* (n,) */
	uint32_t n;
	uint32_t stray;		/* task indexes >= n */
};

static void tp_count_task(void *ctx, uint32_t t)
{
	struct tp_count *c = ctx;
	/* A little work first, so a run that returned early is caught before the counts land. */
	for (volatile int spin = 0; spin < 2000; spin++)
		;
	if (t >= c->n) {
		__atomic_fetch_add(&c->stray, 1, __ATOMIC_RELAXED);
		return;
	}
	__atomic_fetch_add(&c->hits[t], 1, __ATOMIC_RELAXED);
}

static void tp_check(struct threadpool *tp, uint32_t n)
{
	uint32_t hits[1000] = { 0 };
	struct tp_count c = { .hits = hits, .n = n };
	threadpool_run(tp, tp_count_task, &c, n);
	assert_int_equal(c.stray, 0);
	for (uint32_t t = 0; t < n; t++)
		if (hits[t] != 1)
			fail_msg("%u threads, %u tasks: task %u ran %u times", threadpool_size(tp), n,
				 t, hits[t]);
}

static void test_threadpool(void **state)
{
	(void)state;
	static const uint32_t threads[] = { 1, 2, 4 };
	static const uint32_t tasks[] = { 0, 1, 7, 1000 };
	struct threadpool *tp;
	assert_int_equal(threadpool_create(&tp, 0), -EINVAL);
	for (size_t i = 0; i < sizeof(threads) / sizeof(threads[0]); i++) {
		assert_int_equal(threadpool_create(&tp, threads[i]), 0);
		assert_int_equal(threadpool_size(tp), threads[i]);
		for (int rep = 0; rep < 3; rep++)
			for (size_t j = 0; j < sizeof(tasks) / sizeof(tasks[0]); j++)
				tp_check(tp, tasks[j]);
		/* Past the spin phase the workers sleep on the futex; a run must wake them. */
		for (int rep = 0; rep < 3; rep++) {
			usleep(30000);
			tp_check(tp, 7);
		}
		threadpool_destroy(tp);
	}
	/*
	 * Back to back: a lost wake-up or a stale counter hangs here, and the
	 * alarm turns a hang into a failure. Four threads on fewer cores spin
	 * against each other (milliseconds a run), so they get fewer runs.
	 */
	alarm(kw_s(60000));
	for (size_t i = 0; i < sizeof(threads) / sizeof(threads[0]); i++) {
		long cores = sysconf(_SC_NPROCESSORS_ONLN);
		int runs = threads[i] <= (uint32_t)cores ? 2000 : 100;
		assert_int_equal(threadpool_create(&tp, threads[i]), 0);
		for (int rep = 0; rep < runs; rep++)
			tp_check(tp, (uint32_t)rep % 9);
		threadpool_destroy(tp);
	}
	alarm(0);
}

/*
 * Tiny tasks over many runs, each run with its own ctx and one of two fns
 * by its parity: a task run twice or never, or run with another run's fn
 * or ctx (a worker arriving late with a stale view of the pool), is counted.
 */
struct tp_run {
	uint32_t id;		/* the run's number; tp_current names the run in flight */
	uint32_t n;
	uint32_t hits[16];
};

static uint32_t tp_current;
static uint32_t tp_stale;

static void tp_run_task(struct tp_run *r, uint32_t t, uint32_t parity)
{
	if (r->id != __atomic_load_n(&tp_current, __ATOMIC_RELAXED) || (r->id & 1) != parity ||
	    t >= r->n)
		__atomic_fetch_add(&tp_stale, 1, __ATOMIC_RELAXED);
	else
		__atomic_fetch_add(&r->hits[t], 1, __ATOMIC_RELAXED);
}

static void tp_even_task(void *ctx, uint32_t t)
{
	tp_run_task(ctx, t, 0);
}

static void tp_odd_task(void *ctx, uint32_t t)
{
	tp_run_task(ctx, t, 1);
}

/* Runs first..first+runs-1 of 0..16 tasks; returns the tasks not run exactly once or run stale. */
static uint32_t tp_tiny_runs(struct threadpool *tp, uint32_t first, uint32_t runs)
{
	uint32_t bad = 0;
	__atomic_store_n(&tp_stale, 0, __ATOMIC_RELAXED);
	for (uint32_t i = first; i < first + runs; i++) {
		/* The same stack slot every run: a stale ctx pointer reads this run's id, the parity catches it. */
		struct tp_run r = { .id = i, .n = i % 17 };
		__atomic_store_n(&tp_current, i, __ATOMIC_RELAXED);
		threadpool_run(tp, i & 1 ? tp_odd_task : tp_even_task, &r, r.n);
		for (uint32_t t = 0; t < r.n; t++)
			bad += r.hits[t] != 1;
	}
	return bad + __atomic_load_n(&tp_stale, __ATOMIC_RELAXED);
}

static void test_threadpool_tiny(void **state)
{
	(void)state;
	alarm(kw_s(60000));
	for (uint32_t threads = 2; threads <= 4; threads++) {
		struct threadpool *tp;
		assert_int_equal(threadpool_create(&tp, threads), 0);
		uint32_t bad = tp_tiny_runs(tp, 0, 5000);
		threadpool_destroy(tp);
		if (bad)
			fail_msg("%u threads: %u tasks not run exactly once or with a stale ctx", threads,
				 bad);
	}
	alarm(0);
}

/*
 * A worker held outside any run (as one descheduled by another process, or
 * slow to wake, is): runs must complete without it. It is held in a signal
 * handler, so the pool needs no test hook.
 */
static pthread_t tp_caller, tp_worker;
static uint32_t tp_worker_found, tp_held, tp_release;

static void tp_find_task(void *ctx, uint32_t t)
{
	(void)ctx;
	(void)t;
	/* Long enough that a worker joins before the caller has done every task. */
	for (volatile int spin = 0; spin < 20000; spin++)
		;
	if (!pthread_equal(pthread_self(), tp_caller) &&
	    !__atomic_exchange_n(&tp_worker_found, 1, __ATOMIC_RELAXED))
		tp_worker = pthread_self();
}

static void tp_hold(int sig)
{
	(void)sig;
	struct timespec ms = { .tv_nsec = 1000000 };
	__atomic_store_n(&tp_held, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&tp_release, __ATOMIC_ACQUIRE))
		nanosleep(&ms, NULL);
}

#define TP_HELD_RUNS 3000

static void test_threadpool_late_worker(void **state)
{
	(void)state;
	struct sigaction sa = { .sa_handler = tp_hold }, old;
	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
	/* A run that waits for the held worker never returns: the alarm turns that into a failure. */
	alarm(kw_s(60000));
	for (uint32_t threads = 2; threads <= 4; threads++) {
		struct threadpool *tp;
		assert_int_equal(threadpool_create(&tp, threads), 0);
		tp_caller = pthread_self();
		tp_worker_found = tp_held = tp_release = 0;
		/* Returned from the run it did tasks of, the worker is inside none when the signal lands. */
		while (!tp_worker_found)
			threadpool_run(tp, tp_find_task, NULL, 64);
		assert_int_equal(pthread_kill(tp_worker, SIGUSR1), 0);
		while (!__atomic_load_n(&tp_held, __ATOMIC_ACQUIRE))
			usleep(1000);
		uint32_t bad = tp_tiny_runs(tp, 0, TP_HELD_RUNS);
		/* It resumes amid these runs, the generation it last saw long gone. */
		__atomic_store_n(&tp_release, 1, __ATOMIC_RELEASE);
		bad += tp_tiny_runs(tp, TP_HELD_RUNS, 3000);
		threadpool_destroy(tp);
		if (bad)
			fail_msg("%u threads, one held: %u tasks not run exactly once or with a stale ctx",
				 threads, bad);
	}
	alarm(0);
	sigaction(SIGUSR1, &old, NULL);
}

/*
 * A task that sleeps when a worker runs it: the caller, done with the
 * others first, sleeps until the worker leaves the run and wakes it. The
 * caller's tasks take long enough that a worker joins.
 */
static uint32_t tp_slow_runs;

static void tp_slow_task(void *ctx, uint32_t t)
{
	struct tp_count *c = ctx;
	if (pthread_equal(pthread_self(), tp_caller)) {
		for (volatile int spin = 0; spin < 20000; spin++)
			;
	} else {
		__atomic_fetch_add(&tp_slow_runs, 1, __ATOMIC_RELAXED);
		usleep(1000);
	}
	__atomic_fetch_add(&c->hits[t], 1, __ATOMIC_RELAXED);
}

static void test_threadpool_slow_worker(void **state)
{
	(void)state;
	/* A lost wake-up hangs here. */
	alarm(kw_s(60000));
	tp_caller = pthread_self();
	for (uint32_t threads = 2; threads <= 4; threads++) {
		struct threadpool *tp;
		uint32_t bad = 0;
		assert_int_equal(threadpool_create(&tp, threads), 0);
		__atomic_store_n(&tp_slow_runs, 0, __ATOMIC_RELAXED);
		while (__atomic_load_n(&tp_slow_runs, __ATOMIC_RELAXED) < 50) {
			uint32_t hits[8] = { 0 };
			struct tp_count c = { .hits = hits, .n = 8 };
			threadpool_run(tp, tp_slow_task, &c, 8);
			for (uint32_t t = 0; t < 8; t++)
				bad += hits[t] != 1;
		}
		threadpool_destroy(tp);
		if (bad)
			fail_msg("%u threads, slow workers: %u tasks not run exactly once", threads, bad);
	}
	alarm(0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fp16_decode_all),
		cmocka_unit_test(test_fp16_encode),
		cmocka_unit_test(test_f16_row),
		cmocka_unit_test(test_dequant_small),
		cmocka_unit_test(test_dequant_k),
		cmocka_unit_test(test_dequant_float),
		cmocka_unit_test(test_qdot),
		cmocka_unit_test(test_quantize_simd),
		cmocka_unit_test(test_qgemm),
		cmocka_unit_test(test_matmul_invariance),
		cmocka_unit_test(test_matmul),
		cmocka_unit_test(test_rmsnorm),
		cmocka_unit_test(test_swiglu),
		cmocka_unit_test(test_bias_scale_softcap),
		cmocka_unit_test(test_geglu),
		cmocka_unit_test(test_fast_expf),
		cmocka_unit_test(test_rope),
		cmocka_unit_test(test_rope_scaled),
		cmocka_unit_test(test_attention),
		cmocka_unit_test(test_attention_paths),
		cmocka_unit_test(test_attention_window_cap),
		cmocka_unit_test(test_threadpool),
		cmocka_unit_test(test_threadpool_tiny),
		cmocka_unit_test(test_threadpool_late_worker),
		cmocka_unit_test(test_threadpool_slow_worker),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
