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

/* e^x of eight lanes: expf_inline()'s operations, lane by lane, so the same bits. */
static inline __m256 exp8(__m256 x)
{
	x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
	x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
				   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), x);
	r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187e-06f), r);
	__m256 p = _mm256_set1_ps(1.0f / 5040);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* softmax_row() with the element-wise steps eight lanes at a time (same bits). */
static void softmax8(float *x, uint32_t n, int round16)
{
	uint32_t p = 0;
	float mx = -INFINITY;
	for (p = 0; p < n; p++)
		mx = x[p] > mx ? x[p] : mx;
	__m256 vm = _mm256_set1_ps(mx);
	for (p = 0; p + 8 <= n; p += 8)
		_mm256_storeu_ps(x + p, exp8(_mm256_sub_ps(_mm256_loadu_ps(x + p), vm)));
	for (; p < n; p++)
		x[p] = expf_inline(x[p] - mx);
	double sum = 0.0;
	for (p = 0; p < n; p++)
		sum += x[p];
	float inv = (float)(1.0 / sum);
	__m256 vi = _mm256_set1_ps(inv);
	for (p = 0; p + 8 <= n; p += 8) {
		__m256 w = _mm256_mul_ps(_mm256_loadu_ps(x + p), vi);
		if (round16)
			w = _mm256_cvtph_ps(_mm256_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT));
		_mm256_storeu_ps(x + p, w);
	}
	for (; p < n; p++)
		x[p] = round16 ? fp16_round(x[p] * inv) : x[p] * inv;
}

/*
 * hsum256() of eight vectors at once, lane j of the result from a[j]: the
 * same additions in the same order, done across the eight.
 */
static inline __m256 hsum256x8(const __m256 a[8])
{
	__m256 b[4];
	for (int j = 0; j < 4; j++)
		b[j] = _mm256_add_ps(_mm256_permute2f128_ps(a[j], a[j + 4], 0x20),
				     _mm256_permute2f128_ps(a[j], a[j + 4], 0x31));
	__m256 t01 = _mm256_add_ps(_mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(1, 0, 1, 0)),
				   _mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(3, 2, 3, 2)));
	__m256 t23 = _mm256_add_ps(_mm256_shuffle_ps(b[2], b[3], _MM_SHUFFLE(1, 0, 1, 0)),
				   _mm256_shuffle_ps(b[2], b[3], _MM_SHUFFLE(3, 2, 3, 2)));
	return _mm256_add_ps(_mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(2, 0, 2, 0)),
			     _mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Rows p0..p0+7 (which 0: K, 1: V) of kv head kvh as f32, (8, hd). */
static inline void load_rows8(float *dst, const struct kb_kv_view *kv, int which, uint32_t p0,
			      size_t off, uint32_t hd, int f32)
{
	for (uint32_t j = 0; j < 8; j++) {
		const uint8_t *row = kb_kv_row(kv, which, p0 + j);
		for (uint32_t i = 0; i < hd; i += 8)
			_mm256_store_ps(dst + j * hd + i, load8(row, f32, off + i));
	}
}

/*
 * head_dim % 8 == 0: lane j of the accumulator sums elements j, j+8, ... like
 * dot_lanes(). K and V rows are converted once per block of eight positions
 * for the whole query-head group; eight positions' scores are reduced
 * together.
 */
int ops_attention_group_avx2(float *out, const float *q, const struct kb_kv_view *kv,
			     uint32_t pos, uint32_t kvh, const struct kb_attn_shape *sh)
{
	const uint32_t hd = sh->head_dim, group = sh->n_heads / sh->n_kv_heads;
	const uint32_t p0 = ops_att_first(pos, sh->window), np = pos + 1 - p0;
	const float sc = sh->softcap != 0.0f ? 1.0f : sh->scale;	/* a capped score is scaled after */
	const int f32 = kv->type == KB_F32;
	const size_t off = (size_t)kvh * hd;
	float qh[ATT_MAX_GROUP][ATT_MAX_HD] __attribute__((aligned(32)));
	float rows[8 * ATT_MAX_HD] __attribute__((aligned(32)));
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
	const __m256 scale = _mm256_set1_ps(sc);
	uint32_t p = 0;
	for (; p + 8 <= np; p += 8) {
		load_rows8(rows, kv, 0, p0 + p, off, hd, f32);
		for (uint32_t g = 0; g < group; g++) {
			__m256 acc[8];
			for (int j = 0; j < 8; j++)
				acc[j] = _mm256_setzero_ps();
			for (uint32_t i = 0; i < hd; i += 8) {
				__m256 qv = _mm256_load_ps(&qh[g][i]);
				for (int j = 0; j < 8; j++)
					acc[j] = _mm256_fmadd_ps(qv, _mm256_load_ps(rows + j * hd + i),
								 acc[j]);
			}
			_mm256_storeu_ps(s + g * np + p, _mm256_mul_ps(hsum256x8(acc), scale));
		}
	}
	for (; p < np; p++) {
		const uint8_t *k = kb_kv_row(kv, 0, p0 + p);
		for (uint32_t g = 0; g < group; g++) {
			__m256 acc = _mm256_setzero_ps();
			for (uint32_t i = 0; i < hd; i += 8)
				acc = _mm256_fmadd_ps(_mm256_load_ps(&qh[g][i]),
						      load8(k, f32, off + i), acc);
			s[g * np + p] = hsum256(acc) * sc;
		}
	}
	if (sh->softcap != 0.0f)
		ops_att_softcap(s, group * np, sh->softcap, sh->scale);
	for (uint32_t g = 0; g < group; g++)
		softmax8(s + g * np, np, !f32);
	memset(out, 0, (size_t)group * hd * sizeof(float));
	for (p = 0; p + 8 <= np; p += 8) {
		load_rows8(rows, kv, 1, p0 + p, off, hd, f32);
		for (uint32_t g = 0; g < group; g++) {
			const float *sg = s + g * np + p;
			float *o = out + g * hd;
			for (uint32_t i = 0; i < hd; i += 8) {
				__m256 acc = _mm256_loadu_ps(o + i);
				for (int j = 0; j < 8; j++)
					acc = _mm256_fmadd_ps(_mm256_set1_ps(sg[j]),
							      _mm256_load_ps(rows + j * hd + i), acc);
				_mm256_storeu_ps(o + i, acc);
			}
		}
	}
	for (; p < np; p++) {
		const uint8_t *v = kb_kv_row(kv, 1, p0 + p);
		for (uint32_t g = 0; g < group; g++) {
			__m256 w = _mm256_set1_ps(s[g * np + p]);
			float *o = out + g * hd;
			for (uint32_t i = 0; i < hd; i += 8)
				_mm256_storeu_ps(o + i, _mm256_fmadd_ps(w, load8(v, f32, off + i),
									_mm256_loadu_ps(o + i)));
		}
	}
	return 0;
}
#endif
