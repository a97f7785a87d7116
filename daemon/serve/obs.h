/* obs.h — the daemon's --bpf option: load, attach and pin its metrics programs, and undo it at exit. */
#ifndef KVD_OBS_H
#define KVD_OBS_H

#include "bpf/kvd_load.h"

/*
 * KVD_BPF_AUTO: load when the process holds the capabilities, a failure is
 * logged; KVD_BPF_ON: a failure is returned as -errno; KVD_BPF_OFF: nothing.
 * *out is NULL when nothing was loaded. Maps are pinned under
 * $KVD_BPF_PIN_DIR, else /sys/fs/bpf/kvd.
 */
int obs_start(enum kvd_bpf_mode mode, struct kvd_bpf **out);

/* Detach and unpin; NULL is fine. */
void obs_stop(struct kvd_bpf *b);

#endif
