/* ops.h — f32 row-wise kernels of the CPU backend: norms, RoPE, activations, attention. */
#ifndef KVD_CPU_OPS_H
#define KVD_CPU_OPS_H

#include <stdint.h>
#include "kernels/backend.h"

/* e^x to ~1 ulp over the f32 range, branch-free so loops over it vectorise. */
float fast_expf(float x);

/*
 * The index of the largest of x (n >= 1,) as a scan from x[0] keeping the
 * first strict improvement finds it: the lowest index wins a tie, a NaN never
 * wins (x[0] NaN: 0). Sixteen running maxima, then the first index holding
 * the largest, so the loop vectorises.
 */
uint32_t ops_argmax_row(const float *x, uint32_t n);

/* h (n,) = x rounded to f16, f32_to_fp16() of each (a K or V row going into an f16 cache). */
void ops_f16_row(uint16_t *h, const float *x, uint32_t n);

/* out (dim,) = x / sqrt(mean(x^2) + eps) * g */
void ops_rmsnorm_row(float *out, const float *x, const float *g, uint32_t dim, float eps);
/* out (dim,) = silu(gate) * up */
void ops_swiglu_row(float *out, const float *gate, const float *up, uint32_t dim);
/* The portable ops_swiglu_row(), which the SIMD one matches bit for bit (for tests). */
void ops_swiglu_row_c(float *out, const float *gate, const float *up, uint32_t dim);
/* x (dim,) += bias (dim,) */
void ops_add_bias_row(float *x, const float *bias, uint32_t dim);
/* x (dim,) *= s */
void ops_scale_row(float *x, float s, uint32_t dim);
/* x (dim,) = tanh(x * (1 / cap)) * cap, in f32 as ggml's scale, tanh, scale */
void ops_softcap_row(float *x, float cap, uint32_t dim);
/*
 * out (dim,) = gelu(gate) * up, GELU's tanh form as ggml's f32 GEGLU takes
 * it: gate <= -10 gives 0, gate >= 10 gives gate * up, anything between is
 * looked up by its f16 in a table of f16 results.
 */
void ops_geglu_row(float *out, const float *gate, const float *up, uint32_t dim);
/* GELU's tanh form in f32, the formula the table is made of (for tests). */
float ops_gelu_f32(float x);

/* x (n_heads, head_dim) rotated by the (cos, sin) pairs cs (rot_dim / 2, 2) */
void ops_rope_row(float *x, const float *cs, uint32_t n_heads, uint32_t head_dim,
		  uint32_t rot_dim, int neox);
/*
 * The (cos, sin) table of one position, cs (rope->rot_dim / 2, 2), as
 * ggml's rope cache computes it; the factors are read from ff (host
 * memory, rot_dim / 2 of them) or are all 1 when ff is NULL.
 */
void ops_rope_table(float *cs, uint32_t pos, const struct kb_rope *rope, const float *ff);

/*
 * Attention of one query row at position pos against kv heads kvh0 ..
 * kvh0 + nkv - 1, for the groups of query heads they serve: out and q are
 * (nkv * group, head_dim) slices. The row sees positions
 * ops_att_first(pos, window) .. pos; each score is q.k * scale, or with a
 * soft-cap tanh(q.k / cap) * cap * scale. Scores, softmax and the weighted
 * sum of V each run in position order, so each head's result is the same
 * whatever nkv; the SIMD kernel reads each K and V row once for all of
 * them. Returns 0 or -ENOMEM.
 */
int ops_attention_heads(float *out, const float *q, const struct kb_kv_view *kv,
			uint32_t pos, uint32_t kvh0, uint32_t nkv, const struct kb_attn_shape *shape);
/* The first position a row at pos sees through a sliding window (0: none): p - q < window. */
uint32_t ops_att_first(uint32_t pos, uint32_t window);
/* s (n,) = tanh(s * (1 / cap)) * cap * scale, the soft-capped scores of raw q.k products. */
void ops_att_softcap(float *s, uint32_t n, float cap, float scale);
/* The portable implementation for one kv head, which every SIMD one must match bit for bit (for tests). */
int ops_attention_group_c(float *out, const float *q, const struct kb_kv_view *kv,
			   uint32_t pos, uint32_t kvh, const struct kb_attn_shape *shape);

/* The calling thread's scratch for n attention scores (grown on demand), or NULL. */
float *ops_att_scores(size_t n);
/* Free the calling thread's scratch (pool workers' is freed as they exit). */
void ops_thread_scratch_free(void);
#endif
