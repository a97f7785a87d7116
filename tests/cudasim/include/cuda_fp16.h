/* cuda_fp16.h — the cudasim's __half: IEEE binary16 through the host compiler's _Float16 (round to nearest even). */
#ifndef KVD_CUDASIM_FP16_H
#define KVD_CUDASIM_FP16_H

#include <string.h>

struct __half {
	unsigned short x;
};

static inline __half __float2half_rn(float f)
{
	_Float16 h = (_Float16)f;
	__half r;
	memcpy(&r.x, &h, 2);
	return r;
}

static inline float __half2float(__half h)
{
	_Float16 v;
	memcpy(&v, &h.x, 2);
	return (float)v;
}

static inline __half __ushort_as_half(unsigned short u)
{
	return __half{ u };
}

static inline unsigned short __half_as_ushort(__half h)
{
	return h.x;
}

#endif
