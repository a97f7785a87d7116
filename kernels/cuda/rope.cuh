/* rope.cuh — rotary position embedding, in place. */
#ifndef KVD_CUDA_ROPE_CUH
#define KVD_CUDA_ROPE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/*
 * x (n, n_heads, head_dim) rotated in place by pos (n,) (device); step =
 * theta^(-2 / rot_dim), computed by the caller on the host with the same
 * powf the CPU backend uses so both walk the same angles.
 */
int cuda_rope(cudaStream_t s, float *x, const uint32_t *pos, uint32_t n, uint32_t n_heads,
	      uint32_t head_dim, uint32_t rot_dim, float step, int neox);

#endif
