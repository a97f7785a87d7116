/* repack.h — weights repacked for the SIMD kernels: eight rows interleaved per sub-block, and the backend's cache of them. */
#ifndef KVD_CPU_REPACK_H
#define KVD_CPU_REPACK_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/backend.h"

#define RP_ROWS 8

/*
 * One repacked block: sub-block k (32 elements) of eight weight rows, with
 * row i's values in 32-bit lane i of every vector the kernel loads, so one
 * broadcast dword of an activation block serves all eight rows:
 *   d[8]	f16 dw of each row (K types and IQ4_XS: the super-block's d)
 *   m[8]	f16 mw (Q4_1, Q5_1), dmin (Q4_K, Q5_K, Q2_K), else 0
 *   ls[2][8]	K types and IQ4_XS only: integer scales of elements 0-15 and
 *		16-31 (Q2_K, Q3_K, Q6_K: their two scales; IQ4_XS: its one,
 *		twice; Q4_K, Q5_K: ls[0] the 6-bit scale, ls[1] the 6-bit min)
 *   lm[2][8]	Q2_K only: the integer mins of elements 0-15 and 16-31
 *   qs		all types but Q8_0 and Q6_K: 4 vectors of 32 bytes, vector c
 *		lane i holding row i's elements 4c..4c+3 in the low nibbles
 *		and 16+4c..16+4c+3 in the high ones, unsigned: Q4_0 keeps its
 *		+8, the IQ4 types their table indices (looked up in the
 *		kernel), Q3_K gets +4 (taken out of the integer sum with the
 *		activation sums), the 5-bit types their low 4 bits (Q5_0 with
 *		its +16);
 *		Q8_0 and Q6_K: 8 vectors, vector g lane i holding row i's
 *		elements 4g..4g+3 as signed bytes (Q6_K's minus 32 applied)
 *   qh		5-bit types only: one vector, byte 4i + k holding in bit g the
 *		fifth bit of row i's element 4g + k, so that one shift and one
 *		mask put group g's fifth bits into bit 4 of their bytes.
 */
#define RP_OFF_M 16
#define RP_OFF_LS 32
#define RP_OFF_LM 48
static inline int rp_is_k(uint32_t type)
{
	return type == KB_Q4_K || type == KB_Q6_K || type == KB_Q5_K || type == KB_Q3_K ||
	       type == KB_Q2_K || type == KB_IQ4_XS;
}
static inline int rp_is_nib(uint32_t type)
{
	return type != KB_Q8_0 && type != KB_Q6_K;
}
static inline int rp_is_iq4(uint32_t type)
{
	return type == KB_IQ4_NL || type == KB_IQ4_XS;
}
static inline int rp_is_5bit(uint32_t type)
{
	return type == KB_Q5_0 || type == KB_Q5_1 || type == KB_Q5_K;
}
/*
 * Unsigned values below 32 summed per half (scales per 16, or offsets
 * taken out per half): four groups' maddubs sums fit int16 (4 * 2 * 31 * 127 < 2^15).
 */
static inline int rp_is_u8(uint32_t type)
{
	return rp_is_5bit(type) || type == KB_Q2_K || type == KB_Q3_K;
}
/* What such a type's repacked values add to its own. */
static inline int rp_u8_off(uint32_t type)
{
	return type == KB_Q5_0 ? 16 : type == KB_Q3_K ? 4 : 0;
}
static inline size_t rp_hdr_bytes(uint32_t type)
{
	return type == KB_Q2_K ? 64 : rp_is_k(type) ? 48 : 32;
}
static inline size_t rp_blk_bytes(uint32_t type)
{
	return rp_hdr_bytes(type) + (rp_is_nib(type) ? 128 : 256) + (rp_is_5bit(type) ? 32 : 0);
}

/* Repack nrows (<= 8; the rest are zero) rows of nblk sub-blocks into dst (nblk * rp_blk_bytes). */
void rp_pack(uint32_t type, const void *rows, size_t row_bytes, uint32_t nrows, size_t nblk,
	     void *dst);
/*
 * Two groups for the 16-row kernels, in the bytes of two (2 * nblk *
 * rp_blk_bytes), interleaved by block so that the kernel reads one stream:
 * block k of rows 0-7 at 2k, of rows 8-15 at 2k + 1 (in blocks). nrows <= 16.
 */
void rp_pack_pair(uint32_t type, const void *rows, size_t row_bytes, uint32_t nrows, size_t nblk,
		  void *dst);

/*
 * The buffers import() handed out, and their repacked forms, made on the
 * first matmul that knows the type and shape (import() is told neither).
 * Only imported memory is cached: the contract of import() says it stays
 * unchanged until unimport(), which no other pointer promises.
 */
struct rp_ent {
	const void *src;
	size_t bytes;
	uint32_t refs;
	uint32_t type, rows, cols;	/* of the repacked form, when rp is set */
	size_t row_bytes;
	int paired;			/* whole pairs of groups by rp_pack_pair() (16-row kernels) */
	void *rp;			/* (ceil(rows / 8), cols / 32) repacked blocks, or NULL */
	int ready;			/* rp holds them (a failed matmul may leave it unfilled) */
};

struct rp_cache {
	struct rp_ent *e;	/* sorted by src */
	size_t n, cap;
};

int rp_cache_add(struct rp_cache *c, const void *src, size_t bytes);
/* Drop one reference of src; the last frees its repacked form. */
void rp_cache_remove(struct rp_cache *c, const void *src);
/* The entry of an imported buffer starting at p, or NULL. */
struct rp_ent *rp_cache_find(struct rp_cache *c, const void *p);
void rp_cache_free(struct rp_cache *c);

#endif
