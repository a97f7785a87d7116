/* attention.cu — paged flash-style attention with context splits, and the split merge. */
#include <math.h>
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/common.cuh"

#define KVT CUDA_ATT_KV_TILE
#define QPW (CUDA_ATT_QUERIES / CUDA_ATT_WARPS)	/* queries per warp */

struct att_geo {
	const uint8_t *base;
	size_t block_bytes, k_off, v_off, row_bytes;
	uint32_t shift, mask;
};

/* Eight elements e0 .. e0 + 7 of a cached row (a head's slice) as floats. */
template <int CT>
__device__ __forceinline__ void load8(const uint8_t *row, uint32_t e0, float *o)
{
	if (CT == KB_F16) {
		uint4 u = *(const uint4 *)(row + (size_t)e0 * 2);
		uint32_t w[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
		for (int j = 0; j < 4; j++) {
			o[2 * j] = h2f((uint16_t)(w[j] & 0xffff));
			o[2 * j + 1] = h2f((uint16_t)(w[j] >> 16));
		}
	} else if (CT == KB_F32) {
		const float4 *f = (const float4 *)(row + (size_t)e0 * 4);
		float4 a = f[0], b = f[1];
		o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w;
		o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
	} else {
		const uint8_t *blk = row + (size_t)(e0 / 32) * 34;
		float d = h2f(*(const uint16_t *)blk);
		uint32_t lo = ld_u32_a2(blk + 2 + e0 % 32), hi = ld_u32_a2(blk + 6 + e0 % 32);
#pragma unroll
		for (int j = 0; j < 4; j++) {
			o[j] = d * (float)(int8_t)((lo >> (8 * j)) & 0xff);
			o[4 + j] = d * (float)(int8_t)((hi >> (8 * j)) & 0xff);
		}
	}
}

template <int HD, int CT>
__global__ void __launch_bounds__(32 * CUDA_ATT_WARPS)
attn_partial_kernel(const float *__restrict__ q, att_geo g, const uint32_t *__restrict__ tables,
		    const uint32_t *__restrict__ tab_off, const uint32_t *__restrict__ pos,
		    const uint32_t *__restrict__ tiles, uint32_t sub, uint32_t rpb, uint32_t group,
		    uint32_t n_heads, uint32_t chunk, float scale, float cap, uint32_t window,
		    float *__restrict__ part_ml,
		    float *__restrict__ part_acc, size_t slots)
{
	CUDA_DYN_SHARED(float, smem);
	float *sq = smem;					/* (QUERIES, HD) */
	float *sk = sq + CUDA_ATT_QUERIES * HD;			/* (KVT, HD + 1) */
	float *sv = sk + KVT * (HD + 1);			/* (KVT, HD) */

	const uint32_t tile = blockIdx.x / sub, si = blockIdx.x % sub, kvh = blockIdx.y;
	const uint32_t t_rows = tiles[2 * tile + 1];
	if (si * rpb >= t_rows)
		return;
	const uint32_t r0 = tiles[2 * tile] + si * rpb;
	const uint32_t nr = min(rpb, t_rows - si * rpb), nq = nr * group;
	const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const uint32_t *table = tables + tab_off[r0];
	uint32_t maxp = 0, minp = 0xffffffffu;
	for (uint32_t r = 0; r < nr; r++) {
		maxp = max(maxp, pos[r0 + r]);
		minp = min(minp, pos[r0 + r]);
	}
	const uint32_t t0 = blockIdx.z * chunk, t1 = min(t0 + chunk, maxp + 1);
	/*
	 * Tiles wholly before every row's window are never loaded: a tile a
	 * query sees nothing of leaves its state untouched, so skipping one
	 * changes no result.
	 */
	const uint32_t lo = window && minp >= window ? (minp - window + 1) / KVT * KVT : 0;
	const uint32_t tstart = max(t0, lo);
	const float inv_cap = cap != 0.0f ? 1.0f / cap : 0.0f;
	const size_t slot0 = (((size_t)blockIdx.x * gridDim.y + kvh) * gridDim.z + blockIdx.z) *
			     CUDA_ATT_QUERIES;

	float m[QPW], l[QPW], acc[QPW][HD / 32];
	uint32_t qpos[QPW];
#pragma unroll
	for (int j = 0; j < QPW; j++) {
		m[j] = -INFINITY;
		l[j] = 0.0f;
		uint32_t qi = warp + CUDA_ATT_WARPS * j;
		qpos[j] = qi < nq ? pos[r0 + qi / group] : 0;
#pragma unroll
		for (int i = 0; i < HD / 32; i++)
			acc[j][i] = 0.0f;
	}

	if (t0 < t1) {
		for (uint32_t e = threadIdx.x; e < nq * HD; e += blockDim.x) {
			uint32_t qi = e / HD, d = e % HD;
			float x = q[((size_t)(r0 + qi / group) * n_heads + kvh * group + qi % group) * HD + d];
			sq[qi * HD + d] = CT == KB_F16 ? __half2float(__float2half_rn(x)) : x;
		}
		for (uint32_t tb = tstart; tb < t1; tb += KVT) {
			__syncthreads();	/* q is staged; the previous tile is consumed */
			for (uint32_t u = threadIdx.x; u < KVT * HD / 8; u += blockDim.x) {
				uint32_t t = u / (HD / 8), e0 = (u % (HD / 8)) * 8, p = tb + t;
				float kx[8], vx[8];
				if (p < t1) {
					const uint8_t *blk = g.base + (size_t)table[p >> g.shift] * g.block_bytes +
							     (size_t)(p & g.mask) * g.row_bytes;
					load8<CT>(blk + g.k_off, kvh * HD + e0, kx);
					load8<CT>(blk + g.v_off, kvh * HD + e0, vx);
				} else {
#pragma unroll
					for (int j = 0; j < 8; j++)
						kx[j] = vx[j] = 0.0f;
				}
#pragma unroll
				for (int j = 0; j < 8; j++) {
					sk[t * (HD + 1) + e0 + j] = kx[j];
					sv[t * HD + e0 + j] = vx[j];
				}
			}
			__syncthreads();
			const uint32_t p = tb + lane;
#pragma unroll
			for (int j = 0; j < QPW; j++) {
				uint32_t qi = warp + CUDA_ATT_WARPS * j;
				if (qi >= nq)
					break;
				float s = -INFINITY;
				if (p < t1 && p <= qpos[j] && (!window || qpos[j] - p < window)) {
					const float *qv = sq + qi * HD, *kv = sk + lane * (HD + 1);
					float a = 0.0f;
#pragma unroll 16
					for (int d = 0; d < HD; d++)
						a = fmaf(qv[d], kv[d], a);
					/*
					 * Gemma 2's soft-cap on the raw q.k, then the scale, as
					 * the CPU and llama.cpp's graph (the engine pre-scales Q
					 * and passes scale 1 there, so the order is moot for it).
					 */
					if (cap != 0.0f)
						a = __fmul_rn(tanhf(__fmul_rn(a, inv_cap)), cap);
					s = __fmul_rn(a, scale);
				}
				float tmax = warp_max(s);
				if (tmax == -INFINITY)
					continue;	/* nothing this query may see in the tile */
				float mn = fmaxf(m[j], tmax);
				float alpha = expf(m[j] - mn);	/* 0 while m is still -inf */
				float pr = s == -INFINITY ? 0.0f : expf(s - mn);
				l[j] = l[j] * alpha + warp_sum(pr);
#pragma unroll
				for (int i = 0; i < HD / 32; i++)
					acc[j][i] *= alpha;
				for (int t = 0; t < KVT; t++) {
					float pt = __shfl_sync(0xffffffffu, pr, t);
#pragma unroll
					for (int i = 0; i < HD / 32; i++)
						acc[j][i] = fmaf(pt, sv[t * HD + lane + 32 * i], acc[j][i]);
				}
				m[j] = mn;
			}
		}
	}
#pragma unroll
	for (int j = 0; j < QPW; j++) {
		uint32_t qi = warp + CUDA_ATT_WARPS * j;
		if (qi >= nq)
			break;
		size_t sl = slot0 + qi;
		if (lane == 0) {
			part_ml[2 * sl] = m[j];
			part_ml[2 * sl + 1] = l[j];
		}
#pragma unroll
		for (int i = 0; i < HD / 32; i++)
			part_acc[sl * HD + lane + 32 * i] = acc[j][i];
	}
	(void)slots;
}

/* One block per (block of the first kernel, KV head): merge every split of its queries. */
template <int HD>
__global__ void attn_merge_kernel(float *__restrict__ out, const uint32_t *__restrict__ tiles,
				  uint32_t sub, uint32_t rpb, uint32_t group, uint32_t n_heads,
				  uint32_t n_splits, const float *__restrict__ part_ml,
				  const float *__restrict__ part_acc)
{
	const uint32_t tile = blockIdx.x / sub, si = blockIdx.x % sub, kvh = blockIdx.y;
	const uint32_t t_rows = tiles[2 * tile + 1];
	if (si * rpb >= t_rows)
		return;
	const uint32_t r0 = tiles[2 * tile] + si * rpb;
	const uint32_t nq = min(rpb, t_rows - si * rpb) * group;
	const size_t base = ((size_t)blockIdx.x * gridDim.y + kvh) * n_splits;
	for (uint32_t qi = 0; qi < nq; qi++) {
		float mx = -INFINITY;
		for (uint32_t z = 0; z < n_splits; z++)
			mx = fmaxf(mx, part_ml[2 * ((base + z) * CUDA_ATT_QUERIES + qi)]);
		for (uint32_t d = threadIdx.x; d < HD; d += blockDim.x) {
			float lsum = 0.0f, o = 0.0f;
			for (uint32_t z = 0; z < n_splits; z++) {
				size_t sl = (base + z) * CUDA_ATT_QUERIES + qi;
				float mz = part_ml[2 * sl];
				if (mz == -INFINITY)
					continue;
				float w = expf(mz - mx);
				lsum = fmaf(part_ml[2 * sl + 1], w, lsum);
				o = fmaf(part_acc[sl * HD + d], w, o);
			}
			out[((size_t)(r0 + qi / group) * n_heads + kvh * group + qi % group) * HD + d] =
				lsum > 0.0f ? o / lsum : 0.0f;
		}
	}
}

template <int HD, int CT>
static int launch(cudaStream_t s, const struct cuda_attn_plan *p, float *out, const float *q,
		  const struct kb_kv_rows *kv, const uint32_t *pos, const struct kb_attn_shape *sh,
		  float *part)
{
	const struct kb_kv_view *v = &kv->geo;
	att_geo g = { v->base, v->block_bytes, v->k_off, v->v_off, v->row_bytes,
		      (uint32_t)__builtin_ctz(v->block_tokens), v->block_tokens - 1 };
	size_t slots = (size_t)p->grid_x * p->grid_y * p->grid_z * CUDA_ATT_QUERIES;
	dim3 grid(p->grid_x, p->grid_y, p->grid_z);
	CUDA_LAUNCH(grid, 32 * CUDA_ATT_WARPS, p->smem, s, attn_partial_kernel<HD, CT>)(
		q, g, kv->tables, kv->tab_off, pos, kv->tiles, p->sub, p->rows_per_block, p->group,
		sh->n_heads, p->chunk, sh->scale, sh->softcap, sh->window, part, part + 2 * slots,
		slots);
	CK_LAUNCH("attention");
	CUDA_LAUNCH(dim3(p->grid_x, p->grid_y), HD, 0, s, attn_merge_kernel<HD>)(
		out, kv->tiles, p->sub, p->rows_per_block, p->group, sh->n_heads, p->n_splits, part,
		part + 2 * slots);
	CK_LAUNCH("attention merge");
	return 0;
}

template <int HD>
static int launch_hd(cudaStream_t s, const struct cuda_attn_plan *p, float *out, const float *q,
		     const struct kb_kv_rows *kv, const uint32_t *pos,
		     const struct kb_attn_shape *sh, float *part)
{
	switch (kv->geo.type) {
	case KB_F16: return launch<HD, KB_F16>(s, p, out, q, kv, pos, sh, part);
	case KB_F32: return launch<HD, KB_F32>(s, p, out, q, kv, pos, sh, part);
	case KB_Q8_0: return launch<HD, KB_Q8_0>(s, p, out, q, kv, pos, sh, part);
	default: return -ENOTSUP;
	}
}

int cuda_attention(cudaStream_t s, const struct cuda_attn_plan *p, float *out, const float *q,
		   const struct kb_kv_rows *kv, const uint32_t *pos,
		   const struct kb_attn_shape *sh, float *part)
{
	switch (sh->head_dim) {
	case 64: return launch_hd<64>(s, p, out, q, kv, pos, sh, part);
	case 96: return launch_hd<96>(s, p, out, q, kv, pos, sh, part);
	case 128: return launch_hd<128>(s, p, out, q, kv, pos, sh, part);
	case 256: return launch_hd<256>(s, p, out, q, kv, pos, sh, part);
	default: return -EINVAL;
	}
}

template <int HD, int CT>
static int set_smem(void)
{
	int bytes = (int)(sizeof(float) * ((size_t)CUDA_ATT_QUERIES * HD + (size_t)KVT * (HD + 1) +
					    (size_t)KVT * HD));
	CK(cudaFuncSetAttribute(attn_partial_kernel<HD, CT>,
				cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
	return 0;
}

template <int HD>
static int set_smem_hd(void)
{
	int rc = set_smem<HD, KB_F16>();
	if (!rc)
		rc = set_smem<HD, KB_F32>();
	if (!rc)
		rc = set_smem<HD, KB_Q8_0>();
	return rc;
}

int cuda_attention_init(void)
{
	int rc = set_smem_hd<64>();
	if (!rc)
		rc = set_smem_hd<96>();
	if (!rc)
		rc = set_smem_hd<128>();
	if (!rc)
		rc = set_smem_hd<256>();
	return rc;
}
