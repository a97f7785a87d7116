/* backend_cpu.h — the CPU backend's single-sequence K/V and attention, outside the vtable. */
#ifndef KVD_BACKEND_CPU_H
#define KVD_BACKEND_CPU_H

#include "kernels/backend.h"

/*
 * One sequence, one block table for every row: the forms the reference
 * tests check the kernels with. The engine runs write_kv_rows and
 * attention_rows, which give these same bits row for row. b must be a CPU
 * backend (backend_cpu_create); pointers are host memory.
 */

/* Store k, v (n, kv_dim) at positions pos (n,) of kv; -ERANGE past the table. */
int backend_cpu_write_kv(struct backend *b, const struct kb_kv_view *kv, const uint32_t *pos,
			 uint32_t n, uint32_t kv_dim, const float *k, const float *v);
/*
 * Causal attention of n query rows: out (n, n_heads * head_dim) for q (n,
 * n_heads * head_dim), row r attending to positions 0..pos[r] of kv (which
 * must already hold them), or with shape->window only to those q with
 * pos[r] - q < window. With shape->softcap each score is the raw q.k
 * capped, cap * tanh(q.k / cap), then times shape->scale (llama.cpp's
 * order). With an f16 cache Q is rounded to f16 for the scores and the
 * softmax weights to f16 for the sum over V (as llama.cpp does); an f32
 * cache keeps everything in f32.
 */
int backend_cpu_attention(struct backend *b, float *out, const float *q,
			  const struct kb_kv_view *kv, const uint32_t *pos, uint32_t n,
			  const struct kb_attn_shape *shape);

#endif
