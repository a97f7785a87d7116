/* deq.h — the reference backend's own decoders of the GGUF block formats and half floats. */
#ifndef KVD_REF_DEQ_H
#define KVD_REF_DEQ_H

#include <stddef.h>
#include <stdint.h>

/*
 * Written from the ggml block layouts alone, sharing nothing with
 * kernels/cpu, so that the fast kernels are checked against an independent
 * reading of the formats. Each value is computed exactly in double and
 * rounded once to the nearest f32.
 */

/* The exact value of an IEEE binary16 (inf and nan carried through). */
double ref_f16_to_f64(uint16_t h);
/* The exact value of a bfloat16. */
double ref_bf16_to_f64(uint16_t h);
/* f rounded to the nearest binary16, ties to even; overflow to inf. */
uint16_t ref_f32_to_f16(float f);

/*
 * y (n,) = the n elements of a row of type starting at row; n a multiple
 * of the type's block. -ENOTSUP for a type not in enum kb_type, -EINVAL
 * for a length that is not whole blocks.
 */
int ref_dequantize_row(uint32_t type, const void *row, float *y, size_t n);

/*
 * x (n,) as q8_0 blocks (f16 d = max|x| / 127, q = round(x / d)), as
 * ggml's reference quantize_row_q8_0 writes them: the one quantizer the
 * reference backend has, for a KV cache the user asked to be q8_0.
 */
void ref_quantize_q8_0(uint8_t *dst, const float *x, size_t n);

#endif
