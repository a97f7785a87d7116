/* gemm.cuh — matrix-matrix product for prefill and large batches through cuBLAS. */
#ifndef KVD_CUDA_GEMM_CUH
#define KVD_CUDA_GEMM_CUH

#include <cublas_v2.h>
#include <stdint.h>

/*
 * y (n, rows) f32 = x (n, cols) @ W^T with W (rows, cols) and x both f16
 * (f16 = 1) or both f32 (f16 = 0), accumulated in f32 on the handle's
 * stream. 0 or -EIO.
 */
int cuda_gemm(cublasHandle_t h, float *y, const void *w, const void *x, uint32_t rows,
	      uint32_t cols, uint32_t n, int f16);

/* Log a failed cuBLAS call; returns -EIO. */
extern "C" int cuda_fail(const char *call, const char *file, int line, const char *what);

#define CKB(call)                                                                         \
	do {                                                                              \
		cublasStatus_t cb_ = (call);                                              \
		if (cb_ != CUBLAS_STATUS_SUCCESS)                                         \
			return cuda_fail(#call, __FILE__, __LINE__, cublasGetStatusString(cb_)); \
	} while (0)

#endif
