/* backend.c — choosing and creating a compute backend at run time, and loading the CUDA one. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
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
	else if (!strcmp(name, "ref"))
		*out = KB_BACKEND_REF;
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
	if (want == KB_BACKEND_REF) {
		snprintf(why, whylen, "ref backend: requested (exact f32/f64 reference, one thread)");
		return KB_BACKEND_REF;
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

/* ---- the CUDA backend's shared object ---- */

#ifndef KVD_BACKEND_LIBDIR
#define KVD_BACKEND_LIBDIR "/usr/local/lib/kvd"
#endif
/* Directories this long or longer are not searched (the messages must hold three). */
#define DIR_MAX 512

static struct {
	pthread_once_t once;
	const struct kb_cuda_api *api;
	char path[DIR_MAX + 32];
	char why[3 * DIR_MAX + 256];
} cuda_so = { .once = PTHREAD_ONCE_INIT };

/* The directory of the running binary, or "" when /proc is not there to say. */
static void exe_dir(char *dir, size_t len)
{
	ssize_t n = readlink("/proc/self/exe", dir, len);
	/* A name that fills the buffer may have been cut: no directory rather than a wrong one. */
	dir[n > 0 && (size_t)n < len ? n : 0] = '\0';
	char *slash = strrchr(dir, '/');
	if (slash)
		*slash = '\0';
	else
		dir[0] = '\0';
}

/*
 * One directory to search, in dir; 0, or -ENAMETOOLONG with dir holding the note that says why
 * it is not searched. A cut path names another directory, where a foreign object could be.
 */
static int put_dir(char *dir, const char *base, const char *tail)
{
	int n = snprintf(dir, DIR_MAX, "%s%s", base, tail);
	if (n >= 0 && n < DIR_MAX)
		return 0;
	snprintf(dir, DIR_MAX, "%.64s... (not searched: %d characters, kvd searches up to %d)", base,
		 n, DIR_MAX - 1);
	return -ENAMETOOLONG;
}

/* The object in dir, dlopened and checked; 0, -ENOENT when dir holds none, or -ELIBACC with why filled. */
static int load_from(const char *dir)
{
	char *path = cuda_so.path;
	int len = snprintf(path, sizeof(cuda_so.path), "%s/%s", dir, KB_CUDA_SONAME);
	if (len < 0 || (size_t)len >= sizeof(cuda_so.path)) {
		path[0] = '\0';
		return -ENOENT;
	}
	if (access(path, F_OK))
		return -ENOENT;
	/* The log names the file itself, not the way there (bin/../lib/kvd). */
	char real[PATH_MAX];
	if (realpath(path, real) && strlen(real) < sizeof(cuda_so.path))
		memcpy(path, real, strlen(real) + 1);
	/* Never closed: the backend's vtable and the CUDA runtime live in it until exit. */
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		/* The loader names the object only when the object itself is at fault. */
		const char *err = dlerror();
		snprintf(cuda_so.why, sizeof(cuda_so.why), "%s%s%s",
			 strstr(err, path) ? "" : path, strstr(err, path) ? "" : ": ", err);
		return -ELIBACC;
	}
	const struct kb_cuda_api *(*entry)(void) =
		(const struct kb_cuda_api *(*)(void))dlsym(h, KB_CUDA_ENTRY_NAME);
	const struct kb_cuda_api *api = entry ? entry() : NULL;
	if (!api) {
		snprintf(cuda_so.why, sizeof(cuda_so.why),
			 "%s has no %s: it was built for another version of kvd", path,
			 KB_CUDA_ENTRY_NAME);
	} else if (api->abi != KB_CUDA_ABI || api->ops_size != sizeof(struct backend_ops)) {
		snprintf(cuda_so.why, sizeof(cuda_so.why),
			 "%s has backend ABI %u (vtable of %u bytes), this kvd needs %u (%zu): it was built for another version of kvd",
			 path, api->abi, api->ops_size, KB_CUDA_ABI, sizeof(struct backend_ops));
		api = NULL;
	}
	if (!api) {
		dlclose(h);
		return -ELIBACC;
	}
	cuda_so.api = api;
	return 0;
}

static void load_once(void)
{
	/* A program linked with the object (the CUDA tests) has it already. */
	const struct kb_cuda_api *(*linked)(void) =
		(const struct kb_cuda_api *(*)(void))dlsym(RTLD_DEFAULT, KB_CUDA_ENTRY_NAME);
	Dl_info info;
	if (linked) {
		cuda_so.api = linked();
		snprintf(cuda_so.path, sizeof(cuda_so.path), "%s",
			 dladdr((void *)linked, &info) && info.dli_fname ? info.dli_fname
									: KB_CUDA_SONAME);
		return;
	}
	char dirs[3][DIR_MAX], tried[3 * DIR_MAX + 8] = "";
	int n = 0, cut[3] = { 0 };
	/* secure_getenv: a set-id kvd takes no code from its caller's environment. */
	const char *env = secure_getenv("KVD_BACKEND_DIR");
	if (env && env[0]) {
		cut[n] = put_dir(dirs[n], env, "");
		n++;
	} else {
		char self[PATH_MAX];
		exe_dir(self, sizeof(self));
		if (self[0]) {
			cut[n] = put_dir(dirs[n], self, "");
			cut[n + 1] = put_dir(dirs[n + 1], self, "/../lib/kvd");
			n += 2;
		}
		cut[n] = put_dir(dirs[n], KVD_BACKEND_LIBDIR, "");
		n++;
	}
	for (int i = 0; i < n; i++) {
		int rc = cut[i] ? -ENOENT : load_from(dirs[i]);
		if (rc != -ENOENT)
			return;
		/* Three long names whole would push the reason out of the caller's line: head and tail. */
		size_t used = strlen(tried), len = strlen(dirs[i]);
		if (cut[i] || len <= 128)
			snprintf(tried + used, sizeof(tried) - used, "%s%s", used ? ", " : "", dirs[i]);
		else
			snprintf(tried + used, sizeof(tried) - used, "%s%.64s...%s", used ? ", " : "",
				 dirs[i], dirs[i] + len - 48);
	}
	snprintf(cuda_so.why, sizeof(cuda_so.why), "no %s in %s%s", KB_CUDA_SONAME, tried,
		 env && env[0] ? " (KVD_BACKEND_DIR)" : "");
}

const struct kb_cuda_api *backend_cuda_load(char *why, size_t whylen, const char **path)
{
	pthread_once(&cuda_so.once, load_once);
	if (!cuda_so.api && whylen) {
		/* A caller's short buffer takes the reason's start; the message says it all first. */
		size_t len = strnlen(cuda_so.why, whylen - 1);
		memcpy(why, cuda_so.why, len);
		why[len] = '\0';
	}
	if (path)
		*path = cuda_so.path;
	return cuda_so.api;
}

#ifdef KVD_HAVE_CUDA
int backend_cuda_create(struct backend **out, int dev, char *why, size_t whylen)
{
	const struct kb_cuda_api *api = backend_cuda_load(why, whylen, NULL);
	return api ? api->create(out, dev, why, whylen) : -ELIBACC;
}

int backend_cuda_devices(char *why, size_t whylen)
{
	const struct kb_cuda_api *api = backend_cuda_load(why, whylen, NULL);
	return api ? api->devices(why, whylen) : 0;
}
#else
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

/* CUDA chosen: start it on device 0; why says on what and from which object, or why not. */
static int create_cuda(struct backend **out, const char *choice, const char *path, char *why,
		       size_t whylen)
{
	char err[256] = "";
	int rc = backend_cuda_create(out, 0, err, sizeof(err));
	if (rc)
		snprintf(why, whylen, "%s, but it cannot start: %s", choice, err[0] ? err : strerror(-rc));
	else
		snprintf(why, whylen, "%s: %s (%s)", choice, err, path);
	return rc;
}

int backend_create(struct backend **out, enum kb_kind want, uint32_t n_threads, char *why,
		   size_t whylen)
{
	char reason[768] = "", choice[256];
	const char *path = "";
#ifdef KVD_HAVE_CUDA
	const int built = 1;
#else
	const int built = 0;
#endif
	int n_dev = 0;
	if (want == KB_BACKEND_REF) {
		backend_choose(want, built, 0, why, whylen);
		return backend_ref_create(out, n_threads);
	}
	if (want != KB_BACKEND_CPU && built) {
		if (!backend_cuda_load(reason, sizeof(reason), &path)) {
			if (want == KB_BACKEND_CUDA) {
				snprintf(why, whylen, "cuda backend: requested, but it cannot start: "
					 "CUDA backend not loadable: %s", reason);
				return -ELIBACC;
			}
			snprintf(why, whylen, "cpu backend: auto, CUDA backend not loadable: %s", reason);
			return backend_cpu_create(out, n_threads);
		}
		n_dev = backend_cuda_devices(reason, sizeof(reason));
	}
	enum kb_kind k = backend_choose(want, built, n_dev, choice, sizeof(choice));
	if (k == KB_BACKEND_CUDA)
		return create_cuda(out, choice, path, why, whylen);
	int rc = backend_cpu_create(out, n_threads);
	if (n_dev <= 0 && want == KB_BACKEND_AUTO && built)
		snprintf(why, whylen, "%s (%s: %s)", choice, path, reason);
	else
		snprintf(why, whylen, "%s", choice);
	return rc;
}
