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

struct blk_q6_k {
	uint8_t ql[QK_K / 2];	/* low 4 bits */
	uint8_t qh[QK_K / 4];	/* high 2 bits */
	int8_t scales[QK_K / 16]; /* one per 16 elements */
	uint16_t d;		/* f16 super-scale */
};

_Static_assert(sizeof(struct blk_q4_0) == 18, "q4_0");
_Static_assert(sizeof(struct blk_q4_1) == 20, "q4_1");
_Static_assert(sizeof(struct blk_q8_0) == 34, "q8_0");
_Static_assert(sizeof(struct blk_q4_k) == 144, "q4_k");
_Static_assert(sizeof(struct blk_q6_k) == 210, "q6_k");

/*
 * An activation block: x[i] ~ d * qs[i]; s = d * sum(qs) for the min terms.
 * d and s hold f16-representable values (like ggml's q8_0/q8_1 blocks).
 * qsum = sum(qs) exactly, for kernels that take unsigned weights with an
 * offset (Q4_0's nibble - 8) out of the integer sum.
 */
struct blk_q8x {
	float d;
	float s;
	int32_t qsum;
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
 * of 4 elements (group j covers elements 4j..4j+3: Q4_K's 6-bit sub-block
 * scale, Q6_K's scale of each 16, else 1), a float scale dw and a float min
 * coefficient mw, such that
 *   sum_i w[i] x[i] = dw * dx * S + mw * s_x,  S = sum_j ls[j] * sum_{i in j} v[i] q[i]
 * for an activation block (dx, s_x, q). S is an exact int32; every kernel,
 * portable or SIMD, adds S * (dw * dx) and then mw * s_x (types with a min)
 * into one float accumulator per output, sub-block after sub-block, which
 * makes results identical across code paths (kernels/cpu/dot.h).
 */
struct wsub {
	int16_t v[QK];
	int32_t ls[8];
	float dw;
	float mw;
};

/* Sub-block k (0-based, in units of QK elements) of a row of a quantized type. */
void unpack_wsub(uint32_t type, const void *row, size_t k, struct wsub *out);
/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block's scales. */
void q4k_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m);
/* Whether a type takes the integer (activation-quantized) path. */
int type_is_quantized(uint32_t type);
/* Whether its sub-blocks carry a min term (Q4_1, Q4_K). */
static inline int type_has_min(uint32_t type)
{
	return type == KB_Q4_1 || type == KB_Q4_K;
}

#endif
