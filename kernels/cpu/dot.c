/* dot.c — portable dot-product kernels and the run-time choice of SIMD ones. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/backend.h"
#include "kernels/cpu/dot.h"

void dot_q_generic(uint32_t type, const void *row, const struct blk_q8x *x, size_t x_stride,
		   int nr, size_t nblk, float *out, size_t out_stride)
{
	float acc[DOT_MAX_NR] = {0};
	int has_min = type_has_min(type), has_min16 = type_has_min16(type);
	struct wsub w;
	for (size_t k = 0; k < nblk; k++) {
		unpack_wsub(type, row, k, &w);
		for (int r = 0; r < nr; r++) {
			const struct blk_q8x *xb = x + r * x_stride + k;
			int32_t s = 0;
			for (int j = 0; j < 8; j++) {
				int32_t g = 0;
				for (int i = 4 * j; i < 4 * j + 4; i++)
					g += (int32_t)w.v[i] * xb->qs[i];
				s += g * w.ls[j];
			}
			acc[r] = fmaf((float)s, w.dw * xb->d, acc[r]);
			if (has_min)
				acc[r] = fmaf(w.mw, xb->s, acc[r]);
			if (has_min16) {
				int32_t m = w.lm[0] * xb->qsum16[0] + w.lm[1] * xb->qsum16[1];
				acc[r] = fmaf((float)m, w.mw * xb->d, acc[r]);
			}
		}
	}
	for (int r = 0; r < nr; r++)
		out[r * out_stride] = acc[r];
}

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
qgemm_fn dot_x86_select(uint32_t type, const char *want, const char **isa);
qgemm_fn dot_x86_select16(uint32_t type, const char *want);
quantize_fn dot_x86_select_quantize(const char *want);
#endif

const char *dot_wanted_isa(void)
{
	const char *want = getenv("KVD_CPU_ISA");
	return want && *want ? want : NULL;
}

qgemm_fn dot_select_gemm_isa(uint32_t type, const char *want)
{
	const char *isa;
	if (!want || !strcmp(want, "generic"))
		return NULL;
#if defined(__x86_64__)
	if (!strcmp(want, "avx512"))
		return dot_x86_select16(type, want);
	return dot_x86_select(type, want, &isa);
#else
	(void)type;
	(void)isa;
	return NULL;
#endif
}

qgemm_fn dot_select_gemm(uint32_t type, const char **isa)
{
	const char *want = dot_wanted_isa(), *name = "generic";
	qgemm_fn f = NULL;
#if defined(__x86_64__)
	if (!want || strcmp(want, "generic"))
		f = dot_x86_select(type, want, &name);
	if (!f)
		name = "generic";
#endif
	(void)type;
	if (isa)
		*isa = name;
	return f;
}

qgemm_fn dot_select_gemm16(uint32_t type)
{
#if defined(__x86_64__)
	return dot_x86_select16(type, dot_wanted_isa());
#else
	(void)type;
	return NULL;
#endif
}

quantize_fn dot_select_quantize(void)
{
#if defined(__x86_64__)
	quantize_fn f = dot_x86_select_quantize(dot_wanted_isa());
	if (f)
		return f;
#endif
	return quantize_row_q8x;
}
