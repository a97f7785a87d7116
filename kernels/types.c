/*
 * types.c — the weight type table, apart from backend.c: code that needs a
 * type's block geometry (the GGUF reader, tests) links it without pulling
 * in backend_create() and with it the CUDA libraries.
 */
#include <errno.h>
#include <stddef.h>
#include "kernels/backend.h"

/*
 * Block geometry of every type a backend computes with, the one table the
 * GGUF reader, the model loader and both backends consult. The byte counts
 * are the ggml block layouts (kernels/cpu/quant.h and kernels/cuda/common.cuh
 * pin their structs to the same sizes).
 */
static const struct {
	const char *name;
	uint16_t elems;
	uint16_t bytes;
} kb_types[] = {
	[KB_F32]  = { "F32",  1,   4 },
	[KB_F16]  = { "F16",  1,   2 },
	[KB_BF16] = { "BF16", 1,   2 },
	[KB_Q4_0] = { "Q4_0", 32,  18 },	/* f16 d, 16 B of nibbles */
	[KB_Q4_1] = { "Q4_1", 32,  20 },	/* f16 d, f16 m, 16 B of nibbles */
	[KB_Q5_0] = { "Q5_0", 32,  22 },	/* f16 d, 4 B high bits, 16 B nibbles */
	[KB_Q5_1] = { "Q5_1", 32,  24 },	/* f16 d, f16 m, 4 B high bits, 16 B nibbles */
	[KB_Q8_0] = { "Q8_0", 32,  34 },	/* f16 d, 32 int8 */
	[KB_Q2_K] = { "Q2_K", 256, 84 },	/* 16 B 4-bit scales/mins, 64 B 2-bit q, d, dmin */
	[KB_Q3_K] = { "Q3_K", 256, 110 },	/* 32 B high bits, 64 B 2-bit q, 12 B scales, d */
	[KB_Q4_K] = { "Q4_K", 256, 144 },	/* d, dmin, 12 B scales, 128 B nibbles */
	[KB_Q5_K] = { "Q5_K", 256, 176 },	/* d, dmin, 12 B scales, 32 B high bits, 128 B nibbles */
	[KB_Q6_K] = { "Q6_K", 256, 210 },	/* 128 B ql, 64 B qh, 16 scales, d */
	[KB_IQ4_NL] = { "IQ4_NL", 32, 18 },	/* f16 d, 16 B nibbles indexing a 16-value table */
	[KB_IQ4_XS] = { "IQ4_XS", 256, 136 },	/* d, 2 B + 4 B 6-bit scales, 128 B table nibbles */
};

int kb_type_block(uint32_t type, uint32_t *blk_elems, uint32_t *blk_bytes)
{
	if (type >= sizeof(kb_types) / sizeof(kb_types[0]) || !kb_types[type].name)
		return -EINVAL;
	if (blk_elems)
		*blk_elems = kb_types[type].elems;
	if (blk_bytes)
		*blk_bytes = kb_types[type].bytes;
	return 0;
}

const char *kb_type_name(uint32_t type)
{
	if (type >= sizeof(kb_types) / sizeof(kb_types[0]) || !kb_types[type].name)
		return "unknown";
	return kb_types[type].name;
}
