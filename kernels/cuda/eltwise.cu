/* eltwise.cu — bias add, scale and soft-cap: one thread per element, grid-stride. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/eltwise.cuh"
#include "kernels/cuda/plan.h"

__global__ void add_bias_kernel(float *x, const float *__restrict__ bias, uint32_t dim, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		x[i] = __fadd_rn(x[i], bias[i % dim]);
}

__global__ void scale_kernel(float *x, float k, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		x[i] = __fmul_rn(x[i], k);
}

__global__ void softcap_kernel(float *x, float cap, float inv, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		x[i] = __fmul_rn(cap, tanhf(__fmul_rn(x[i], inv)));
}

int cuda_add_bias(cudaStream_t s, float *x, const float *bias, uint32_t n, uint32_t dim)
{
	size_t total = (size_t)n * dim;
	if (total == 0)
		return 0;
	CUDA_LAUNCH(cuda_plan_blocks(total, 256, 65535), 256, 0, s, add_bias_kernel)(x, bias, dim, total);
	CK_LAUNCH("add_bias");
	return 0;
}

int cuda_scale(cudaStream_t s, float *x, float k, size_t n)
{
	if (n == 0)
		return 0;
	CUDA_LAUNCH(cuda_plan_blocks(n, 256, 65535), 256, 0, s, scale_kernel)(x, k, n);
	CK_LAUNCH("scale");
	return 0;
}

int cuda_softcap(cudaStream_t s, float *x, float cap, size_t n)
{
	if (cap == 0.0f)
		return -EINVAL;
	if (n == 0)
		return 0;
	/* 1 / cap once, on the host: ggml scales by that reciprocal rather than dividing. */
	CUDA_LAUNCH(cuda_plan_blocks(n, 256, 65535), 256, 0, s, softcap_kernel)(x, cap, 1.0f / cap, n);
	CK_LAUNCH("softcap");
	return 0;
}
