/* gemm.cu — y = x @ W^T through cuBLAS (tensor cores for f16), f32 accumulation and output. */
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

/*
 * Row-major y (n, rows) is column-major y^T (rows, n) = W x^T: W row-major
 * (rows, cols) is column-major (cols, rows), so it enters transposed with
 * leading dimension cols, and x (n, cols) enters as column-major (cols, n).
 */
int cuda_gemm(cublasHandle_t h, float *y, const void *w, const void *x, uint32_t rows,
	      uint32_t cols, uint32_t n, int f16)
{
	const float one = 1.0f, zero = 0.0f;
	cudaDataType_t t = f16 ? CUDA_R_16F : CUDA_R_32F;
	/* f32 operands stay f32 (no TF32): that path is the f32 reference-accuracy one. */
	cublasComputeType_t ct = CUBLAS_COMPUTE_32F;
	CKB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)cols, &one, w, t,
			 (int)cols, x, t, (int)cols, &zero, y, CUDA_R_32F, (int)rows, ct,
			 CUBLAS_GEMM_DEFAULT));
	return 0;
}
