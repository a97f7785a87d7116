/* eltwise.cuh — the element-wise row ops only some architectures use: bias, scale, soft-cap. */
#ifndef KVD_CUDA_ELTWISE_CUH
#define KVD_CUDA_ELTWISE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* x (n, dim) += bias (dim,) on every row. */
int cuda_add_bias(cudaStream_t s, float *x, const float *bias, uint32_t n, uint32_t dim);
/* x (n,) *= k */
int cuda_scale(cudaStream_t s, float *x, float k, size_t n);
/* x (n,) = cap * tanh(x * (1 / cap)), as ggml's scale, tanh, scale chain; cap != 0. */
int cuda_softcap(cudaStream_t s, float *x, float cap, size_t n);

#endif
