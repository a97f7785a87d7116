/* metrics.c — GET /metrics: kvhttp's own counters and kvd's STATS as Prometheus text, vLLM's names where they exist. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
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

int kvh_metrics_text(char **out)
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
	struct kvd_stats_rep st;
	struct kvd_hello_rep h;
	int up = kvh_pool_stats(&st, &h) == 0;
	one(f, "kvd_up", "gauge", "1 if kvhttp reached kvd's socket.", (unsigned long long)up);
	if (up) {
		double use = st.kv_blocks_total ? (double)st.kv_blocks_used / (double)st.kv_blocks_total : 0;
		fprintf(f, "# HELP vllm:gpu_cache_usage_perc KV cache blocks in use, of the pool (1 = full).\n"
			   "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc %g\n", use);
		fprintf(f, "# HELP kvd_kv_blocks KV cache blocks by state.\n# TYPE kvd_kv_blocks gauge\n"
			   "kvd_kv_blocks{state=\"in_use\"} %llu\nkvd_kv_blocks{state=\"cached\"} %llu\n"
			   "kvd_kv_blocks{state=\"free\"} %llu\n", st.kv_blocks_used, st.kv_blocks_cached,
			st.kv_blocks_total - st.kv_blocks_used - st.kv_blocks_cached);
		one(f, "kvd_daemon_requests_total", "counter", "Requests completed (daemon STATS).", st.requests);
		one(f, "kvd_daemon_tokens_prefilled_total", "counter", "Prompt tokens computed (daemon STATS).",
		    st.tokens_prefilled);
		one(f, "kvd_daemon_tokens_generated_total", "counter", "Tokens sampled (daemon STATS).",
		    st.tokens_generated);
		one(f, "kvd_daemon_prefix_hit_tokens_total", "counter", "Prefix-cache hit tokens (daemon STATS).",
		    st.prefix_hit_tokens);
		one(f, "kvd_daemon_prefix_miss_tokens_total", "counter", "Prefix-cache miss tokens (daemon STATS).",
		    st.prefix_miss_tokens);
		one(f, "vllm:num_preemptions_total", "counter", "Sequences preempted (daemon STATS).", st.preemptions);
		one(f, "kvd_daemon_evictions_total", "counter", "Cached blocks reclaimed (daemon STATS).", st.evictions);
		one(f, "kvd_daemon_steps_total", "counter", "Engine steps (daemon STATS).", st.steps);
		one(f, "kvd_daemon_connections", "gauge", "Client connections open.", st.connections);
		one(f, "kvd_daemon_sessions", "gauge", "Sessions open.", st.sessions);
	}
	if (fclose(f))
		return -errno;
	*out = buf;
	return (int)len;
}
