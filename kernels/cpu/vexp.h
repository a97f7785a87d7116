/* vexp.h — the e^x every CPU kernel uses, inline so each instruction-set variant vectorises it. */
#ifndef KVD_CPU_VEXP_H
#define KVD_CPU_VEXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "kernels/cpu/quant.h"

/*
 * x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact
 * reduction); e^r by its degree-7 Taylor polynomial (error < 1e-8), then
 * scaled by 2^n built in the exponent bits. Clamped to the normal range;
 * a NaN is taken as the lower bound (never an out-of-range shift below).
 */
static inline float expf_inline(float x)
{
	/* Written so a NaN fails both tests and lands on the lower clamp, as _mm256_max_ps takes it. */
	x = x > -87.3f ? x : -87.3f;
	x = x < 88.3f ? x : 88.3f;
	float n = nearbyintf(x * 1.44269504088896341f);
	float r = fmaf(n, -0.693145751953125f, x);
	r = fmaf(n, -1.428606765330187e-06f, r);
	float p = 1.0f / 5040;
	p = fmaf(p, r, 1.0f / 720);
	p = fmaf(p, r, 1.0f / 120);
	p = fmaf(p, r, 1.0f / 24);
	p = fmaf(p, r, 1.0f / 6);
	p = fmaf(p, r, 0.5f);
	p = fmaf(p, r, 1.0f);
	p = fmaf(p, r, 1.0f);
	int32_t e = ((int32_t)n + 127) << 23;
	float s;
	memcpy(&s, &e, 4);
	return p * s;
}

/*
 * x (n,) = softmax(x) in place: the exponentials summed in double, then
 * scaled; round16 rounds each weight to f16, as the sum over an f16 V
 * cache takes them. Inline so each instruction-set variant compiles its own.
 */
static inline void softmax_row(float *x, uint32_t n, int round16)
{
	float mx = -INFINITY;
	for (uint32_t p = 0; p < n; p++)
		mx = x[p] > mx ? x[p] : mx;
	for (uint32_t p = 0; p < n; p++)
		x[p] = expf_inline(x[p] - mx);
	double sum = 0.0;
	for (uint32_t p = 0; p < n; p++)
		sum += x[p];
	float inv = (float)(1.0 / sum);
	for (uint32_t p = 0; p < n; p++)
		x[p] = round16 ? fp16_round(x[p] * inv) : x[p] * inv;
}

#endif
