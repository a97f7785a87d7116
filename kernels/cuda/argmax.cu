/* argmax.cu — one block per logits row, (value, index) pairs reduced with the lower index winning ties. */
#include "kernels/cuda/argmax.cuh"
#include "kernels/cuda/common.cuh"

#define AM_THREADS 512

__device__ __forceinline__ void better(float &v, uint32_t &i, float v2, uint32_t i2)
{
	/* NaN never wins; among equals the lower index does. */
	if (v2 > v || (v2 == v && i2 < i) || (v != v && v2 == v2)) {
		v = v2;
		i = i2;
	}
}

__global__ void __launch_bounds__(AM_THREADS)
argmax_kernel(uint32_t *ids, const float *__restrict__ x, uint32_t dim)
{
	__shared__ float sv[AM_THREADS / 32];
	__shared__ uint32_t si[AM_THREADS / 32];
	const float *row = x + (size_t)blockIdx.x * dim;
	float v = -INFINITY;
	uint32_t idx = UINT32_MAX;
	for (uint32_t i = threadIdx.x; i < dim; i += AM_THREADS)
		better(v, idx, row[i], i);
	for (int o = 16; o > 0; o >>= 1) {
		float v2 = __shfl_xor_sync(0xffffffffu, v, o);
		uint32_t i2 = __shfl_xor_sync(0xffffffffu, idx, o);
		better(v, idx, v2, i2);
	}
	if (threadIdx.x % 32 == 0) {
		sv[threadIdx.x / 32] = v;
		si[threadIdx.x / 32] = idx;
	}
	__syncthreads();
	if (threadIdx.x < 32) {
		v = threadIdx.x < AM_THREADS / 32 ? sv[threadIdx.x] : -INFINITY;
		idx = threadIdx.x < AM_THREADS / 32 ? si[threadIdx.x] : UINT32_MAX;
		for (int o = 16; o > 0; o >>= 1) {
			float v2 = __shfl_xor_sync(0xffffffffu, v, o);
			uint32_t i2 = __shfl_xor_sync(0xffffffffu, idx, o);
			better(v, idx, v2, i2);
		}
		if (threadIdx.x == 0)
			ids[blockIdx.x] = idx == UINT32_MAX ? 0 : idx;
	}
}

int cuda_argmax(cudaStream_t s, uint32_t *ids, const float *x, uint32_t n, uint32_t dim)
{
	if (n == 0)
		return 0;
	if (dim == 0)
		return -EINVAL;
	CUDA_LAUNCH(n, AM_THREADS, 0, s, argmax_kernel)(ids, x, dim);
	CK_LAUNCH("argmax");
	return 0;
}
