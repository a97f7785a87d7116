/* dot.c — portable dot-product kernels and the run-time choice of SIMD ones. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/backend.h"
#include "kernels/cpu/dot.h"

void dot_q_generic(uint32_t type, const void *row, const struct blk_q8x *x, size_t x_stride,
		   int nr, size_t nblk, float *out, size_t out_stride)
{
	float acc[DOT_MAX_NR][8] = {{0}};
	float accm[DOT_MAX_NR] = {0};
	struct wsub w;
	for (size_t k = 0; k < nblk; k++) {
		unpack_wsub(type, row, k, &w);
		for (int r = 0; r < nr; r++) {
			const struct blk_q8x *xb = x + r * x_stride + k;
			float d = w.dw * xb->d;
			for (int j = 0; j < 8; j++) {
				int32_t s = 0;
				for (int i = 4 * j; i < 4 * j + 4; i++)
					s += (int32_t)w.v[i] * xb->qs[i];
				acc[r][j] = fmaf((float)(s * w.ls[j]), d, acc[r][j]);
			}
			accm[r] = fmaf(w.mw, xb->s, accm[r]);
		}
	}
	for (int r = 0; r < nr; r++)
		out[r * out_stride] = hsum8(acc[r]) + accm[r];
}

/* Eight rows at a time through the one-row reference (for tests and as a fallback). */
void dot8_q_generic(uint32_t type, const void *rows, size_t row_bytes, const struct blk_q8x *x,
		    size_t x_stride, int nr, size_t nblk, float *out, size_t out_stride)
{
	for (int i = 0; i < 8; i++)
		dot_q_generic(type, (const uint8_t *)rows + i * row_bytes, x, x_stride, nr, nblk,
			      out + i, out_stride);
}

#define GENERIC_Q(name, type)                                                         \
	static void name(const void *row, const struct blk_q8x *x, size_t x_stride,    \
			 int nr, size_t nblk, float *out, size_t out_stride)           \
	{                                                                              \
		dot_q_generic(type, row, x, x_stride, nr, nblk, out, out_stride);      \
	}
GENERIC_Q(dot_q4_0_c, KB_Q4_0)
GENERIC_Q(dot_q4_1_c, KB_Q4_1)
GENERIC_Q(dot_q8_0_c, KB_Q8_0)
GENERIC_Q(dot_q4_k_c, KB_Q4_K)
GENERIC_Q(dot_q6_k_c, KB_Q6_K)

static inline float load_f(uint32_t type, const void *row, size_t i)
{
	switch (type) {
	case KB_F16:
		return fp16_to_f32(((const uint16_t *)row)[i]);
	case KB_BF16:
		return bf16_to_f32(((const uint16_t *)row)[i]);
	default:
		return ((const float *)row)[i];
	}
}

/* Lane i % 8 accumulates x[i] * w[i] in order; the compiler vectorises the lanes. */
static inline void dot_f(uint32_t type, const void *row, const float *x, size_t x_stride,
			 int nr, size_t n, float *out, size_t out_stride)
{
	for (int r = 0; r < nr; r++) {
		const float *xr = x + r * x_stride;
		float acc[8] = {0};
		size_t i = 0;
		for (; i + 8 <= n; i += 8)
			for (int j = 0; j < 8; j++)
				acc[j] = fmaf(load_f(type, row, i + j), xr[i + j], acc[j]);
		for (; i < n; i++)
			acc[i % 8] = fmaf(load_f(type, row, i), xr[i], acc[i % 8]);
		out[r * out_stride] = hsum8(acc);
	}
}

#define FLOAT_DOT(name, type)                                                         \
	static void name(const void *row, const float *x, size_t x_stride, int nr,     \
			 size_t n, float *out, size_t out_stride)                      \
	{                                                                              \
		dot_f(type, row, x, x_stride, nr, n, out, out_stride);                 \
	}
FLOAT_DOT(dot_f32_c, KB_F32)
FLOAT_DOT(dot_f16_c, KB_F16)
FLOAT_DOT(dot_bf16_c, KB_BF16)

fdot_fn dot_select_f(uint32_t type)
{
	switch (type) {
	case KB_F32: return dot_f32_c;
	case KB_F16: return dot_f16_c;
	case KB_BF16: return dot_bf16_c;
	default: return NULL;
	}
}

#if defined(__x86_64__)
qdot_fn dot_x86_select(uint32_t type, const char *want, const char **isa);
qdot8_fn dot_x86_select8(uint32_t type, const char *want);
#endif

qdot_fn dot_select_q_isa(uint32_t type, const char *want, const char **isa)
{
	*isa = "generic";
	if (!want || strcmp(want, "generic")) {
#if defined(__x86_64__)
		qdot_fn f = dot_x86_select(type, want, isa);
		if (f || want)
			return f;
#else
		if (want)
			return NULL;
#endif
	}
	switch (type) {
	case KB_Q4_0: return dot_q4_0_c;
	case KB_Q4_1: return dot_q4_1_c;
	case KB_Q8_0: return dot_q8_0_c;
	case KB_Q4_K: return dot_q4_k_c;
	case KB_Q6_K: return dot_q6_k_c;
	default: return NULL;
	}
}

/* KVD_CPU_ISA=generic|avx2|avx512vnni forces a path (for comparisons). */
static const char *wanted_isa(void)
{
	const char *want = getenv("KVD_CPU_ISA");
	return want && *want ? want : NULL;
}

qdot_fn dot_select_q(uint32_t type)
{
	const char *isa;
	return dot_select_q_isa(type, wanted_isa(), &isa);
}

qdot8_fn dot_select_q8_isa(uint32_t type, const char *want)
{
	if (want && !strcmp(want, "generic"))
		return NULL;
#if defined(__x86_64__)
	return dot_x86_select8(type, want);
#else
	(void)type;
	return NULL;
#endif
}

qdot8_fn dot_select_q8(uint32_t type)
{
	return dot_select_q8_isa(type, wanted_isa());
}

