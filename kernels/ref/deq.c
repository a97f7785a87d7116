/* deq.c — GGUF block formats decoded from their definitions, one plain loop per type. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include "kernels/backend.h"
#include "kernels/ref/deq.h"

/* Little-endian fields read byte by byte: the layout is the file's, not the host's. */
static uint16_t le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

double ref_f16_to_f64(uint16_t h)
{
	int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
	double v;
	if (e == 31)
		v = m ? NAN : INFINITY;
	else if (e == 0)
		v = ldexp((double)m, -24);		/* subnormal: m * 2^-14 / 1024 */
	else
		v = ldexp((double)(1024 + m), e - 25);	/* (1 + m/1024) * 2^(e-15) */
	return sign ? -v : v;
}

double ref_bf16_to_f64(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t ref_f32_to_f16(float f)
{
	uint16_t sign = signbit(f) ? 0x8000 : 0;
	double a = fabs((double)f);
	if (isnan(f))
		return sign | 0x7e00;
	/* 65520 is halfway between the largest half (65504) and 2^16: it and above round to inf. */
	if (a >= 65520.0)
		return sign | 0x7c00;
	int e;
	frexp(a, &e);		/* a = frac * 2^e, frac in [0.5, 1) */
	/* The half's unit in the last place: 2^(e-11) for normals, 2^-24 below 2^-14. */
	int ulp_exp = e - 11 < -24 ? -24 : e - 11;
	/* a / ulp is exact in double; rint rounds it to nearest even in the default mode. */
	double q = rint(ldexp(a, -ulp_exp));
	double v = ldexp(q, ulp_exp);
	if (v == 0)
		return sign;
	if (v < 0x1p-14)	/* subnormal (or rounded up to the smallest normal: same bits) */
		return sign | (uint16_t)q;
	frexp(v, &e);		/* rounding may have carried into the next binade */
	uint16_t mant = (uint16_t)(ldexp(v, 11 - e) - 1024);
	return sign | (uint16_t)((e + 14) << 10) | mant;
}

/* ggml's Q4_K packing of the 6-bit scale and min of sub-block j (0..7). */
static void q4k_scale_min(const uint8_t *s, int j, int *sc, int *mn)
{
	if (j < 4) {
		*sc = s[j] & 63;
		*mn = s[j + 4] & 63;
	} else {
		*sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
		*mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
	}
}

/* Q4_0, 18 B: f16 d; 16 B nibbles, low nibble of byte j is element j, high is j + 16. */
static void deq_q4_0(const uint8_t *b, float *y)
{
	double d = ref_f16_to_f64(le16(b));
	for (int j = 0; j < 16; j++) {
		y[j] = (float)(d * ((b[2 + j] & 0xf) - 8));
		y[j + 16] = (float)(d * ((b[2 + j] >> 4) - 8));
	}
}

/* Q4_1, 20 B: f16 d, f16 m; nibbles as Q4_0, x = d * q + m. */
static void deq_q4_1(const uint8_t *b, float *y)
{
	double d = ref_f16_to_f64(le16(b)), m = ref_f16_to_f64(le16(b + 2));
	for (int j = 0; j < 16; j++) {
		y[j] = (float)(d * (b[4 + j] & 0xf) + m);
		y[j + 16] = (float)(d * (b[4 + j] >> 4) + m);
	}
}

/* Q8_0, 34 B: f16 d; 32 int8, x = d * q. */
static void deq_q8_0(const uint8_t *b, float *y)
{
	double d = ref_f16_to_f64(le16(b));
	for (int j = 0; j < 32; j++)
		y[j] = (float)(d * (int8_t)b[2 + j]);
}

/*
 * Q4_K, 144 B: f16 d, f16 dmin, 12 B of 6-bit (scale, min) pairs for eight
 * 32-element sub-blocks, 128 B nibbles: byte l of 32-byte chunk c holds
 * element l of sub-block 2c (low nibble) and of 2c + 1 (high);
 * x = d * scale * q - dmin * min.
 */
static void deq_q4_k(const uint8_t *b, float *y)
{
	double d = ref_f16_to_f64(le16(b)), dmin = ref_f16_to_f64(le16(b + 2));
	const uint8_t *scales = b + 4, *qs = b + 16;
	for (int sub = 0; sub < 8; sub++) {
		int sc, mn;
		q4k_scale_min(scales, sub, &sc, &mn);
		const uint8_t *q = qs + 32 * (sub / 2);
		for (int l = 0; l < 32; l++) {
			int v = sub % 2 ? q[l] >> 4 : q[l] & 0xf;
			y[32 * sub + l] = (float)(d * sc * v - dmin * mn);
		}
	}
}

/*
 * Q6_K, 210 B: 128 B ql (low 4 bits), 64 B qh (high 2 bits), 16 int8
 * scales (one per 16 elements), f16 d. Each half of 128 elements uses 64 B
 * of ql and 32 of qh: element 32 g + l (g < 4, l < 32) takes the low
 * nibble of ql[l] (g 0), ql[l + 32] (g 1), or their high nibbles (g 2, 3),
 * and bits 2g, 2g + 1 of qh[l]; x = d * scale * (q - 32).
 */
static void deq_q6_k(const uint8_t *b, float *y)
{
	const uint8_t *ql = b, *qh = b + 128;
	const int8_t *sc = (const int8_t *)(b + 192);
	double d = ref_f16_to_f64(le16(b + 208));
	for (int i = 0; i < 256; i++) {
		int half = i / 128, g = (i % 128) / 32, l = i % 32;
		int lo = ql[64 * half + l + (g % 2) * 32];
		lo = g < 2 ? lo & 0xf : lo >> 4;
		int hi = (qh[32 * half + l] >> (2 * g)) & 3;
		y[i] = (float)(d * sc[i / 16] * ((lo | hi << 4) - 32));
	}
}

/* The fifth bits of Q5_0/Q5_1: a little-endian u32, bit j for element j. */
static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Q5_0, 22 B: f16 d; 4 B high bits; 16 B nibbles as Q4_0; x = d * (q - 16). */
static void deq_q5_0(const uint8_t *b, float *y)
{
	double d = ref_f16_to_f64(le16(b));
	uint32_t qh = le32(b + 2);
	for (int j = 0; j < 16; j++) {
		int q0 = (b[6 + j] & 0xf) | (int)((qh >> j) & 1) << 4;
		int q1 = (b[6 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
		y[j] = (float)(d * (q0 - 16));
		y[j + 16] = (float)(d * (q1 - 16));
	}
}

/* Q5_1, 24 B: f16 d, f16 m; then as Q5_0; x = d * q + m. */
static void deq_q5_1(const uint8_t *b, float *y)
{
	double d = ref_f16_to_f64(le16(b)), m = ref_f16_to_f64(le16(b + 2));
	uint32_t qh = le32(b + 4);
	for (int j = 0; j < 16; j++) {
		int q0 = (b[8 + j] & 0xf) | (int)((qh >> j) & 1) << 4;
		int q1 = (b[8 + j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
		y[j] = (float)(d * q0 + m);
		y[j + 16] = (float)(d * q1 + m);
	}
}

/*
 * Q2_K, 84 B: 16 B scales (low nibble scale, high nibble min, one per 16
 * elements), 64 B of 2-bit q, f16 d, f16 dmin. Element 128 h + 32 g + l
 * (h < 2, g < 4, l < 32) is bits 2g, 2g + 1 of qs[32 h + l];
 * x = d * scale * q - dmin * min.
 */
static void deq_q2_k(const uint8_t *b, float *y)
{
	const uint8_t *sc = b, *qs = b + 16;
	double d = ref_f16_to_f64(le16(b + 80)), dmin = ref_f16_to_f64(le16(b + 82));
	for (int i = 0; i < 256; i++) {
		int h = i / 128, g = (i % 128) / 32, l = i % 32;
		int q = (qs[32 * h + l] >> (2 * g)) & 3;
		y[i] = (float)(d * (sc[i / 16] & 0xf) * q - dmin * (sc[i / 16] >> 4));
	}
}

/*
 * Q3_K, 110 B: 32 B hmask, 64 B low 2 bits (laid out as Q2_K's), 12 B of
 * sixteen 6-bit scales, f16 d. Scale j: low 4 bits are the low (j < 8) or
 * high nibble of byte j % 8, high 2 bits are bits 2 (j / 4), +1 of byte
 * 8 + j % 4; it is stored plus 32. Element 128 h + 32 g + l is minus 4
 * unless bit 4 h + g of hmask[l] is set; x = d * (scale - 32) * q.
 */
static void deq_q3_k(const uint8_t *b, float *y)
{
	const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
	double d = ref_f16_to_f64(le16(b + 108));
	for (int i = 0; i < 256; i++) {
		int h = i / 128, g = (i % 128) / 32, l = i % 32, j = i / 16;
		int q = ((qs[32 * h + l] >> (2 * g)) & 3) - ((hm[l] >> (4 * h + g)) & 1 ? 0 : 4);
		int s = (j < 8 ? sc[j] & 0xf : sc[j - 8] >> 4) | ((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
		y[i] = (float)(d * (s - 32) * q);
	}
}

/*
 * Q5_K, 176 B: f16 d, f16 dmin, 12 B scales as Q4_K, 32 B qh, 128 B
 * nibbles as Q4_K; element l of sub-block s has its fifth bit in bit s of
 * qh[l]; x = d * scale * q - dmin * min.
 */
static void deq_q5_k(const uint8_t *b, float *y)
{
	double d = ref_f16_to_f64(le16(b)), dmin = ref_f16_to_f64(le16(b + 2));
	const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
	for (int sub = 0; sub < 8; sub++) {
		int sc, mn;
		q4k_scale_min(scales, sub, &sc, &mn);
		const uint8_t *q = qs + 32 * (sub / 2);
		for (int l = 0; l < 32; l++) {
			int v = (sub % 2 ? q[l] >> 4 : q[l] & 0xf) | ((qh[l] >> sub) & 1) << 4;
			y[32 * sub + l] = (float)(d * sc * v - dmin * mn);
		}
	}
}

/* ggml's kvalues_iq4nl: the 16 levels a 4-bit IQ4 index selects. */
static const int iq4_levels[16] = {
	-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

/* IQ4_NL, 18 B: f16 d; 16 B of indices laid out as Q4_0's nibbles; x = d * level. */
static void deq_iq4_nl(const uint8_t *b, float *y)
{
	double d = ref_f16_to_f64(le16(b));
	for (int j = 0; j < 16; j++) {
		y[j] = (float)(d * iq4_levels[b[2 + j] & 0xf]);
		y[j + 16] = (float)(d * iq4_levels[b[2 + j] >> 4]);
	}
}

/*
 * IQ4_XS, 136 B: f16 d, u16 scales_h, 4 B scales_l, 128 B indices: sub-block
 * s (32 elements) has a 6-bit scale (nibble s % 2 of scales_l[s / 2], high
 * bits 2s, 2s + 1 of scales_h) stored plus 32, and 16 B of indices as IQ4_NL.
 */
static void deq_iq4_xs(const uint8_t *b, float *y)
{
	double d = ref_f16_to_f64(le16(b));
	int sh = le16(b + 2);
	for (int s = 0; s < 8; s++) {
		int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 0xf) | ((sh >> (2 * s)) & 3) << 4;
		const uint8_t *q = b + 8 + 16 * s;
		for (int j = 0; j < 16; j++) {
			y[32 * s + j] = (float)(d * (ls - 32) * iq4_levels[q[j] & 0xf]);
			y[32 * s + j + 16] = (float)(d * (ls - 32) * iq4_levels[q[j] >> 4]);
		}
	}
}

int ref_dequantize_row(uint32_t type, const void *row, float *y, size_t n)
{
	const uint8_t *p = row;
	void (*blk)(const uint8_t *, float *);
	size_t be = 1, bb = 0;
	switch (type) {
	case KB_F32:
		memcpy(y, row, n * sizeof(float));
		return 0;
	case KB_F16:
		for (size_t i = 0; i < n; i++)
			y[i] = (float)ref_f16_to_f64(le16(p + 2 * i));
		return 0;
	case KB_BF16:
		for (size_t i = 0; i < n; i++)
			y[i] = (float)ref_bf16_to_f64(le16(p + 2 * i));
		return 0;
	case KB_Q4_0: blk = deq_q4_0; be = 32; bb = 18; break;
	case KB_Q4_1: blk = deq_q4_1; be = 32; bb = 20; break;
	case KB_Q8_0: blk = deq_q8_0; be = 32; bb = 34; break;
	case KB_Q4_K: blk = deq_q4_k; be = 256; bb = 144; break;
	case KB_Q6_K: blk = deq_q6_k; be = 256; bb = 210; break;
	case KB_Q5_0: blk = deq_q5_0; be = 32; bb = 22; break;
	case KB_Q5_1: blk = deq_q5_1; be = 32; bb = 24; break;
	case KB_Q2_K: blk = deq_q2_k; be = 256; bb = 84; break;
	case KB_Q3_K: blk = deq_q3_k; be = 256; bb = 110; break;
	case KB_Q5_K: blk = deq_q5_k; be = 256; bb = 176; break;
	case KB_IQ4_NL: blk = deq_iq4_nl; be = 32; bb = 18; break;
	case KB_IQ4_XS: blk = deq_iq4_xs; be = 256; bb = 136; break;
	default:
		return -ENOTSUP;
	}
	if (n % be)
		return -EINVAL;
	for (size_t k = 0; k < n / be; k++)
		blk(p + k * bb, y + k * be);
	return 0;
}

void ref_quantize_q8_0(uint8_t *dst, const float *x, size_t n)
{
	for (size_t k = 0; k < n / 32; k++) {
		const float *xb = x + 32 * k;
		uint8_t *b = dst + 34 * k;
		float amax = 0.0f;
		for (int j = 0; j < 32; j++)
			amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
		float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
		uint16_t h = ref_f32_to_f16(d);
		b[0] = (uint8_t)(h & 0xff);
		b[1] = (uint8_t)(h >> 8);
		for (int j = 0; j < 32; j++)
			b[2 + j] = (uint8_t)(int8_t)roundf(xb[j] * id);
	}
}
