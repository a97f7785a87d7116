/* snap.c — what kvtop and kvhttp share: one reading of kvd's pinned BPF maps and STATS, figures from it, its Prometheus text. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include "tools/snap.h"

const char *const snap_hist_names[KVD_HIST_LAST] = { "queue", "ttft", "itl", "step", "prefill_per_token" };
static const char *const hist_prom[KVD_HIST_LAST] = {
	"queue_wait_seconds", "ttft_seconds", "inter_token_seconds", "step_seconds", "prefill_token_seconds",
};
static const char *const hist_help[KVD_HIST_LAST] = {
	"Time from submission until the scheduler starts the request.",
	"Time from submission to the first generated token.",
	"Time between consecutive tokens of one request.",
	"Duration of one engine step.",
	"Step time per row, for steps that carry prompt rows.",
};

/* Read-only: the pins are 0640 for the socket's group, and a read-write open needs w. */
static int open_map(const char *dir, const char *name)
{
	char path[512];
	LIBBPF_OPTS(bpf_obj_get_opts, ro, .file_flags = BPF_F_RDONLY);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int fd = bpf_obj_get_opts(path, &ro);
	return fd < 0 ? -errno : fd;
}

static struct uid_row *uid_row(struct snap *s, uint32_t uid)
{
	for (uint32_t i = 0; i < s->n_uids; i++)
		if (s->uids[i].uid == uid)
			return &s->uids[i];
	if (s->n_uids == SNAP_MAX_UIDS)
		return NULL;
	struct uid_row *r = &s->uids[s->n_uids++];
	memset(r, 0, sizeof(*r));
	r->uid = uid;
	return r;
}

/* The pinned maps under dir; 0, or -errno when they are not there (no BPF programs loaded). */
int snap_read_bpf(const char *dir, struct snap *s)
{
	int fd_c = open_map(dir, "counters");
	int fd_p = fd_c < 0 ? fd_c : open_map(dir, "pool");
	int fd_m = fd_p < 0 ? fd_p : open_map(dir, "meta");
	int fd_h = fd_m < 0 ? fd_m : open_map(dir, "hists");
	int fd_u = fd_h < 0 ? fd_h : open_map(dir, "uids");
	int rc = fd_u < 0 ? fd_u : 0;
	__u32 zero = 0;
	if (rc)
		goto out;
	if (bpf_map_lookup_elem(fd_c, &zero, &s->ctr) || bpf_map_lookup_elem(fd_p, &zero, &s->pool) ||
	    bpf_map_lookup_elem(fd_m, &zero, &s->meta)) {
		rc = -errno;
		goto out;
	}
	__u32 uid, *prev = NULL;
	while (bpf_map_get_next_key(fd_u, prev, &uid) == 0) {
		struct uid_row *r = uid_row(s, uid);
		if (r && bpf_map_lookup_elem(fd_u, &uid, &r->st))
			memset(&r->st, 0, sizeof(r->st));	/* gone meanwhile */
		prev = &uid;
	}
	struct kvd_hist_key k, *pk = NULL;
	while (bpf_map_get_next_key(fd_h, pk, &k) == 0) {
		struct kvd_hist h;
		pk = &k;
		if (k.kind >= KVD_HIST_LAST || bpf_map_lookup_elem(fd_h, &k, &h))
			continue;
		if (k.uid == KVD_UID_ALL) {
			s->h[k.kind] = h;
		} else {
			struct uid_row *r = uid_row(s, k.uid);
			if (r)
				r->h[k.kind] = h;
		}
	}
	s->have_bpf = 1;
out:
	for (int *fd = (int[]){ fd_c, fd_p, fd_m, fd_h, fd_u, -2 }; *fd != -2; fd++)
		if (*fd >= 0)
			close(*fd);
	return rc;
}


/* The histogram's estimate of quantile q, in seconds: the upper bound of the slot it falls in. */
double snap_hist_quantile(const struct kvd_hist *h, double q)
{
	__u64 total = 0, acc = 0;
	for (int i = 0; i < KVD_HIST_SLOTS; i++)
		total += h->slots[i];
	if (!total)
		return 0;
	for (int i = 0; i < KVD_HIST_SLOTS; i++) {
		acc += h->slots[i];
		if ((double)acc >= q * (double)total)
			return ldexp(1e-6, i);
	}
	return ldexp(1e-6, KVD_HIST_SLOTS - 1);
}

__u64 snap_hist_total(const struct kvd_hist *h)
{
	__u64 n = 0;
	for (int i = 0; i < KVD_HIST_SLOTS; i++)
		n += h->slots[i];
	return n;
}

__u64 snap_inflight(const struct snap *s)
{
	__u64 n = 0;
	for (uint32_t i = 0; i < s->n_uids; i++)
		n += s->uids[i].st.inflight;
	return n;
}

/* Pool figures: the BPF gauge once it has seen the pool change, else the daemon's STATS. */
int snap_pool_figures(const struct snap *s, __u64 *used, __u64 *cached, __u64 *total,
			const char **src)
{
	if (s->have_bpf && s->pool.updates) {
		*used = s->pool.in_use;
		*cached = s->pool.cached;
		*total = s->pool.in_use + s->pool.cached + s->pool.free;
		*src = "bpf";
		return 1;
	}
	if (s->have_stats) {
		*used = s->st.kv_blocks_used;
		*cached = s->st.kv_blocks_cached;
		*total = s->st.kv_blocks_total;
		*src = "stats";
		return 1;
	}
	*used = *cached = *total = 0;
	*src = "none";
	return 0;
}

double snap_hit_rate(__u64 hit, __u64 miss)
{
	return hit + miss ? (double)hit / (double)(hit + miss) : 0;
}

static void prom_head(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP kvd_%s %s\n# TYPE kvd_%s %s\n", name, help, name, type);
}

static void prom_one(FILE *f, const char *name, const char *type, const char *help, __u64 v)
{
	prom_head(f, name, type, help);
	fprintf(f, "kvd_%s %llu\n", name, v);
}

/* Cumulative buckets; the last slot is open-ended, so it is +Inf's. labels: "" or `uid="N",`. */
static void prom_hist(FILE *f, const char *name, const char *labels, const struct kvd_hist *h)
{
	__u64 acc = 0;
	for (int i = 0; i < KVD_HIST_SLOTS - 1; i++) {
		acc += h->slots[i];
		fprintf(f, "kvd_%s_bucket{%sle=\"%g\"} %llu\n", name, labels, ldexp(1e-6, i), acc);
	}
	acc += h->slots[KVD_HIST_SLOTS - 1];
	fprintf(f, "kvd_%s_bucket{%sle=\"+Inf\"} %llu\n", name, labels, acc);
	char lb[64] = "";
	if (*labels)
		snprintf(lb, sizeof(lb), "{%.*s}", (int)strlen(labels) - 1, labels);	/* drop the comma */
	fprintf(f, "kvd_%s_sum%s %.9f\n", name, lb, h->sum_ns * 1e-9);
	fprintf(f, "kvd_%s_count%s %llu\n", name, lb, acc);
}

/* One per-uid series of the field f of struct kvd_uid_stats. */
static void prom_uid(FILE *f, const struct snap *s, const char *name, size_t off, const char *type, const char *help)
{
	prom_head(f, name, type, help);
	for (uint32_t i = 0; i < s->n_uids; i++) {
		__u64 v;
		memcpy(&v, (const char *)&s->uids[i].st + off, sizeof(v));
		fprintf(f, "kvd_%s{uid=\"%u\"} %llu\n", name, s->uids[i].uid, v);
	}
}

void snap_prometheus(FILE *f, const struct snap *s)
{
	const struct kvd_counters *c = &s->ctr;
	prom_one(f, "up", "gauge", "1 if kvtop reached the daemon's socket.", (__u64)s->have_stats);
	prom_one(f, "bpf_loaded", "gauge", "1 if the BPF metrics maps are pinned.", (__u64)s->have_bpf);
	if (s->have_bpf) {
		prom_one(f, "tokens_total", "counter", "Tokens generated.", c->tokens);
		prom_one(f, "first_tokens_total", "counter", "Requests that produced a first token.", c->first_tokens);
		prom_one(f, "requests_total", "counter", "Requests completed.", c->requests);
		prom_one(f, "requests_submitted_total", "counter", "Requests queued.", c->submitted);
		prom_one(f, "cancels_total", "counter", "Cancellations asked for.", c->cancels);
		prom_one(f, "prefill_tokens_total", "counter", "Prompt tokens computed.", c->prefill_tokens);
		prom_one(f, "prefix_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.", c->prefix_hit_tokens);
		prom_one(f, "prefix_miss_tokens_total", "counter", "Prompt tokens not found in the prefix cache.", c->prefix_miss_tokens);
		prom_one(f, "evictions_total", "counter", "Cached KV blocks reclaimed.", c->evictions);
		prom_one(f, "preemptions_total", "counter", "Sequences that gave up their KV blocks.", c->preemptions);
		prom_one(f, "steps_total", "counter", "Engine steps.", c->steps);
		prom_one(f, "requests_in_flight", "gauge", "Requests submitted and not completed.", snap_inflight(s));
		for (int k = 0; k < KVD_HIST_LAST; k++) {
			prom_head(f, hist_prom[k], "histogram", hist_help[k]);
			prom_hist(f, hist_prom[k], "", &s->h[k]);
		}
		prom_uid(f, s, "uid_tokens_total", offsetof(struct kvd_uid_stats, tokens), "counter",
			 "Tokens generated, per client uid.");
		prom_uid(f, s, "uid_requests_total", offsetof(struct kvd_uid_stats, requests), "counter",
			 "Requests completed, per client uid.");
		prom_uid(f, s, "uid_requests_in_flight", offsetof(struct kvd_uid_stats, inflight), "gauge",
			 "Requests in flight, per client uid.");
		prom_uid(f, s, "uid_prefill_tokens_total", offsetof(struct kvd_uid_stats, prefill_tokens),
			 "counter", "Prompt tokens computed, per client uid.");
		prom_uid(f, s, "uid_prefix_hit_tokens_total", offsetof(struct kvd_uid_stats, prefix_hit_tokens),
			 "counter", "Prompt tokens served from the prefix cache, per client uid.");
		prom_uid(f, s, "uid_prefix_miss_tokens_total", offsetof(struct kvd_uid_stats, prefix_miss_tokens),
			 "counter", "Prompt tokens not found in the prefix cache, per client uid.");
		for (int k = 0; k <= KVD_HIST_ITL; k++) {
			char name[64], help[160], lb[32];
			snprintf(name, sizeof(name), "uid_%s", hist_prom[k]);
			snprintf(help, sizeof(help), "%s Per client uid.", hist_help[k]);
			prom_head(f, name, "histogram", help);
			for (uint32_t i = 0; i < s->n_uids; i++) {
				snprintf(lb, sizeof(lb), "uid=\"%u\",", s->uids[i].uid);
				prom_hist(f, name, lb, &s->uids[i].h[k]);
			}
		}
	}
	__u64 used, cached, total;
	const char *src;
	if (snap_pool_figures(s, &used, &cached, &total, &src)) {
		prom_head(f, "kv_blocks", "gauge", "KV cache blocks by state.");
		fprintf(f, "kvd_kv_blocks{state=\"in_use\"} %llu\n", used);
		fprintf(f, "kvd_kv_blocks{state=\"cached\"} %llu\n", cached);
		fprintf(f, "kvd_kv_blocks{state=\"free\"} %llu\n", total - used - cached);
	}
	if (s->have_stats) {
		const struct kvd_stats_rep *t = &s->st;
		prom_one(f, "daemon_requests_total", "counter", "Requests completed (daemon STATS).", t->requests);
		prom_one(f, "daemon_tokens_prefilled_total", "counter", "Prompt tokens computed (daemon STATS).", t->tokens_prefilled);
		prom_one(f, "daemon_tokens_generated_total", "counter", "Tokens sampled (daemon STATS).", t->tokens_generated);
		prom_one(f, "daemon_prefix_hit_tokens_total", "counter", "Prefix-cache hit tokens (daemon STATS).", t->prefix_hit_tokens);
		prom_one(f, "daemon_prefix_miss_tokens_total", "counter", "Prefix-cache miss tokens (daemon STATS).", t->prefix_miss_tokens);
		prom_one(f, "daemon_evictions_total", "counter", "Cached blocks reclaimed (daemon STATS).", t->evictions);
		prom_one(f, "daemon_preemptions_total", "counter", "Sequences preempted (daemon STATS).", t->preemptions);
		prom_one(f, "daemon_steps_total", "counter", "Engine steps (daemon STATS).", t->steps);
		prom_one(f, "daemon_connections", "gauge", "Client connections open.", t->connections);
		prom_one(f, "daemon_sessions", "gauge", "Sessions open.", t->sessions);
	}
}
