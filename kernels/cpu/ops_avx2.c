/* ops_avx2.c — attention, SwiGLU and f16 rounding with AVX2/FMA/F16C: the same operations, in the same order, as the portable kernels. */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <errno.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>
#include "kernels/cpu/dot.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/ops_avx2.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/vexp.h"

int ops_have_avx2(void)
{
	static int have = -1;
	if (have < 0) {
		__builtin_cpu_init();
		have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		       __builtin_cpu_supports("f16c");
	}
	return have;
}

#define ATT_G 1
#define ATT_ENTRY ops_attention_heads_avx2
#include "kernels/cpu/ops_att_body.h"

/* ops_swiglu_row_c() eight lanes at a time: exp8() is expf_inline() lane by lane, then the same 1 +, / and *. */
int ops_swiglu_row_avx2(float *out, const float *gate, const float *up, uint32_t dim)
{
	const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
	uint32_t i = 0;
	for (; i + 8 <= dim; i += 8) {
		__m256 g = _mm256_loadu_ps(gate + i);
		__m256 e = exp8(_mm256_xor_ps(g, neg));
		_mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)),
							_mm256_loadu_ps(up + i)));
	}
	return (int)i;
}

int ops_f16_row_avx2(uint16_t *h, const float *x, uint32_t n)
{
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i);
		if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)))
			break;
		_mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
	}
	return (int)i;
}

#endif
