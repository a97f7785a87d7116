/* dot_avx2.c — dot kernels for AVX2+FMA+F16C, and the x86 run-time selection. */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#define SFX avx2
#define DOTI32(u, s) _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(1))
#define DOT8_TILE 1	/* 8 accumulators a row: 16 vector registers */
#include "kernels/cpu/dot_x86_body.h"

#include <string.h>

qdot_fn dot_x86_select_vnni(uint32_t type);
qdot8_fn dot_x86_select8_vnni(uint32_t type);
qdot_fn dot_x86_select(uint32_t type, const char *want, const char **isa);
qdot8_fn dot_x86_select8(uint32_t type, const char *want);

static int has_avx2(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	       __builtin_cpu_supports("f16c");
}

static int has_vnni(void)
{
	return has_avx2() && __builtin_cpu_supports("avx512vnni") &&
	       __builtin_cpu_supports("avx512vl");
}

/* want: NULL for the best this CPU has, or "avx512vnni" / "avx2" (NULL result if unsupported). */
qdot_fn dot_x86_select(uint32_t type, const char *want, const char **isa)
{
	int avx2 = has_avx2(), vnni = has_vnni();
	if (vnni && (!want || !strcmp(want, "avx512vnni"))) {
		*isa = "avx512vnni";
		return dot_x86_select_vnni(type);
	}
	if (avx2 && (!want || !strcmp(want, "avx2"))) {
		*isa = "avx2";
		return FN(dot_x86_select_)(type);
	}
	return NULL;
}

/* The eight-row kernel of the same instruction set dot_x86_select() picks. */
qdot8_fn dot_x86_select8(uint32_t type, const char *want)
{
	if (has_vnni() && (!want || !strcmp(want, "avx512vnni")))
		return dot_x86_select8_vnni(type);
	if (has_avx2() && (!want || !strcmp(want, "avx2")))
		return FN(dot_x86_select8_)(type);
	return NULL;
}
#endif
