/* dot_vnni.c — dot kernels for AVX-512 VNNI (256-bit vpdpbusd), same arithmetic as AVX2. */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")
#define SFX vnni
#define DOTI32(u, s) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (u), (s))
#define DOT8_TILE 2	/* 8 accumulators a row: 32 vector registers */
#include "kernels/cpu/dot_x86_body.h"
#endif
