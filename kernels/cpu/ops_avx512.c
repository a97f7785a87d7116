/*
 * ops_avx512.c — the attention of ops_avx2.c compiled for AVX-512VL: the
 * same 256-bit operations in the same order, with the 32 vector registers
 * holding three query heads' sums at once, so each K and V row is
 * converted once per kv head instead of once per query head, and the
 * weighted V sums sixteen elements to a vector (each element's fmas as
 * before).
 */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl")
#include <string.h>
#include "kernels/cpu/dot.h"
#include "kernels/cpu/ops_avx2.h"

int ops_have_avx512(void)
{
	static int have = -1;
	if (have < 0) {
		const char *want = dot_wanted_isa();
		__builtin_cpu_init();
		have = ops_have_avx2() && __builtin_cpu_supports("avx512f") &&
		       __builtin_cpu_supports("avx512vl") && (!want || !strcmp(want, "avx512"));
	}
	return have;
}

#define ATT_G 3
#define ATT_ZMM 1	/* the weighted sums in 512-bit vectors: each lane's operations unchanged */
#define ATT_ENTRY ops_attention_heads_avx512
#include "kernels/cpu/ops_att_body.h"
#endif
