/*
 * ops_att_body.h — attention over f16/f32 caches in 256-bit vectors (the
 * weighted sums in 512-bit ones with ATT_ZMM 1), the
 * portable kernel's operations in its order, included after a #pragma GCC
 * target with ATT_G (query heads of one kv head whose scores and weighted
 * sums one pass forms together, converting each K and V row once for all
 * of them: 1 with AVX2's 16 vector registers, 3 with AVX-512VL's 32) and
 * ATT_ENTRY (the entry point's name) defined.
 */
#include <errno.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/vexp.h"

/* Same tree as hsum8(). */
static inline float hsum256(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	__m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
	return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
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

/* Largest of x[0..n-1] as softmax_row() finds it: NaN skipped (max_ps keeps m), every other order giving the same value. */
static float max_row(const float *x, uint32_t n)
{
	__m256 m = _mm256_set1_ps(-INFINITY);
	uint32_t p = 0;
	for (; p + 8 <= n; p += 8)
		m = _mm256_max_ps(_mm256_loadu_ps(x + p), m);
	float l[8], mx = -INFINITY;
	_mm256_storeu_ps(l, m);
	for (int i = 0; i < 8; i++)
		mx = l[i] > mx ? l[i] : mx;
	for (; p < n; p++)
		mx = x[p] > mx ? x[p] : mx;
	return mx;
}

/*
 * softmax_row() of the nh rows (nh, n) of x, with the element-wise steps
 * eight lanes at a time and the rows' double sums, each in position
 * order, four rows abreast (same bits). A zero of either sign as the max
 * gives the same differences.
 */
static void softmax_rows8(float *x, uint32_t nh, uint32_t n, int round16)
{
	for (uint32_t h = 0; h < nh; h++) {
		float *xr = x + (size_t)h * n;
		__m256 vm = _mm256_set1_ps(max_row(xr, n));
		uint32_t p = 0;
		for (; p + 8 <= n; p += 8)
			_mm256_storeu_ps(xr + p, exp8(_mm256_sub_ps(_mm256_loadu_ps(xr + p), vm)));
		for (; p < n; p++)
			xr[p] = expf_inline(xr[p] - _mm256_cvtss_f32(vm));
	}
	for (uint32_t h0 = 0; h0 < nh; h0 += 4) {
		const float *r[4];
		for (uint32_t k = 0; k < 4; k++)	/* past the last row: its sum again, unused */
			r[k] = x + (size_t)(h0 + k < nh ? h0 + k : nh - 1) * n;
		double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
		for (uint32_t p = 0; p < n; p++) {
			s0 += r[0][p];
			s1 += r[1][p];
			s2 += r[2][p];
			s3 += r[3][p];
		}
		const double sum[4] = { s0, s1, s2, s3 };
		for (uint32_t k = 0; k < 4 && h0 + k < nh; k++) {
			float *xr = x + (size_t)(h0 + k) * n, inv = (float)(1.0 / sum[k]);
			__m256 vi = _mm256_set1_ps(inv);
			uint32_t p = 0;
			for (; p + 8 <= n; p += 8) {
				__m256 w = _mm256_mul_ps(_mm256_loadu_ps(xr + p), vi);
				if (round16)
					w = _mm256_cvtph_ps(_mm256_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT));
				_mm256_storeu_ps(xr + p, w);
			}
			for (; p < n; p++)
				xr[p] = round16 ? fp16_round(xr[p] * inv) : xr[p] * inv;
		}
	}
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

/* Eight f32 elements at byte address r: an f32 row's, or an f16 row's converted. */
static inline __attribute__((always_inline)) __m256 ld8(const uint8_t *r, int k, const int f32)
{
	if (f32)
		return _mm256_loadu_ps((const float *)r + 8 * k);
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 16 * k)));
}

#ifndef ATT_ZMM
#define ATT_ZMM 0
#endif

/* Positions of V whose rows one pass keeps in L1 while every head sums over them. */
#define ATT_RUN 32
/*
 * How many K rows ahead of the scores the prefetches into L1 run, and those
 * into L2 (a step's K and V are far more than the last-level cache holds:
 * each row comes from DRAM). While the scores are formed, each position's
 * V row is fetched into L2 for the weighted sums (16 streams of decode:
 * the two about a sixth faster).
 */
#define ATT_AHEAD 32
#define ATT_AHEAD_L2 96
/*
 * How many positions ahead of a weighted sum the prefetch of a head's V
 * row runs: one run's worth of a DRAM latency. Prefetching a whole run of
 * every head's rows at once, as before, left the sums waiting on V (16
 * streams of decode: about a tenth faster this way).
 */
#define PV_AHEAD 32

/*
 * Every cache line of the bytes bytes at eoff in rows p..p+n-1 (which 0: K,
 * 1: V), into L1, or into L2 where l2.
 */
static inline void prefetch_rows(const struct kb_kv_view *kv, int which, uint32_t p, uint32_t n,
				 size_t eoff, size_t bytes, const int l2)
{
	for (uint32_t j = 0; j < n; j++) {
		const char *r = (const char *)kb_kv_row(kv, which, p + j) + eoff;
		for (size_t b = 0; b < bytes; b += 64) {
			if (l2)
				_mm_prefetch(r + b, _MM_HINT_T1);
			else
				_mm_prefetch(r + b, _MM_HINT_T0);
		}
	}
}

/*
 * Scores of positions p .. p+7 for the g (<= ATT_G) heads of one kv head
 * at qv (g, hd), into s + h * np: lane j of acc[h][j] sums elements j,
 * j+8, ... like dot_lanes(), then hsum256x8(). Each K row is converted
 * once for all g heads.
 */
static inline __attribute__((always_inline)) void qk8(float *s, size_t np, const float *qv,
						      const uint8_t *const kr[8], uint32_t hd,
						      __m256 scale, const int f32, const int g)
{
	__m256 acc[ATT_G][8];
	for (int h = 0; h < g; h++)
		for (int j = 0; j < 8; j++)
			acc[h][j] = _mm256_setzero_ps();
	for (uint32_t i = 0; i < hd / 8; i++) {
		__m256 x[ATT_G];
		for (int h = 0; h < g; h++)
			x[h] = _mm256_loadu_ps(qv + (size_t)h * hd + 8 * i);
		for (int j = 0; j < 8; j++) {
			__m256 k = ld8(kr[j], (int)i, f32);
			for (int h = 0; h < g; h++)
				acc[h][j] = _mm256_fmadd_ps(x[h], k, acc[h][j]);
		}
	}
	for (int h = 0; h < g; h++)
		_mm256_storeu_ps(s + (size_t)h * np, _mm256_mul_ps(hsum256x8(acc[h]), scale));
}

/*
 * o[h * hd + 0 .. 8 nv - 1] += w[h * np + p] * V[p][..] for the g (<= ATT_G)
 * heads of one kv head, over positions p0+p .. p0+p1-1 (eoff: the bytes
 * before element 0 in a row), in p's order; nv (at most 8) and g are
 * constants after inlining, so o stays in registers and each V row is
 * converted once for all g heads; with ATT_ZMM, 64 elements (nv 8) go in
 * 512-bit vectors, each element's fmas the same. The row PV_AHEAD
 * positions on is prefetched.
 */
static inline __attribute__((always_inline)) void pv_sum(float *o, uint32_t hd, const float *w,
							 size_t np, const struct kb_kv_view *kv,
							 uint32_t p0, uint32_t p, uint32_t p1, size_t eoff,
							 const int nv, const int f32, const int g)
{
	const size_t esz = f32 ? 4 : 2;
#if ATT_ZMM
	if (nv == 8) {	/* in 512-bit vectors, sixteen elements each */
		__m512 z[ATT_G][4];
		for (int h = 0; h < g; h++)
			for (int k = 0; k < 4; k++)
				z[h][k] = _mm512_loadu_ps(o + (size_t)h * hd + 16 * k);
		for (; p < p1; p++) {
			const uint8_t *r = kb_kv_row(kv, 1, p0 + p) + eoff;
			if (p + PV_AHEAD < np)
				prefetch_rows(kv, 1, p0 + p + PV_AHEAD, 1, eoff, 64 * esz, 0);
			__m512 wp[ATT_G];
			for (int h = 0; h < g; h++)
				wp[h] = _mm512_set1_ps(w[(size_t)h * np + p]);
			for (int k = 0; k < 4; k++) {
				__m512 v = f32 ? _mm512_loadu_ps((const float *)r + 16 * k)
					       : _mm512_cvtph_ps(_mm256_loadu_si256(
							 (const __m256i *)(r + 32 * k)));
				for (int h = 0; h < g; h++)
					z[h][k] = _mm512_fmadd_ps(wp[h], v, z[h][k]);
			}
		}
		for (int h = 0; h < g; h++)
			for (int k = 0; k < 4; k++)
				_mm512_storeu_ps(o + (size_t)h * hd + 16 * k, z[h][k]);
		return;
	}
#endif
	__m256 a[ATT_G][8];
	for (int h = 0; h < g; h++)
		for (int k = 0; k < nv; k++)
			a[h][k] = _mm256_loadu_ps(o + (size_t)h * hd + 8 * k);
	for (; p < p1; p++) {
		const uint8_t *r = kb_kv_row(kv, 1, p0 + p) + eoff;
		if (p + PV_AHEAD < np)
			prefetch_rows(kv, 1, p0 + p + PV_AHEAD, 1, eoff, (size_t)nv * 8 * esz, 0);
		__m256 wp[ATT_G];
		for (int h = 0; h < g; h++)
			wp[h] = _mm256_set1_ps(w[(size_t)h * np + p]);
		for (int k = 0; k < nv; k++) {
			__m256 v = ld8(r, k, f32);
			for (int h = 0; h < g; h++)
				a[h][k] = _mm256_fmadd_ps(wp[h], v, a[h][k]);
		}
	}
	for (int h = 0; h < g; h++)
		for (int k = 0; k < nv; k++)
			_mm256_storeu_ps(o + (size_t)h * hd + 8 * k, a[h][k]);
}

/* f(args..., g) with g the heads left in a kv head's group, at most ATT_G, a constant in each branch. */
#define ATT_BY_G(g, f, ...)                                   \
	do {                                                  \
		if (ATT_G >= 3 && (g) >= 3)                   \
			f(__VA_ARGS__, ATT_G >= 3 ? 3 : 1);   \
		else if (ATT_G >= 2 && (g) == 2)              \
			f(__VA_ARGS__, ATT_G >= 2 ? 2 : 1);   \
		else                                          \
			f(__VA_ARGS__, 1);                    \
	} while (0)

/*
 * head_dim % 8 == 0; kv heads kvh0 .. kvh0 + nkv - 1 and the query heads
 * they serve, in one pass over the rows, so each K and V row is read from
 * memory once and in address order. Scores: eight positions at a time for
 * every head, each K row converted as it is used. Weighted V sums: runs
 * of ATT_RUN positions, every head over one run before the next, each
 * head's outputs in registers through a run. Rows ahead are prefetched.
 * Every element sees the portable kernel's operations in its order.
 */
static inline __attribute__((always_inline)) int attention_heads(
	float *out, const float *q, const struct kb_kv_view *kv, uint32_t pos, uint32_t kvh0,
	uint32_t nkv, const struct kb_attn_shape *sh, const int f32)
{
	const uint32_t hd = sh->head_dim, group = sh->n_heads / sh->n_kv_heads, nh = nkv * group;
	const uint32_t p0 = ops_att_first(pos, sh->window), np = pos + 1 - p0;
	const float sc = sh->softcap != 0.0f ? 1.0f : sh->scale;	/* a capped score is scaled after */
	const size_t esz = f32 ? 4 : 2, eoff = (size_t)kvh0 * hd * esz, rbytes = nkv * hd * esz;
	/* (nh, hd) queries, then (nh, np) scores */
	float *qh = ops_att_scores((size_t)nh * hd + (size_t)nh * np);
	if (!qh)
		return -ENOMEM;
	float *s = qh + (size_t)nh * hd;
	for (uint32_t i = 0; i < nh * hd; i += 8) {
		__m256 x = _mm256_loadu_ps(q + i);
		if (!f32)
			x = _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
		_mm256_storeu_ps(qh + i, x);
	}
	const __m256 scale = _mm256_set1_ps(sc);
	uint32_t p = 0;
	prefetch_rows(kv, 0, p0, np < ATT_AHEAD ? np : ATT_AHEAD, eoff, rbytes, 0);
	for (; p + 8 <= np; p += 8) {
		if (p + ATT_AHEAD + 8 <= np)
			prefetch_rows(kv, 0, p0 + p + ATT_AHEAD, 8, eoff, rbytes, 0);
		if (p + ATT_AHEAD_L2 + 8 <= np)
			prefetch_rows(kv, 0, p0 + p + ATT_AHEAD_L2, 8, eoff, rbytes, 1);
		prefetch_rows(kv, 1, p0 + p, 8, eoff, rbytes, 1);
		const uint8_t *kr[8];
		for (int j = 0; j < 8; j++)
			kr[j] = kb_kv_row(kv, 0, p0 + p + j) + eoff;
		for (uint32_t kh = 0; kh < nkv; kh++) {
			const uint8_t *kk[8];
			for (int j = 0; j < 8; j++)
				kk[j] = kr[j] + (size_t)kh * hd * esz;
			for (uint32_t h = kh * group, h1 = h + group; h < h1; h += ATT_G) {
				ATT_BY_G(h1 - h, qk8, s + (size_t)h * np + p, np, qh + (size_t)h * hd, kk,
					 hd, scale, f32);
			}
		}
	}
	for (; p < np; p++) {
		const uint8_t *kr = kb_kv_row(kv, 0, p0 + p) + eoff;
		for (uint32_t h = 0; h < nh; h++) {
			const uint8_t *k = kr + (size_t)(h / group) * hd * esz;
			__m256 acc = _mm256_setzero_ps();
			for (uint32_t i = 0; i < hd / 8; i++)
				acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + (size_t)h * hd + 8 * i),
						      ld8(k, (int)i, f32), acc);
			s[(size_t)h * np + p] = hsum256(acc) * sc;
		}
	}
	if (sh->softcap != 0.0f)
		ops_att_softcap(s, nh * np, sh->softcap, sh->scale);
	prefetch_rows(kv, 1, p0, np < ATT_RUN ? np : ATT_RUN, eoff, rbytes, 0);
	softmax_rows8(s, nh, np, !f32);
	memset(out, 0, (size_t)nh * hd * sizeof(float));
	for (p = 0; p < np; p += ATT_RUN) {
		const uint32_t p1 = np - p < ATT_RUN ? np : p + ATT_RUN;
		for (uint32_t kh = 0; kh < nkv; kh++) {
			const size_t ho = eoff + (size_t)kh * hd * esz;
			for (uint32_t h = kh * group, h1 = h + group; h < h1; h += ATT_G) {
				float *o = out + (size_t)h * hd;
				const float *w = s + (size_t)h * np;
				uint32_t c = 0;
				for (; c + 64 <= hd; c += 64)
					ATT_BY_G(h1 - h, pv_sum, o + c, hd, w, np, kv, p0, p, p1,
						 ho + c * esz, 8, f32);
				for (; c < hd; c += 8)
					ATT_BY_G(h1 - h, pv_sum, o + c, hd, w, np, kv, p0, p, p1,
						 ho + c * esz, 1, f32);
			}
		}
	}
	return 0;
}

int ATT_ENTRY(float *out, const float *q, const struct kb_kv_view *kv, uint32_t pos,
	      uint32_t kvh0, uint32_t nkv, const struct kb_attn_shape *sh)
{
	if (kv->type == KB_F32)
		return attention_heads(out, q, kv, pos, kvh0, nkv, sh, 1);
	return attention_heads(out, q, kv, pos, kvh0, nkv, sh, 0);
}
