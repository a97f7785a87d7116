/* common.cuh — what every CUDA kernel file shares: error checks, GGUF blocks on the device, reductions. */
#ifndef KVD_CUDA_COMMON_CUH
#define KVD_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include "kernels/backend.h"

/* Log a failed CUDA call (the call, file, line and the runtime's words); returns -EIO. */
extern "C" int cuda_fail(const char *call, const char *file, int line, const char *what);

/* Every CUDA runtime call goes through CK: failure logs and returns -EIO, never aborts. */
#define CK(call)                                                                    \
	do {                                                                        \
		cudaError_t ck_ = (call);                                           \
		if (ck_ != cudaSuccess)                                             \
			return cuda_fail(#call, __FILE__, __LINE__, cudaGetErrorString(ck_)); \
	} while (0)

/* After a kernel launch: a bad configuration shows up here, a fault at the next sync. */
#define CK_LAUNCH(what) CK(cudaGetLastError())

/*
 * A launch, CUDA_LAUNCH(grid, block, smem, stream, kernel)(args...), and a
 * kernel's dynamic shared memory: the chevrons and extern __shared__ here;
 * tests/cudasim, which runs these kernels on the host, defines both as calls.
 */
#ifndef KVD_CUDASIM
#define CUDA_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#define CUDA_DYN_SHARED(T, name) extern __shared__ T name[]
#endif

#define QK 32
#define QK_K 256

struct __align__(2) dq4_0 { uint16_t d; uint8_t qs[16]; };
struct __align__(4) dq4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };
struct __align__(2) dq8_0 { uint16_t d; int8_t qs[32]; };
struct __align__(4) dq4_k { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct __align__(2) dq6_k { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
struct __align__(2) dq5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct __align__(4) dq5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[16]; };
struct __align__(4) dq2_k { uint8_t scales[16]; uint8_t qs[64]; uint16_t d; uint16_t dmin; };
struct __align__(2) dq3_k { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct __align__(4) dq5_k { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct __align__(2) diq4_nl { uint16_t d; uint8_t qs[16]; };
struct __align__(4) diq4_xs { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };
static_assert(sizeof(dq4_0) == 18 && sizeof(dq4_1) == 20 && sizeof(dq8_0) == 34 &&
	      sizeof(dq4_k) == 144 && sizeof(dq6_k) == 210, "GGUF block sizes");
static_assert(sizeof(dq5_0) == 22 && sizeof(dq5_1) == 24 && sizeof(dq2_k) == 84 &&
	      sizeof(dq3_k) == 110 && sizeof(dq5_k) == 176 && sizeof(diq4_nl) == 18 &&
	      sizeof(diq4_xs) == 136, "GGUF block sizes");

/* The block decoders also compile for the host, where tests check them against the CPU's. */
#define KB_HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define KB_UNROLL _Pragma("unroll")
#else
#define KB_UNROLL
#endif

KB_HD float h2f(uint16_t h)
{
	return __half2float(__ushort_as_half(h));
}

KB_HD uint16_t f2h(float f)
{
	return __half_as_ushort(__float2half_rn(f));
}

__device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* Four bytes from an address that is only 2-byte aligned (Q8_0 and Q6_K blocks). */
KB_HD uint32_t ld_u32_a2(const uint8_t *p)
{
	const uint16_t *h = (const uint16_t *)p;
	return (uint32_t)h[0] | (uint32_t)h[1] << 16;
}

/*
 * The 32 elements of sub-block k (elements 32k .. 32k + 31) of a weight row
 * in GGUF format T, as floats: the one dequantizer the mat-vec, GEMM and
 * embedding paths share, so all agree with each other and with the CPU's
 * dequantize_row() up to f32 rounding.
 */
KB_HD float bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
	return __uint_as_float(u);
#else
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
#endif
}

/* Scale and min of sub-block sub (0..7) of a Q4_K/Q5_K block: six bits each, packed in 12 bytes. */
KB_HD void scale_min_k4(int sub, const uint8_t *s, int *sc, int *mn)
{
	if (sub < 4) {
		*sc = s[sub] & 63;
		*mn = s[sub + 4] & 63;
	} else {
		*sc = (s[sub + 4] & 0xf) | ((s[sub - 4] >> 6) << 4);
		*mn = (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
	}
}

/* IQ4_NL's and IQ4_XS's 16 non-uniform levels, eight to a word, so no table sits in memory. */
#define IQ4_LO 0xf6eaddcfbfad9881ull	/* -127 -104 -83 -65 -49 -35 -22 -10 */
#define IQ4_HI 0x7159453526190d01ull	/*    1   13  25  38  53  69  89 113 */

KB_HD float iq4_level(uint32_t i)
{
#ifdef __CUDA_ARCH__
	uint64_t w = i < 8 ? IQ4_LO : IQ4_HI;
	uint32_t b = __byte_perm((uint32_t)w, (uint32_t)(w >> 32), i & 7);
#else
	uint32_t b = (uint32_t)(((i < 8 ? IQ4_LO : IQ4_HI) >> (8 * (i & 7))) & 0xff);
#endif
	return (float)(int8_t)(b & 0xff);
}

/*
 * Every product below is exact in f32 (an f16 scale times integers of at
 * most 13 bits), so the only rounding is the final add of a min: the
 * values are the CPU's whether or not either side fuses it.
 */

/* Q5_0 / Q5_1 (one block): low nibbles in qs, element j's fifth bit at bit j of qh. */
template <int T>
KB_HD void deq_q5(const uint8_t *row, uint32_t k, float v[32])
{
	float d, m = 0.0f;
	uint32_t qh, q[4];
	if (T == KB_Q5_1) {
		const uint32_t *w = (const uint32_t *)(row + (size_t)k * 24);	/* 24-byte blocks */
		d = h2f((uint16_t)(w[0] & 0xffff));
		m = h2f((uint16_t)(w[0] >> 16));
		qh = w[1];
KB_UNROLL
		for (int i = 0; i < 4; i++)
			q[i] = w[2 + i];
	} else {
		const uint8_t *b = row + (size_t)k * 22;
		d = h2f(*(const uint16_t *)b);
		qh = ld_u32_a2(b + 2);
KB_UNROLL
		for (int i = 0; i < 4; i++)
			q[i] = ld_u32_a2(b + 6 + 4 * i);
	}
KB_UNROLL
	for (int i = 0; i < 16; i++) {
		uint32_t byte = (q[i / 4] >> (8 * (i % 4))) & 0xff;
		int lo = (int)((byte & 0xf) | ((qh >> i) & 1) << 4);
		int hi = (int)((byte >> 4) | ((qh >> (i + 16)) & 1) << 4);
		if (T == KB_Q5_1) {
			v[i] = d * (float)lo + m;
			v[i + 16] = d * (float)hi + m;
		} else {
			v[i] = d * (float)(lo - 16);
			v[i + 16] = d * (float)(hi - 16);
		}
	}
}

/* Q5_K: Q4_K's layout plus qh, whose bit sub of byte l is the fifth bit of element l. */
KB_HD void deq_q5_k(const uint8_t *row, uint32_t k, float v[32])
{
	const dq5_k *b = (const dq5_k *)row + k / 8;
	int sub = (int)(k % 8), sc, mn;
	scale_min_k4(sub, b->scales, &sc, &mn);
	float d = h2f(b->d) * (float)sc, m = h2f(b->dmin) * (float)mn;
	const uint32_t *ql = (const uint32_t *)(b->qs + 32 * (sub / 2));
	const uint32_t *qh = (const uint32_t *)b->qh;
	int shift = (sub & 1) * 4;
KB_UNROLL
	for (int i = 0; i < 8; i++) {
		uint32_t l = ql[i], h = qh[i];
KB_UNROLL
		for (int j = 0; j < 4; j++) {
			int q = (int)(((l >> (8 * j + shift)) & 0xf) | ((h >> (8 * j + sub)) & 1) << 4);
			v[4 * i + j] = d * (float)q - m;
		}
	}
}

/*
 * Q2_K and Q3_K: 2-bit quants, element e of sub-block sub at bits 2 (sub % 4)
 * of byte 32 (sub / 4) + e, under two 16-element scales.
 */
KB_HD void deq_q2_k(const uint8_t *row, uint32_t k, float v[32])
{
	const dq2_k *b = (const dq2_k *)row + k / 8;
	int sub = (int)(k % 8), half = sub / 4, shift = 2 * (sub % 4);
	const uint8_t *s = b->scales + 8 * half + 2 * (sub % 4);
	const uint32_t *q = (const uint32_t *)(b->qs + 32 * half);
	float d = h2f(b->d), dm = h2f(b->dmin);
KB_UNROLL
	for (int g = 0; g < 2; g++) {	/* two 16-element groups, one scale and min each */
		float dl = d * (float)(s[g] & 0xf), ml = dm * (float)(s[g] >> 4);
KB_UNROLL
		for (int i = 4 * g; i < 4 * g + 4; i++) {
			uint32_t w = q[i];
KB_UNROLL
			for (int j = 0; j < 4; j++)
				v[4 * i + j] = dl * (float)((w >> (8 * j + shift)) & 3) - ml;
		}
	}
}

/* Q3_K's sixteen 6-bit scales: low nibbles in bytes 0..7, the top two bits in bytes 8..11. */
KB_HD int q3_k_scale(const uint8_t *s, int is)
{
	int lo = is < 8 ? s[is] & 0xf : s[is - 8] >> 4;
	int hi = (s[8 + is % 4] >> (2 * (is / 4))) & 3;
	return (lo | hi << 4) - 32;
}

/* Q3_K: Q2_K's quants, a third bit in hmask (bit 4 (sub / 4) + sub % 4 of byte e) clear meaning -4. */
KB_HD void deq_q3_k(const uint8_t *row, uint32_t k, float v[32])
{
	const dq3_k *b = (const dq3_k *)row + k / 8;
	int sub = (int)(k % 8), half = sub / 4, shift = 2 * (sub % 4), hbit = 4 * half + sub % 4;
	int is = 8 * half + 2 * (sub % 4);
	float d = h2f(b->d);
KB_UNROLL
	for (int g = 0; g < 2; g++) {	/* two 16-element groups, one scale each */
		float dl = d * (float)q3_k_scale(b->scales, is + g);
KB_UNROLL
		for (int i = 4 * g; i < 4 * g + 4; i++) {
			uint32_t w = ld_u32_a2(b->qs + 32 * half + 4 * i), h = ld_u32_a2(b->hmask + 4 * i);
KB_UNROLL
			for (int j = 0; j < 4; j++) {
				int q = (int)((w >> (8 * j + shift)) & 3) -
					(((h >> (8 * j + hbit)) & 1) ? 0 : 4);
				v[4 * i + j] = dl * (float)q;
			}
		}
	}
}

/* IQ4_NL (one block, scale d) and IQ4_XS (sub-block k % 8 of 256, a 6-bit scale each). */
template <int T>
KB_HD void deq_iq4(const uint8_t *row, uint32_t k, float v[32])
{
	float d;
	uint32_t q[4];
	if (T == KB_IQ4_NL) {
		const uint8_t *b = row + (size_t)k * 18;
		d = h2f(*(const uint16_t *)b);
KB_UNROLL
		for (int i = 0; i < 4; i++)
			q[i] = ld_u32_a2(b + 2 + 4 * i);
	} else {
		const diq4_xs *b = (const diq4_xs *)row + k / 8;
		int ib = (int)(k % 8);
		int ls = ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | ((b->scales_h >> (2 * ib)) & 3) << 4;
		d = h2f(b->d) * (float)(ls - 32);
		const uint32_t *w = (const uint32_t *)(b->qs + 16 * ib);
KB_UNROLL
		for (int i = 0; i < 4; i++)
			q[i] = w[i];
	}
KB_UNROLL
	for (int i = 0; i < 16; i++) {
		uint32_t byte = (q[i / 4] >> (8 * (i % 4))) & 0xff;
		v[i] = d * iq4_level(byte & 0xf);
		v[i + 16] = d * iq4_level(byte >> 4);
	}
}

template <int T>
KB_HD void deq32(const uint8_t *row, uint32_t k, float v[32])
{
	if (T == KB_F32) {
		const float4 *p = (const float4 *)(row + (size_t)k * 128);
KB_UNROLL
		for (int i = 0; i < 8; i++) {
			float4 f = p[i];
			v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
		}
	} else if (T == KB_F16 || T == KB_BF16) {
		const uint4 *p = (const uint4 *)(row + (size_t)k * 64);
KB_UNROLL
		for (int i = 0; i < 4; i++) {
			uint4 u = p[i];
			uint32_t w[4] = { u.x, u.y, u.z, u.w };
KB_UNROLL
			for (int j = 0; j < 4; j++) {
				uint16_t lo = (uint16_t)(w[j] & 0xffff), hi = (uint16_t)(w[j] >> 16);
				if (T == KB_F16) {
					v[8 * i + 2 * j] = h2f(lo);
					v[8 * i + 2 * j + 1] = h2f(hi);
				} else {
					v[8 * i + 2 * j] = bits_f32((uint32_t)lo << 16);
					v[8 * i + 2 * j + 1] = bits_f32((uint32_t)hi << 16);
				}
			}
		}
	} else if (T == KB_Q4_0 || T == KB_Q4_1) {
		const uint8_t *b = row + (size_t)k * (T == KB_Q4_0 ? 18 : 20);
		float d, m;
		uint32_t q[4];
		if (T == KB_Q4_1) {
			const uint32_t *w = (const uint32_t *)b;	/* 4-byte aligned: 20-byte blocks */
			uint32_t dm = w[0];
			d = h2f((uint16_t)(dm & 0xffff));
			m = h2f((uint16_t)(dm >> 16));
KB_UNROLL
			for (int i = 0; i < 4; i++)
				q[i] = w[1 + i];
		} else {
			d = h2f(*(const uint16_t *)b);
			m = -8.0f * d;
KB_UNROLL
			for (int i = 0; i < 4; i++)
				q[i] = ld_u32_a2(b + 2 + 4 * i);
		}
KB_UNROLL
		for (int i = 0; i < 16; i++) {
			uint32_t byte = (q[i / 4] >> (8 * (i % 4))) & 0xff;
			v[i] = d * (float)(byte & 0xf) + m;
			v[i + 16] = d * (float)(byte >> 4) + m;
		}
	} else if (T == KB_Q8_0) {
		const uint8_t *b = row + (size_t)k * 34;
		float d = h2f(*(const uint16_t *)b);
KB_UNROLL
		for (int i = 0; i < 8; i++) {
			uint32_t w = ld_u32_a2(b + 2 + 4 * i);
KB_UNROLL
			for (int j = 0; j < 4; j++)
				v[4 * i + j] = d * (float)(int8_t)((w >> (8 * j)) & 0xff);
		}
	} else if (T == KB_Q4_K) {
		const dq4_k *b = (const dq4_k *)row + k / 8;
		int sub = (int)(k % 8);
		int sc, mn;
		scale_min_k4(sub, b->scales, &sc, &mn);
		float d = h2f(b->d) * (float)sc, m = -(h2f(b->dmin) * (float)mn);
		const uint32_t *q = (const uint32_t *)(b->qs + 32 * (sub / 2));
		int shift = (sub & 1) * 4;
KB_UNROLL
		for (int i = 0; i < 8; i++) {
			uint32_t w = q[i];
KB_UNROLL
			for (int j = 0; j < 4; j++)
				v[4 * i + j] = d * (float)((w >> (8 * j + shift)) & 0xf) + m;
		}
	} else if (T == KB_Q6_K) {
		const dq6_k *b = (const dq6_k *)row + k / 8;
		int sub = (int)(k % 8), half = sub / 4, g = sub % 4;
		const uint8_t *ql = b->ql + 64 * half + 32 * (g & 1);
		const uint8_t *qh = b->qh + 32 * half;
		const int8_t *sc = b->scales + 8 * half + 2 * g;
		float d = h2f(b->d);
		float d0 = d * (float)sc[0], d1 = d * (float)sc[1];
		int lshift = (g & 2) ? 4 : 0, hshift = 2 * g;
KB_UNROLL
		for (int i = 0; i < 8; i++) {
			uint32_t l = ld_u32_a2(ql + 4 * i), h = ld_u32_a2(qh + 4 * i);
KB_UNROLL
			for (int j = 0; j < 4; j++) {
				int lo = (int)((l >> (8 * j + lshift)) & 0xf);
				int hi = (int)((h >> (8 * j + hshift)) & 3);
				int e = 4 * i + j;
				v[e] = (e < 16 ? d0 : d1) * (float)((lo | hi << 4) - 32);
			}
		}
	} else if (T == KB_Q5_0 || T == KB_Q5_1) {
		deq_q5<T>(row, k, v);
	} else if (T == KB_Q5_K) {
		deq_q5_k(row, k, v);
	} else if (T == KB_Q2_K) {
		deq_q2_k(row, k, v);
	} else if (T == KB_Q3_K) {
		deq_q3_k(row, k, v);
	} else if (T == KB_IQ4_NL || T == KB_IQ4_XS) {
		deq_iq4<T>(row, k, v);
	}
}

/* Call f.template operator()<T>() for a runtime weight type; -ENOTSUP for others. */
#define KB_DISPATCH_TYPE(type, CALL)                       \
	switch (type) {                                    \
	case KB_F32: CALL(KB_F32); break;                  \
	case KB_F16: CALL(KB_F16); break;                  \
	case KB_BF16: CALL(KB_BF16); break;                \
	case KB_Q4_0: CALL(KB_Q4_0); break;                \
	case KB_Q4_1: CALL(KB_Q4_1); break;                \
	case KB_Q8_0: CALL(KB_Q8_0); break;                \
	case KB_Q4_K: CALL(KB_Q4_K); break;                \
	case KB_Q6_K: CALL(KB_Q6_K); break;                \
	case KB_Q5_0: CALL(KB_Q5_0); break;                \
	case KB_Q5_1: CALL(KB_Q5_1); break;                \
	case KB_Q2_K: CALL(KB_Q2_K); break;                \
	case KB_Q3_K: CALL(KB_Q3_K); break;                \
	case KB_Q5_K: CALL(KB_Q5_K); break;                \
	case KB_IQ4_NL: CALL(KB_IQ4_NL); break;            \
	case KB_IQ4_XS: CALL(KB_IQ4_XS); break;            \
	default: return -ENOTSUP;                          \
	}

#endif
