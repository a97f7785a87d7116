/* snap.h — what kvtop and kvhttp share: one reading of kvd's pinned BPF maps and STATS, figures from it, its Prometheus text. */
#ifndef KVD_TOOLS_SNAP_H
#define KVD_TOOLS_SNAP_H

#include <stdint.h>
#include <stdio.h>
#include "uapi/kvd.h"
#include "uapi/kvd_metrics.h"

#define SNAP_MAX_UIDS 256

struct uid_row {
	uint32_t uid;
	struct kvd_uid_stats st;
	struct kvd_hist h[KVD_HIST_LAST];
};

/* One reading of everything kvtop shows. */
struct snap {
	double t;			/* CLOCK_MONOTONIC seconds */
	int have_bpf;
	int bpf_err;			/* why not: the first map's -errno */
	struct kvd_counters ctr;
	struct kvd_pool pool;
	struct kvd_meta meta;
	struct kvd_hist h[KVD_HIST_LAST];	/* all clients */
	struct uid_row uids[SNAP_MAX_UIDS];
	uint32_t n_uids;
	int have_stats;
	struct kvd_stats_rep st;
};

/* Short names of the histograms (KVD_HIST_*), as JSON keys. */
extern const char *const snap_hist_names[KVD_HIST_LAST];

/* The pinned maps under dir into s; 0, or -errno when they are not there (no BPF programs loaded). */
int snap_read_bpf(const char *dir, struct snap *s);

/* The histogram's estimate of quantile q, in seconds: the upper bound of the slot it falls in. */
double snap_hist_quantile(const struct kvd_hist *h, double q);
__u64 snap_hist_total(const struct kvd_hist *h);
/* Requests in flight over all uids. */
__u64 snap_inflight(const struct snap *s);
/* Pool figures: the BPF gauge once it has seen the pool change, else the daemon's STATS; 0 if neither. */
int snap_pool_figures(const struct snap *s, __u64 *used, __u64 *cached, __u64 *total, const char **src);
double snap_hit_rate(__u64 hit, __u64 miss);

/* s in the Prometheus text exposition format (kvtop --prometheus, kvhttp's /metrics). */
void snap_prometheus(FILE *f, const struct snap *s);

#endif
