/* kvcache.cu — K/V rows into their sequences' blocks: one block per row, f32, f16 or q8_0. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kvcache.cuh"

struct kv_geo {
	uint8_t *base;
	size_t block_bytes, k_off, v_off, row_bytes;
	uint32_t shift, mask;
};

__device__ __forceinline__ uint8_t *kv_row(const kv_geo &g, const uint32_t *table, uint32_t p,
					    int which)
{
	return g.base + (size_t)table[p >> g.shift] * g.block_bytes + (which ? g.v_off : g.k_off) +
	       (size_t)(p & g.mask) * g.row_bytes;
}

template <int T>
__global__ void write_kv_kernel(kv_geo g, const uint32_t *__restrict__ tables,
				const uint32_t *__restrict__ tab_off, const uint32_t *__restrict__ pos,
				uint32_t kv_dim, const float *__restrict__ k,
				const float *__restrict__ v)
{
	const uint32_t r = blockIdx.x;
	const uint32_t *table = tables + tab_off[r];
	const uint32_t p = pos[r];
	for (int which = 0; which < 2; which++) {
		const float *src = (which ? v : k) + (size_t)r * kv_dim;
		uint8_t *dst = kv_row(g, table, p, which);
		if (T == KB_F32) {
			for (uint32_t i = threadIdx.x; i < kv_dim; i += blockDim.x)
				((float *)dst)[i] = src[i];
		} else if (T == KB_F16) {
			for (uint32_t i = threadIdx.x; i < kv_dim; i += blockDim.x)
				((uint16_t *)dst)[i] = f2h(src[i]);
		} else {
			/* One warp per 32-element block: amax, then d = amax / 127 as an f16. */
			const uint32_t lane = threadIdx.x % 32, nw = blockDim.x / 32;
			for (uint32_t b = threadIdx.x / 32; b < kv_dim / 32; b += nw) {
				float x = src[b * 32 + lane];
				float amax = warp_max(fabsf(x));
				float id = amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
				uint8_t *blk = dst + (size_t)b * 34;
				if (lane == 0)
					*(uint16_t *)blk = f2h(__fdiv_rn(amax, 127.0f));
				blk[2 + lane] = (uint8_t)(int8_t)__float2int_rn(__fmul_rn(x, id));
			}
		}
	}
}

int cuda_write_kv(cudaStream_t s, const struct kb_kv_rows *kv, const uint32_t *pos, uint32_t n,
		  uint32_t kv_dim, const float *k, const float *v)
{
	if (n == 0)
		return 0;
	const struct kb_kv_view *gv = &kv->geo;
	kv_geo g = { gv->base, gv->block_bytes, gv->k_off, gv->v_off, gv->row_bytes,
		     (uint32_t)__builtin_ctz(gv->block_tokens), gv->block_tokens - 1 };
	switch (gv->type) {
	case KB_F32:
		CUDA_LAUNCH(n, 128, 0, s, write_kv_kernel<KB_F32>)(g, kv->tables, kv->tab_off, pos, kv_dim, k, v);
		break;
	case KB_F16:
		CUDA_LAUNCH(n, 128, 0, s, write_kv_kernel<KB_F16>)(g, kv->tables, kv->tab_off, pos, kv_dim, k, v);
		break;
	case KB_Q8_0:
		if (kv_dim % 32)
			return -EINVAL;
		CUDA_LAUNCH(n, 128, 0, s, write_kv_kernel<KB_Q8_0>)(g, kv->tables, kv->tab_off, pos, kv_dim, k, v);
		break;
	default:
		return -ENOTSUP;
	}
	CK_LAUNCH("write_kv");
	return 0;
}
