/* dot_avx2.c — the repacked kernels for AVX2+FMA+F16C, and the x86 run-time selection. */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#define SFX avx2
#define DOT_VNNI 0
#define GEMM_TILE 4	/* 16 vector registers: eight slices, four accumulators, temporaries */
#define KW 8
#include "kernels/cpu/dot_x86_body.h"

#include <string.h>

qgemm_fn dot_x86_select_vnni(uint32_t type);
qgemm_fn dot_x86_select_avx512(uint32_t type);
qgemm_fn dot_x86_select(uint32_t type, const char *want, const char **isa);
qgemm_fn dot_x86_select16(uint32_t type, const char *want);

static int has_avx2(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	       __builtin_cpu_supports("f16c");
}

static int has_vnni(void)
{
	return has_avx2() && __builtin_cpu_supports("avx512vnni") &&
	       __builtin_cpu_supports("avx512vl");
}

static int has_avx512(void)
{
	return has_vnni() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}

/*
 * want: NULL for the best this CPU has, or "avx512vnni" / "avx2" (NULL
 * result if unsupported); "avx512" takes the avx512vnni kernels for the
 * groups its 16-row ones leave.
 */
qgemm_fn dot_x86_select(uint32_t type, const char *want, const char **isa)
{
	if (has_vnni() && (!want || !strcmp(want, "avx512vnni") || !strcmp(want, "avx512"))) {
		*isa = has_avx512() && (!want || !strcmp(want, "avx512")) ? "avx512" : "avx512vnni";
		return dot_x86_select_vnni(type);
	}
	if (has_avx2() && (!want || !strcmp(want, "avx2"))) {
		*isa = "avx2";
		return FN(dot_x86_select_)(type);
	}
	return NULL;
}

/* The 16-row kernels: for want NULL or "avx512", where the CPU has them. */
qgemm_fn dot_x86_select16(uint32_t type, const char *want)
{
	if (has_avx512() && (!want || !strcmp(want, "avx512")))
		return dot_x86_select_avx512(type);
	return NULL;
}
#endif

#if defined(__x86_64__)
/* quantize_row_q8x() with 8 lanes: the same max, divisions, products and round-to-nearest-even, so the same blocks. */
static void quantize_row_q8x_avx2(const float *x, struct blk_q8x *y, size_t n)
{
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	for (size_t k = 0; k < n / QK; k++) {
		const float *xb = x + k * QK;
		__m256 v[4], m = _mm256_setzero_ps();
		for (int i = 0; i < 4; i++) {
			v[i] = _mm256_loadu_ps(xb + 8 * i);
			/* operand order: a NaN element is skipped, as the scalar comparison skips it */
			m = _mm256_max_ps(_mm256_and_ps(v[i], absmask), m);
		}
		__m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
		h = _mm_max_ps(h, _mm_movehl_ps(h, h));
		h = _mm_max_ss(h, _mm_movehdup_ps(h));
		float amax = _mm_cvtss_f32(h);
		float d = amax / 127.0f;
		float id = amax > 0.0f ? 127.0f / amax : 0.0f;
		__m256i q[4], sum = _mm256_setzero_si256(), lo;
		for (int i = 0; i < 4; i++) {
			q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
			sum = _mm256_add_epi32(sum, q[i]);
			if (i == 1)
				lo = sum;	/* elements 0-15 */
		}
		__m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
		_mm256_storeu_si256((__m256i *)y[k].qs, _mm256_permutevar8x32_epi32(b, order));
		__m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
		s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
		s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
		int isum = _mm_cvtsi128_si32(s);
		__m128i t = _mm_add_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
		t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
		t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
		int ilo = _mm_cvtsi128_si32(t);
		y[k].qsum16[0] = (int16_t)ilo;
		y[k].qsum16[1] = (int16_t)(isum - ilo);
		__m128 ds = _mm_setr_ps(d, d * (float)isum, 0.0f, 0.0f);
		ds = _mm_cvtph_ps(_mm_cvtps_ph(ds, _MM_FROUND_TO_NEAREST_INT));
		y[k].d = _mm_cvtss_f32(ds);
		y[k].s = _mm_cvtss_f32(_mm_movehdup_ps(ds));
		y[k].qsum = isum;
	}
}

quantize_fn dot_x86_select_quantize(const char *want);
quantize_fn dot_x86_select_quantize(const char *want)
{
	if (has_avx2() && (!want || strcmp(want, "generic")))
		return quantize_row_q8x_avx2;
	return NULL;
}
#endif
