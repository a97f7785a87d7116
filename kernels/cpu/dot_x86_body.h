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

/* sum over four groups g of u[g] x s, for unsigned bytes below 32 (rp_is_u8()). */
static inline __m256i FN(sum_u8x4_)(const __m256i u[4], const int8_t *q)
{
#if DOT_VNNI
	__m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u[0], FN(bcast_)(q));
	for (int g = 1; g < 4; g++)
		s = _mm256_dpbusd_epi32(s, u[g], FN(bcast_)(q + 4 * g));
	return s;
#else
	__m256i h = _mm256_maddubs_epi16(u[0], FN(bcast_)(q));
	for (int g = 1; g < 4; g++)
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

/* The per-row factors of one repacked block: dw, the min coefficient mw, the integer scales and mins. */
struct FN(hdr_) {
	__m256 dw, mw;
	__m256i ls0, ls1, lm0;	/* lm0: Q2_K's two mins, int16 pairs */
};

static inline __attribute__((always_inline)) void FN(load_hdr_)(const uint8_t *b, struct FN(hdr_) *h,
								 const uint32_t T)
{
	const __m256 neg = _mm256_set1_ps(-0.0f);
	h->dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b));
	h->mw = _mm256_setzero_ps();
	h->ls0 = h->ls1 = h->lm0 = _mm256_setzero_si256();
	if (rp_is_k(T)) {
		h->ls0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + RP_OFF_LS)));
		h->ls1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + RP_OFF_LS + 8)));
	}
	if (T == KB_Q4_1 || T == KB_Q5_1)
		h->mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + RP_OFF_M)));
	if (T == KB_Q4_K || T == KB_Q5_K) {
		/* -(dmin * m): the product dot_q_generic() forms, then negated */
		__m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + RP_OFF_M)));
		h->mw = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(h->ls1)), neg);
	}
	if (T == KB_Q2_K) {
		h->mw = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + RP_OFF_M))), neg);
		/* lane i: (lm0, lm1) as two int16, for one madd with (qsum16[0], qsum16[1]) */
		__m256i m0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + RP_OFF_LM)));
		__m256i m1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + RP_OFF_LM + 8)));
		h->lm0 = _mm256_or_si256(m0, _mm256_slli_epi32(m1, 16));
	}
}

/*
 * The weights of one repacked block, group g of 4 elements per vector:
 * u[g] unsigned (the magnitudes, for signed types), w[g] the signed values
 * of Q8_0, Q6_K and the IQ4 types (unset for the others).
 */
static inline __attribute__((always_inline)) void FN(load_q_)(const uint8_t *q, __m256i u[8],
							       __m256i w[8], const uint32_t T)
{
	if (rp_is_nib(T)) {
		const __m256i m4 = _mm256_set1_epi8(0xf);
		for (int c = 0; c < 4; c++) {
			__m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
			u[c] = _mm256_and_si256(v, m4);
			u[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
		}
		if (rp_is_5bit(T)) {
			/* bit g of byte 4i + k to bit 4: a 16-bit shift keeps bits 4 and 12 in their bytes */
			const __m256i b4 = _mm256_set1_epi8(0x10);
			__m256i hb = _mm256_loadu_si256((const __m256i *)(q + 128));
			for (int g = 0; g < 8; g++) {
				__m256i t = g < 4 ? _mm256_slli_epi16(hb, 4 - g) : _mm256_srli_epi16(hb, g - 4);
				u[g] = _mm256_or_si256(u[g], _mm256_and_si256(t, b4));
			}
		}
		if (rp_is_iq4(T)) {
			const __m256i tbl = _mm256_broadcastsi128_si256(
				_mm_loadu_si128((const __m128i *)iq4nl_values));
			for (int g = 0; g < 8; g++) {
				w[g] = _mm256_shuffle_epi8(tbl, u[g]);
				u[g] = _mm256_abs_epi8(w[g]);
			}
		}
	} else {
		for (int g = 0; g < 8; g++) {
			w[g] = _mm256_loadu_si256((const __m256i *)(q + 32 * g));
			u[g] = _mm256_abs_epi8(w[g]);
		}
	}
}

/* The exact int32 sub-block sum S of each lane against one activation block. */
static inline __attribute__((always_inline)) __m256i FN(sub_sum_)(const __m256i u[8], const __m256i w[8],
								  const struct FN(hdr_) *h,
								  const struct blk_q8x *xb, const uint32_t T)
{
	__m256i s;
	if (T == KB_Q4_0 || T == KB_Q4_1 || T == KB_Q4_K) {
		s = FN(sum_nib_)(u, xb->qs);
		if (T == KB_Q4_0)
			s = _mm256_sub_epi32(s, _mm256_set1_epi32(8 * xb->qsum));
		if (T == KB_Q4_K)
			s = _mm256_mullo_epi32(s, h->ls0);
	} else if (rp_is_u8(T)) {
		/* the two halves' sums, less the offsets the repacking added */
		__m256i lo = FN(sum_u8x4_)(u, xb->qs), hi = FN(sum_u8x4_)(u + 4, xb->qs + 16);
		if (T == KB_Q3_K) {
			lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(4 * xb->qsum16[0]));
			hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(4 * xb->qsum16[1]));
		}
		if (T == KB_Q2_K || T == KB_Q3_K) {
			s = _mm256_add_epi32(_mm256_mullo_epi32(lo, h->ls0), _mm256_mullo_epi32(hi, h->ls1));
		} else {
			s = _mm256_add_epi32(lo, hi);
			if (T == KB_Q5_0)
				s = _mm256_sub_epi32(s, _mm256_set1_epi32(16 * xb->qsum));
			if (T == KB_Q5_K)
				s = _mm256_mullo_epi32(s, h->ls0);
		}
	} else if (T == KB_Q6_K) {
		__m256i lo = _mm256_setzero_si256(), hi = lo;
		for (int g = 0; g < 4; g++) {
			lo = FN(dot_s8_)(lo, u[g], w[g], xb->qs + 4 * g);
			hi = FN(dot_s8_)(hi, u[g + 4], w[g + 4], xb->qs + 16 + 4 * g);
		}
		s = _mm256_add_epi32(_mm256_mullo_epi32(lo, h->ls0), _mm256_mullo_epi32(hi, h->ls1));
	} else {
		s = _mm256_setzero_si256();
		for (int g = 0; g < 8; g++)
			s = FN(dot_s8_)(s, u[g], w[g], xb->qs + 4 * g);
		if (T == KB_IQ4_XS)
			s = _mm256_mullo_epi32(s, h->ls0);
	}
	return s;
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
		struct FN(hdr_) h;
		__m256i u[8], w[8];
		FN(load_hdr_)(b, &h, T);
		FN(load_q_)(b + hdr, u, w, T);
		for (int r = 0; r < nr; r++) {
			const struct blk_q8x *xb = x + r * xs + k;
			__m256i s = FN(sub_sum_)(u, w, &h, xb, T);
			__m256 dx = _mm256_set1_ps(xb->d);
			acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(h.dw, dx), acc[r]);
			if (type_has_min(T))
				acc[r] = _mm256_fmadd_ps(h.mw, _mm256_set1_ps(xb->s), acc[r]);
			if (T == KB_Q2_K) {
				int32_t qs2;
				memcpy(&qs2, xb->qsum16, sizeof(qs2));
				__m256i m = _mm256_madd_epi16(h.lm0, _mm256_set1_epi32(qs2));
				acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(h.mw, dx), acc[r]);
			}
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
GEMM_KERNEL(gemm_q5_0_, KB_Q5_0)
GEMM_KERNEL(gemm_q5_1_, KB_Q5_1)
GEMM_KERNEL(gemm_q2_k_, KB_Q2_K)
GEMM_KERNEL(gemm_q3_k_, KB_Q3_K)
GEMM_KERNEL(gemm_q5_k_, KB_Q5_K)
GEMM_KERNEL(gemm_iq4_nl_, KB_IQ4_NL)
GEMM_KERNEL(gemm_iq4_xs_, KB_IQ4_XS)

qgemm_fn FN(dot_x86_select_)(uint32_t type)
{
	switch (type) {
	case KB_Q4_0: return FN(gemm_q4_0_);
	case KB_Q4_1: return FN(gemm_q4_1_);
	case KB_Q8_0: return FN(gemm_q8_0_);
	case KB_Q4_K: return FN(gemm_q4_k_);
	case KB_Q6_K: return FN(gemm_q6_k_);
	case KB_Q5_0: return FN(gemm_q5_0_);
	case KB_Q5_1: return FN(gemm_q5_1_);
	case KB_Q2_K: return FN(gemm_q2_k_);
	case KB_Q3_K: return FN(gemm_q3_k_);
	case KB_Q5_K: return FN(gemm_q5_k_);
	case KB_IQ4_NL: return FN(gemm_iq4_nl_);
	case KB_IQ4_XS: return FN(gemm_iq4_xs_);
	default: return NULL;
	}
}
