/* norm.cu — RMSNorm and the residual add: one block per row, fused so the stream is read once. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/plan.h"

#define NORM_THREADS 256

/*
 * Sum of v over the block (NORM_THREADS threads); every thread gets it.
 * Each warp's total goes to part[warp]; then every warp, not warp 0 alone,
 * sums the NORM_THREADS / 32 partials itself, lane i taking part[i]: the
 * same adds in the same order everywhere, so every thread holds the same
 * bits (a butterfly's partners add the same two values) and no broadcast
 * is needed.
 */
__device__ float block_sum(float v)
{
	__shared__ float part[NORM_THREADS / 32];
	const uint32_t lane = threadIdx.x % 32;
	v = warp_sum(v);
	if (lane == 0)
		part[threadIdx.x / 32] = v;
	__syncthreads();
	float t = warp_sum(lane < NORM_THREADS / 32 ? part[lane] : 0.0f);
	__syncthreads();	/* part is reused by the next call */
	return t;
}

/* With y: x += y first (each thread rewrites the elements it later normalises). */
template <bool ADD>
__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(float *__restrict__ out, float *x, const float *__restrict__ y,
	       const float *__restrict__ g, uint32_t dim, float eps)
{
	const size_t o = (size_t)blockIdx.x * dim;
	float ss = 0.0f;
	for (uint32_t i = threadIdx.x; i < dim; i += NORM_THREADS) {
		float v = x[o + i];
		if (ADD) {
			v += y[o + i];
			x[o + i] = v;
		}
		ss += v * v;
	}
	ss = block_sum(ss);
	const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
	for (uint32_t i = threadIdx.x; i < dim; i += NORM_THREADS)
		out[o + i] = x[o + i] * scale * g[i];
}

__global__ void add_kernel(float *x, const float *__restrict__ y, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		x[i] += y[i];
}

int cuda_rmsnorm(cudaStream_t s, float *out, const float *x, const float *g, uint32_t n,
		 uint32_t dim, float eps)
{
	if (n == 0)
		return 0;
	CUDA_LAUNCH(n, NORM_THREADS, 0, s, rmsnorm_kernel<false>)(out, (float *)x, nullptr, g, dim, eps);
	CK_LAUNCH("rmsnorm");
	return 0;
}

int cuda_add_rmsnorm(cudaStream_t s, float *out, float *x, const float *y, const float *g,
		     uint32_t n, uint32_t dim, float eps)
{
	if (n == 0)
		return 0;
	CUDA_LAUNCH(n, NORM_THREADS, 0, s, rmsnorm_kernel<true>)(out, x, y, g, dim, eps);
	CK_LAUNCH("add_rmsnorm");
	return 0;
}

int cuda_add(cudaStream_t s, float *x, const float *y, size_t n)
{
	if (n == 0)
		return 0;
	CUDA_LAUNCH(cuda_plan_blocks(n, 256, 65535), 256, 0, s, add_kernel)(x, y, n);
	CK_LAUNCH("add");
	return 0;
}
