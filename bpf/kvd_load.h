/* kvd_load.h — load kvd's BPF programs, attach them to one kvd process, pin their maps. */
#ifndef KVD_BPF_LOAD_H
#define KVD_BPF_LOAD_H

#include <stddef.h>
#include <sys/types.h>

struct kvd_bpf;

enum kvd_bpf_mode {
	KVD_BPF_AUTO,	/* load when the process may (CAP_BPF + CAP_PERFMON, or CAP_SYS_ADMIN) */
	KVD_BPF_ON,	/* load or fail */
	KVD_BPF_OFF,
};

/* 1 if this process's effective capabilities allow loading and attaching the programs. */
int kvd_bpf_capable(void);

/*
 * Load the programs, attach them to the USDT probes of process pid (its
 * /proc/pid/exe), and pin the maps counters, pool, hists, uids and meta
 * under pin_dir (bpf/kvd_pin.h names it; created if missing, with its
 * parent when that is missing on a bpf file system). The loader holds an
 * flock() on pin_dir until kvd_bpf_unload(): a directory another running
 * loader holds makes this fail with -EBUSY and leaves its pins alone; pins
 * whose loader is gone are replaced. pin_dir becomes mode 0750 and the
 * pins 0640, of group gid ((gid_t)-1: the loader's own), so that group may
 * read them. Returns 0 and *out, or -errno with a message in err.
 */
int kvd_bpf_load(struct kvd_bpf **out, pid_t pid, const char *pin_dir, gid_t gid, char *err, size_t errlen);

/* Unpin every map, remove pin_dir if it is empty, let go of it, detach, free. NULL is fine. */
void kvd_bpf_unload(struct kvd_bpf *b);

/*
 * Run time and run count of all the programs together, counted only while
 * the kernel's BPF statistics are on (bpf_enable_stats(BPF_STATS_RUN_TIME)).
 */
int kvd_bpf_run_stats(const struct kvd_bpf *b, unsigned long long *ns, unsigned long long *runs);

#endif
