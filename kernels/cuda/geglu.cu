/* geglu.cu — gelu(gate) * up, elementwise, GELU through f16 as ggml's CPU table has it. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/geglu.cuh"
#include "kernels/cuda/plan.h"

/*
 * ggml's CPU builds its f32 GELU (GGML_GELU_FP16) from a table over every
 * f16: gate rounded to f16, 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))
 * in f32 on that value, rounded to f16 again; 0 at or below -10 and x
 * itself at or above 10. Computing the same expression here, unfused and in
 * ggml's order, gives the table's entry up to a tanhf ulp, which the final
 * f16 rounding almost always absorbs.
 */
__device__ __forceinline__ float gelu_ggml(float x)
{
	if (x <= -10.0f)
		return 0.0f;
	if (x >= 10.0f)
		return x;
	float h = __half2float(__float2half_rn(x));
	float inner = __fmul_rn(__fmul_rn(0.79788456080286535587989211986876f, h),
				__fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, h), h)));
	float g = __fmul_rn(__fmul_rn(0.5f, h), __fadd_rn(1.0f, tanhf(inner)));
	return __half2float(__float2half_rn(g));
}

__global__ void geglu_kernel(float *out, const float *gate, const float *__restrict__ up, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		out[i] = __fmul_rn(gelu_ggml(gate[i]), up[i]);
}

int cuda_geglu(cudaStream_t s, float *out, const float *gate, const float *up, size_t n)
{
	if (n == 0)
		return 0;
	CUDA_LAUNCH(cuda_plan_blocks(n, 256, 65535), 256, 0, s, geglu_kernel)(out, gate, up, n);
	CK_LAUNCH("geglu");
	return 0;
}
