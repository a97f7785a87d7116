/* matvec.cuh — quantized matrix-vector product for decode rows (a few activation rows). */
#ifndef KVD_CUDA_MATVEC_CUH
#define KVD_CUDA_MATVEC_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/*
 * y (n, rows) = x (n, cols) @ W^T, W (rows, row_bytes) in GGUF format type,
 * n <= CUDA_MV_MAX_ROWS. One warp per weight row; each lane takes whole
 * 32-element sub-blocks, so a warp reads a run of consecutive blocks
 * (16 bytes of quants per lane for 4-bit types). Returns 0, -EINVAL,
 * -ENOTSUP or -EIO.
 */
int cuda_matvec(cudaStream_t s, float *y, const void *w, uint32_t type, uint32_t rows,
		uint32_t cols, size_t row_bytes, const float *x, uint32_t n);

#endif
