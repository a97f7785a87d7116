/* dot.h — dot products of weight rows against activation rows, the matmul's inner kernels. */
#ifndef KVD_CPU_DOT_H
#define KVD_CPU_DOT_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/cpu/quant.h"

#define DOT_MAX_NR 8	/* activation rows one call serves */

/*
 * Quantized weights: out[r * out_stride] = row . x_r for r < nr, where x_r
 * is x + r * x_stride (activation blocks) and row holds nblk QK-element
 * sub-blocks. Every implementation accumulates the struct wsub
 * decomposition in the same order, so all give identical results, and nr
 * never changes a row's result.
 */
typedef void (*qdot_fn)(const void *row, const struct blk_q8x *x, size_t x_stride,
			int nr, size_t nblk, float *out, size_t out_stride);

/*
 * The same for eight consecutive weight rows (row i at rows + i * row_bytes):
 * out[r * out_stride + i] = row_i . x_r, bitwise what qdot_fn gives: the
 * same eight partial sums per row, accumulated in the same order, with
 * the eight rows side by side in the SIMD lanes.
 */
typedef void (*qdot8_fn)(const void *rows, size_t row_bytes, const struct blk_q8x *x,
			 size_t x_stride, int nr, size_t nblk, float *out, size_t out_stride);

/* Float weights (F32/F16/BF16) against float activations, 8 lanes then a fixed tree. */
typedef void (*fdot_fn)(const void *row, const float *x, size_t x_stride, int nr,
			size_t n, float *out, size_t out_stride);

/* The best implementation this CPU runs for a weight type, or NULL. */
qdot_fn dot_select_q(uint32_t type);
fdot_fn dot_select_f(uint32_t type);
/* A named implementation ("generic", "avx2", "avx512vnni"; NULL = best), or NULL if unavailable. */
qdot_fn dot_select_q_isa(uint32_t type, const char *want, const char **isa);
/* The eight-row kernel of the ISA dot_select_q() chose, or NULL where that type has none. */
qdot8_fn dot_select_q8(uint32_t type);
qdot8_fn dot_select_q8_isa(uint32_t type, const char *want);
/* The portable implementation, for tests. */
void dot_q_generic(uint32_t type, const void *row, const struct blk_q8x *x, size_t x_stride,
		   int nr, size_t nblk, float *out, size_t out_stride);
void dot8_q_generic(uint32_t type, const void *rows, size_t row_bytes, const struct blk_q8x *x,
		    size_t x_stride, int nr, size_t nblk, float *out, size_t out_stride);

/* The fixed reduction tree every path uses for 8 float lanes. */
static inline float hsum8(const float a[8])
{
	return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

#endif
