/* gguf_int.h — what the GGUF parser (gguf.c) and its lookups (gguf_get.c) share. */
#ifndef KVD_GGUF_INT_H
#define KVD_GGUF_INT_H

#include <stdint.h>
#include <string.h>

/* Values are read in place from the mapping, so the host must match the file. */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader reads little-endian files in place; big-endian hosts are not supported"
#endif

/* Loads from the mapping, which aligns nothing. */
static inline uint32_t ld_u32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline uint64_t ld_u64(const void *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

#endif
