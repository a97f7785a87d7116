/* backend.c — the weight type table, and choosing and creating a compute backend at run time. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
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
	[KB_Q8_0] = { "Q8_0", 32,  34 },	/* f16 d, 32 int8 */
	[KB_Q4_K] = { "Q4_K", 256, 144 },	/* d, dmin, 12 B scales, 128 B nibbles */
	[KB_Q6_K] = { "Q6_K", 256, 210 },	/* 128 B ql, 64 B qh, 16 scales, d */
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

int backend_parse(const char *name, enum kb_kind *out)
{
	if (!name)
		return -EINVAL;
	if (!strcmp(name, "auto"))
		*out = KB_BACKEND_AUTO;
	else if (!strcmp(name, "cpu"))
		*out = KB_BACKEND_CPU;
	else if (!strcmp(name, "cuda"))
		*out = KB_BACKEND_CUDA;
	else
		return -EINVAL;
	return 0;
}

enum kb_kind backend_choose(enum kb_kind want, int cuda_built, int n_devices, char *why,
			    size_t whylen)
{
	if (want == KB_BACKEND_CPU) {
		snprintf(why, whylen, "cpu backend: requested");
		return KB_BACKEND_CPU;
	}
	if (want == KB_BACKEND_CUDA) {
		snprintf(why, whylen, "cuda backend: requested");
		return KB_BACKEND_CUDA;
	}
	if (!cuda_built) {
		snprintf(why, whylen, "cpu backend: auto, and kvd was built without CUDA");
		return KB_BACKEND_CPU;
	}
	if (n_devices <= 0) {
		snprintf(why, whylen, "cpu backend: auto, and no CUDA device is present");
		return KB_BACKEND_CPU;
	}
	snprintf(why, whylen, "cuda backend: auto, %d CUDA device%s present", n_devices,
		 n_devices == 1 ? "" : "s");
	return KB_BACKEND_CUDA;
}

#ifndef KVD_HAVE_CUDA
int backend_cuda_create(struct backend **out, int dev, char *why, size_t whylen)
{
	(void)out;
	(void)dev;
	snprintf(why, whylen, "kvd was built without CUDA (no nvcc at build time)");
	return -ENOSYS;
}

int backend_cuda_devices(char *why, size_t whylen)
{
	snprintf(why, whylen, "built without CUDA");
	return 0;
}
#endif

int backend_create(struct backend **out, enum kb_kind want, uint32_t n_threads, char *why,
		   size_t whylen)
{
	char reason[192] = "", choice[256];
#ifdef KVD_HAVE_CUDA
	const int built = 1;
#else
	const int built = 0;
#endif
	int n_dev = want == KB_BACKEND_CPU ? 0 : backend_cuda_devices(reason, sizeof(reason));
	enum kb_kind k = backend_choose(want, built, n_dev, choice, sizeof(choice));
	if (k == KB_BACKEND_CUDA) {
		char err[192] = "";
		int rc = backend_cuda_create(out, 0, err, sizeof(err));
		if (rc) {
			snprintf(why, whylen, "%s, but it cannot start: %s", choice,
				 err[0] ? err : reason);
			return rc;
		}
		snprintf(why, whylen, "%s", choice);
		return 0;
	}
	int rc = backend_cpu_create(out, n_threads);
	if (n_dev <= 0 && reason[0] && want == KB_BACKEND_AUTO && built)
		snprintf(why, whylen, "%s (%s)", choice, reason);
	else
		snprintf(why, whylen, "%s", choice);
	return rc;
}
