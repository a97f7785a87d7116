/* swiglu.cuh — the SwiGLU activation. */
#ifndef KVD_CUDA_SWIGLU_CUH
#define KVD_CUDA_SWIGLU_CUH

#include <cuda_runtime.h>
#include <stddef.h>

/* out (n,) = silu(gate) * up; out may alias gate. */
int cuda_swiglu(cudaStream_t s, float *out, const float *gate, const float *up, size_t n);

#endif
