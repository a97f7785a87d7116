/*
 * dot_x86_body.h — the x86 SIMD dot kernels, included once per instruction
 * set with SFX (name suffix), DOTI32 (four u8 x s8 products summed into
 * each of 8 int32 lanes), DPACC (the same added to an accumulator) and
 * DOT8_TILE (activation rows the eight-row kernel keeps in registers: 4 or
 * 8) defined, after a #pragma GCC target.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>
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
				__m256 sc = _mm256_mul_ps(_mm256_set1_ps(w.dw),            \
							  _mm256_set1_ps(xb->d));          \
				acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[r]);\
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
		case 8: FN(dot_##T##_nr_)(row, x, xs, 8, nblk, out, os); break;           \
		case 7: FN(dot_##T##_nr_)(row, x, xs, 7, nblk, out, os); break;           \
		case 6: FN(dot_##T##_nr_)(row, x, xs, 6, nblk, out, os); break;           \
		case 5: FN(dot_##T##_nr_)(row, x, xs, 5, nblk, out, os); break;           \
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

/*
 * ---- Eight weight rows at once ----
 * Lane i of every vector below belongs to weight row i. A block's 32 weight
 * bytes (or 16 nibble bytes) of eight rows are transposed in registers into
 * slices: slice g holds bytes 4g..4g+3 of each row, which is exactly lane g
 * of the one-row kernel's partial sums. One vpdpbusd against the
 * activation's dword g broadcast therefore gives partial sum g of eight rows,
 * and the rows' 8 x 8 accumulators are summed by the same tree at the end:
 * bitwise the one-row result, with the unpacking and the float work shared.
 */

static inline uint32_t FN(ld32_)(const void *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

/* The f16 fields at byte 0 (d) and 2 (m) of eight blocks, as floats. */
static inline void FN(scales8_)(const uint8_t *const b[8], __m256 *d, __m256 *m)
{
	__m256i dm = _mm256_setr_epi32((int)FN(ld32_)(b[0]), (int)FN(ld32_)(b[1]),
				       (int)FN(ld32_)(b[2]), (int)FN(ld32_)(b[3]),
				       (int)FN(ld32_)(b[4]), (int)FN(ld32_)(b[5]),
				       (int)FN(ld32_)(b[6]), (int)FN(ld32_)(b[7]));
	const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
					      0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
	/* per lane: 4 d then 4 m; then quads (d0-3, d4-7, m0-3, m4-7) */
	__m256i t = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(dm, pick), 0xd8);
	*d = _mm256_cvtph_ps(_mm256_castsi256_si128(t));
	*m = _mm256_cvtph_ps(_mm256_extracti128_si256(t, 1));
}

/* Dword g (g < 4) of the 16 bytes at q[i] + off, for rows i = 0..7, into v[g]. */
static inline void FN(transpose4_)(const uint8_t *const q[8], size_t off, __m256i v[4])
{
	__m256i y[4];
	for (int i = 0; i < 4; i++)
		y[i] = _mm256_inserti128_si256(
			_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(q[i] + off))),
			_mm_loadu_si128((const __m128i *)(q[i + 4] + off)), 1);
	__m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
	__m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
	v[0] = _mm256_unpacklo_epi64(t0, t2);
	v[1] = _mm256_unpackhi_epi64(t0, t2);
	v[2] = _mm256_unpacklo_epi64(t1, t3);
	v[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* Dword g (g < 8) of the 32 bytes at q[i] + off, for rows i = 0..7, into v[g]. */
static inline void FN(transpose8_)(const uint8_t *const q[8], size_t off, __m256i v[8])
{
	__m256i t[8], u[8];
	for (int i = 0; i < 8; i += 2) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(q[i] + off));
		__m256i b = _mm256_loadu_si256((const __m256i *)(q[i + 1] + off));
		t[i] = _mm256_unpacklo_epi32(a, b);
		t[i + 1] = _mm256_unpackhi_epi32(a, b);
	}
	for (int h = 0; h < 8; h += 4) {	/* rows 0-3, then 4-7 */
		u[h + 0] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
		u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
		u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
		u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
	}
	for (int g = 0; g < 4; g++) {
		v[g] = _mm256_permute2x128_si256(u[g], u[g + 4], 0x20);
		v[g + 4] = _mm256_permute2x128_si256(u[g], u[g + 4], 0x31);
	}
}

/*
 * Slices of eight rows' block k in element order: unsigned magnitudes u[g]
 * (g < 8) and, for signed formats, the signed bytes w[g] for the sign
 * trick; plus the rows' dw and mw.
 */
struct xslice {
	__m256i u[8];
	__m256i w[8];
	__m256 dw;
	__m256 mw;
};

static inline void FN(slices_q4_)(const uint8_t *const b[8], size_t off, __m256i v[8])
{
	const __m256i m4 = _mm256_set1_epi8(0xf);
	__m256i t[4];
	FN(transpose4_)(b, off, t);
	for (int g = 0; g < 4; g++) {
		v[g] = _mm256_and_si256(t[g], m4);
		v[g + 4] = _mm256_and_si256(_mm256_srli_epi16(t[g], 4), m4);
	}
}

static inline void FN(slices8_q4_0_)(const uint8_t *const b[8], struct xslice *o)
{
	__m256 unused;
	FN(scales8_)(b, &o->dw, &unused);
	o->mw = _mm256_setzero_ps();
	FN(slices_q4_)(b, 2, o->w);
	for (int g = 0; g < 8; g++) {
		o->w[g] = _mm256_sub_epi8(o->w[g], _mm256_set1_epi8(8));
		o->u[g] = _mm256_abs_epi8(o->w[g]);
	}
}

static inline void FN(slices8_q4_1_)(const uint8_t *const b[8], struct xslice *o)
{
	FN(scales8_)(b, &o->dw, &o->mw);
	FN(slices_q4_)(b, 4, o->u);
}

static inline void FN(slices8_q8_0_)(const uint8_t *const b[8], struct xslice *o)
{
	__m256 unused;
	FN(scales8_)(b, &o->dw, &unused);
	o->mw = _mm256_setzero_ps();
	FN(transpose8_)(b, 2, o->w);
	for (int g = 0; g < 8; g++)
		o->u[g] = _mm256_abs_epi8(o->w[g]);
}

/* Blocks sliced at a time into a stack buffer that every activation row then reads. */
#define DOT8_CHUNK 16

/*
 * nk sliced blocks against nr (<= DOT8_TILE) activation rows whose
 * accumulators live in acc (8 partial-sum vectors and the min term, a row),
 * in registers for the run.
 */
static inline __attribute__((always_inline)) void FN(dot8_run_)(
	const struct xslice *sl, size_t nk, const struct blk_q8x *x, size_t xs, const int nr,
	const int sign, __m256 (*acc)[9])
{
	__m256 a[DOT8_TILE][9];
	for (int r = 0; r < nr; r++)
		for (int g = 0; g < 9; g++)
			a[r][g] = acc[r][g];
	for (size_t k = 0; k < nk; k++) {
		const struct xslice *s = &sl[k];
		for (int r = 0; r < nr; r++) {
			const struct blk_q8x *xb = x + r * xs + k;
			__m256 sc = _mm256_mul_ps(s->dw, _mm256_set1_ps(xb->d));
			for (int g = 0; g < 8; g++) {
				__m256i v = _mm256_set1_epi32((int)FN(ld32_)(xb->qs + 4 * g));
				if (sign)
					v = _mm256_sign_epi8(v, s->w[g]);
				__m256i p = DOTI32(s->u[g], v);
				a[r][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, a[r][g]);
			}
			a[r][8] = _mm256_fmadd_ps(s->mw, _mm256_set1_ps(xb->s), a[r][8]);
		}
	}
	for (int r = 0; r < nr; r++)
		for (int g = 0; g < 9; g++)
			acc[r][g] = a[r][g];
}

#define QDOT8_KERNEL(T, BLK, SIGN)                                                        \
	static void FN(dot8_##T##_)(const void *rows, size_t rb, const struct blk_q8x *x,  \
				    size_t xs, int nr, size_t nblk, float *out, size_t os) \
	{                                                                                  \
		__m256 acc[DOT_MAX_NR][9];                                                 \
		struct xslice sl[DOT8_CHUNK];                                              \
		for (int r = 0; r < nr; r++)                                               \
			for (int g = 0; g < 9; g++)                                        \
				acc[r][g] = _mm256_setzero_ps();                           \
		for (size_t k0 = 0; k0 < nblk; k0 += DOT8_CHUNK) {                         \
			size_t nk = nblk - k0 < DOT8_CHUNK ? nblk - k0 : DOT8_CHUNK;       \
			for (size_t k = 0; k < nk; k++) {                                  \
				const uint8_t *b[8];                                       \
				for (int i = 0; i < 8; i++)                                \
					b[i] = (const uint8_t *)rows + i * rb +            \
					       (k0 + k) * (BLK);                           \
				FN(slices8_##T##_)(b, &sl[k]);                             \
			}                                                                  \
			int r = 0;                                                         \
			for (; r + DOT8_TILE <= nr; r += DOT8_TILE)                        \
				FN(dot8_run_)(sl, nk, x + r * xs + k0, xs, DOT8_TILE,      \
					      SIGN, acc + r);                              \
			if (r < nr)                                                        \
				FN(dot8_run_)(sl, nk, x + r * xs + k0, xs, 1, SIGN,        \
					      acc + r);                                    \
		}                                                                          \
		for (int r = 0; r < nr; r++) {                                             \
			__m256 *a = acc[r];	/* the tree of hsum8(), then the min term */ \
			__m256 t = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]),  \
							       _mm256_add_ps(a[2], a[6])), \
						 _mm256_add_ps(_mm256_add_ps(a[1], a[5]),  \
							       _mm256_add_ps(a[3], a[7])));\
			_mm256_storeu_ps(out + r * os, _mm256_add_ps(t, a[8]));            \
		}                                                                          \
	}

QDOT8_KERNEL(q4_0, sizeof(struct blk_q4_0), 1)
QDOT8_KERNEL(q4_1, sizeof(struct blk_q4_1), 0)
QDOT8_KERNEL(q8_0, sizeof(struct blk_q8_0), 1)

qdot8_fn FN(dot_x86_select8_)(uint32_t type)
{
	switch (type) {
	case KB_Q4_0: return FN(dot8_q4_0_);
	case KB_Q4_1: return FN(dot8_q4_1_);
	case KB_Q8_0: return FN(dot8_q8_0_);
	default: return NULL;
	}
}
