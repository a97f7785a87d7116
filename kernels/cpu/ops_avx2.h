/* ops_avx2.h — the AVX2/FMA/F16C row kernels (ops_avx2.c, ops_avx512.c) that ops.c dispatches to; x86-64 only. */
#ifndef KVD_CPU_OPS_AVX2_H
#define KVD_CPU_OPS_AVX2_H

#include <stdint.h>
#include "kernels/backend.h"

#if defined(__x86_64__)
/* Whether this CPU has AVX2, FMA and F16C (asked once). */
int ops_have_avx2(void);
/* ops_swiglu_row_c() over the whole eights of dim; returns how many elements it did. */
int ops_swiglu_row_avx2(float *out, const float *gate, const float *up, uint32_t dim);
/*
 * ops_f16_row() eight at a time (F16C, round to nearest even: the same
 * bits), up to the first eight holding a NaN, whose payload F16C keeps
 * where f32_to_fp16() makes one quiet NaN; returns how many it did.
 */
int ops_f16_row_avx2(uint16_t *h, const float *x, uint32_t n);
/* ops_attention_heads() for f16 and f32 caches with head_dim % 8 == 0. */
int ops_attention_heads_avx2(float *out, const float *q, const struct kb_kv_view *kv,
			     uint32_t pos, uint32_t kvh0, uint32_t nkv,
			     const struct kb_attn_shape *sh);
/*
 * Whether this CPU has AVX-512F/VL as well (asked once), and KVD_CPU_ISA
 * is unset or "avx512"; then ops_attention_heads_avx512(), the same
 * results with three query heads a pass (kernels/cpu/ops_avx512.c).
 */
int ops_have_avx512(void);
int ops_attention_heads_avx512(float *out, const float *q, const struct kb_kv_view *kv,
			       uint32_t pos, uint32_t kvh0, uint32_t nkv,
			       const struct kb_attn_shape *sh);
#endif
#endif
