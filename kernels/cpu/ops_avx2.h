/* ops_avx2.h — the AVX2/FMA/F16C row kernels (ops_avx2.c) that ops.c dispatches to; x86-64 only. */
#ifndef KVD_CPU_OPS_AVX2_H
#define KVD_CPU_OPS_AVX2_H

#include <stdint.h>
#include "kernels/backend.h"

#if defined(__x86_64__)
/* Whether this CPU has AVX2, FMA and F16C (asked once). */
int ops_have_avx2(void);
/* ops_swiglu_row_c() over the whole eights of dim; returns how many elements it did. */
int ops_swiglu_row_avx2(float *out, const float *gate, const float *up, uint32_t dim);
/* ops_attention_heads() for f16 and f32 caches with head_dim % 8 == 0. */
int ops_attention_heads_avx2(float *out, const float *q, const struct kb_kv_view *kv,
			     uint32_t pos, uint32_t kvh0, uint32_t nkv,
			     const struct kb_attn_shape *sh);
#endif
#endif
