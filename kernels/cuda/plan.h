/* plan.h — launch decisions of the CUDA backend as plain C functions, unit-tested on any host. */
#ifndef KVD_CUDA_PLAN_H
#define KVD_CUDA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Activation rows up to this go through the mat-vec kernel; more through dequantize + GEMM. */
#define CUDA_MV_MAX_ROWS 16
/* Warps (weight rows) per mat-vec block. */
#define CUDA_MV_WARPS 4
/* Tokens per K/V tile of the attention kernel (one per lane of a warp). */
#define CUDA_ATT_KV_TILE 32
#define CUDA_ATT_WARPS 4
/* Queries (row, head) one attention block holds: 8 per warp, in registers. */
#define CUDA_ATT_QUERIES 32

/*
 * The byte alignment the block decoders (common.cuh deq32) need of every
 * block of type; 0 for a type they do not decode.
 */
uint32_t cuda_plan_block_align(uint32_t type);
/*
 * 0 when the kernels can take a weight of type with cols columns in rows
 * row_bytes apart from address data; -ENOTSUP for a type they do not
 * decode (or kb_type_block() does not know), -EINVAL for a shape or an
 * alignment they cannot read.
 */
int cuda_plan_weight(uint32_t type, uint32_t cols, size_t row_bytes, uintptr_t data);

/* 1: y = x @ W^T for n rows goes through GEMM; 0: through the mat-vec kernel. */
int cuda_plan_use_gemm(uint32_t n, uint32_t type);

struct cuda_mv_plan {
	uint32_t grid_x;	/* blocks, CUDA_MV_WARPS weight rows each */
	uint32_t block;		/* threads */
	uint32_t rows_tmpl;	/* activation rows the kernel is instantiated for: 1, 2, 4, 8 or 16 */
};

/* -EINVAL when cols is not a whole number of 32-element sub-blocks or n is 0 or too large. */
int cuda_plan_matvec(struct cuda_mv_plan *p, uint32_t w_rows, uint32_t cols, uint32_t n);

/*
 * Attention grid: x = tiles x sub-tiles (a tile's rows cut so rows x group
 * queries fit one block), y = KV heads, z = splits of the context. chunk is
 * the tokens of one split (a multiple of CUDA_ATT_KV_TILE).
 */
struct cuda_attn_plan {
	uint32_t group;		/* query heads per KV head */
	uint32_t rows_per_block;
	uint32_t sub;		/* blocks per tile along x */
	uint32_t chunk;
	uint32_t n_splits;
	uint32_t grid_x, grid_y, grid_z;
	size_t smem;		/* dynamic shared memory per block, bytes */
	size_t part_floats;	/* scratch for the split partials */
};

/*
 * n_tiles tiles of at most max_tile_rows rows each; max_ctx = the largest
 * position + 1 of any row; n_sms multiprocessors to fill. -EINVAL for a
 * shape the kernel cannot take (group over CUDA_ATT_QUERIES, head_dim not
 * 64, 96, 128 or 256).
 */
int cuda_plan_attention(struct cuda_attn_plan *p, uint32_t n_tiles, uint32_t max_tile_rows,
			uint32_t max_ctx, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
			uint32_t n_sms);

/* Blocks of threads for n elements, at most max blocks (grid-stride loops cover the rest). */
uint32_t cuda_plan_blocks(size_t n, uint32_t threads, uint32_t max);

#ifdef __cplusplus
}
#endif
#endif
