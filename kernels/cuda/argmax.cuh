/* argmax.cuh — greedy sampling on the device: only token ids leave the GPU. */
#ifndef KVD_CUDA_ARGMAX_CUH
#define KVD_CUDA_ARGMAX_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* ids (n,) device = index of the largest element of each row of x (n, dim); lowest index on ties. */
int cuda_argmax(cudaStream_t s, uint32_t *ids, const float *x, uint32_t n, uint32_t dim);

#endif
