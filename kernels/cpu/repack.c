/* repack.c — the portable repacking of weight rows for the SIMD kernels, and the cache of imported weights. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/quant.h"
#include "kernels/cpu/repack.h"

/* The raw f16 scale fields of sub-block k of a row: d, and m (Q4_1/Q5_1's m, the K types' dmin). */
static void raw_scales(uint32_t type, const void *row, size_t k, uint16_t *d, uint16_t *m)
{
	*m = 0;
	switch (type) {
	case KB_Q4_0: *d = ((const struct blk_q4_0 *)row)[k].d; break;
	case KB_Q4_1:
		*d = ((const struct blk_q4_1 *)row)[k].d;
		*m = ((const struct blk_q4_1 *)row)[k].m;
		break;
	case KB_Q5_0: *d = ((const struct blk_q5_0 *)row)[k].d; break;
	case KB_Q5_1:
		*d = ((const struct blk_q5_1 *)row)[k].d;
		*m = ((const struct blk_q5_1 *)row)[k].m;
		break;
	case KB_Q8_0: *d = ((const struct blk_q8_0 *)row)[k].d; break;
	case KB_Q2_K:
		*d = ((const struct blk_q2_k *)row)[k / 8].d;
		*m = ((const struct blk_q2_k *)row)[k / 8].dmin;
		break;
	case KB_Q3_K: *d = ((const struct blk_q3_k *)row)[k / 8].d; break;
	case KB_Q4_K:
		*d = ((const struct blk_q4_k *)row)[k / 8].d;
		*m = ((const struct blk_q4_k *)row)[k / 8].dmin;
		break;
	case KB_Q5_K:
		*d = ((const struct blk_q5_k *)row)[k / 8].d;
		*m = ((const struct blk_q5_k *)row)[k / 8].dmin;
		break;
	case KB_IQ4_NL: *d = ((const struct blk_iq4_nl *)row)[k].d; break;
	case KB_IQ4_XS: *d = ((const struct blk_iq4_xs *)row)[k / 8].d; break;
	default: *d = ((const struct blk_q6_k *)row)[k / 8].d; break;
	}
}

/* The integer scales of lane i: ls[0], ls[1] (Q4_K/Q5_K: scale and min), Q2_K's mins. */
static void pack_scales(uint32_t type, uint8_t *blk, int i, const void *row, size_t k,
			const struct wsub *w)
{
	if (type == KB_Q4_K || type == KB_Q5_K) {
		uint8_t sc, mn;
		const uint8_t *s = type == KB_Q4_K ? ((const struct blk_q4_k *)row)[k / 8].scales
						   : ((const struct blk_q5_k *)row)[k / 8].scales;
		q4k_scale_min(s, (int)(k % 8), &sc, &mn);
		blk[RP_OFF_LS + i] = sc;
		blk[RP_OFF_LS + 8 + i] = mn;
	} else if (rp_is_k(type)) {
		blk[RP_OFF_LS + i] = (uint8_t)(int8_t)w->ls[0];
		blk[RP_OFF_LS + 8 + i] = (uint8_t)(int8_t)w->ls[4];
	}
	if (type == KB_Q2_K) {
		blk[RP_OFF_LM + i] = (uint8_t)w->lm[0];
		blk[RP_OFF_LM + 8 + i] = (uint8_t)w->lm[1];
	}
}

/* The table index of an IQ4 value (the levels are distinct). */
static int iq4_index(int v)
{
	for (int j = 0; j < 16; j++)
		if (iq4nl_values[j] == v)
			return j;
	return 0;
}

/* Row i's sub-block into lane i of one repacked block. */
static void pack_lane(uint32_t type, uint8_t *blk, int i, const void *row, size_t k,
		      const struct wsub *w, uint16_t d, uint16_t m)
{
	uint8_t *qs = blk + rp_hdr_bytes(type);
	memcpy(blk + 2 * i, &d, 2);
	memcpy(blk + RP_OFF_M + 2 * i, &m, 2);
	pack_scales(type, blk, i, row, k, w);
	if (!rp_is_nib(type)) {
		for (int j = 0; j < 32; j++)
			qs[32 * (j / 4) + 4 * i + j % 4] = (uint8_t)(int8_t)w->v[j];
		return;
	}
	int u[32];
	for (int j = 0; j < 32; j++)
		u[j] = rp_is_iq4(type) ? iq4_index(w->v[j])
				       : w->v[j] + (type == KB_Q4_0 ? 8 : rp_u8_off(type));
	for (int j = 0; j < 16; j++)
		qs[32 * (j / 4) + 4 * i + j % 4] = (uint8_t)((u[j] & 0xf) | (u[j + 16] & 0xf) << 4);
	if (rp_is_5bit(type))
		for (int j = 0; j < 32; j++)
			qs[128 + 4 * i + j % 4] |= (uint8_t)((u[j] >> 4) << (j / 4));
}

/* nrows rows into nblk blocks, block k at dst + k * stride (padding lanes zero). */
static void pack_group(uint32_t type, const void *rows, size_t row_bytes, uint32_t nrows,
		       size_t nblk, uint8_t *dst, size_t stride)
{
	struct wsub w;
	for (size_t k = 0; k < nblk; k++) {
		uint8_t *blk = dst + k * stride;
		memset(blk, 0, rp_blk_bytes(type));
		for (uint32_t i = 0; i < nrows; i++) {
			const uint8_t *row = (const uint8_t *)rows + i * row_bytes;
			uint16_t d, m;
			unpack_wsub(type, row, k, &w);
			raw_scales(type, row, k, &d, &m);
			pack_lane(type, blk, (int)i, row, k, &w, d, m);
		}
	}
}

void rp_pack(uint32_t type, const void *rows, size_t row_bytes, uint32_t nrows, size_t nblk,
	     void *dst)
{
	pack_group(type, rows, row_bytes, nrows, nblk, dst, rp_blk_bytes(type));
}

void rp_pack_pair(uint32_t type, const void *rows, size_t row_bytes, uint32_t nrows, size_t nblk,
		  void *dst)
{
	size_t bb = rp_blk_bytes(type);
	uint32_t n0 = nrows < RP_ROWS ? nrows : RP_ROWS;
	pack_group(type, rows, row_bytes, n0, nblk, dst, 2 * bb);
	pack_group(type, (const uint8_t *)rows + (size_t)RP_ROWS * row_bytes, row_bytes, nrows - n0,
		   nblk, (uint8_t *)dst + bb, 2 * bb);
}

/* ---- the cache ---- */

/* Index of the first entry with src >= p. */
static size_t lower_bound(const struct rp_cache *c, const void *p)
{
	size_t lo = 0, hi = c->n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if ((uintptr_t)c->e[mid].src < (uintptr_t)p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct rp_ent *rp_cache_find(struct rp_cache *c, const void *p)
{
	size_t i = lower_bound(c, p);
	return i < c->n && c->e[i].src == p ? &c->e[i] : NULL;
}

int rp_cache_add(struct rp_cache *c, const void *src, size_t bytes)
{
	size_t i = lower_bound(c, src);
	if (i < c->n && c->e[i].src == src) {
		c->e[i].refs++;
		return 0;
	}
	if (c->n == c->cap) {
		size_t cap = c->cap ? 2 * c->cap : 64;
		struct rp_ent *e = realloc(c->e, cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		c->e = e;
		c->cap = cap;
	}
	memmove(c->e + i + 1, c->e + i, (c->n - i) * sizeof(*c->e));
	c->e[i] = (struct rp_ent){ .src = src, .bytes = bytes, .refs = 1 };
	c->n++;
	return 0;
}

void rp_cache_remove(struct rp_cache *c, const void *src)
{
	size_t i = lower_bound(c, src);
	if (i >= c->n || c->e[i].src != src || --c->e[i].refs)
		return;
	free(c->e[i].rp);
	memmove(c->e + i, c->e + i + 1, (c->n - i - 1) * sizeof(*c->e));
	c->n--;
}

void rp_cache_free(struct rp_cache *c)
{
	for (size_t i = 0; i < c->n; i++)
		free(c->e[i].rp);
	free(c->e);
	memset(c, 0, sizeof(*c));
}
