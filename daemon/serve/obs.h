/* obs.h — the daemon's --bpf option: load, attach and pin its metrics programs, and undo it at exit. */
#ifndef KVD_OBS_H
#define KVD_OBS_H

#include <sys/types.h>
#include "bpf/kvd_load.h"

/*
 * KVD_BPF_AUTO: load when the process holds the capabilities, a failure is
 * logged; KVD_BPF_ON: a failure is returned as -errno; KVD_BPF_OFF: nothing.
 * *out is NULL when nothing was loaded. Maps are pinned where
 * kvd_pin_dir() says for instance (NULL: named after the socket: the one
 * systemd passed, else socket_path), so kvtop --socket finds them; they are
 * readable by the socket's group (socket_gid, or the passed socket's group;
 * (gid_t)-1: the daemon's). A directory another live daemon holds is left
 * alone: a warning, or -EBUSY with KVD_BPF_ON.
 */
int obs_start(enum kvd_bpf_mode mode, const char *socket_path, const char *instance, gid_t socket_gid,
	      struct kvd_bpf **out);

/* Detach and unpin; NULL is fine. */
void obs_stop(struct kvd_bpf *b);

#endif
