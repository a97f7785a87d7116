/* dot.h — dot products of weight rows against activation rows, the matmul's inner kernels. */
#ifndef KVD_CPU_DOT_H
#define KVD_CPU_DOT_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/cpu/quant.h"

#define DOT_MAX_NR 16	/* activation rows one call serves */

/*
 * The arithmetic every quantized kernel shares (struct wsub): per output,
 * one float accumulator a, and for each 32-element sub-block k in order
 *   a = fma((float)S_k, dw_k * dx_k, a);  then, for types with a min,
 *   a = fma(mw_k, s_x_k, a)	(Q2_K: a = fma((float)M_k, mw_k * dx_k, a))
 * with S_k (and M_k) the exact int32 sub-block sums. The integer part may be summed in
 * any order (it is exact), the float part may not: so the portable and the
 * SIMD kernels agree bit for bit, and how many rows share a call changes
 * nothing.
 */

/* Quantized weights, portable: out[r * out_stride] = row . x_r for r < nr (x_r = x + r * x_stride). */
void dot_q_generic(uint32_t type, const void *row, const struct blk_q8x *x, size_t x_stride,
		   int nr, size_t nblk, float *out, size_t out_stride);

/*
 * Weight rows in the repacked layout of kernels/cpu/repack.h (nblk
 * sub-blocks) against nr (<= DOT_MAX_NR) activation rows:
 * out[r * out_stride + i] = row_i . x_r, bitwise dot_q_generic(). An 8-row
 * kernel reads one group (rp_pack()), i < 8; a 16-row one a pair
 * (rp_pack_pair()), i < 16. pf: prefetch the weights ahead, for callers
 * whose weights come from memory rather than cache (results the same).
 */
typedef void (*qgemm_fn)(const void *rp, size_t nblk, const struct blk_q8x *x, size_t x_stride,
			 int nr, float *out, size_t out_stride, int pf);

/* Float weights (F32/F16/BF16) against float activations, 8 lanes then a fixed tree. */
typedef void (*fdot_fn)(const void *row, const float *x, size_t x_stride, int nr,
			size_t n, float *out, size_t out_stride);

fdot_fn dot_select_f(uint32_t type);
/*
 * The 8-row repacked kernel of the best instruction set this CPU runs (or
 * the one KVD_CPU_ISA names: generic, avx2, avx512vnni, avx512), or NULL
 * where there is none (the portable path: dot_q_generic on the rows as
 * stored). isa, when not NULL, receives the name.
 */
qgemm_fn dot_select_gemm(uint32_t type, const char **isa);
/*
 * The 16-row kernel (512-bit vectors, "avx512": AVX512F/BW/VL/VNNI) where
 * this CPU has one and KVD_CPU_ISA does not name another path, else NULL:
 * callers use it for pairs of whole groups packed by rp_pack_pair() and
 * dot_select_gemm()'s for the rest.
 */
qgemm_fn dot_select_gemm16(uint32_t type);
/* A named instruction set's kernel ("avx2", "avx512vnni": 8 rows; "avx512": 16), NULL if this CPU lacks it. */
qgemm_fn dot_select_gemm_isa(uint32_t type, const char *want);

/* KVD_CPU_ISA (generic, avx2, avx512vnni, avx512: forces a path, for comparisons), or NULL when unset or empty. */
const char *dot_wanted_isa(void);

/* quantize_row_q8x() (kernels/cpu/quant.h), or a SIMD version giving the same blocks. */
typedef void (*quantize_fn)(const float *x, struct blk_q8x *y, size_t n);
quantize_fn dot_select_quantize(void);

/* The fixed reduction tree every path uses for 8 float lanes. */
static inline float hsum8(const float a[8])
{
	return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

#endif
