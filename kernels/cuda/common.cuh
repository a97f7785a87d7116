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

#define QK 32
#define QK_K 256

struct __align__(2) dq4_0 { uint16_t d; uint8_t qs[16]; };
struct __align__(4) dq4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };
struct __align__(2) dq8_0 { uint16_t d; int8_t qs[32]; };
struct __align__(4) dq4_k { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct __align__(2) dq6_k { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
static_assert(sizeof(dq4_0) == 18 && sizeof(dq4_1) == 20 && sizeof(dq8_0) == 34 &&
	      sizeof(dq4_k) == 144 && sizeof(dq6_k) == 210, "GGUF block sizes");

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
		const uint8_t *s = b->scales;
		int sc, mn;
		if (sub < 4) {
			sc = s[sub] & 63;
			mn = s[sub + 4] & 63;
		} else {
			sc = (s[sub + 4] & 0xf) | ((s[sub - 4] >> 6) << 4);
			mn = (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
		}
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
	default: return -ENOTSUP;                          \
	}

#endif
