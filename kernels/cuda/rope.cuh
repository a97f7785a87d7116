/* rope.cuh — rotary position embedding, in place, with frequency factors and linear/YaRN scaling. */
#ifndef KVD_CUDA_ROPE_CUH
#define KVD_CUDA_ROPE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/*
 * One layer's rotation as the kernel takes it (struct kb_rope, with what
 * the host computes once: step = theta^(-2 / rot_dim) by the same powf the
 * CPU backend uses, so both walk the same angles, and mscale = attn_factor,
 * times YaRN's 1 + 0.1 ln(1 / freq_scale) when ext_factor is not 0).
 */
struct cuda_rope_args {
	uint32_t rot_dim;
	int neox;
	float step;
	float freq_scale, ext_factor, mscale;
	float corr_lo, corr_hi;
	const float *freq_factors;	/* (rot_dim / 2,) device, or NULL */
};

/* x (n, n_heads, head_dim) rotated in place by pos (n,) (device). */
int cuda_rope(cudaStream_t s, float *x, const uint32_t *pos, uint32_t n, uint32_t n_heads,
	      uint32_t head_dim, const struct cuda_rope_args *a);

#endif
