// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/* kvd.bpf.c — programs on kvd's USDT probes: latency histograms, counters and the KV pool gauge. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>
#include "uapi/kvd_metrics.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The loader pins these by name (not by libbpf's pinning attribute: a stale pin must not be reused). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kvd_counters);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kvd_pool);
} pool SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct kvd_meta);
} meta SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, (KVD_MAX_UIDS + 1) * KVD_HIST_LAST);
	__type(key, struct kvd_hist_key);
	__type(value, struct kvd_hist);
} hists SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KVD_MAX_UIDS);
	__type(key, __u32);
	__type(value, struct kvd_uid_stats);
} uids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KVD_MAX_REQS);
	__type(key, __u64);
	__type(value, struct kvd_req);
} reqs SEC(".maps");

/* Zero values to create map entries from (in .rodata, not on the 512-byte stack). */
static const struct kvd_hist zero_hist;
static const struct kvd_uid_stats zero_uid;

/* The engine thread is the only one between step_begin and step_end. */
__u64 step_t0;

#define ADD(field, v) __sync_fetch_and_add(&(field), (v))

static __always_inline struct kvd_counters *ctrs(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&counters, &zero);
}

static __always_inline struct kvd_uid_stats *uid_stats(__u32 uid)
{
	struct kvd_uid_stats *u = bpf_map_lookup_elem(&uids, &uid);
	if (u)
		return u;
	bpf_map_update_elem(&uids, &uid, &zero_uid, BPF_NOEXIST);
	return bpf_map_lookup_elem(&uids, &uid);
}

/* Number of bits of v: 0 for 0, i for 2^(i-1) <= v < 2^i. */
static __always_inline __u32 bits64(__u64 v)
{
	__u32 n = 0;
	if (v >> 32) { v >>= 32; n += 32; }
	if (v >> 16) { v >>= 16; n += 16; }
	if (v >> 8) { v >>= 8; n += 8; }
	if (v >> 4) { v >>= 4; n += 4; }
	if (v >> 2) { v >>= 2; n += 2; }
	if (v >> 1) { v >>= 1; n += 1; }
	return n + (__u32)v;
}

static __always_inline void hist_one(__u32 uid, __u32 kind, __u64 ns, __u32 slot)
{
	struct kvd_hist_key k = { .uid = uid, .kind = kind };
	struct kvd_hist *h = bpf_map_lookup_elem(&hists, &k);
	if (!h) {
		bpf_map_update_elem(&hists, &k, &zero_hist, BPF_NOEXIST);
		h = bpf_map_lookup_elem(&hists, &k);
		if (!h)
			return;
	}
	/* The verifier must see the bound right at the access, after the compiler is done with it. */
	asm volatile("" : "+r"(slot));
	ADD(h->slots[slot & (KVD_HIST_SLOTS - 1)], 1);
	ADD(h->sum_ns, ns);
	ADD(h->count, 1);
}

/* Into the overall histogram and, for a client's request, that uid's. */
static __always_inline void hist_add(__u32 uid, __u32 kind, __u64 ns)
{
	__u32 slot = bits64(ns / 1000);
	if (slot >= KVD_HIST_SLOTS)
		slot = KVD_HIST_SLOTS - 1;
	hist_one(KVD_UID_ALL, kind, ns, slot);
	if (uid != KVD_UID_ALL)
		hist_one(uid, kind, ns, slot);
}

SEC("usdt")
int BPF_USDT(kvd_submit, __u64 id, __u32 session, __u32 uid, __u32 opcode, __u32 n_prompt, __u32 max_out)
{
	struct kvd_req r = { .submit_ns = bpf_ktime_get_ns(), .uid = uid };
	struct kvd_counters *c = ctrs();
	struct kvd_uid_stats *u = uid_stats(uid);
	if (c)
		ADD(c->submitted, 1);
	/* Requests already in flight when the programs were loaded are not tracked (see kvd_finish). */
	if (bpf_map_update_elem(&reqs, &id, &r, BPF_ANY) == 0 && u)
		ADD(u->inflight, 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_admit, __u64 id, __u32 uid, __u32 n_prompt)
{
	struct kvd_req *r = bpf_map_lookup_elem(&reqs, &id);
	if (r)
		hist_add(r->uid, KVD_HIST_QUEUE, bpf_ktime_get_ns() - r->submit_ns);
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_first_token, __u64 id, __u32 uid)
{
	struct kvd_counters *c = ctrs();
	struct kvd_req *r = bpf_map_lookup_elem(&reqs, &id);
	if (c)
		ADD(c->first_tokens, 1);
	if (r)
		hist_add(r->uid, KVD_HIST_TTFT, bpf_ktime_get_ns() - r->submit_ns);
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_token, __u64 id, __u32 uid, __u32 tok, __u32 n_out)
{
	__u64 now = bpf_ktime_get_ns();
	struct kvd_counters *c = ctrs();
	struct kvd_uid_stats *u = uid_stats(uid);
	struct kvd_req *r = bpf_map_lookup_elem(&reqs, &id);
	if (c)
		ADD(c->tokens, 1);
	if (u)
		ADD(u->tokens, 1);
	if (r) {
		if (r->last_token_ns)
			hist_add(r->uid, KVD_HIST_ITL, now - r->last_token_ns);
		r->last_token_ns = now;
	}
	return 0;
}

/* A request leaves: completed (finish) or dropped with its connection (drop). */
static __always_inline void req_gone(__u64 id)
{
	struct kvd_req *r = bpf_map_lookup_elem(&reqs, &id);
	if (!r)
		return;
	struct kvd_uid_stats *u = bpf_map_lookup_elem(&uids, &r->uid);
	if (u)
		ADD(u->inflight, -1);
	bpf_map_delete_elem(&reqs, &id);
}

SEC("usdt")
int BPF_USDT(kvd_finish, __u64 id, __u32 uid, __s32 res, __u32 flags, __u32 n_out)
{
	struct kvd_counters *c = ctrs();
	struct kvd_uid_stats *u = uid_stats(uid);
	if (c)
		ADD(c->requests, 1);
	if (u)
		ADD(u->requests, 1);
	req_gone(id);
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_drop, __u64 id, __u32 uid)
{
	req_gone(id);
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_cancel, __u64 id, __u32 uid)
{
	struct kvd_counters *c = ctrs();
	struct kvd_uid_stats *u = uid_stats(uid);
	if (c)
		ADD(c->cancels, 1);
	if (u)
		ADD(u->cancels, 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_prefill_chunk, __u64 id, __u32 uid, __u32 from, __u32 n)
{
	struct kvd_counters *c = ctrs();
	struct kvd_uid_stats *u = uid_stats(uid);
	if (c)
		ADD(c->prefill_tokens, n);
	if (u)
		ADD(u->prefill_tokens, n);
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_step_begin, __u64 step, __u32 rows, __u32 prefill_rows, __u32 decode_rows)
{
	step_t0 = bpf_ktime_get_ns();
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_step_end, __u64 step, __u32 rows, __u32 prefill_rows, __u32 decode_rows, __s32 rc)
{
	struct kvd_counters *c = ctrs();
	__u64 t0 = step_t0;
	if (c)
		ADD(c->steps, 1);
	if (!t0)
		return 0;	/* loaded in the middle of a step */
	__u64 dt = bpf_ktime_get_ns() - t0;
	step_t0 = 0;
	hist_add(KVD_UID_ALL, KVD_HIST_STEP, dt);
	if (prefill_rows && rows)
		hist_add(KVD_UID_ALL, KVD_HIST_PREFILL, dt / rows);
	return 0;
}

/* ns: the prefix-cache namespace, uid + 1 for a client's sequence, 0 when shared by all. */
SEC("usdt")
int BPF_USDT(kvd_prefix_lookup, __u32 ns, __u32 hit, __u32 miss)
{
	struct kvd_counters *c = ctrs();
	if (c) {
		ADD(c->prefix_hit_tokens, hit);
		ADD(c->prefix_miss_tokens, miss);
	}
	if (ns) {
		struct kvd_uid_stats *u = uid_stats(ns - 1);
		if (u) {
			ADD(u->prefix_hit_tokens, hit);
			ADD(u->prefix_miss_tokens, miss);
		}
	}
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_kv_evict, __u32 block)
{
	struct kvd_counters *c = ctrs();
	if (c)
		ADD(c->evictions, 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_preempt, __u64 id, __u32 ns, __u32 tokens)
{
	struct kvd_counters *c = ctrs();
	if (c)
		ADD(c->preemptions, 1);
	return 0;
}

/* The pool's own counts ride on every alloc and free: the gauge is exact, not summed. */
static __always_inline void pool_set(__u32 in_use, __u32 cached, __u32 nfree)
{
	__u32 zero = 0;
	struct kvd_pool *p = bpf_map_lookup_elem(&pool, &zero);
	if (!p)
		return;
	p->in_use = in_use;
	p->cached = cached;
	p->free = nfree;
	ADD(p->updates, 1);
}

SEC("usdt")
int BPF_USDT(kvd_kv_alloc, __u32 block, __u32 in_use, __u32 cached, __u32 nfree)
{
	struct kvd_counters *c = ctrs();
	if (c)
		ADD(c->kv_allocs, 1);
	pool_set(in_use, cached, nfree);
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_kv_free, __u32 block, __u32 in_use, __u32 cached, __u32 nfree)
{
	struct kvd_counters *c = ctrs();
	if (c)
		ADD(c->kv_frees, 1);
	pool_set(in_use, cached, nfree);
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_conn_open, __s32 pid, __u32 uid)
{
	struct kvd_counters *c = ctrs();
	if (c)
		ADD(c->connects, 1);
	return 0;
}

SEC("usdt")
int BPF_USDT(kvd_conn_close, __s32 pid, __u32 uid)
{
	struct kvd_counters *c = ctrs();
	if (c)
		ADD(c->disconnects, 1);
	return 0;
}
