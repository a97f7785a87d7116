/* backend.h — the compute backend vtable the engine runs the transformer through. */
#ifndef KVD_BACKEND_H
#define KVD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Weight element types; numbering matches GGUF/ggml so loaders pass it through. */
enum kb_type {
	KB_F32 = 0, KB_F16 = 1, KB_Q4_0 = 2, KB_Q4_1 = 3, KB_Q5_0 = 6, KB_Q5_1 = 7, KB_Q8_0 = 8,
	KB_Q2_K = 10, KB_Q3_K = 11, KB_Q4_K = 12, KB_Q5_K = 13, KB_Q6_K = 14, KB_IQ4_NL = 20,
	KB_IQ4_XS = 23, KB_BF16 = 30,
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

/*
 * One layer's K/V for a batch of rows from any number of sequences. Row r
 * reads and writes through its own block table, tables[tab_off[r]] ..
 * [tab_off[r] + tab_len[r] - 1]; geo gives the pool and the block geometry
 * (its blocks and n_blocks are unused). tables, tab_off, tab_len and tiles
 * are backend buffers; the h_ pointers hold the same values in host memory
 * for launch decisions (on the CPU both are the same arrays).
 *
 * Tiles cut the rows into runs of at most KB_TILE_ROWS consecutive
 * positions of one sequence, (n_tiles, 2) = {first row, rows}: a device
 * backend loads each K/V tile once for all of a tile's queries.
 */
#define KB_TILE_ROWS 16

struct kb_kv_rows {
	struct kb_kv_view geo;
	const uint32_t *tables;		/* block ids of every row's sequence, concatenated */
	const uint32_t *tab_off;	/* (n,) */
	const uint32_t *tab_len;	/* (n,) blocks in row r's table */
	const uint32_t *tiles;		/* (n_tiles, 2) */
	const uint32_t *h_tab_off;	/* host copies of the above */
	const uint32_t *h_tab_len;
	const uint32_t *h_tiles;
	const uint32_t *h_pos;		/* (n,) positions, host copy of the op's pos */
	uint32_t n_tiles;
};

struct kb_attn_shape {
	uint32_t n_heads;	/* query heads */
	uint32_t n_kv_heads;	/* divides n_heads; each serves n_heads / n_kv_heads */
	uint32_t head_dim;
	float scale;		/* usually 1 / sqrt(head_dim) */
	float softcap;		/* q.k becomes softcap * tanh(q.k / softcap) before the scale (Gemma 2); 0 = off */
	uint32_t window;	/* sliding window: row at p sees p - window < q <= p; 0 = all */
};

/*
 * Rotary embedding of one layer, as ggml computes it: pair i (of rot_dim / 2)
 * starts from angle pos * theta^(-2i / rot_dim), divided by freq_factors[i]
 * when there are factors (Llama 3's rope_freqs), then interpolated:
 * freq_scale * angle, mixed back toward the unscaled angle by YaRN's ramp
 * between dims corr_lo .. corr_hi times ext_factor (0: no ramp, plain
 * linear scaling). cos and sin are multiplied by attn_factor, and with
 * ext_factor != 0 by 1 + 0.1 ln(1 / freq_scale) as well. The defaults
 * freq_scale 1, ext_factor 0, attn_factor 1, no factors are plain RoPE.
 */
struct kb_rope {
	uint32_t rot_dim;	/* even, at most head_dim */
	int neox;		/* 0 rotates adjacent pairs (2i, 2i+1) (Llama GGUF), 1 rotates (i, i + rot_dim/2) */
	float theta;		/* frequency base */
	float freq_scale;
	float ext_factor;
	float attn_factor;
	float corr_lo, corr_hi;
	const float *freq_factors;	/* (rot_dim / 2,) backend buffer, or NULL */
	const float *h_freq_factors;	/* the same values in host memory */
};

/* Plain RoPE, no factors and no scaling, as a compound literal. */
#define KB_ROPE_PLAIN(rot, th, nx)                                                    \
	((struct kb_rope){ .rot_dim = (rot), .theta = (th), .neox = (nx), .freq_scale = 1.0f, \
			   .attn_factor = 1.0f })

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
	 * In place on x (n, n_heads, head_dim): rotate the first rope->rot_dim
	 * dims of each head by the angles struct kb_rope gives for pos[r].
	 */
	int (*rope)(struct backend *b, float *x, const uint32_t *pos, uint32_t n,
		    uint32_t n_heads, uint32_t head_dim, const struct kb_rope *rope);
	/* out (n, dim) = silu(gate) * up;  out may alias gate */
	int (*swiglu)(struct backend *b, float *out, const float *gate, const float *up,
		      uint32_t n, uint32_t dim);
	/* x (n, dim) += y */
	int (*add)(struct backend *b, float *x, const float *y, uint32_t n, uint32_t dim);
	/* Store k, v (n, kv_dim) at positions pos (n,), row r through its own table of kv. */
	int (*write_kv_rows)(struct backend *b, const struct kb_kv_rows *kv, const uint32_t *pos,
			     uint32_t n, uint32_t kv_dim, const float *k, const float *v);
	/*
	 * Causal attention of n query rows of any sequences: out (n, n_heads *
	 * head_dim) for q (n, n_heads * head_dim), row r attending to positions
	 * 0..pos[r] of its sequence in kv (which must already hold them), or to
	 * the last shape->window of them. With
	 * an f16 cache Q is rounded to f16 for the scores and the softmax
	 * weights to f16 for the sum over V (as llama.cpp does); an f32 cache
	 * keeps everything in f32. (The CPU backend's single-sequence forms,
	 * for tests, are in kernels/cpu/backend_cpu.h.)
	 */
	int (*attention_rows)(struct backend *b, float *out, const float *q,
			      const struct kb_kv_rows *kv, const uint32_t *pos, uint32_t n,
			      const struct kb_attn_shape *shape);
	/* x (n, dim) += y, then out (n, dim) = rmsnorm(x) * g: add and rmsnorm in one pass. */
	int (*add_rmsnorm)(struct backend *b, float *out, float *x, const float *y, const float *g,
			   uint32_t n, uint32_t dim, float eps);
	/* ids (n,) in host memory = the index of each row's largest x (n, dim); the lowest index wins ties. */
	int (*argmax)(struct backend *b, uint32_t *ids, const float *x, uint32_t n, uint32_t dim);

	/*
	 * Backend buffers: every pointer the operations above take is one (or
	 * points into one). On the CPU they are host memory; on a device they
	 * are device memory and the host must not touch them. Transfers run in
	 * the backend's stream order; download returns with dst filled.
	 */
	int (*buf_alloc)(struct backend *b, void **out, size_t bytes);
	void (*buf_free)(struct backend *b, void *p);
	int (*upload)(struct backend *b, void *dst, const void *src, size_t bytes);
	int (*download)(struct backend *b, void *dst, const void *src, size_t bytes);
	int (*copy)(struct backend *b, void *dst, const void *src, size_t bytes);
	/*
	 * src (host, unchanged for the backend's life: the model mapping) as a
	 * backend buffer: the CPU hands back src itself, a device copies it
	 * once. Undo with unimport.
	 */
	int (*import)(struct backend *b, const void **out, const void *src, size_t bytes);
	void (*unimport)(struct backend *b, const void *p);

	/*
	 * Optional (NULL on the CPU): bracket the operations of one forward
	 * step. A device backend may record them instead of running them and
	 * replay the recording at step_end (CUDA graphs) when shape_key
	 * repeats; shape_key 0 asks for plain execution. step_end receives the
	 * step's status and returns the final one: -EAGAIN means the recording
	 * could not be made and the step must be run again with key 0.
	 */
	int (*step_begin)(struct backend *b, uint64_t shape_key);
	int (*step_end)(struct backend *b, int rc);

	/*
	 * What only some architectures use. A backend may leave one NULL:
	 * the engine then refuses a model that needs it, by name, at load.
	 */
	/* x (n, dim) += bias (dim,), the same bias on every row (Qwen2's Q/K/V) */
	int (*add_bias)(struct backend *b, float *x, const float *bias, uint32_t n, uint32_t dim);
	/* x (n, dim) *= s (Gemma's embedding scale) */
	int (*scale)(struct backend *b, float *x, float s, uint32_t n, uint32_t dim);
	/* x (n, dim) = cap * tanh(x / cap) (Gemma 2's final logits) */
	int (*softcap)(struct backend *b, float *x, float cap, uint32_t n, uint32_t dim);
	/* out (n, dim) = gelu(gate) * up, GELU's tanh form (Gemma);  out may alias gate */
	int (*geglu)(struct backend *b, float *out, const float *gate, const float *up,
		     uint32_t n, uint32_t dim);
};

struct backend {
	const struct backend_ops *ops;
	uint32_t n_threads;
	int host_mem;		/* 1: backend buffers are host memory, host pointers may be passed */
};

/* The CPU backend: n_threads 0 = one per online core. */
int backend_cpu_create(struct backend **out, uint32_t n_threads);

/*
 * The exact reference backend (kernels/ref): weights dequantized to f32,
 * activations never quantized, every sum in f64; slow, and what the fast
 * kernels are measured against. n_threads is ignored: it runs on one.
 */
int backend_ref_create(struct backend **out, uint32_t n_threads);

/*
 * The CUDA backend on device dev, from its shared object (below). -ENODEV
 * when there is no usable device, -ELIBACC when the object cannot be
 * loaded, -ENOSYS when kvd was built without CUDA; why receives the reason.
 */
int backend_cuda_create(struct backend **out, int dev, char *why, size_t whylen);

/*
 * The CUDA backend is a shared object of its own, libkvd-cuda.so, so that
 * kvd links no CUDA library and one kvd binary runs with or without them.
 * The object exports one function, KB_CUDA_ENTRY, returning this table.
 * Bump KB_CUDA_ABI, and with it the entry's name, whenever anything in this
 * header changes layout or meaning: an object built against another
 * version then lacks the symbol and is refused by name.
 */
#define KB_CUDA_ABI 2
#define KB_CUDA_ENTRY kvd_cuda_backend_v2
#define KB_CUDA_SONAME "libkvd-cuda.so"
#define KB_STR_(x) #x
#define KB_STR(x) KB_STR_(x)
#define KB_CUDA_ENTRY_NAME KB_STR(KB_CUDA_ENTRY)

struct kb_cuda_api {
	uint32_t abi;		/* KB_CUDA_ABI of the object's build */
	uint32_t ops_size;	/* sizeof(struct backend_ops) there */
	int (*devices)(char *why, size_t whylen);
	int (*create)(struct backend **out, int dev, char *why, size_t whylen);
	/* The kernels' block decoder run on the host, for tests (kernels/cuda/hostcheck.h). */
	int (*host_deq32)(uint32_t type, const void *row, uint32_t k, float *out);
};

const struct kb_cuda_api *KB_CUDA_ENTRY(void);

/*
 * The CUDA backend's object, loaded on the first call and kept for the
 * process's life; NULL when it cannot be, with why saying where it looked
 * and what failed. A program linked with the object (the CUDA tests) uses
 * that copy. Otherwise the first of these directories holding
 * libkvd-cuda.so is used: $KVD_BACKEND_DIR alone when it is set; else the
 * directory of the running binary (build/ in the tree), ../lib/kvd from
 * it (an installed tree, wherever it was moved), and the library
 * directory compiled in (KVD_BACKEND_LIBDIR). path, when not NULL,
 * receives the object's file name.
 */
const struct kb_cuda_api *backend_cuda_load(char *why, size_t whylen, const char **path);

/* KB_BACKEND_REF is only ever chosen by name: auto never picks it. */
enum kb_kind { KB_BACKEND_AUTO, KB_BACKEND_CPU, KB_BACKEND_CUDA, KB_BACKEND_REF };

/* "auto", "cpu", "cuda" or "ref" to kind; -EINVAL for anything else. */
int backend_parse(const char *name, enum kb_kind *out);
/*
 * What a request becomes: auto picks CUDA when it is built in and a device
 * is present, else the CPU; cuda stays cuda (and then fails without one),
 * ref stays ref.
 * why receives the reason in words.
 */
enum kb_kind backend_choose(enum kb_kind want, int cuda_built, int n_devices, char *why,
			    size_t whylen);
/*
 * Create the backend want asks for (see backend_choose); why receives
 * which one and why. -ENODEV when cuda was demanded and none is usable.
 */
int backend_create(struct backend **out, enum kb_kind want, uint32_t n_threads, char *why,
		   size_t whylen);
/* Devices the CUDA runtime sees (0 without one, when the object cannot be loaded, or when built without CUDA). */
int backend_cuda_devices(char *why, size_t whylen);

/* Elements and bytes per block of a type; -EINVAL for an unknown type. */
int kb_type_block(uint32_t type, uint32_t *blk_elems, uint32_t *blk_bytes);
/* "Q4_K", ...; "unknown" for a type kb_type_block() refuses. */
const char *kb_type_name(uint32_t type);

#ifdef __cplusplus
}
#endif
#endif
