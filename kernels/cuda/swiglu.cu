/* swiglu.cu — silu(gate) * up, elementwise, four elements per thread when aligned. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/plan.h"
#include "kernels/cuda/swiglu.cuh"

__device__ __forceinline__ float silu_mul(float g, float u)
{
	return g / (1.0f + expf(-g)) * u;
}

__global__ void swiglu_kernel(float *out, const float *gate, const float *__restrict__ up, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		out[i] = silu_mul(gate[i], up[i]);
}

__global__ void swiglu4_kernel(float4 *out, const float4 *gate, const float4 *__restrict__ up,
			       size_t n4)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
	     i += (size_t)gridDim.x * blockDim.x) {
		float4 g = gate[i], u = up[i];
		out[i] = make_float4(silu_mul(g.x, u.x), silu_mul(g.y, u.y), silu_mul(g.z, u.z),
				     silu_mul(g.w, u.w));
	}
}

int cuda_swiglu(cudaStream_t s, float *out, const float *gate, const float *up, size_t n)
{
	if (n == 0)
		return 0;
	if (n % 4 == 0 && !(((uintptr_t)out | (uintptr_t)gate | (uintptr_t)up) & 15))
		CUDA_LAUNCH(cuda_plan_blocks(n / 4, 256, 65535), 256, 0, s, swiglu4_kernel)(
			(float4 *)out, (const float4 *)gate, (const float4 *)up, n / 4);
	else
		CUDA_LAUNCH(cuda_plan_blocks(n, 256, 65535), 256, 0, s, swiglu_kernel)(out, gate, up, n);
	CK_LAUNCH("swiglu");
	return 0;
}
