/* metrics.c — GET /metrics: kvhttp's own counters and latency histograms, then what kvtop --prometheus prints; vLLM's names (with kvd: for vllm:) where they exist. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include "bpf/kvd_pin.h"
#include "tools/snap.h"
#include "tools/kvhttp/kvhttp.h"

static unsigned long long m_requests[6];	/* by status class: 1xx..5xx, index 1..5 */
static unsigned long long m_prompt, m_completion;
static unsigned long long m_finished[3];	/* choices by finished_reason: stop, length, abort */
static const char *const FINISHED[3] = { "stop", "length", "abort" };

/*
 * vLLM's bucket boundaries (vllm/v1/metrics/loggers.py), so its dashboards'
 * quantiles mean the same here: TTFT 1 ms .. 2560 s, ITL 10 ms .. 80 s.
 */
static const double TTFT_LE[] = { 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
				  2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0 };
static const double ITL_LE[] = { 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
				 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0 };
#define N_LE(a)	(sizeof(a) / sizeof((a)[0]))

/* Counts per bucket (not cumulative; the last one is +Inf), under mu with the sum. */
struct hist {
	const double *le;
	unsigned int n_le;
	unsigned long long count[N_LE(TTFT_LE) + 1];
	double sum;
};

static pthread_mutex_t h_mu = PTHREAD_MUTEX_INITIALIZER;
static struct hist h_ttft = { TTFT_LE, N_LE(TTFT_LE), { 0 }, 0 };
static struct hist h_itl = { ITL_LE, N_LE(ITL_LE), { 0 }, 0 };

static void observe(struct hist *h, double s)
{
	unsigned int b = 0;
	while (b < h->n_le && s > h->le[b])
		b++;
	pthread_mutex_lock(&h_mu);
	h->count[b]++;
	h->sum += s;
	pthread_mutex_unlock(&h_mu);
}

void kvh_metrics_ttft(double seconds) { observe(&h_ttft, seconds); }
void kvh_metrics_itl(double seconds) { observe(&h_itl, seconds); }

void kvh_metrics_request(unsigned int status)
{
	unsigned int k = status / 100;
	__atomic_add_fetch(&m_requests[k < 6 ? k : 5], 1, __ATOMIC_RELAXED);
}

void kvh_metrics_tokens(uint32_t prompt, uint32_t completion)
{
	__atomic_add_fetch(&m_prompt, prompt, __ATOMIC_RELAXED);
	__atomic_add_fetch(&m_completion, completion, __ATOMIC_RELAXED);
}

void kvh_metrics_finished(const char *reason)
{
	unsigned int k = reason && !strcmp(reason, "stop") ? 0 : reason && !strcmp(reason, "length") ? 1 : 2;
	__atomic_add_fetch(&m_finished[k], 1, __ATOMIC_RELAXED);
}

static void hist_print(FILE *f, const char *name, const char *help, const struct hist *h)
{
	struct hist c;
	pthread_mutex_lock(&h_mu);
	c = *h;
	pthread_mutex_unlock(&h_mu);
	fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	unsigned long long acc = 0;
	for (unsigned int b = 0; b < c.n_le; b++) {
		acc += c.count[b];
		fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, c.le[b], acc);
	}
	acc += c.count[c.n_le];
	fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9f\n%s_count %llu\n", name, acc, name, c.sum, name, acc);
}

static void one(FILE *f, const char *name, const char *type, const char *help, unsigned long long v)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name, v);
}

/*
 * vLLM's names for the figures it shares with kvd, prefixed kvd: rather
 * than vllm: (these are kvd's figures; a relabel maps them for vLLM's
 * dashboards). KV-cache usage from STATS when kvd answered, else the BPF
 * pool map.
 */
static void vllm_names(FILE *f, const struct snap *s)
{
	__u64 used, cached, total;
	const char *src;
	int have = snap_pool_figures(s, &used, &cached, &total, &src);
	if (s->have_stats) {
		used = s->st.kv_blocks_used;
		total = s->st.kv_blocks_total;
	}
	if (have)
		fprintf(f, "# HELP kvd:kv_cache_usage_perc KV cache blocks in use, of the pool (1 = full).\n"
			   "# TYPE kvd:kv_cache_usage_perc gauge\nkvd:kv_cache_usage_perc %g\n",
			total ? (double)used / (double)total : 0.0);
	if (s->have_bpf)
		one(f, "kvd:num_requests_running", "gauge", "Requests submitted to kvd and not completed.",
		    snap_inflight(s));
	if (s->have_stats) {
		one(f, "kvd:num_preemptions_total", "counter", "Sequences preempted (daemon STATS).",
		    s->st.preemptions);
		one(f, "kvd:prefix_cache_queries_total", "counter",
		    "Prompt tokens looked up in the prefix cache (daemon STATS).",
		    s->st.prefix_hit_tokens + s->st.prefix_miss_tokens);
		one(f, "kvd:prefix_cache_hits_total", "counter", "Prompt tokens the prefix cache supplied (daemon STATS).",
		    s->st.prefix_hit_tokens);
	}
}

/* What kvtop --socket SOCK --prometheus prints, read the same way (tools/snap.c). */
static void kvd_part(FILE *f, const char *sock)
{
	static struct snap s;	/* 100 kB: not on a connection thread's stack; under the lock */
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	char def[256], dir[256];
	pthread_mutex_lock(&mu);
	memset(&s, 0, sizeof(s));
	if (!sock && kvc_default_socket(def, sizeof(def)) >= 0)
		sock = def;
	s.bpf_err = sock && kvd_pin_dir(dir, sizeof(dir), NULL, sock) >= 0 ? snap_read_bpf(dir, &s) : -ENOENT;
	s.have_stats = kvh_pool_stats(&s.st, NULL) == 0;
	snap_prometheus(f, &s);
	vllm_names(f, &s);
	pthread_mutex_unlock(&mu);
}

int kvh_metrics_text(char **out, const char *sock)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return -errno;
	fprintf(f, "# HELP kvhttp_requests_total HTTP requests answered, by status class.\n"
		   "# TYPE kvhttp_requests_total counter\n");
	for (int k = 2; k < 6; k++)
		fprintf(f, "kvhttp_requests_total{code=\"%dxx\"} %llu\n", k,
			__atomic_load_n(&m_requests[k], __ATOMIC_RELAXED));
	one(f, "kvd:prompt_tokens_total", "counter", "Prompt tokens of requests kvhttp served.",
	    __atomic_load_n(&m_prompt, __ATOMIC_RELAXED));
	one(f, "kvd:generation_tokens_total", "counter", "Tokens generated for requests kvhttp served.",
	    __atomic_load_n(&m_completion, __ATOMIC_RELAXED));
	fprintf(f, "# HELP kvd:request_success_total Choices finished, by finished_reason (abort: the client "
		   "went away).\n# TYPE kvd:request_success_total counter\n");
	for (int k = 0; k < 3; k++)
		fprintf(f, "kvd:request_success_total{finished_reason=\"%s\"} %llu\n", FINISHED[k],
			__atomic_load_n(&m_finished[k], __ATOMIC_RELAXED));
	hist_print(f, "kvd:time_to_first_token_seconds",
		   "From the request's arrival to its first generated token, as kvhttp saw it.", &h_ttft);
	hist_print(f, "kvd:inter_token_latency_seconds",
		   "Between consecutive generated tokens of a choice, as kvhttp saw them.", &h_itl);
	kvd_part(f, sock);
	if (fclose(f))
		return -errno;
	*out = buf;
	return (int)len;
}
