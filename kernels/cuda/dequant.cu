/* dequant.cu — GGUF weight rows to f16 for the GEMM path and to f32 for the embedding lookup. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/hostcheck.h"
#include "kernels/cuda/plan.h"

/* One thread per 32-element sub-block: 64 bytes of f16 out in four 16-byte stores. */
template <int T>
__global__ void dequant_f16_kernel(uint4 *__restrict__ out, const uint8_t *__restrict__ w,
				   size_t row_bytes, uint32_t nsub, size_t total)
{
	for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total;
	     t += (size_t)gridDim.x * blockDim.x) {
		size_t r = t / nsub;
		uint32_t k = (uint32_t)(t % nsub);
		float v[32];
		deq32<T>(w + r * row_bytes, k, v);
		uint4 *o = out + t * 4;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			uint32_t p[4];
#pragma unroll
			for (int j = 0; j < 4; j++)
				p[j] = (uint32_t)f2h(v[8 * i + 2 * j]) |
				       (uint32_t)f2h(v[8 * i + 2 * j + 1]) << 16;
			o[i] = make_uint4(p[0], p[1], p[2], p[3]);
		}
	}
}

template <int T>
__global__ void get_rows_kernel(float *__restrict__ out, const uint8_t *__restrict__ w,
				size_t row_bytes, uint32_t rows, uint32_t cols,
				const uint32_t *__restrict__ ids)
{
	const uint32_t r = blockIdx.y, nsub = cols / 32, id = ids[r];
	const uint8_t *src = w + (size_t)id * row_bytes;
	for (uint32_t k = blockIdx.x * blockDim.x + threadIdx.x; k < nsub; k += gridDim.x * blockDim.x) {
		float v[32];
		if (id < rows) {
			deq32<T>(src, k, v);
		} else {	/* never read outside W: a bad id gives NaNs, which nothing mistakes for data */
#pragma unroll
			for (int i = 0; i < 32; i++)
				v[i] = __int_as_float(0x7fc00000);
		}
		float4 *o = (float4 *)(out + (size_t)r * cols + (size_t)k * 32);
#pragma unroll
		for (int i = 0; i < 8; i++)
			o[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
	}
}

__global__ void f32_to_f16_kernel(__half *__restrict__ out, const float *__restrict__ x, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		out[i] = __float2half_rn(x[i]);
}

int cuda_dequant_f16(cudaStream_t s, void *out, const void *w, uint32_t type, uint32_t rows,
		     uint32_t cols, size_t row_bytes)
{
	if (cols % 32)
		return -EINVAL;
	size_t total = (size_t)rows * (cols / 32);
	uint32_t blocks = cuda_plan_blocks(total, 256, 65535);
#define DQ_CALL(T) CUDA_LAUNCH(blocks, 256, 0, s, dequant_f16_kernel<T>)((uint4 *)out, (const uint8_t *)w, \
								  row_bytes, cols / 32, total)
	KB_DISPATCH_TYPE(type, DQ_CALL)
#undef DQ_CALL
	CK_LAUNCH("dequant_f16");
	return 0;
}

int cuda_get_rows(cudaStream_t s, float *out, const void *w, uint32_t type, uint32_t rows,
		  uint32_t cols, size_t row_bytes, const uint32_t *ids, uint32_t n)
{
	if (cols % 32 || n == 0 || n > 65535)
		return n == 0 ? 0 : -EINVAL;
	dim3 grid(cuda_plan_blocks(cols / 32, 64, 64), n);
#define GR_CALL(T) CUDA_LAUNCH(grid, 64, 0, s, get_rows_kernel<T>)(out, (const uint8_t *)w, row_bytes, rows, cols, ids)
	KB_DISPATCH_TYPE(type, GR_CALL)
#undef GR_CALL
	CK_LAUNCH("get_rows");
	return 0;
}

int cuda_f32_to_f16(cudaStream_t s, void *out, const float *x, size_t n)
{
	if (n == 0)
		return 0;
	CUDA_LAUNCH(cuda_plan_blocks(n, 256, 65535), 256, 0, s, f32_to_f16_kernel)((__half *)out, x, n);
	CK_LAUNCH("f32_to_f16");
	return 0;
}

extern "C" int cuda_host_deq32(uint32_t type, const void *row, uint32_t k, float *out)
{
#define HD_CALL(T) deq32<T>((const uint8_t *)row, k, out)
	KB_DISPATCH_TYPE(type, HD_CALL)
#undef HD_CALL
	return 0;
}
