/* backend.h — the compute backend vtable the engine runs the transformer through. */
#ifndef KVD_BACKEND_H
#define KVD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

/* Weight element types; numbering matches GGUF/ggml so loaders pass it through. */
enum kb_type {
	KB_F32 = 0, KB_F16 = 1, KB_Q4_0 = 2, KB_Q4_1 = 3, KB_Q8_0 = 8,
	KB_Q4_K = 12, KB_Q6_K = 14, KB_BF16 = 30,
};

/* A weight matrix W (rows, cols): each row is cols elements in type's blocks. */
struct kb_weight {
	const void *data;	/* (rows, row_bytes) */
	uint32_t type;		/* enum kb_type */
	uint32_t rows;
	uint32_t cols;		/* multiple of the type's block size */
	size_t row_bytes;
};

/*
 * One sequence's K/V cache for one layer, paged: position p lives in block
 * blocks[p / block_tokens] at slot p % block_tokens; inside a block this
 * layer's K rows start at k_off and its V rows at v_off, row_bytes apart.
 * Each row holds n_kv_heads * head_dim elements of type; head h's elements
 * start at element h * head_dim. A contiguous cache is one block.
 */
struct kb_kv_view {
	uint8_t *base;		/* the pool: (n_blocks_in_pool, block_bytes) */
	const uint32_t *blocks;	/* (n_blocks,) this sequence's block table */
	uint32_t n_blocks;
	uint32_t block_tokens;	/* power of two */
	size_t block_bytes;
	size_t k_off;		/* byte offset of this layer's K rows in a block */
	size_t v_off;		/* byte offset of this layer's V rows in a block */
	size_t row_bytes;
	uint32_t type;		/* KB_F16, KB_F32 or KB_Q8_0 */
};

/* Address of the K (which 0) or V (which 1) row of position p; p < n_blocks * block_tokens. */
static inline uint8_t *kb_kv_row(const struct kb_kv_view *kv, int which, uint32_t p)
{
	uint32_t shift = (uint32_t)__builtin_ctz(kv->block_tokens);
	return kv->base + (size_t)kv->blocks[p >> shift] * kv->block_bytes +
	       (which ? kv->v_off : kv->k_off) + (size_t)(p & (kv->block_tokens - 1)) * kv->row_bytes;
}

struct kb_attn_shape {
	uint32_t n_heads;	/* query heads */
	uint32_t n_kv_heads;	/* divides n_heads; each serves n_heads / n_kv_heads */
	uint32_t head_dim;
	float scale;		/* usually 1 / sqrt(head_dim) */
};

struct backend;

/*
 * Every operation is row-wise batch invariant: row r's result depends only
 * on row r's inputs (and, for attention, its sequence's cache), never on how
 * many rows share the call or how work is split across threads. Every
 * operation returns 0 or -errno.
 */
struct backend_ops {
	const char *name;
	void (*destroy)(struct backend *b);
	/* y (n, W.rows) = x (n, W.cols) @ W^T */
	int (*matmul)(struct backend *b, float *y, const struct kb_weight *w,
		      const float *x, uint32_t n);
	/*
	 * y[i] (n, w[i].rows) = x (n, cols) @ W[i]^T for count weights sharing
	 * cols (Q/K/V, gate/up): x is prepared once, one parallel pass serves
	 * all. Each y[i] is bitwise what matmul() would give.
	 */
	int (*matmul_multi)(struct backend *b, float *const *y, const struct kb_weight *const *w,
			    uint32_t count, const float *x, uint32_t n);
	/* out (n, W.cols) = W[ids[i]] dequantized (embedding lookup) */
	int (*get_rows)(struct backend *b, float *out, const struct kb_weight *w,
			const uint32_t *ids, uint32_t n);
	/* out (n, dim) = x / sqrt(mean(x^2) + eps) * g;  out may alias x */
	int (*rmsnorm)(struct backend *b, float *out, const float *x, const float *g,
		       uint32_t n, uint32_t dim, float eps);
	/*
	 * In place on x (n, n_heads, head_dim): rotate the first rot_dim dims
	 * of each head by angle pos[r] * theta^(-2i/rot_dim). neox = 0 rotates
	 * adjacent pairs (2i, 2i+1) (Llama GGUF), 1 rotates (i, i + rot_dim/2).
	 */
	int (*rope)(struct backend *b, float *x, const uint32_t *pos, uint32_t n,
		    uint32_t n_heads, uint32_t head_dim, uint32_t rot_dim, float theta,
		    int neox);
	/* out (n, dim) = silu(gate) * up;  out may alias gate */
	int (*swiglu)(struct backend *b, float *out, const float *gate, const float *up,
		      uint32_t n, uint32_t dim);
	/* x (n, dim) += y */
	int (*add)(struct backend *b, float *x, const float *y, uint32_t n, uint32_t dim);
	/* Store k, v (n, kv_dim) of one sequence at positions pos (n,) of kv. */
	int (*write_kv)(struct backend *b, const struct kb_kv_view *kv, const uint32_t *pos,
			uint32_t n, uint32_t kv_dim, const float *k, const float *v);
	/*
	 * Causal attention of n query rows of one sequence: out (n, n_heads *
	 * head_dim) for q (n, n_heads * head_dim), row r attending to cache
	 * positions 0..pos[r] of kv (which must already hold them). With an
	 * f16 cache Q is rounded to f16 for the scores and the softmax weights
	 * to f16 for the sum over V (as llama.cpp does); an f32 cache keeps
	 * everything in f32.
	 */
	int (*attention)(struct backend *b, float *out, const float *q,
			 const struct kb_kv_view *kv, const uint32_t *pos, uint32_t n,
			 const struct kb_attn_shape *shape);
};

struct backend {
	const struct backend_ops *ops;
	uint32_t n_threads;
};

/* The CPU backend: n_threads 0 = one per online core. */
int backend_cpu_create(struct backend **out, uint32_t n_threads);

/* Elements and bytes per block of a type; -EINVAL for an unknown type. */
int kb_type_block(uint32_t type, uint32_t *blk_elems, uint32_t *blk_bytes);

#endif
