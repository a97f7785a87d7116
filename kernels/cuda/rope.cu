/* rope.cu — rotary position embedding: one thread per rotated pair. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.cuh"

/*
 * The angle of pair i is pos * step^i, advanced by repeated f32 multiplies
 * exactly as the CPU's table is built, and the rotation rounds like the CPU
 * (fma on the first product): the two backends agree to sin/cos ulps.
 */
__global__ void rope_kernel(float *x, const uint32_t *__restrict__ pos, uint32_t n_heads,
			    uint32_t head_dim, uint32_t rot_dim, float step, int neox)
{
	const uint32_t half = rot_dim / 2, r = blockIdx.y;
	for (uint32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < n_heads * half;
	     t += gridDim.x * blockDim.x) {
		uint32_t h = t / half, i = t % half;
		float a = (float)pos[r];
		for (uint32_t j = 0; j < i; j++)
			a = __fmul_rn(a, step);
		float c = cosf(a), sn = sinf(a);
		float *v = x + ((size_t)r * n_heads + h) * head_dim;
		uint32_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
		float x0 = v[ia], x1 = v[ib];
		v[ia] = fmaf(x0, c, -__fmul_rn(x1, sn));
		v[ib] = fmaf(x0, sn, __fmul_rn(x1, c));
	}
}

int cuda_rope(cudaStream_t s, float *x, const uint32_t *pos, uint32_t n, uint32_t n_heads,
	      uint32_t head_dim, uint32_t rot_dim, float step, int neox)
{
	if (n == 0)
		return 0;
	if (rot_dim > head_dim || rot_dim % 2 || n > 65535)
		return -EINVAL;
	uint32_t pairs = n_heads * (rot_dim / 2);
	dim3 grid((pairs + 127) / 128, n);
	rope_kernel<<<grid, 128, 0, s>>>(x, pos, n_heads, head_dim, rot_dim, step, neox);
	CK_LAUNCH("rope");
	return 0;
}
