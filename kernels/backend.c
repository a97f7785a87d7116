/* backend.c — choosing and creating a compute backend at run time. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "kernels/backend.h"

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
