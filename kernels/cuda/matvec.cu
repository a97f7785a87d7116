/* matvec.cu — quantized matrix-vector product for decode rows: one warp per weight row. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matvec.cuh"
#include "kernels/cuda/plan.h"

/*
 * Lane l of the warp for weight row r dequantizes sub-blocks l, l + 32, ...
 * of the row and dots each with the same 32 elements of every activation
 * row; the 32 partial sums of each activation row meet in a warp reduction.
 */
template <int T, int R>
__global__ void __launch_bounds__(32 * CUDA_MV_WARPS)
matvec_kernel(float *__restrict__ y, const uint8_t *__restrict__ w, size_t row_bytes,
	      uint32_t rows, uint32_t cols, const float *__restrict__ x, uint32_t n)
{
	const uint32_t lane = threadIdx.x % 32;
	const uint32_t r = blockIdx.x * CUDA_MV_WARPS + threadIdx.x / 32;
	if (r >= rows)
		return;
	const uint8_t *wr = w + (size_t)r * row_bytes;
	const uint32_t nsub = cols / 32;
	float acc[R];
#pragma unroll
	for (int i = 0; i < R; i++)
		acc[i] = 0.0f;
	for (uint32_t k = lane; k < nsub; k += 32) {
		float v[32];
		deq32<T>(wr, k, v);
#pragma unroll
		for (int i = 0; i < R; i++) {
			if (i < (int)n) {
				const float4 *xr = (const float4 *)(x + (size_t)i * cols + (size_t)k * 32);
				float a = 0.0f;
#pragma unroll
				for (int j = 0; j < 8; j++) {
					float4 xv = __ldg(xr + j);
					a += v[4 * j] * xv.x + v[4 * j + 1] * xv.y + v[4 * j + 2] * xv.z +
					     v[4 * j + 3] * xv.w;
				}
				acc[i] += a;
			}
		}
	}
#pragma unroll
	for (int i = 0; i < R; i++) {
		float s = warp_sum(acc[i]);
		if (lane == 0 && i < (int)n)
			y[(size_t)i * rows + r] = s;
	}
}

template <int T>
static int launch(cudaStream_t s, const struct cuda_mv_plan *p, float *y, const void *w,
		  uint32_t rows, uint32_t cols, size_t row_bytes, const float *x, uint32_t n)
{
	const uint8_t *wb = (const uint8_t *)w;
	switch (p->rows_tmpl) {
	case 1: CUDA_LAUNCH(p->grid_x, p->block, 0, s, matvec_kernel<T, 1>)(y, wb, row_bytes, rows, cols, x, n); break;
	case 2: CUDA_LAUNCH(p->grid_x, p->block, 0, s, matvec_kernel<T, 2>)(y, wb, row_bytes, rows, cols, x, n); break;
	case 4: CUDA_LAUNCH(p->grid_x, p->block, 0, s, matvec_kernel<T, 4>)(y, wb, row_bytes, rows, cols, x, n); break;
	case 8: CUDA_LAUNCH(p->grid_x, p->block, 0, s, matvec_kernel<T, 8>)(y, wb, row_bytes, rows, cols, x, n); break;
	case 16: CUDA_LAUNCH(p->grid_x, p->block, 0, s, matvec_kernel<T, 16>)(y, wb, row_bytes, rows, cols, x, n); break;
	default: return -EINVAL;
	}
	CK_LAUNCH("matvec");
	return 0;
}

int cuda_matvec(cudaStream_t s, float *y, const void *w, uint32_t type, uint32_t rows,
		uint32_t cols, size_t row_bytes, const float *x, uint32_t n)
{
	struct cuda_mv_plan p;
	int rc = cuda_plan_matvec(&p, rows, cols, n);
	if (rc)
		return rc;
#define MV_CALL(T) return launch<T>(s, &p, y, w, rows, cols, row_bytes, x, n)
	KB_DISPATCH_TYPE(type, MV_CALL)
#undef MV_CALL
	return -ENOTSUP;
}
