/* kvd_metrics.h — the BPF maps kvd pins under /sys/fs/bpf/kvd/ (version 1): a second ABI, read by kvtop, bpftool and scripts. */
#ifndef _UAPI_KVD_METRICS_H
#define _UAPI_KVD_METRICS_H

/*
 * Fixed-width __u32/__u64 fields only: the same structs are compiled for
 * the BPF target and for the host. Every map carries BTF, so
 * `bpftool map dump pinned /sys/fs/bpf/kvd/<map>` prints these names.
 * New fields go at the end of a struct; readers check value_size. The
 * sizes and offsets are pinned at the end of this file, so the program,
 * the loader and every reader that includes it fail to build when a field
 * moves.
 */

/* The BPF side has the kernel's own types from vmlinux.h, which clash with the uapi headers. */
#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define KVD_PIN_DIR	"/sys/fs/bpf/kvd"
#define KVD_HIST_SLOTS	32		/* log2 slots of microseconds */
#define KVD_UID_ALL	0xffffffffU	/* the histogram key of all clients together */
#define KVD_MAX_UIDS	1024		/* distinct client uids tracked */
#define KVD_MAX_REQS	65536		/* requests in flight tracked */
#define KVD_MAPS_VERSION 1

/* Latency histograms. */
enum kvd_hist_kind {
	KVD_HIST_QUEUE,		/* submit -> admit (the request leaves its slot's queue) */
	KVD_HIST_TTFT,		/* submit -> first token */
	KVD_HIST_ITL,		/* token -> next token of the same request */
	KVD_HIST_STEP,		/* engine step: step_begin -> step_end */
	KVD_HIST_PREFILL,	/* per prompt token: a step with prefill rows, its time / its rows */
	KVD_HIST_LAST
};

struct kvd_hist_key {
	__u32 uid;		/* a client uid, or KVD_UID_ALL */
	__u32 kind;		/* enum kvd_hist_kind */
};

/*
 * slots[0] counts values below 1 us; slots[i], i > 0, counts values v with
 * 2^(i-1) <= v < 2^i us (the last slot also takes everything longer).
 */
struct kvd_hist {
	__u64 count;
	__u64 sum_ns;
	__u64 slots[KVD_HIST_SLOTS];
};

/* The single entry of the map "counters": daemon-wide totals since the programs were loaded. */
struct kvd_counters {
	__u64 tokens;			/* tokens sampled (probe token) */
	__u64 first_tokens;		/* requests that produced their first token */
	__u64 requests;			/* requests completed (probe finish) */
	__u64 submitted;		/* requests queued (probe submit) */
	__u64 cancels;			/* cancellations asked for */
	__u64 prefill_tokens;		/* prompt tokens computed (probe prefill_chunk) */
	__u64 prefix_hit_tokens;	/* prompt tokens served from the prefix cache */
	__u64 prefix_miss_tokens;	/* prompt tokens looked up and not found */
	__u64 evictions;		/* cached KV blocks reclaimed */
	__u64 preemptions;		/* sequences that gave up their KV blocks */
	__u64 steps;			/* engine steps */
	__u64 kv_allocs;		/* KV blocks handed out */
	__u64 kv_frees;			/* KV blocks whose last holder let go */
	__u64 connects;
	__u64 disconnects;
};

/* Per client uid (map "uids"). */
struct kvd_uid_stats {
	__u64 tokens;
	__u64 requests;			/* completed */
	__u64 inflight;			/* submitted and neither completed nor dropped */
	__u64 prefill_tokens;
	__u64 prefix_hit_tokens;	/* only when prefixes are scoped per uid */
	__u64 prefix_miss_tokens;
	__u64 cancels;
};

/* The single entry of the map "pool": KV block occupancy after the last alloc/free. */
struct kvd_pool {
	__u64 in_use;			/* held by a sequence */
	__u64 cached;			/* free, holding a reusable prefix */
	__u64 free;
	__u64 updates;			/* 0: no alloc/free seen yet, the figures mean nothing */
};

/* The single entry of the map "meta": who loaded the programs, for kvtop and stale pins. */
struct kvd_meta {
	__u32 version;			/* KVD_MAPS_VERSION */
	__u32 daemon_pid;		/* the traced kvd */
	__u32 loader_pid;		/* the process that holds the links (kvd itself, or kvtop) */
	__u32 resv;
	__u64 loaded_ns;		/* CLOCK_MONOTONIC at load */
};

/* Per request in flight (map "reqs", not pinned). */
struct kvd_req {
	__u64 submit_ns;
	__u64 last_token_ns;		/* 0 before the first token */
	__u32 uid;
	__u32 resv;
};

/* Layout pins: a field that moves changes what every reader of the pins sees. */
#ifdef __cplusplus
#define KVD_METRICS_ASSERT_ static_assert
#else
#define KVD_METRICS_ASSERT_ _Static_assert
#endif
#define KVD_METRICS_PIN_(type, field, off) \
	KVD_METRICS_ASSERT_(__builtin_offsetof(type, field) == (off), #type "." #field " moved")

KVD_METRICS_ASSERT_(sizeof(struct kvd_hist_key) == 8, "kvd_hist_key size");
KVD_METRICS_PIN_(struct kvd_hist_key, kind, 4);
KVD_METRICS_ASSERT_(sizeof(struct kvd_hist) == 16 + 8 * KVD_HIST_SLOTS, "kvd_hist size");
KVD_METRICS_PIN_(struct kvd_hist, sum_ns, 8);
KVD_METRICS_PIN_(struct kvd_hist, slots, 16);
KVD_METRICS_ASSERT_(sizeof(struct kvd_counters) == 120, "kvd_counters size");
KVD_METRICS_PIN_(struct kvd_counters, prefill_tokens, 40);
KVD_METRICS_PIN_(struct kvd_counters, steps, 80);
KVD_METRICS_PIN_(struct kvd_counters, disconnects, 112);
KVD_METRICS_ASSERT_(sizeof(struct kvd_uid_stats) == 56, "kvd_uid_stats size");
KVD_METRICS_PIN_(struct kvd_uid_stats, inflight, 16);
KVD_METRICS_PIN_(struct kvd_uid_stats, cancels, 48);
KVD_METRICS_ASSERT_(sizeof(struct kvd_pool) == 32, "kvd_pool size");
KVD_METRICS_PIN_(struct kvd_pool, updates, 24);
KVD_METRICS_ASSERT_(sizeof(struct kvd_meta) == 24, "kvd_meta size");
KVD_METRICS_PIN_(struct kvd_meta, loader_pid, 8);
KVD_METRICS_PIN_(struct kvd_meta, loaded_ns, 16);
KVD_METRICS_ASSERT_(sizeof(struct kvd_req) == 24, "kvd_req size");
KVD_METRICS_PIN_(struct kvd_req, uid, 16);

#undef KVD_METRICS_PIN_
#undef KVD_METRICS_ASSERT_

#endif
