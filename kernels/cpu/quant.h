/* quant.h — GGUF block formats, their dequantization, and 8-bit activation blocks. */
#ifndef KVD_CPU_QUANT_H
#define KVD_CPU_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/backend.h"

#define QK 32		/* elements per small block, and per activation block */
#define QK_K 256	/* elements per K-quant super-block */

struct blk_q4_0 {
	uint16_t d;		/* f16 scale */
	uint8_t qs[QK / 2];	/* x[i] = d * (nibble - 8); low nibbles 0..15, high 16..31 */
};

struct blk_q4_1 {
	uint16_t d;		/* f16 scale */
	uint16_t m;		/* f16 minimum */
	uint8_t qs[QK / 2];	/* x[i] = d * nibble + m; low nibbles 0..15, high 16..31 */
};

struct blk_q5_0 {
	uint16_t d;		/* f16 scale */
	uint8_t qh[4];		/* bit i (little-endian u32) = bit 4 of element i */
	uint8_t qs[QK / 2];	/* x[i] = d * ((nibble | high << 4) - 16); nibbles as Q4_0 */
};

struct blk_q5_1 {
	uint16_t d;		/* f16 scale */
	uint16_t m;		/* f16 minimum */
	uint8_t qh[4];		/* as Q5_0 */
	uint8_t qs[QK / 2];	/* x[i] = d * (nibble | high << 4) + m */
};

struct blk_q8_0 {
	uint16_t d;		/* f16 scale */
	int8_t qs[QK];		/* x[i] = d * qs[i] */
};

struct blk_q4_k {
	uint16_t d;		/* f16 super-scale of the 6-bit scales */
	uint16_t dmin;		/* f16 super-scale of the 6-bit mins */
	uint8_t scales[12];	/* 8 sub-blocks x (6-bit scale, 6-bit min), packed */
	uint8_t qs[QK_K / 2];	/* 64-element chunks: low nibbles sub-block 2j, high 2j+1 */
};

struct blk_q5_k {
	uint16_t d;		/* as Q4_K, plus a fifth bit: */
	uint16_t dmin;
	uint8_t scales[12];
	uint8_t qh[QK_K / 8];	/* bit j of qh[l] = bit 4 of element l of sub-block j */
	uint8_t qs[QK_K / 2];
};

/*
 * Q2_K and Q3_K: element 128h + 32g + l (h < 2, g < 4, l < 32) takes bits
 * 2g, 2g+1 of qs[32h + l]; Q3_K's bit 2 is bit 4h + g of hmask[l], and
 * clear means minus 4. One scale per 16 elements.
 */
struct blk_q2_k {
	uint8_t scales[QK_K / 16];	/* low nibble scale, high nibble min */
	uint8_t qs[QK_K / 4];
	uint16_t d;		/* f16 super-scale of the scales */
	uint16_t dmin;		/* f16 super-scale of the mins */
};

struct blk_q3_k {
	uint8_t hmask[QK_K / 8];
	uint8_t qs[QK_K / 4];
	uint8_t scales[12];	/* 16 6-bit scales, minus 32 (q3k_scale()) */
	uint16_t d;		/* f16 super-scale */
};

struct blk_q6_k {
	uint8_t ql[QK_K / 2];	/* low 4 bits */
	uint8_t qh[QK_K / 4];	/* high 2 bits */
	int8_t scales[QK_K / 16]; /* one per 16 elements */
	uint16_t d;		/* f16 super-scale */
};

/* x[i] = d * iq4nl_values[nibble]; nibbles as Q4_0. */
struct blk_iq4_nl {
	uint16_t d;
	uint8_t qs[QK / 2];
};

/* Eight sub-blocks of 32 laid out as IQ4_NL's, each with a 6-bit scale minus 32. */
struct blk_iq4_xs {
	uint16_t d;		/* f16 super-scale */
	uint16_t scales_h;	/* bits 2j, 2j+1: high bits of sub-block j's scale */
	uint8_t scales_l[QK_K / 64];	/* nibble j % 2 of byte j / 2: its low bits */
	uint8_t qs[QK_K / 2];
};

/* The IQ4 formats' 16 non-uniform levels (ggml's kvalues_iq4nl). */
extern const int8_t iq4nl_values[16];

_Static_assert(sizeof(struct blk_q4_0) == 18, "q4_0");
_Static_assert(sizeof(struct blk_q5_0) == 22, "q5_0");
_Static_assert(sizeof(struct blk_q5_1) == 24, "q5_1");
_Static_assert(sizeof(struct blk_q2_k) == 84, "q2_k");
_Static_assert(sizeof(struct blk_q3_k) == 110, "q3_k");
_Static_assert(sizeof(struct blk_q5_k) == 176, "q5_k");
_Static_assert(sizeof(struct blk_iq4_nl) == 18, "iq4_nl");
_Static_assert(sizeof(struct blk_iq4_xs) == 136, "iq4_xs");
_Static_assert(sizeof(struct blk_q4_1) == 20, "q4_1");
_Static_assert(sizeof(struct blk_q8_0) == 34, "q8_0");
_Static_assert(sizeof(struct blk_q4_k) == 144, "q4_k");
_Static_assert(sizeof(struct blk_q6_k) == 210, "q6_k");

/*
 * An activation block: x[i] ~ d * qs[i]; s = d * sum(qs) for the min terms.
 * d and s hold f16-representable values (like ggml's q8_0/q8_1 blocks).
 * qsum = sum(qs) exactly, for kernels that take unsigned weights with an
 * offset (Q4_0's nibble - 8) out of the integer sum; qsum16 the sums of
 * elements 0-15 and 16-31, for Q2_K's min of each 16 and the offset the
 * repacking gives Q3_K's values (kernels/cpu/repack.h).
 */
struct blk_q8x {
	float d;
	float s;
	int32_t qsum;
	int16_t qsum16[2];
	int8_t qs[QK];
};

/*
 * Exact f16 -> f32, branch-free so that loops over it vectorise: a normal
 * half is rebased by shifting its exponent/mantissa into float position and
 * scaling by 2^-112 (which also carries inf/nan through); a subnormal half
 * is built as the float 0.5 + m * 2^-24, minus 0.5, which is exact.
 */
static inline float fp16_to_f32(uint16_t h)
{
	uint32_t w = (uint32_t)h << 16;
	uint32_t sign = w & 0x80000000u;
	uint32_t two_w = w + w;
	union { uint32_t u; float f; } n = { (two_w >> 4) + (0xe0u << 23) };
	union { uint32_t u; float f; } d = { (two_w >> 17) | (126u << 23) };
	n.f *= 0x1.0p-112f;
	d.f -= 0.5f;
	union { uint32_t u; float f; } r = { sign | (two_w < (1u << 27) ? d.u : n.u) };
	return r.f;
}
uint16_t f32_to_fp16(float f);	/* round to nearest even */
float bf16_to_f32(uint16_t h);

/* f rounded to the nearest f16 value. */
static inline float fp16_round(float f)
{
	return fp16_to_f32(f32_to_fp16(f));
}

/* y (n,) = the n elements of one row of type starting at src; n % block == 0. */
int dequantize_row(uint32_t type, const void *src, float *y, size_t n);

/* Quantize x (n,) to n / QK activation blocks; n % QK == 0. */
void quantize_row_q8x(const float *x, struct blk_q8x *y, size_t n);

/*
 * One 32-element sub-block of a weight row in integer form: values v (the
 * integers the format stores, offsets applied), an integer scale per group
 * of 4 elements (group j covers elements 4j..4j+3: Q4_K/Q5_K's 6-bit
 * sub-block scale, Q2_K/Q3_K/Q6_K's scale of each 16, IQ4_XS's of each 32,
 * else 1), a float scale dw and a float min coefficient mw, such that
 *   sum_i w[i] x[i] = dw * dx * S + mw * s_x,  S = sum_j ls[j] * sum_{i in j} v[i] q[i]
 * for an activation block (dx, s_x, q). S is an exact int32; every kernel,
 * portable or SIMD, adds S * (dw * dx) and then mw * s_x (types with a min)
 * into one float accumulator per output, sub-block after sub-block, which
 * makes results identical across code paths (kernels/cpu/dot.h).
 * Q2_K has an integer min lm[h] per 16 elements instead: its min term is
 * (mw * dx) * M, M = lm[0] * qsum16[0] + lm[1] * qsum16[1] exact, mw = -dmin.
 */
struct wsub {
	int16_t v[QK];
	int32_t ls[8];
	int32_t lm[2];
	float dw;
	float mw;
};

/* Sub-block k (0-based, in units of QK elements) of a row of a quantized type. */
void unpack_wsub(uint32_t type, const void *row, size_t k, struct wsub *out);
/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block's scales. */
void q4k_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m);
/* Whether a type takes the integer (activation-quantized) path. */
int type_is_quantized(uint32_t type);
/* Whether its sub-blocks carry a min term mw * s_x (Q4_1, Q4_K, Q5_1, Q5_K). */
static inline int type_has_min(uint32_t type)
{
	return type == KB_Q4_1 || type == KB_Q4_K || type == KB_Q5_1 || type == KB_Q5_K;
}
/* Whether it has integer mins per 16 elements instead (Q2_K). */
static inline int type_has_min16(uint32_t type)
{
	return type == KB_Q2_K;
}
/* The signed 6-bit scale (already minus 32) of 16-element group j (0..15) of a Q3_K super-block. */
int q3k_scale(const uint8_t *s, int j);
/* The signed 6-bit scale (minus 32) of sub-block j (0..7) of an IQ4_XS super-block. */
int iq4xs_scale(const struct blk_iq4_xs *b, int j);

#endif
