/* attention.cuh — paged attention over many sequences: decode and prefill, split over the context. */
#ifndef KVD_CUDA_ATTENTION_CUH
#define KVD_CUDA_ATTENTION_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include "kernels/backend.h"
#include "kernels/cuda/plan.h"

/*
 * out (n, n_heads * head_dim) = causal attention of q (n, n_heads *
 * head_dim) against each row's cached K/V (kv and pos on the device, the
 * positions already written). p comes from cuda_plan_attention for this
 * batch; part is device scratch of p->part_floats floats.
 *
 * Each block takes one tile's rows (consecutive positions of one sequence)
 * and one KV head, stages K/V tiles of 32 tokens in shared memory once for
 * every query head of the group and every row of the tile (flash-style,
 * online softmax, causal mask by position), over one split of the context;
 * a second kernel merges the splits. With an f16 cache Q is rounded to f16
 * first, as the CPU backend does.
 */
int cuda_attention(cudaStream_t s, const struct cuda_attn_plan *p, float *out, const float *q,
		   const struct kb_kv_rows *kv, const uint32_t *pos,
		   const struct kb_attn_shape *sh, float *part);

/* Opt every attention kernel into the shared memory it needs; once, before any launch. */
int cuda_attention_init(void);

#endif
