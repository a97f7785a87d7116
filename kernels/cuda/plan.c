/* plan.c — launch decisions of the CUDA backend: grid, block and split sizes from the shapes. */
#include <errno.h>
#include "kernels/backend.h"
#include "kernels/cuda/plan.h"

uint32_t cuda_plan_block_align(uint32_t type)
{
	switch (type) {
	case KB_F32:
	case KB_F16:
	case KB_BF16:
		return 16;	/* a 32-element run in 16-byte vector loads */
	case KB_Q4_1:
	case KB_Q5_1:
	case KB_Q2_K:
	case KB_Q4_K:
	case KB_Q5_K:
	case KB_IQ4_XS:
		return 4;	/* blocks of a multiple of 4 bytes, quants read as words */
	case KB_Q4_0:
	case KB_Q5_0:
	case KB_Q8_0:
	case KB_Q3_K:
	case KB_Q6_K:
	case KB_IQ4_NL:
		return 2;	/* 18-, 22-, 34-, 110- and 210-byte blocks: words read as two halves */
	default:
		return 0;
	}
}

int cuda_plan_weight(uint32_t type, uint32_t cols, size_t row_bytes, uintptr_t data)
{
	uint32_t align = cuda_plan_block_align(type), be, bb;
	if (!align || kb_type_block(type, &be, &bb))
		return -ENOTSUP;
	if (cols == 0 || cols % 32 || cols % be || row_bytes < (size_t)cols / be * bb)
		return -EINVAL;
	if (row_bytes % align || data % align)
		return -EINVAL;
	return 0;
}

int cuda_plan_use_gemm(uint32_t n, uint32_t type)
{
	(void)type;
	/*
	 * Up to 16 rows a decode step is bound by reading the weights once in
	 * their block format; past that the GEMM's tensor cores win even after
	 * paying a pass to dequantize the weight to f16.
	 */
	return n > CUDA_MV_MAX_ROWS;
}

int cuda_plan_matvec(struct cuda_mv_plan *p, uint32_t w_rows, uint32_t cols, uint32_t n)
{
	if (n == 0 || n > CUDA_MV_MAX_ROWS || cols == 0 || cols % 32 || w_rows == 0)
		return -EINVAL;
	p->block = 32 * CUDA_MV_WARPS;
	p->grid_x = (w_rows + CUDA_MV_WARPS - 1) / CUDA_MV_WARPS;
	p->rows_tmpl = 1;
	while (p->rows_tmpl < n)
		p->rows_tmpl *= 2;
	return 0;
}

int cuda_plan_attention(struct cuda_attn_plan *p, uint32_t n_tiles, uint32_t max_tile_rows,
			uint32_t max_ctx, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
			uint32_t n_sms)
{
	if (!n_tiles || !max_tile_rows || max_tile_rows > KB_TILE_ROWS || !max_ctx ||
	    !n_kv_heads || n_heads % n_kv_heads)
		return -EINVAL;
	if (head_dim != 64 && head_dim != 96 && head_dim != 128 && head_dim != 256)
		return -EINVAL;
	uint32_t g = n_heads / n_kv_heads;
	if (g > CUDA_ATT_QUERIES)
		return -EINVAL;
	p->group = g;
	p->rows_per_block = CUDA_ATT_QUERIES / g;
	if (p->rows_per_block > max_tile_rows)
		p->rows_per_block = max_tile_rows;
	p->sub = (max_tile_rows + p->rows_per_block - 1) / p->rows_per_block;
	p->grid_x = n_tiles * p->sub;
	p->grid_y = n_kv_heads;

	/*
	 * Split the context until the grid has about eight blocks per SM (what
	 * fits resident), so a few long sequences still keep every SM reading;
	 * never below one K/V tile per split.
	 */
	uint64_t base = (uint64_t)p->grid_x * p->grid_y, want = (uint64_t)(n_sms ? n_sms : 1) * 8;
	uint32_t tiles_ctx = (max_ctx + CUDA_ATT_KV_TILE - 1) / CUDA_ATT_KV_TILE;
	uint32_t splits = base >= want ? 1 : (uint32_t)((want + base - 1) / base);
	if (splits > tiles_ctx)
		splits = tiles_ctx;
	uint32_t chunk_tiles = (tiles_ctx + splits - 1) / splits;
	p->chunk = chunk_tiles * CUDA_ATT_KV_TILE;
	p->n_splits = (tiles_ctx + chunk_tiles - 1) / chunk_tiles;
	p->grid_z = p->n_splits;

	/* q (queries, hd), K tile (tile, hd + 1: no bank conflicts across lanes), V tile (tile, hd). */
	p->smem = sizeof(float) * ((size_t)CUDA_ATT_QUERIES * head_dim +
				   (size_t)CUDA_ATT_KV_TILE * (head_dim + 1) +
				   (size_t)CUDA_ATT_KV_TILE * head_dim);
	p->part_floats = (size_t)p->grid_x * p->grid_y * p->grid_z * CUDA_ATT_QUERIES *
			 (head_dim + 2);
	return 0;
}

uint32_t cuda_plan_blocks(size_t n, uint32_t threads, uint32_t max)
{
	size_t b = (n + threads - 1) / threads;
	if (b == 0)
		b = 1;
	return b > max ? max : (uint32_t)b;
}
