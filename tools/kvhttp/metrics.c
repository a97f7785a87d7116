/* metrics.c — GET /metrics: kvhttp's own counters, then what kvtop --prometheus prints, vLLM's names where they exist. */
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

static void one(FILE *f, const char *name, const char *type, const char *help, unsigned long long v)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name, v);
}

/* vLLM's names for the figures it shares with kvd, so dashboards built for it work. */
static void vllm_names(FILE *f, const struct snap *s)
{
	__u64 used, cached, total;
	const char *src;
	if (snap_pool_figures(s, &used, &cached, &total, &src))
		fprintf(f, "# HELP vllm:gpu_cache_usage_perc KV cache blocks in use, of the pool (1 = full).\n"
			   "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc %g\n",
			total ? (double)used / (double)total : 0.0);
	if (s->have_bpf)
		one(f, "vllm:num_requests_running", "gauge", "Requests submitted to kvd and not completed.",
		    snap_inflight(s));
	if (s->have_stats)
		one(f, "vllm:num_preemptions_total", "counter", "Sequences preempted (daemon STATS).",
		    s->st.preemptions);
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
	one(f, "vllm:prompt_tokens_total", "counter", "Prompt tokens of requests kvhttp served.",
	    __atomic_load_n(&m_prompt, __ATOMIC_RELAXED));
	one(f, "vllm:generation_tokens_total", "counter", "Tokens generated for requests kvhttp served.",
	    __atomic_load_n(&m_completion, __ATOMIC_RELAXED));
	kvd_part(f, sock);
	if (fclose(f))
		return -errno;
	*out = buf;
	return (int)len;
}
