/* ref.h — the reference backend's state and the ops its files share. */
#ifndef KVD_REF_REF_H
#define KVD_REF_REF_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/backend.h"

struct ref_backend {
	struct backend base;
	double *xt;		/* (ceil(n / REF_TILE), cols, REF_TILE) the matmul's x, transposed per tile */
	size_t xt_cap;		/* doubles */
	float *wrows;		/* (REF_WROWS, cols) dequantized weight rows */
	size_t wrows_cap;	/* floats */
	double *scores;		/* (positions + head_dim) attention scratch */
	size_t scores_cap;	/* doubles */
};

#define REF(b) ((struct ref_backend *)(b))

/* Grow *buf to hold n elements of size sz; 0 or -ENOMEM. */
int ref_grow(void **buf, size_t *cap, size_t n, size_t sz);

/* The element-wise and attention ops of ref_ops.c (contracts: backend.h). */
int ref_rmsnorm(struct backend *b, float *out, const float *x, const float *g, uint32_t n,
		uint32_t dim, float eps);
int ref_rope(struct backend *b, float *x, const uint32_t *pos, uint32_t n, uint32_t n_heads,
	     uint32_t head_dim, const struct kb_rope *rope);
int ref_swiglu(struct backend *b, float *out, const float *gate, const float *up, uint32_t n,
	       uint32_t dim);
int ref_add(struct backend *b, float *x, const float *y, uint32_t n, uint32_t dim);
int ref_add_rmsnorm(struct backend *b, float *out, float *x, const float *y, const float *g,
		    uint32_t n, uint32_t dim, float eps);
int ref_add_bias(struct backend *b, float *x, const float *bias, uint32_t n, uint32_t dim);
int ref_scale(struct backend *b, float *x, float s, uint32_t n, uint32_t dim);
int ref_softcap(struct backend *b, float *x, float cap, uint32_t n, uint32_t dim);
int ref_geglu(struct backend *b, float *out, const float *gate, const float *up, uint32_t n,
	      uint32_t dim);
int ref_argmax(struct backend *b, uint32_t *ids, const float *x, uint32_t n, uint32_t dim);
int ref_write_kv_rows(struct backend *b, const struct kb_kv_rows *kv, const uint32_t *pos,
		      uint32_t n, uint32_t kv_dim, const float *k, const float *v);
int ref_attention_rows(struct backend *b, float *out, const float *q,
		       const struct kb_kv_rows *kv, const uint32_t *pos, uint32_t n,
		       const struct kb_attn_shape *shape);

#endif
