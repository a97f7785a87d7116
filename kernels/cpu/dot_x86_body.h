/*
 * dot_x86_body.h — the x86 SIMD dot kernels, included once per instruction
 * set with SFX (name suffix) and DOTI32 (four u8 x s8 products summed into
 * each of 8 int32 lanes) defined, after a #pragma GCC target.
 */
#include <immintrin.h>
#include <math.h>
#include "kernels/backend.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/quant.h"

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

/* One weight sub-block ready for DOTI32: unsigned magnitudes u (with their signs in sv when sign). */
struct xsub {
	__m256i u;
	__m256i sv;
	__m256i ls;
	float dw;
	float mw;
	int sign;
	int scaled;
};

/* Same tree as hsum8(): ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
static inline float FN(hsum256_)(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	__m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
	return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

static inline __m256i FN(nibbles16_)(const uint8_t *qs)
{
	__m128i raw = _mm_loadu_si128((const __m128i *)qs);
	__m128i m4 = _mm_set1_epi8(0xf);
	return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
}

static inline void FN(unpack_q4_0_)(const void *row, size_t k, struct xsub *o)
{
	const struct blk_q4_0 *b = (const struct blk_q4_0 *)row + k;
	o->sv = _mm256_sub_epi8(FN(nibbles16_)(b->qs), _mm256_set1_epi8(8));
	o->u = _mm256_abs_epi8(o->sv);
	o->dw = _cvtsh_ss(b->d);
	o->mw = 0.0f;
	o->sign = 1;
	o->scaled = 0;
}

static inline void FN(unpack_q4_1_)(const void *row, size_t k, struct xsub *o)
{
	const struct blk_q4_1 *b = (const struct blk_q4_1 *)row + k;
	o->u = FN(nibbles16_)(b->qs);
	o->dw = _cvtsh_ss(b->d);
	o->mw = _cvtsh_ss(b->m);
	o->sign = 0;
	o->scaled = 0;
}

static inline void FN(unpack_q8_0_)(const void *row, size_t k, struct xsub *o)
{
	const struct blk_q8_0 *b = (const struct blk_q8_0 *)row + k;
	o->sv = _mm256_loadu_si256((const __m256i *)b->qs);
	o->u = _mm256_abs_epi8(o->sv);
	o->dw = _cvtsh_ss(b->d);
	o->mw = 0.0f;
	o->sign = 1;
	o->scaled = 0;
}

static inline void FN(unpack_q4_k_)(const void *row, size_t k, struct xsub *o)
{
	const struct blk_q4_k *b = (const struct blk_q4_k *)row + k / 8;
	int sub = (int)(k % 8);
	__m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * (sub / 2)));
	__m256i m4 = _mm256_set1_epi8(0xf);
	o->u = (sub & 1) ? _mm256_and_si256(_mm256_srli_epi16(q, 4), m4) : _mm256_and_si256(q, m4);
	const uint8_t *s = b->scales;
	int sc, m;
	if (sub < 4) {
		sc = s[sub] & 63;
		m = s[sub + 4] & 63;
	} else {
		sc = (s[sub + 4] & 0xf) | ((s[sub - 4] >> 6) << 4);
		m = (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
	}
	o->dw = _cvtsh_ss(b->d) * (float)sc;
	o->mw = -(_cvtsh_ss(b->dmin) * (float)m);
	o->sign = 0;
	o->scaled = 0;
}

static inline void FN(unpack_q6_k_)(const void *row, size_t k, struct xsub *o)
{
	const struct blk_q6_k *b = (const struct blk_q6_k *)row + k / 8;
	int s = (int)(k % 8), half = s / 4, g = s % 4;
	__m256i m4 = _mm256_set1_epi8(0xf);
	__m256i l = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * half + ((g & 1) ? 32 : 0)));
	__m256i lo = (g & 2) ? _mm256_and_si256(_mm256_srli_epi16(l, 4), m4) : _mm256_and_si256(l, m4);
	__m256i h = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * half));
	__m256i hi = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * g)),
				      _mm256_set1_epi8(3));
	__m256i v = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
	o->sv = _mm256_sub_epi8(v, _mm256_set1_epi8(32));
	o->u = _mm256_abs_epi8(o->sv);
	int s0 = b->scales[2 * s], s1 = b->scales[2 * s + 1];
	o->ls = _mm256_setr_epi32(s0, s0, s0, s0, s1, s1, s1, s1);
	o->dw = _cvtsh_ss(b->d);
	o->mw = 0.0f;
	o->sign = 1;
	o->scaled = 1;
}

#define QDOT_KERNEL(T)                                                                    \
	static inline __attribute__((always_inline)) void FN(dot_##T##_nr_)(              \
		const void *row, const struct blk_q8x *x, size_t xs, const int nr,           \
		size_t nblk, float *out, size_t os)                                          \
	{                                                                                  \
		__m256 acc[DOT_MAX_NR];                                                    \
		float accm[DOT_MAX_NR];                                                    \
		for (int r = 0; r < nr; r++) {                                             \
			acc[r] = _mm256_setzero_ps();                                      \
			accm[r] = 0.0f;                                                    \
		}                                                                          \
		for (size_t k = 0; k < nblk; k++) {                                        \
			struct xsub w;                                                     \
			FN(unpack_##T##_)(row, k, &w);                                     \
			for (int r = 0; r < nr; r++) {                                     \
				const struct blk_q8x *xb = x + r * xs + k;                 \
				__m256i xv = _mm256_loadu_si256((const __m256i *)xb->qs);  \
				if (w.sign)                                                \
					xv = _mm256_sign_epi8(xv, w.sv);                   \
				__m256i p = DOTI32(w.u, xv);                               \
				if (w.scaled)                                              \
					p = _mm256_mullo_epi32(p, w.ls);                   \
				acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),            \
							 _mm256_set1_ps(w.dw * xb->d),     \
							 acc[r]);                          \
				accm[r] = fmaf(w.mw, xb->s, accm[r]);                      \
			}                                                                  \
		}                                                                          \
		for (int r = 0; r < nr; r++)                                               \
			out[r * os] = FN(hsum256_)(acc[r]) + accm[r];                      \
	}                                                                                  \
	static void FN(dot_##T##_)(const void *row, const struct blk_q8x *x, size_t xs,   \
				   int nr, size_t nblk, float *out, size_t os)             \
	{                                                                                  \
		switch (nr) {                                                              \
		case 4: FN(dot_##T##_nr_)(row, x, xs, 4, nblk, out, os); break;           \
		case 3: FN(dot_##T##_nr_)(row, x, xs, 3, nblk, out, os); break;           \
		case 2: FN(dot_##T##_nr_)(row, x, xs, 2, nblk, out, os); break;           \
		default: FN(dot_##T##_nr_)(row, x, xs, 1, nblk, out, os); break;         \
		}                                                                          \
	}

QDOT_KERNEL(q4_0)
QDOT_KERNEL(q4_1)
QDOT_KERNEL(q8_0)
QDOT_KERNEL(q4_k)
QDOT_KERNEL(q6_k)

qdot_fn FN(dot_x86_select_)(uint32_t type)
{
	switch (type) {
	case KB_Q4_0: return FN(dot_q4_0_);
	case KB_Q4_1: return FN(dot_q4_1_);
	case KB_Q8_0: return FN(dot_q8_0_);
	case KB_Q4_K: return FN(dot_q4_k_);
	case KB_Q6_K: return FN(dot_q6_k_);
	default: return NULL;
	}
}
