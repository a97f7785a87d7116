/* kvd_pin.h — where one daemon's BPF maps are pinned: a directory per instance, named by --instance or after its socket. */
#ifndef KVD_BPF_PIN_H
#define KVD_BPF_PIN_H

#include <stddef.h>

/*
 * Each daemon pins under KVD_PIN_DIR/<instance>/ (KVD_PIN_DIR is
 * /sys/fs/bpf/kvd, uapi/kvd_metrics.h), so two daemons never share maps
 * and kvtop --socket PATH finds the maps of the daemon on PATH. kvd and
 * kvtop both call kvd_pin_dir(): the name is derived, not asked for, so the
 * maps are found while the daemon is busy or gone.
 */
#define KVD_PIN_SYSTEM_SOCKET	"/run/kvd/kvd.sock"	/* its instance is "kvd" */
#define KVD_PIN_INSTANCE_MAX	48			/* characters of an instance name */

/* 1 if s can name an instance: 1 to KVD_PIN_INSTANCE_MAX of [A-Za-z0-9_.-], not starting with '.'. */
static inline int kvd_pin_instance_valid(const char *s)
{
	size_t n = 0;
	if (!s || !*s || *s == '.')
		return 0;
	for (; s[n]; n++) {
		char c = s[n];
		if (n == KVD_PIN_INSTANCE_MAX ||
		    !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '.' || c == '-'))
			return 0;
	}
	return 1;
}

/*
 * The instance of a daemon on socket path sock that was not given one:
 * "kvd" for KVD_PIN_SYSTEM_SOCKET; else the file name without ".sock"
 * (characters an instance may not hold become '_', at most 32 kept), '-',
 * and 8 hex digits of a hash of the absolute path with its directory
 * resolved (realpath), so that /a/kvd.sock, ./kvd.sock seen from /a, and a
 * symlinked /a name one instance, and /b/kvd.sock another. Returns the
 * length, or -ENAMETOOLONG.
 */
int kvd_pin_instance(char *buf, size_t len, const char *sock);

/*
 * $KVD_BPF_PIN_DIR when set and not empty (every daemon and kvtop that see
 * it share that one directory); else KVD_PIN_DIR/instance, with instance,
 * when NULL, kvd_pin_instance(sock). Returns the length, or -EINVAL (an
 * invalid instance) or -ENAMETOOLONG.
 */
int kvd_pin_dir(char *buf, size_t len, const char *instance, const char *sock);

#endif
