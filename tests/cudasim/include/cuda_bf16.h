/* cuda_bf16.h — the cudasim's: kernels/cuda decodes bf16 from its bits itself and needs no type from here. */
#ifndef KVD_CUDASIM_BF16_H
#define KVD_CUDASIM_BF16_H
#endif
