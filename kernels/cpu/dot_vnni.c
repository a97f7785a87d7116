/* dot_vnni.c — the repacked kernels for AVX-512 VNNI (256-bit vpdpbusd), same arithmetic as AVX2. */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")
#define SFX vnni
#define DOT_VNNI 1
#define GEMM_TILE 8	/* 32 vector registers: eight accumulators beside the eight slices */
#define KW 8
#include "kernels/cpu/dot_x86_body.h"
#endif
