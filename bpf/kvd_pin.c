/* kvd_pin.c — the pin directory of a daemon, the same in kvd and kvtop: from $KVD_BPF_PIN_DIR, its instance, or its socket path. */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bpf/kvd_pin.h"
#include "uapi/kvd_metrics.h"

/* FNV-1a: stable across builds and machines, which is all a name needs. */
static uint32_t fnv1a(const char *s)
{
	uint32_t h = 2166136261u;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 16777619u;
	return h;
}

/*
 * sock as an absolute path with its directory resolved: the daemon may
 * name it before binding (no file yet), kvtop after, and either may spell it
 * relative or through a symlink.
 */
static int canonical(char *buf, size_t len, const char *sock)
{
	char dir[PATH_MAX], real[PATH_MAX];
	const char *slash = strrchr(sock, '/');
	const char *base = slash ? slash + 1 : sock;
	int n;
	if (slash)
		n = snprintf(dir, sizeof(dir), "%.*s", slash == sock ? 1 : (int)(slash - sock), sock);
	else
		n = snprintf(dir, sizeof(dir), ".");
	if (n < 0 || (size_t)n >= sizeof(dir))
		return -ENAMETOOLONG;
	if (realpath(dir, real))
		n = snprintf(buf, len, "%s%s%s", real, strcmp(real, "/") ? "/" : "", base);
	else if (sock[0] == '/' || !getcwd(real, sizeof(real)))
		n = snprintf(buf, len, "%s", sock);
	else
		n = snprintf(buf, len, "%s/%s", real, sock);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : n;
}

int kvd_pin_instance(char *buf, size_t len, const char *sock)
{
	char path[PATH_MAX], stem[33];
	int rc = canonical(path, sizeof(path), sock);
	if (rc < 0)
		return rc;
	if (!strcmp(path, KVD_PIN_SYSTEM_SOCKET)) {
		rc = snprintf(buf, len, "kvd");
		return rc < 0 || (size_t)rc >= len ? -ENAMETOOLONG : rc;
	}
	const char *base = strrchr(path, '/') + 1;
	size_t n = strlen(base);
	if (n > 5 && !strcmp(base + n - 5, ".sock"))
		n -= 5;
	if (n > sizeof(stem) - 1)
		n = sizeof(stem) - 1;
	for (size_t i = 0; i < n; i++) {
		char c = base[i];
		int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			 c == '-' || c == '_' || (c == '.' && i);
		stem[i] = ok ? c : '_';
	}
	stem[n] = 0;
	rc = snprintf(buf, len, "%s%s%08x", stem, n ? "-" : "kvd-", fnv1a(path));
	return rc < 0 || (size_t)rc >= len ? -ENAMETOOLONG : rc;
}

int kvd_pin_dir(char *buf, size_t len, const char *instance, const char *sock)
{
	const char *env = getenv("KVD_BPF_PIN_DIR");
	char name[64];
	int rc;
	if (env && *env) {
		rc = snprintf(buf, len, "%s", env);
		return rc < 0 || (size_t)rc >= len ? -ENAMETOOLONG : rc;
	}
	if (!instance) {
		if ((rc = kvd_pin_instance(name, sizeof(name), sock)) < 0)
			return rc;
		instance = name;
	} else if (!kvd_pin_instance_valid(instance)) {
		return -EINVAL;
	}
	rc = snprintf(buf, len, "%s/%s", KVD_PIN_DIR, instance);
	return rc < 0 || (size_t)rc >= len ? -ENAMETOOLONG : rc;
}
