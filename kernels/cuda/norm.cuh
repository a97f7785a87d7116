/* norm.cuh — RMSNorm, the residual add, and the two fused (add, then norm, in one pass). */
#ifndef KVD_CUDA_NORM_CUH
#define KVD_CUDA_NORM_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* out (n, dim) = x / sqrt(mean(x^2) + eps) * g; out may alias x. */
int cuda_rmsnorm(cudaStream_t s, float *out, const float *x, const float *g, uint32_t n,
		 uint32_t dim, float eps);
/* x (n, dim) += y, then out = rmsnorm(x) * g; one read of x and y, one write of x and out. */
int cuda_add_rmsnorm(cudaStream_t s, float *out, float *x, const float *y, const float *g,
		     uint32_t n, uint32_t dim, float eps);
/* x (n * dim) += y */
int cuda_add(cudaStream_t s, float *x, const float *y, size_t n);

#endif
