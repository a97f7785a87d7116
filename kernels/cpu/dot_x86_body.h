/*
 * dot_x86_body.h — the x86 SIMD kernels over repacked weights, included once
 * per instruction set after a #pragma GCC target, with SFX (name suffix),
 * GEMM_TILE (activation rows kept in registers at once; GEMM_WIDE 1: twice
 * that for the types tile_rows_() names), DOT_VNNI (1:
 * vpdpbusd sums four u8 x s8 products into int32 lanes; 0: AVX2's
 * maddubs + madd) and KW defined: the weight rows one call serves, 8 (one
 * repacked group, 256-bit vectors) or 16 (a pair of groups interleaved by
 * block, rp_pack_pair(), in 512-bit vectors; DOT_VNNI and AVX512BW).
 *
 * Lane i of every vector belongs to weight row i (kernels/cpu/repack.h). Per
 * sub-block the integer sum of all 32 products is formed exactly in int32,
 * then one float fma by dw * dx and one for the min term: the arithmetic of
 * dot_q_generic(), in its order, so all paths agree bit for bit.
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

/*
 * The vector layer: vi/vf hold one int32/float (or four bytes) per weight
 * row; the loads take a repacked block's bytes at p and, for KW 16, the
 * second group's block's at p + gs.
 */
#if KW == 8
typedef __m256i vi;
typedef __m256 vf;
#define V_AND _mm256_and_si256
#define V_OR _mm256_or_si256
#define V_XOR _mm256_xor_si256
#define V_BCST "%{1to8%}"
#define V_ADD32 _mm256_add_epi32
#define V_SUB32 _mm256_sub_epi32
#define V_MUL32 _mm256_mullo_epi32
#define V_SRL16 _mm256_srli_epi16
#define V_SLL16 _mm256_slli_epi16
#define V_SLL32 _mm256_slli_epi32
#define V_ABS8 _mm256_abs_epi8
#define V_MADD16 _mm256_madd_epi16
#define V_SET8 _mm256_set1_epi8
#define V_SET32 _mm256_set1_epi32
#define V_ZERO _mm256_setzero_si256
#define F_ZERO _mm256_setzero_ps
#define F_SET _mm256_set1_ps
#define F_CVT _mm256_cvtepi32_ps
#define F_MUL _mm256_mul_ps
#define F_XOR _mm256_xor_ps
#define F_FMA _mm256_fmadd_ps
#define F_STORE _mm256_storeu_ps
static inline vi FN(ld_)(const uint8_t *p, size_t gs)
{
	(void)gs;
	return _mm256_loadu_si256((const __m256i *)p);
}
static inline vf FN(ld_f16_)(const uint8_t *p, size_t gs)
{
	(void)gs;
	return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline vi FN(ld_s8_)(const uint8_t *p, size_t gs)
{
	(void)gs;
	return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
static inline vi FN(ld_u8_)(const uint8_t *p, size_t gs)
{
	(void)gs;
	return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
/* IQ4's 16-entry table in every 128-bit lane */
static inline vi FN(iq4_tbl_)(void)
{
	return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4nl_values));
}
#define V_SHUF8 _mm256_shuffle_epi8
/* x times the sign of w (0 where w is 0) */
#define V_SIGN8(x, w) _mm256_sign_epi8(x, w)
#elif KW == 16
typedef __m512i vi;
typedef __m512 vf;
#define V_AND _mm512_and_si512
#define V_OR _mm512_or_si512
#define V_XOR _mm512_xor_si512
#define V_BCST "%{1to16%}"
#define V_ADD32 _mm512_add_epi32
#define V_SUB32 _mm512_sub_epi32
#define V_MUL32 _mm512_mullo_epi32
#define V_SRL16 _mm512_srli_epi16
#define V_SLL16 _mm512_slli_epi16
#define V_SLL32 _mm512_slli_epi32
#define V_ABS8 _mm512_abs_epi8
#define V_MADD16 _mm512_madd_epi16
#define V_SET8 _mm512_set1_epi8
#define V_SET32 _mm512_set1_epi32
#define V_ZERO _mm512_setzero_si512
#define F_ZERO _mm512_setzero_ps
#define F_SET _mm512_set1_ps
#define F_CVT _mm512_cvtepi32_ps
#define F_MUL _mm512_mul_ps
#define F_XOR(a, b) _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)))
#define F_FMA _mm512_fmadd_ps
#define F_STORE _mm512_storeu_ps
static inline vi FN(ld_)(const uint8_t *p, size_t gs)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
				  _mm256_loadu_si256((const __m256i *)(p + gs)), 1);
}
static inline __m128i FN(ld_2x8_)(const uint8_t *p, size_t gs)
{
	return _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)p),
				  _mm_loadl_epi64((const __m128i *)(p + gs)));
}
static inline vf FN(ld_f16_)(const uint8_t *p, size_t gs)
{
	return _mm512_cvtph_ps(_mm256_inserti128_si256(
		_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p)),
		_mm_loadu_si128((const __m128i *)(p + gs)), 1));
}
static inline vi FN(ld_s8_)(const uint8_t *p, size_t gs)
{
	return _mm512_cvtepi8_epi32(FN(ld_2x8_)(p, gs));
}
static inline vi FN(ld_u8_)(const uint8_t *p, size_t gs)
{
	return _mm512_cvtepu8_epi32(FN(ld_2x8_)(p, gs));
}
static inline vi FN(iq4_tbl_)(void)
{
	return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)iq4nl_values));
}
#define V_SHUF8 _mm512_shuffle_epi8
#else
#error "KW must be 8 or 16"
#endif
#if KW == 16 && !DOT_VNNI
#error "the 16-row kernels use vpdpbusd"
#endif

/*
 * Bytes ahead of the block being read that the tiles prefetch. Past a
 * group's end they are the next group's, which follows in memory: a task's
 * groups are one stream, but each call reads only its own (a few KiB), too
 * short for the hardware prefetcher to run ahead of (16 streams of decode
 * on a Zen 5: about a fifth faster). Asked for (pf) only where the weights
 * come from memory: where they are in cache, as for most of a prefill's
 * activation rows, the prefetches cost a fifth of pp512. A wide tile
 * (more than GEMM_TILE rows) spends longer on each block and reaches
 * further (16 streams on one thread: ~1/6 faster than at 2048 bytes).
 */
#define RP_AHEAD 2048
#define RP_AHEAD_WIDE 8192

static inline vi FN(bcast_)(const int8_t *p)
{
	int32_t v;
	memcpy(&v, p, sizeof(v));
	return V_SET32(v);
}

/*
 * s plus, in each lane, the four products of u's unsigned bytes and the
 * signed bytes q[0..3]. With VNNI, one vpdpbusd whose operand is q broadcast
 * from memory (EVEX {1toN}): gcc 12 emits a separate vpbroadcastd for
 * _mm*_set1_epi32, one instruction more per four products.
 */
#if DOT_VNNI
typedef int32_t FN(i32u_) __attribute__((may_alias, aligned(1)));
static inline vi FN(dpb_)(vi s, vi u, const int8_t *q)
{
	__asm__("vpdpbusd %2" V_BCST ", %1, %0" : "+v"(s) : "v"(u), "m"(*(const FN(i32u_) *)q));
	return s;
}
#endif

/* sum over g of the four u[g] x s products of each lane, for 4-bit u (no int16 overflow: 8 * 2 * 15 * 127 < 2^15). */
static inline vi FN(sum_nib_)(const vi u[8], const int8_t *q)
{
#if DOT_VNNI
	vi s = FN(dpb_)(V_ZERO(), u[0], q);
	for (int g = 1; g < 8; g++)
		s = FN(dpb_)(s, u[g], q + 4 * g);
	return s;
#else
	__m256i h = _mm256_maddubs_epi16(u[0], FN(bcast_)(q));
	for (int g = 1; g < 8; g++)
		h = _mm256_add_epi16(h, _mm256_maddubs_epi16(u[g], FN(bcast_)(q + 4 * g)));
	return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
#endif
}

/* sum over four groups g of u[g] x s, for unsigned bytes below 32 (rp_is_u8()). */
static inline vi FN(sum_u8x4_)(const vi u[4], const int8_t *q)
{
#if DOT_VNNI
	vi s = FN(dpb_)(V_ZERO(), u[0], q);
	for (int g = 1; g < 4; g++)
		s = FN(dpb_)(s, u[g], q + 4 * g);
	return s;
#else
	__m256i h = _mm256_maddubs_epi16(u[0], FN(bcast_)(q));
	for (int g = 1; g < 4; g++)
		h = _mm256_add_epi16(h, _mm256_maddubs_epi16(u[g], FN(bcast_)(q + 4 * g)));
	return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
#endif
}

/*
 * s plus four products of signed weight bytes w and activation bytes q.
 * With VNNI, u holds w + 128 (w ^ 0x80, load_q_()) and the caller starts s
 * at -128 times the sum of the q it covers: the same exact int32 sum in one
 * instruction. Without, u = |w| and q takes w's sign (maddubs would
 * saturate on 255 x 127 pairs).
 */
static inline vi FN(dot_s8_)(vi s, vi u, vi w, const int8_t *q)
{
#if DOT_VNNI
	(void)w;
	return FN(dpb_)(s, u, q);
#else
	vi x = V_SIGN8(FN(bcast_)(q), w);
	/* |w| <= 128, |q| <= 127: each pair stays below 2^15 */
	return _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x),
						     _mm256_set1_epi16(1)));
#endif
}

/* The per-row factors of one repacked block: dw, the min coefficient mw, the integer scales and mins. */
struct FN(hdr_) {
	vf dw, mw;
	vi ls0, ls1, lm0;	/* lm0: Q2_K's two mins, int16 pairs */
};

static inline __attribute__((always_inline)) void FN(load_hdr_)(const uint8_t *b, size_t gs,
								 struct FN(hdr_) *h, const uint32_t T)
{
	const vf neg = F_SET(-0.0f);
	h->dw = FN(ld_f16_)(b, gs);
	h->mw = F_ZERO();
	h->ls0 = h->ls1 = h->lm0 = V_ZERO();
	if (rp_is_k(T)) {
		h->ls0 = FN(ld_s8_)(b + RP_OFF_LS, gs);
		h->ls1 = FN(ld_s8_)(b + RP_OFF_LS + 8, gs);
	}
	if (T == KB_Q4_1 || T == KB_Q5_1)
		h->mw = FN(ld_f16_)(b + RP_OFF_M, gs);
	if (T == KB_Q4_K || T == KB_Q5_K) {
		/* -(dmin * m): the product dot_q_generic() forms, then negated */
		vf dmin = FN(ld_f16_)(b + RP_OFF_M, gs);
		h->mw = F_XOR(F_MUL(dmin, F_CVT(h->ls1)), neg);
	}
	if (T == KB_Q2_K) {
		h->mw = F_XOR(FN(ld_f16_)(b + RP_OFF_M, gs), neg);
		/* lane i: (lm0, lm1) as two int16, for one madd with (qsum16[0], qsum16[1]) */
		vi m0 = FN(ld_u8_)(b + RP_OFF_LM, gs);
		vi m1 = FN(ld_u8_)(b + RP_OFF_LM + 8, gs);
		h->lm0 = V_OR(m0, V_SLL32(m1, 16));
	}
}

/*
 * The weights of one repacked block, group g of 4 elements per vector:
 * u[g] unsigned (for the signed types, w + 128 with VNNI, the magnitudes
 * without: dot_s8_()), w[g] the signed values of Q8_0, Q6_K and the IQ4
 * types (unset for the others).
 */
#if DOT_VNNI
#define S8_TO_U(w) V_XOR(w, V_SET8((char)0x80))
#else
#define S8_TO_U(w) V_ABS8(w)
#endif
static inline __attribute__((always_inline)) void FN(load_q_)(const uint8_t *q, size_t gs, vi u[8],
							       vi w[8], const uint32_t T)
{
	if (rp_is_nib(T)) {
		const vi m4 = V_SET8(0xf);
		for (int c = 0; c < 4; c++) {
			vi v = FN(ld_)(q + 32 * c, gs);
			u[c] = V_AND(v, m4);
			u[c + 4] = V_AND(V_SRL16(v, 4), m4);
		}
		if (rp_is_5bit(T)) {
			/* bit g of byte 4i + k to bit 4: a 16-bit shift keeps bits 4 and 12 in their bytes */
			const vi b4 = V_SET8(0x10);
			vi hb = FN(ld_)(q + 128, gs);
			for (int g = 0; g < 8; g++) {
				vi t = g < 4 ? V_SLL16(hb, 4 - g) : V_SRL16(hb, g - 4);
				u[g] = V_OR(u[g], V_AND(t, b4));
			}
		}
		if (rp_is_iq4(T)) {
			const vi tbl = FN(iq4_tbl_)();
			for (int g = 0; g < 8; g++) {
				w[g] = V_SHUF8(tbl, u[g]);
				u[g] = S8_TO_U(w[g]);
			}
		}
	} else {
		for (int g = 0; g < 8; g++) {
			w[g] = FN(ld_)(q + 32 * g, gs);
			u[g] = S8_TO_U(w[g]);
		}
	}
}

/* The exact int32 sub-block sum S of each lane against one activation block. */
static inline __attribute__((always_inline)) vi FN(sub_sum_)(const vi u[8], const vi w[8],
								  const struct FN(hdr_) *h,
								  const struct blk_q8x *xb, const uint32_t T)
{
	vi s;
	if (T == KB_Q4_0 || T == KB_Q4_1 || T == KB_Q4_K) {
		s = FN(sum_nib_)(u, xb->qs);
		if (T == KB_Q4_0)
			s = V_SUB32(s, V_SET32(8 * xb->qsum));
		if (T == KB_Q4_K)
			s = V_MUL32(s, h->ls0);
	} else if (rp_is_u8(T)) {
		/* the two halves' sums, less the offsets the repacking added */
		vi lo = FN(sum_u8x4_)(u, xb->qs), hi = FN(sum_u8x4_)(u + 4, xb->qs + 16);
		if (T == KB_Q3_K) {
			lo = V_SUB32(lo, V_SET32(4 * xb->qsum16[0]));
			hi = V_SUB32(hi, V_SET32(4 * xb->qsum16[1]));
		}
		if (T == KB_Q2_K || T == KB_Q3_K) {
			s = V_ADD32(V_MUL32(lo, h->ls0), V_MUL32(hi, h->ls1));
		} else {
			s = V_ADD32(lo, hi);
			if (T == KB_Q5_0)
				s = V_SUB32(s, V_SET32(16 * xb->qsum));
			if (T == KB_Q5_K)
				s = V_MUL32(s, h->ls0);
		}
	} else if (T == KB_Q6_K) {
		vi lo = V_ZERO(), hi = lo;
		if (DOT_VNNI) {
			lo = V_SET32(-128 * xb->qsum16[0]);
			hi = V_SET32(-128 * xb->qsum16[1]);
		}
		for (int g = 0; g < 4; g++) {
			lo = FN(dot_s8_)(lo, u[g], w[g], xb->qs + 4 * g);
			hi = FN(dot_s8_)(hi, u[g + 4], w[g + 4], xb->qs + 16 + 4 * g);
		}
		s = V_ADD32(V_MUL32(lo, h->ls0), V_MUL32(hi, h->ls1));
	} else {
		s = DOT_VNNI ? V_SET32(-128 * xb->qsum) : V_ZERO();
		for (int g = 0; g < 8; g++)
			s = FN(dot_s8_)(s, u[g], w[g], xb->qs + 4 * g);
		if (T == KB_IQ4_XS)
			s = V_MUL32(s, h->ls0);
	}
	return s;
}

/*
 * Activation rows one tile keeps in registers for type T: GEMM_TILE, or
 * twice that where GEMM_WIDE and T's per-row state leaves room (32 vector
 * registers: the eight weight slices, the block's factors, 16 accumulators,
 * the sum; Q6_K, Q2_K and Q3_K carry two scales and two sums). A wide tile
 * decodes each weight block once for all its rows.
 */
#ifndef GEMM_WIDE
#define GEMM_WIDE 0
#endif
#define TILE_MAX (GEMM_WIDE ? 2 * GEMM_TILE : GEMM_TILE)
static inline int FN(tile_rows_)(const uint32_t T)
{
	if (GEMM_WIDE && T != KB_Q6_K && T != KB_Q2_K && T != KB_Q3_K)
		return 2 * GEMM_TILE;
	return GEMM_TILE;
}

/*
 * nr (<= TILE_MAX) activation rows against KW repacked rows, prefetching
 * the weights ahead where pf; T is the weight type, a constant after inlining.
 */
static inline __attribute__((always_inline)) void FN(tile_)(
	const uint8_t *rp, size_t nblk, const struct blk_q8x *x, size_t xs, const int nr,
	float *out, size_t os, const int pf, const uint32_t T)
{
	const size_t bb = rp_blk_bytes(T), hdr = rp_hdr_bytes(T);
	const size_t gs = bb;	/* KW 16: rows 8-15 in the block after (rp_pack_pair()) */
	vf acc[TILE_MAX];
#pragma GCC unroll 16
	for (int r = 0; r < nr; r++)
		acc[r] = F_ZERO();
	for (size_t k = 0; k < nblk; k++) {
		const uint8_t *b = rp + k * bb * (KW / 8);
		for (size_t o = 0; pf && o < bb * (KW / 8); o += 64)
			_mm_prefetch((const char *)b + (nr > GEMM_TILE ? RP_AHEAD_WIDE : RP_AHEAD) + o,
				     _MM_HINT_T0);
		struct FN(hdr_) h;
		vi u[8], w[8];
		FN(load_hdr_)(b, gs, &h, T);
		FN(load_q_)(b + hdr, gs, u, w, T);
#pragma GCC unroll 16
		for (int r = 0; r < nr; r++) {
			const struct blk_q8x *xb = x + r * xs + k;
			vi s = FN(sub_sum_)(u, w, &h, xb, T);
			vf dx = F_SET(xb->d);
			acc[r] = F_FMA(F_CVT(s), F_MUL(h.dw, dx), acc[r]);
			if (type_has_min(T))
				acc[r] = F_FMA(h.mw, F_SET(xb->s), acc[r]);
			if (T == KB_Q2_K) {
				int32_t qs2;
				memcpy(&qs2, xb->qsum16, sizeof(qs2));
				vi m = V_MADD16(h.lm0, V_SET32(qs2));
				acc[r] = F_FMA(F_CVT(m), F_MUL(h.mw, dx), acc[r]);
			}
		}
	}
#pragma GCC unroll 16
	for (int r = 0; r < nr; r++)
		F_STORE(out + r * os, acc[r]);
}

/*
 * Whole tiles (tile_rows_()), then for a wide type one of GEMM_TILE rows if
 * that many are left, then the rest in one narrower tile: the same per-row
 * arithmetic. Only the first tile prefetches: the others find the weights
 * in cache.
 */
#define TILE_CASE(n, T) case n: FN(tile_)(rp, nblk, x + r * xs, xs, n, out + r * os, os, pf && !r, T); break;
#define GEMM_KERNEL(name, T)                                                                  \
	static void FN(name)(const void *rp, size_t nblk, const struct blk_q8x *x, size_t xs,   \
			     int nr, float *out, size_t os, int pf)                             \
	{                                                                                       \
		const int tr = FN(tile_rows_)(T);                                               \
		int r = 0;                                                                      \
		for (; r + tr <= nr; r += tr)                                                   \
			FN(tile_)(rp, nblk, x + r * xs, xs, tr, out + r * os, os, pf && !r, T); \
		if (tr > GEMM_TILE && r + GEMM_TILE <= nr) {                                    \
			FN(tile_)(rp, nblk, x + r * xs, xs, GEMM_TILE, out + r * os, os,        \
				  pf && !r, T);                                                 \
			r += GEMM_TILE;                                                         \
		}                                                                               \
		switch (nr - r) {                                                               \
		case 0: break;                                                                  \
		TILE_CASE(1, T) TILE_CASE(2, T) TILE_CASE(3, T)                                 \
		GEMM_TAIL_CASES(T)                                                              \
		}                                                                               \
	}

#if GEMM_TILE > 4
#define GEMM_TAIL_CASES(T) TILE_CASE(4, T) TILE_CASE(5, T) TILE_CASE(6, T) TILE_CASE(7, T)
#else
#define GEMM_TAIL_CASES(T)
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
