/* kvcache.cuh — storing K/V rows into the paged cache on the device. */
#ifndef KVD_CUDA_KVCACHE_CUH
#define KVD_CUDA_KVCACHE_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include "kernels/backend.h"

/*
 * Store k, v (n, kv_dim) at positions pos (n,) of each row's sequence (see
 * kb_kv_rows; every pointer in kv and pos on the device), converted to the
 * cache type: f32 copied, f16 rounded to nearest even, q8_0 quantized per
 * 32 elements as the CPU does it (bit for bit). The caller has checked the
 * positions against the tables.
 */
int cuda_write_kv(cudaStream_t s, const struct kb_kv_rows *kv, const uint32_t *pos, uint32_t n,
		  uint32_t kv_dim, const float *k, const float *v);

#endif
