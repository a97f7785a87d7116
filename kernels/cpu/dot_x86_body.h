/*
 * dot_x86_body.h — the x86 SIMD kernels over repacked weights, included once
 * per instruction set after a #pragma GCC target, with SFX (name suffix),
 * GEMM_TILE (activation rows kept in registers at once) and DOT_VNNI (1:
 * vpdpbusd sums four u8 x s8 products into int32 lanes; 0: AVX2's
 * maddubs + madd) defined.
 *
 * Lane i of every vector belongs to weight row i (kernels/cpu/repack.h). Per
 * sub-block the integer sum of all 32 products is formed exactly in int32,
 * then one float fma by dw * dx and one for the min term: the arithmetic of
 * dot_q_generic(), in its order, so both agree bit for bit.
 */
#include <immintrin.h>
#include <string.h>
#include "kernels/backend.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/repack.h"

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

static inline __m256i FN(bcast_)(const int8_t *p)
{
	int32_t v;
	memcpy(&v, p, sizeof(v));
	return _mm256_set1_epi32(v);
}

/* sum over g of the four u[g] x s products of each lane, for 4-bit u (no int16 overflow: 8 * 2 * 15 * 127 < 2^15). */
static inline __m256i FN(sum_nib_)(const __m256i u[8], const int8_t *q)
{
#if DOT_VNNI
	__m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u[0], FN(bcast_)(q));
	for (int g = 1; g < 8; g++)
		s = _mm256_dpbusd_epi32(s, u[g], FN(bcast_)(q + 4 * g));
	return s;
#else
	__m256i h = _mm256_maddubs_epi16(u[0], FN(bcast_)(q));
	for (int g = 1; g < 8; g++)
		h = _mm256_add_epi16(h, _mm256_maddubs_epi16(u[g], FN(bcast_)(q + 4 * g)));
	return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
#endif
}

/* Four products of signed weight bytes w (magnitudes u) and activation bytes q, added to s. */
static inline __m256i FN(dot_s8_)(__m256i s, __m256i u, __m256i w, const int8_t *q)
{
	__m256i x = _mm256_sign_epi8(FN(bcast_)(q), w);
#if DOT_VNNI
	return _mm256_dpbusd_epi32(s, u, x);
#else
	/* |w| <= 128, |q| <= 127: each pair stays below 2^15 */
	return _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x),
						     _mm256_set1_epi16(1)));
#endif
}

/*
 * nr (<= GEMM_TILE) activation rows against eight repacked rows; T is the
 * weight type, a constant after inlining.
 */
static inline __attribute__((always_inline)) void FN(tile_)(
	const uint8_t *rp, size_t nblk, const struct blk_q8x *x, size_t xs, const int nr,
	float *out, size_t os, const uint32_t T)
{
	const size_t bb = rp_blk_bytes(T), hdr = rp_hdr_bytes(T);
	__m256 acc[GEMM_TILE];
	for (int r = 0; r < nr; r++)
		acc[r] = _mm256_setzero_ps();
	for (size_t k = 0; k < nblk; k++) {
		const uint8_t *b = rp + k * bb;
		__m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
		__m256 mw = _mm256_setzero_ps();
		__m256i ls0 = _mm256_setzero_si256(), ls1 = ls0;
		if (T == KB_Q4_K || T == KB_Q6_K) {
			ls0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + RP_OFF_LS)));
			ls1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + RP_OFF_LS + 8)));
		}
		if (T == KB_Q4_1)
			mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + RP_OFF_M)));
		if (T == KB_Q4_K) {
			/* -(dmin * m): the product dot_q_generic() forms, then negated */
			__m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + RP_OFF_M)));
			mw = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(ls1)),
					   _mm256_set1_ps(-0.0f));
		}
		__m256i u[8], w[8];
		if (rp_is_nib(T)) {
			const __m256i m4 = _mm256_set1_epi8(0xf);
			for (int c = 0; c < 4; c++) {
				__m256i q = _mm256_loadu_si256((const __m256i *)(b + hdr + 32 * c));
				u[c] = _mm256_and_si256(q, m4);
				u[c + 4] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
			}
		} else {
			for (int g = 0; g < 8; g++) {
				w[g] = _mm256_loadu_si256((const __m256i *)(b + hdr + 32 * g));
				u[g] = _mm256_abs_epi8(w[g]);
			}
		}
		for (int r = 0; r < nr; r++) {
			const struct blk_q8x *xb = x + r * xs + k;
			__m256i s;
			if (rp_is_nib(T)) {
				s = FN(sum_nib_)(u, xb->qs);
				if (T == KB_Q4_0)
					s = _mm256_sub_epi32(s, _mm256_set1_epi32(8 * xb->qsum));
				if (T == KB_Q4_K)
					s = _mm256_mullo_epi32(s, ls0);
			} else if (T == KB_Q6_K) {
				__m256i lo = _mm256_setzero_si256(), hi = lo;
				for (int g = 0; g < 4; g++) {
					lo = FN(dot_s8_)(lo, u[g], w[g], xb->qs + 4 * g);
					hi = FN(dot_s8_)(hi, u[g + 4], w[g + 4], xb->qs + 16 + 4 * g);
				}
				s = _mm256_add_epi32(_mm256_mullo_epi32(lo, ls0), _mm256_mullo_epi32(hi, ls1));
			} else {
				s = _mm256_setzero_si256();
				for (int g = 0; g < 8; g++)
					s = FN(dot_s8_)(s, u[g], w[g], xb->qs + 4 * g);
			}
			__m256 d = _mm256_mul_ps(dw, _mm256_set1_ps(xb->d));
			acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc[r]);
			if (T == KB_Q4_1 || T == KB_Q4_K)
				acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xb->s), acc[r]);
		}
	}
	for (int r = 0; r < nr; r++)
		_mm256_storeu_ps(out + r * os, acc[r]);
}

/* Whole tiles of GEMM_TILE activation rows, then the rest in one narrower tile: the same per-row arithmetic. */
#define GEMM_KERNEL(name, T)                                                              \
	static void FN(name)(const void *rp, size_t nblk, const struct blk_q8x *x, size_t xs, \
			     int nr, float *out, size_t os)                                 \
	{                                                                                   \
		int r = 0;                                                                  \
		for (; r + GEMM_TILE <= nr; r += GEMM_TILE)                                 \
			FN(tile_)(rp, nblk, x + r * xs, xs, GEMM_TILE, out + r * os, os, T);\
		switch (nr - r) {                                                           \
		case 0: break;                                                              \
		case 1: FN(tile_)(rp, nblk, x + r * xs, xs, 1, out + r * os, os, T); break; \
		case 2: FN(tile_)(rp, nblk, x + r * xs, xs, 2, out + r * os, os, T); break; \
		case 3: FN(tile_)(rp, nblk, x + r * xs, xs, 3, out + r * os, os, T); break; \
		GEMM_TAIL_CASES(rp, nblk, x + r * xs, xs, out + r * os, os, T)              \
		}                                                                           \
	}

#if GEMM_TILE > 4
#define GEMM_TAIL_CASES(rp, nblk, x, xs, out, os, T)                  \
	case 4: FN(tile_)(rp, nblk, x, xs, 4, out, os, T); break;     \
	case 5: FN(tile_)(rp, nblk, x, xs, 5, out, os, T); break;     \
	case 6: FN(tile_)(rp, nblk, x, xs, 6, out, os, T); break;     \
	default: FN(tile_)(rp, nblk, x, xs, 7, out, os, T); break;
#else
#define GEMM_TAIL_CASES(rp, nblk, x, xs, out, os, T)
#endif

GEMM_KERNEL(gemm_q4_0_, KB_Q4_0)
GEMM_KERNEL(gemm_q4_1_, KB_Q4_1)
GEMM_KERNEL(gemm_q8_0_, KB_Q8_0)
GEMM_KERNEL(gemm_q4_k_, KB_Q4_K)
GEMM_KERNEL(gemm_q6_k_, KB_Q6_K)

qgemm_fn FN(dot_x86_select_)(uint32_t type)
{
	switch (type) {
	case KB_Q4_0: return FN(gemm_q4_0_);
	case KB_Q4_1: return FN(gemm_q4_1_);
	case KB_Q8_0: return FN(gemm_q8_0_);
	case KB_Q4_K: return FN(gemm_q4_k_);
	case KB_Q6_K: return FN(gemm_q6_k_);
	default: return NULL;
	}
}
