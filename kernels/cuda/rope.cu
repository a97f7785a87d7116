/* rope.cu — rotary position embedding: one thread per rotated pair. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.cuh"

/*
 * The angle of pair i, as ggml's rope cache computes it: pos * step^i,
 * advanced by repeated f32 multiplies exactly as the CPU's table is built,
 * divided by the pair's frequency factor, then interpolated (freq_scale)
 * and mixed back toward the unscaled angle by YaRN's ramp. Every step is
 * spelled as a rounded intrinsic so nvcc fuses nothing the CPU does not.
 */
__device__ __forceinline__ float rope_angle(const cuda_rope_args &a, float p, uint32_t i)
{
	float te = p;
	for (uint32_t j = 0; j < i; j++)
		te = __fmul_rn(te, a.step);
	if (a.freq_factors)
		te = __fdiv_rn(te, a.freq_factors[i]);
	float t = __fmul_rn(a.freq_scale, te);
	if (a.ext_factor != 0.0f) {
		float y = __fdiv_rn(__fsub_rn((float)i, a.corr_lo),
				    fmaxf(0.001f, __fsub_rn(a.corr_hi, a.corr_lo)));
		float mix = __fmul_rn(1.0f - fminf(1.0f, fmaxf(0.0f, y)), a.ext_factor);
		t = __fadd_rn(__fmul_rn(t, __fsub_rn(1.0f, mix)), __fmul_rn(te, mix));
	}
	return t;
}

/* The rotation rounds like the CPU's (fma on the first product): the backends agree to sin/cos ulps. */
__global__ void rope_kernel(float *x, const uint32_t *__restrict__ pos, uint32_t n_heads,
			    uint32_t head_dim, cuda_rope_args a)
{
	const uint32_t half = a.rot_dim / 2, r = blockIdx.y;
	for (uint32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < n_heads * half;
	     t += gridDim.x * blockDim.x) {
		uint32_t h = t / half, i = t % half;
		float ang = rope_angle(a, (float)pos[r], i);
		float c = __fmul_rn(cosf(ang), a.mscale), sn = __fmul_rn(sinf(ang), a.mscale);
		float *v = x + ((size_t)r * n_heads + h) * head_dim;
		uint32_t ia = a.neox ? i : 2 * i, ib = a.neox ? i + half : 2 * i + 1;
		float x0 = v[ia], x1 = v[ib];
		v[ia] = fmaf(x0, c, -__fmul_rn(x1, sn));
		v[ib] = fmaf(x0, sn, __fmul_rn(x1, c));
	}
}

int cuda_rope(cudaStream_t s, float *x, const uint32_t *pos, uint32_t n, uint32_t n_heads,
	      uint32_t head_dim, const struct cuda_rope_args *a)
{
	if (n == 0 || a->rot_dim == 0)
		return 0;
	if (a->rot_dim > head_dim || a->rot_dim % 2 || n > 65535)
		return -EINVAL;
	uint32_t pairs = n_heads * (a->rot_dim / 2);
	dim3 grid((pairs + 127) / 128, n);
	CUDA_LAUNCH(grid, 128, 0, s, rope_kernel)(x, pos, n_heads, head_dim, *a);
	CK_LAUNCH("rope");
	return 0;
}
