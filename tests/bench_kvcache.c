/*
 * bench_kvcache.c — the paged KV cache's two figures (a benchmark, not a test):
 * internal waste for 64 sequences of random length against reserving each
 * sequence's maximum, and time to first token with a cached prefix against cold.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tests/bench_util.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/kvpool.h"
#include "daemon/model/model.h"
#include "kernels/backend.h"
#include "tests/lib/fixture.h"
#include "tests/lib/rng.h"

#define RUNS 5
#define N_SEQS 64
#define MIN_LEN 16
#define MAX_LEN 2048
#define PROMPT 1024
#define CACHED 960
#define CHUNK 512
#define THREADS 2

/* Waste of paged blocks for 64 sequences, each grown by prefill then decode steps. */
static int waste(const struct model *m)
{
	struct kvpool_config pc = { .n_blocks = N_SEQS * MAX_LEN / 16 + N_SEQS, .block_tokens = 16,
				    .n_layers = m->hp.n_layers, .kv_dim = m->hp.kv_dim,
				    .kv_type = KB_F16 };
	struct kvpool *p;
	if (kvpool_create(&p, &pc))
		return 1;
	static struct kvseq seqs[N_SEQS];
	static uint32_t toks[MAX_LEN];
	struct rng s = rng_make(42);
	uint64_t total = 0;
	for (int i = 0; i < N_SEQS; i++) {
		uint32_t len = MIN_LEN + rng_u32(&s) % (MAX_LEN - MIN_LEN + 1);
		uint32_t prompt = len / 2 + 1;
		for (uint32_t t = 0; t < len; t++)
			toks[t] = rng_u32(&s) % m->hp.vocab;
		kvseq_init(&seqs[i], (uint32_t)i + 1);
		if (kvseq_prepare(p, &seqs[i], 0, prompt) ||
		    kvseq_commit(p, &seqs[i], 0, prompt, toks))
			return 1;
		for (uint32_t t = prompt; t < len; t++)
			if (kvseq_prepare(p, &seqs[i], t, t + 1) ||
			    kvseq_commit(p, &seqs[i], t, t + 1, toks + t))
				return 1;
		total += len;
	}
	struct kvpool_stats st;
	kvpool_get_stats(p, &st);
	double paged = 100.0 * (double)(st.slots_allocated - st.tokens_stored) / (double)st.slots_allocated;
	double reserved = 100.0 * (double)(N_SEQS * (uint64_t)MAX_LEN - total) /
			  (double)(N_SEQS * (uint64_t)MAX_LEN);
	printf("KV waste, %d sequences of %d..%d tokens (%llu tokens, 16-token blocks)\n", N_SEQS,
	       MIN_LEN, MAX_LEN, (unsigned long long)total);
	printf("| allocation                 | slots allocated | waste   | target |\n");
	printf("|----------------------------|-----------------|---------|--------|\n");
	printf("| paged blocks               | %15llu | %6.2f%% | <= 2%%  |\n",
	       (unsigned long long)st.slots_allocated, paged);
	printf("| reserve max length (2048)  | %15llu | %6.2f%% |        |\n\n",
	       (unsigned long long)N_SEQS * MAX_LEN, reserved);
	for (int i = 0; i < N_SEQS; i++)
		kvseq_release(p, &seqs[i]);
	kvpool_destroy(p);
	return 0;
}

/* Time until the prompt's last logits, reusing whatever prefix the pool holds. */
static double ttft(struct engine *e, const uint32_t *ids, uint32_t n, float *logits,
		   struct engine_row *rows, int *hit)
{
	struct engine_seq s;
	engine_seq_init(e, &s, 0);
	double t0 = now_s();
	int h = engine_seq_attach_prefix(e, &s, ids, n);
	if (h < 0)
		return -1;
	for (uint32_t p = (uint32_t)h; p < n; p += CHUNK) {
		uint32_t c = n - p < CHUNK ? n - p : CHUNK;
		for (uint32_t i = 0; i < c; i++)
			rows[i] = (struct engine_row){ &s, p + i, ids[p + i], p + i == n - 1 };
		if (engine_forward(e, rows, c, logits))
			return -1;
	}
	double t1 = now_s();
	engine_seq_release(e, &s);
	*hit = h;
	return t1 - t0;
}

static int prefix_ttft(struct fixture *fx)
{
	const struct model *m = fx->m;
	if (fixture_pool(fx, THREADS, 4 * PROMPT / 16) || fixture_engine(fx, CHUNK)) {
		fixture_close_engine(fx);
		return 1;
	}
	struct engine *e = fx->eng;
	float *logits = malloc((size_t)m->hp.vocab * sizeof(float));
	struct engine_row *rows = calloc(CHUNK, sizeof(*rows));
	static uint32_t a[PROMPT], b[PROMPT];
	double cold[RUNS], warm[RUNS];
	int hit = 0, runs = bench_pick(RUNS, 1);
	struct rng s = rng_make(7);
	for (int run = bench_pick(-1, 0); run < runs; run++) {	/* -1 warms up, not in quick mode */
		/* A fresh system prompt each run: a cold start really is cold. */
		for (uint32_t i = 0; i < PROMPT; i++)
			a[i] = rng_u32(&s) % m->hp.vocab;
		memcpy(b, a, CACHED * sizeof(uint32_t));
		for (uint32_t i = CACHED; i < PROMPT; i++)
			b[i] = rng_u32(&s) % m->hp.vocab;
		double tc = ttft(e, a, PROMPT, logits, rows, &hit);
		double tw = ttft(e, b, PROMPT, logits, rows, &hit);
		if (tc < 0 || tw < 0 || hit != CACHED)
			return 1;
		if (run >= 0) {
			cold[run] = tc;
			warm[run] = tw;
		}
	}
	double ratios[RUNS];
	for (int i = 0; i < runs; i++)
		ratios[i] = cold[i] / warm[i];
	printf("Time to first token, %d-token prompt, %d threads, %d runs%s\n", PROMPT, THREADS, runs,
	       bench_mark());
	printf("| case                        | TTFT median (ms) | ratio cold/cached | target |\n");
	printf("|-----------------------------|------------------|-------------------|--------|\n");
	printf("| cold                        | %16.1f |                   |        |\n",
	       1e3 * median(cold, runs));
	printf("| first %d tokens cached     | %16.1f | %17.1f | >= 10  |\n", CACHED,
	       1e3 * median(warm, runs), median(ratios, runs));
	free(logits);
	free(rows);
	fixture_close_engine(fx);
	return 0;
}

int main(void)
{
	struct fixture fx;
	char err[256];
	if (fixture_load(&fx, err, sizeof(err))) {
		fprintf(stderr, "bench_kvcache: %s\n", err);
		fixture_close(&fx);
		return 1;
	}
	int rc = waste(fx.m) || prefix_ttft(&fx);
	if (rc)
		fprintf(stderr, "bench_kvcache: failed\n");
	fixture_close(&fx);
	return rc;
}
