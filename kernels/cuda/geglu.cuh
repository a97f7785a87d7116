/* geglu.cuh — the GeGLU activation (Gemma): GELU's tanh form as ggml's CPU computes it. */
#ifndef KVD_CUDA_GEGLU_CUH
#define KVD_CUDA_GEGLU_CUH

#include <cuda_runtime.h>
#include <stddef.h>

/* out (n,) = gelu(gate) * up; out may alias gate. */
int cuda_geglu(cudaStream_t s, float *out, const float *gate, const float *up, size_t n);

#endif
