/* quant.c — scalar reference of the block formats: (de)quantization and unpacking. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include "kernels/backend.h"
#include "kernels/cpu/quant.h"

uint16_t f32_to_fp16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint16_t sign = (x >> 16) & 0x8000;
	uint32_t ax = x & 0x7fffffffu;
	if (ax >= 0x7f800000u)	/* inf or nan */
		return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);
	if (ax >= 0x477ff000u)	/* rounds to >= 65520: overflow */
		return sign | 0x7c00;
	if (ax < 0x38800000u) {	/* below the smallest normal half: subnormal */
		if (ax < 0x33000000u)
			return sign;
		uint32_t e = ax >> 23;
		uint32_t m = (ax & 0x7fffff) | 0x800000;
		uint32_t shift = 126 - e;	/* 14 + (113 - e) */
		uint32_t half = m >> shift;
		uint32_t rem = m & ((1u << shift) - 1);
		uint32_t mid = 1u << (shift - 1);
		if (rem > mid || (rem == mid && (half & 1)))
			half++;
		return sign | (uint16_t)half;
	}
	uint32_t r = ax + 0xfff + ((ax >> 13) & 1);	/* round to nearest even */
	return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

float bf16_to_f32(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

int type_is_quantized(uint32_t type)
{
	return type == KB_Q4_0 || type == KB_Q4_1 || type == KB_Q8_0 ||
	       type == KB_Q4_K || type == KB_Q6_K;
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block. */
void q4k_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*m = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
		*m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
	}
}

/*
 * Q6_K stores a 256-element super-block as two halves of 128; within a half,
 * element l + 32*g (l < 32, g < 4) takes ql's low/high nibble and 2 bits of
 * qh[l]. This returns the 6-bit value (0..63) of element i of the super-block.
 */
static inline int q6k_value(const struct blk_q6_k *b, int i)
{
	int half = i / 128, r = i % 128, g = r / 32, l = r % 32;
	const uint8_t *ql = b->ql + 64 * half;
	const uint8_t *qh = b->qh + 32 * half;
	int lo = (g & 1) ? ql[l + 32] : ql[l];
	lo = (g & 2) ? lo >> 4 : lo & 0xf;
	int hi = (qh[l] >> (2 * g)) & 3;
	return lo | hi << 4;
}

void unpack_wsub(uint32_t type, const void *row, size_t k, struct wsub *o)
{
	for (int j = 0; j < 8; j++)
		o->ls[j] = 1;
	o->mw = 0.0f;
	switch (type) {
	case KB_Q4_0: {
		const struct blk_q4_0 *b = (const struct blk_q4_0 *)row + k;
		for (int i = 0; i < 16; i++) {
			o->v[i] = (int16_t)((b->qs[i] & 0xf) - 8);
			o->v[i + 16] = (int16_t)((b->qs[i] >> 4) - 8);
		}
		o->dw = fp16_to_f32(b->d);
		break;
	}
	case KB_Q4_1: {
		const struct blk_q4_1 *b = (const struct blk_q4_1 *)row + k;
		for (int i = 0; i < 16; i++) {
			o->v[i] = b->qs[i] & 0xf;
			o->v[i + 16] = b->qs[i] >> 4;
		}
		o->dw = fp16_to_f32(b->d);
		o->mw = fp16_to_f32(b->m);
		break;
	}
	case KB_Q8_0: {
		const struct blk_q8_0 *b = (const struct blk_q8_0 *)row + k;
		for (int i = 0; i < QK; i++)
			o->v[i] = b->qs[i];
		o->dw = fp16_to_f32(b->d);
		break;
	}
	case KB_Q4_K: {
		const struct blk_q4_k *b = (const struct blk_q4_k *)row + k / 8;
		int sub = (int)(k % 8);
		const uint8_t *q = b->qs + 32 * (sub / 2);
		for (int i = 0; i < QK; i++)
			o->v[i] = (sub & 1) ? q[i] >> 4 : q[i] & 0xf;
		uint8_t sc, m;
		q4k_scale_min(b->scales, sub, &sc, &m);
		for (int j = 0; j < 8; j++)
			o->ls[j] = sc;
		o->dw = fp16_to_f32(b->d);
		o->mw = -(fp16_to_f32(b->dmin) * (float)m);
		break;
	}
	case KB_Q6_K: {
		const struct blk_q6_k *b = (const struct blk_q6_k *)row + k / 8;
		int base = (int)(k % 8) * QK;
		for (int i = 0; i < QK; i++)
			o->v[i] = (int16_t)(q6k_value(b, base + i) - 32);
		for (int j = 0; j < 8; j++)
			o->ls[j] = b->scales[(base + 4 * j) / 16];
		o->dw = fp16_to_f32(b->d);
		break;
	}
	default:
		memset(o, 0, sizeof(*o));
	}
}

int dequantize_row(uint32_t type, const void *src, float *y, size_t n)
{
	switch (type) {
	case KB_F32:
		memcpy(y, src, n * sizeof(float));
		return 0;
	case KB_F16: {
		const uint16_t *h = src;
		for (size_t i = 0; i < n; i++)
			y[i] = fp16_to_f32(h[i]);
		return 0;
	}
	case KB_BF16: {
		const uint16_t *h = src;
		for (size_t i = 0; i < n; i++)
			y[i] = bf16_to_f32(h[i]);
		return 0;
	}
	default:
		break;
	}
	if (!type_is_quantized(type) || n % QK)
		return -EINVAL;
	struct wsub w;
	for (size_t k = 0; k < n / QK; k++) {
		unpack_wsub(type, src, k, &w);
		for (int i = 0; i < QK; i++)
			y[k * QK + i] = w.dw * (float)w.ls[i / 4] * (float)w.v[i] + w.mw;
	}
	return 0;
}

void quantize_row_q8x(const float *x, struct blk_q8x *y, size_t n)
{
	for (size_t k = 0; k < n / QK; k++) {
		const float *xb = x + k * QK;
		float amax = 0.0f;
		for (int i = 0; i < QK; i++) {
			float a = fabsf(xb[i]);
			amax = a > amax ? a : amax;
		}
		float d = amax / 127.0f;
		float id = amax > 0.0f ? 127.0f / amax : 0.0f;
		int sum = 0;
		for (int i = 0; i < QK; i++) {
			int q = (int)nearbyintf(xb[i] * id);
			y[k].qs[i] = (int8_t)q;
			sum += q;
		}
		/* Scales are kept at f16 precision, as GGUF's own 8-bit blocks carry them. */
		y[k].d = fp16_round(d);
		y[k].s = fp16_round(d * (float)sum);
		y[k].qsum = sum;
	}
}
