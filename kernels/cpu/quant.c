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

const int8_t iq4nl_values[16] = {
	-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

int type_is_quantized(uint32_t type)
{
	switch (type) {
	case KB_Q4_0: case KB_Q4_1: case KB_Q5_0: case KB_Q5_1: case KB_Q8_0:
	case KB_Q2_K: case KB_Q3_K: case KB_Q4_K: case KB_Q5_K: case KB_Q6_K:
	case KB_IQ4_NL: case KB_IQ4_XS:
		return 1;
	default:
		return 0;
	}
}

/* Low nibble from the first 8 bytes, high 2 bits from bytes 8-11 (ggml's Q3_K packing). */
int q3k_scale(const uint8_t *s, int j)
{
	int lo = j < 8 ? s[j] & 0xf : s[j - 8] >> 4;
	int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
	return (lo | hi << 4) - 32;
}

int iq4xs_scale(const struct blk_iq4_xs *b, int j)
{
	int lo = (b->scales_l[j / 2] >> (4 * (j % 2))) & 0xf;
	int hi = (b->scales_h >> (2 * j)) & 3;
	return (lo | hi << 4) - 32;
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

/* The 5-bit values of Q5_0/Q5_1: nibbles as Q4_0, bit i of qh the fifth bit of element i. */
static void unpack_q5(const uint8_t *qh4, const uint8_t *qs, int off, struct wsub *o)
{
	uint32_t qh = (uint32_t)qh4[0] | (uint32_t)qh4[1] << 8 | (uint32_t)qh4[2] << 16 |
		      (uint32_t)qh4[3] << 24;
	for (int i = 0; i < 16; i++) {
		o->v[i] = (int16_t)(((qs[i] & 0xf) | ((qh >> i) & 1) << 4) - off);
		o->v[i + 16] = (int16_t)(((qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) - off);
	}
}

static void unpack_q5_k(const struct blk_q5_k *b, int sub, struct wsub *o)
{
	const uint8_t *q = b->qs + 32 * (sub / 2);
	for (int i = 0; i < QK; i++) {
		int lo = (sub & 1) ? q[i] >> 4 : q[i] & 0xf;
		o->v[i] = (int16_t)(lo | ((b->qh[i] >> sub) & 1) << 4);
	}
	uint8_t sc, m;
	q4k_scale_min(b->scales, sub, &sc, &m);
	for (int j = 0; j < 8; j++)
		o->ls[j] = sc;
	o->dw = fp16_to_f32(b->d);
	o->mw = -(fp16_to_f32(b->dmin) * (float)m);
}

/* Elements 32 sub .. 32 sub + 31 of a Q2_K/Q3_K super-block: 2 low bits each. */
static void unpack_2bit(const uint8_t *qs, int sub, struct wsub *o)
{
	const uint8_t *q = qs + 32 * (sub / 4);
	int shift = 2 * (sub % 4);
	for (int i = 0; i < QK; i++)
		o->v[i] = (int16_t)((q[i] >> shift) & 3);
}

static void unpack_q2_k(const struct blk_q2_k *b, int sub, struct wsub *o)
{
	unpack_2bit(b->qs, sub, o);
	for (int j = 0; j < 8; j++)
		o->ls[j] = b->scales[2 * sub + j / 4] & 0xf;
	o->lm[0] = b->scales[2 * sub] >> 4;
	o->lm[1] = b->scales[2 * sub + 1] >> 4;
	o->dw = fp16_to_f32(b->d);
	o->mw = -fp16_to_f32(b->dmin);
}

static void unpack_q3_k(const struct blk_q3_k *b, int sub, struct wsub *o)
{
	unpack_2bit(b->qs, sub, o);
	int bit = 4 * (sub / 4) + sub % 4;
	for (int i = 0; i < QK; i++)
		o->v[i] = (int16_t)(o->v[i] - ((b->hmask[i] >> bit) & 1 ? 0 : 4));
	for (int j = 0; j < 8; j++)
		o->ls[j] = q3k_scale(b->scales, 2 * sub + j / 4);
	o->dw = fp16_to_f32(b->d);
}

/* 16 bytes of table nibbles: low nibbles elements 0-15, high 16-31. */
static void unpack_iq4(const uint8_t *qs, struct wsub *o)
{
	for (int i = 0; i < 16; i++) {
		o->v[i] = iq4nl_values[qs[i] & 0xf];
		o->v[i + 16] = iq4nl_values[qs[i] >> 4];
	}
}

/* The types added after the first five, one helper each. */
static void unpack_wsub_more(uint32_t type, const void *row, size_t k, struct wsub *o)
{
	switch (type) {
	case KB_Q5_0: {
		const struct blk_q5_0 *b = (const struct blk_q5_0 *)row + k;
		unpack_q5(b->qh, b->qs, 16, o);
		o->dw = fp16_to_f32(b->d);
		break;
	}
	case KB_Q5_1: {
		const struct blk_q5_1 *b = (const struct blk_q5_1 *)row + k;
		unpack_q5(b->qh, b->qs, 0, o);
		o->dw = fp16_to_f32(b->d);
		o->mw = fp16_to_f32(b->m);
		break;
	}
	case KB_Q5_K: unpack_q5_k((const struct blk_q5_k *)row + k / 8, (int)(k % 8), o); break;
	case KB_Q2_K: unpack_q2_k((const struct blk_q2_k *)row + k / 8, (int)(k % 8), o); break;
	case KB_Q3_K: unpack_q3_k((const struct blk_q3_k *)row + k / 8, (int)(k % 8), o); break;
	case KB_IQ4_NL: {
		const struct blk_iq4_nl *b = (const struct blk_iq4_nl *)row + k;
		unpack_iq4(b->qs, o);
		o->dw = fp16_to_f32(b->d);
		break;
	}
	case KB_IQ4_XS: {
		const struct blk_iq4_xs *b = (const struct blk_iq4_xs *)row + k / 8;
		int sub = (int)(k % 8);
		unpack_iq4(b->qs + 16 * sub, o);
		for (int j = 0; j < 8; j++)
			o->ls[j] = iq4xs_scale(b, sub);
		o->dw = fp16_to_f32(b->d);
		break;
	}
	default:
		memset(o, 0, sizeof(*o));
	}
}

void unpack_wsub(uint32_t type, const void *row, size_t k, struct wsub *o)
{
	for (int j = 0; j < 8; j++)
		o->ls[j] = 1;
	o->lm[0] = o->lm[1] = 0;
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
		unpack_wsub_more(type, row, k, o);
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
	int min16 = type_has_min16(type), min = type_has_min(type);
	for (size_t k = 0; k < n / QK; k++) {
		unpack_wsub(type, src, k, &w);
		for (int i = 0; i < QK; i++) {
			float v = w.dw * (float)w.ls[i / 4] * (float)w.v[i];
			/*
			 * Q2_K's min is -dmin * m exactly (a 4-bit m), as ggml forms it;
			 * a type without a min adds nothing, not +0, which would turn
			 * a -0 (negative d, zero code) into +0 where ggml keeps -0.
			 */
			if (min16)
				v += w.mw * (float)w.lm[i / 16];
			else if (min)
				v += w.mw;
			y[k * QK + i] = v;
		}
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
		int sum = 0, lo = 0;
		for (int i = 0; i < QK; i++) {
			int q = (int)nearbyintf(xb[i] * id);
			y[k].qs[i] = (int8_t)q;
			sum += q;
			lo += i < 16 ? q : 0;
		}
		y[k].qsum16[0] = (int16_t)lo;
		y[k].qsum16[1] = (int16_t)(sum - lo);
		/* Scales are kept at f16 precision, as GGUF's own 8-bit blocks carry them. */
		y[k].d = fp16_round(d);
		y[k].s = fp16_round(d * (float)sum);
		y[k].qsum = sum;
	}
}
