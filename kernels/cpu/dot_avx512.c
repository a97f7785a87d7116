/*
 * dot_avx512.c — the repacked kernels in 512-bit vectors (AVX512F/BW/VL +
 * VNNI): sixteen weight rows, two repacked groups, per call; the arithmetic
 * of the 8-row kernels lane by lane.
 */
#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
#define SFX avx512
#define DOT_VNNI 1
#define GEMM_TILE 8	/* 32 vector registers: eight accumulators beside the eight slices */
#define GEMM_WIDE 1	/* or sixteen, for most types (tile_rows_()) */
#define KW 16
#include "kernels/cpu/dot_x86_body.h"
#endif
