/* dequant.cuh — GGUF weight rows to f16 (for GEMM) or f32 (embedding lookup). */
#ifndef KVD_CUDA_DEQUANT_CUH
#define KVD_CUDA_DEQUANT_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* out (rows, cols) f16 = W dequantized; 0, -ENOTSUP or -EIO. */
int cuda_dequant_f16(cudaStream_t s, void *out, const void *w, uint32_t type, uint32_t rows,
		     uint32_t cols, size_t row_bytes);
/* out (n, cols) f32 = W[ids[i]] dequantized; ids (device) at or above rows give NaN rows. */
int cuda_get_rows(cudaStream_t s, float *out, const void *w, uint32_t type, uint32_t rows,
		  uint32_t cols, size_t row_bytes, const uint32_t *ids, uint32_t n);
/* out (n,) f16 = x (n,) rounded to nearest. */
int cuda_f32_to_f16(cudaStream_t s, void *out, const float *x, size_t n);

#endif
