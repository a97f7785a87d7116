/* ops_avx2.c — attention with AVX2/FMA/F16C: the same operations, in the same order, as the portable kernel. */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <errno.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "kernels/cpu/dot.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/vexp.h"

#define ATT_MAX_GROUP 16
#define ATT_MAX_HD 256

int ops_attention_have_avx2(void);
int ops_attention_group_avx2(float *out, const float *q, const struct kb_kv_view *kv,
			     uint32_t pos, uint32_t kvh, const struct kb_attn_shape *sh);

int ops_attention_have_avx2(void)
{
	static int have = -1;
	if (have < 0) {
		__builtin_cpu_init();
		have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		       __builtin_cpu_supports("f16c");
	}
	return have;
}

/* Same tree as hsum8(). */
static inline float hsum256(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	__m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
	return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* Eight elements at element index off of a row, as f32 (f32 or f16 rows). */
static inline __m256 load8(const uint8_t *row, int f32, size_t off)
{
	if (f32)
		return _mm256_loadu_ps((const float *)row + off);
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + off)));
}

/* head_dim % 8 == 0: lane j of the accumulator sums elements j, j+8, ... like dot_lanes(). */
int ops_attention_group_avx2(float *out, const float *q, const struct kb_kv_view *kv,
			     uint32_t pos, uint32_t kvh, const struct kb_attn_shape *sh)
{
	const uint32_t hd = sh->head_dim, group = sh->n_heads / sh->n_kv_heads;
	const uint32_t np = pos + 1;
	const int f32 = kv->type == KB_F32;
	float qh[ATT_MAX_GROUP][ATT_MAX_HD] __attribute__((aligned(32)));
	float *s = ops_att_scores((size_t)group * np);	/* (group, np) */
	if (!s)
		return -ENOMEM;
	for (uint32_t g = 0; g < group; g++)
		for (uint32_t i = 0; i < hd; i += 8) {
			__m256 x = _mm256_loadu_ps(q + g * hd + i);
			if (!f32)
				x = _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
			_mm256_store_ps(&qh[g][i], x);
		}
	for (uint32_t p = 0; p < np; p++) {
		const uint8_t *k = kb_kv_row(kv, 0, p);
		size_t off = (size_t)kvh * hd;
		for (uint32_t g = 0; g < group; g++) {
			__m256 acc = _mm256_setzero_ps();
			for (uint32_t i = 0; i < hd; i += 8)
				acc = _mm256_fmadd_ps(_mm256_load_ps(&qh[g][i]),
						      load8(k, f32, off + i), acc);
			s[g * np + p] = hsum256(acc) * sh->scale;
		}
	}
	for (uint32_t g = 0; g < group; g++)
		softmax_row(s + g * np, np, !f32);
	for (uint32_t g = 0; g < group; g++) {
		__m256 acc[ATT_MAX_HD / 8];
		for (uint32_t i = 0; i < hd / 8; i++)
			acc[i] = _mm256_setzero_ps();
		const float *sg = s + g * np;
		for (uint32_t p = 0; p < np; p++) {
			const uint8_t *v = kb_kv_row(kv, 1, p);
			size_t off = (size_t)kvh * hd;
			__m256 w = _mm256_set1_ps(sg[p]);
			for (uint32_t i = 0; i < hd / 8; i++)
				acc[i] = _mm256_fmadd_ps(w, load8(v, f32, off + 8 * i), acc[i]);
		}
		for (uint32_t i = 0; i < hd / 8; i++)
			_mm256_storeu_ps(out + g * hd + 8 * i, acc[i]);
	}
	return 0;
}
#endif
