/* hostcheck.h — host entry points into the CUDA backend's device code, for tests on machines without a GPU. */
#ifndef KVD_CUDA_HOSTCHECK_H
#define KVD_CUDA_HOSTCHECK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * out (32,) = sub-block k of a weight row in GGUF type, decoded on the host
 * by the very code the kernels run (kernels/cuda/common.cuh deq32).
 * -ENOTSUP for a type the kernels do not take. Built only with nvcc.
 */
int cuda_host_deq32(uint32_t type, const void *row, uint32_t k, float *out);

#ifdef __cplusplus
}
#endif
#endif
