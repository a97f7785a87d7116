/*
 * bench_engine.c — single-stream throughput of the CPU engine (a benchmark, not a test).
 * Like llama-bench's pp512 / tg128: prefill of a 512-token prompt, and 128
 * tokens decoded one at a time from an empty context; plus 128 decoded
 * after the 512-token prompt, where attention reads a longer cache.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/bench_util.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/generate.h"
#include "daemon/engine/kvpool.h"
#include "daemon/engine/sampler.h"
#include "daemon/model/model.h"
#include "kernels/backend.h"

#define RUNS 5
#define PROMPT 512
#define DECODE 128
#define THREADS 2

static int runs;	/* RUNS, or 1 in quick mode */

static void print_row(const char *name, double *v, const char *target)
{
	double lo = v[0], hi = v[0];
	for (int i = 1; i < runs; i++) {
		lo = v[i] < lo ? v[i] : lo;
		hi = v[i] > hi ? v[i] : hi;
	}
	printf("| %-34s | %12.1f | %7.1f | %7.1f | %6s |\n", name, median(v, runs), lo, hi, target);
}

int main(void)
{
	runs = bench_pick(RUNS, 1);
	struct model *m;
	struct backend *be;
	struct engine *e;
	struct kvpool *pool;
	if (!(m = bench_load_model("bench_engine")))
		return 1;
	struct kvpool_config pc = { .n_blocks = 2 * (PROMPT + DECODE) / 16, .block_tokens = 16,
				    .n_layers = m->hp.n_layers, .kv_dim = m->hp.kv_dim,
				    .kv_type = KB_F16 };
	if (backend_cpu_create(&be, THREADS) || kvpool_create(&pool, &pc) ||
	    engine_create(&e, m, be, pool, PROMPT)) {
		fprintf(stderr, "bench_engine: setup failed\n");
		return 1;
	}
	/* Its pages committed before anything is timed, as llama.cpp clears its cache (bench_batch.c). */
	if (kvpool_prefault(pool))
		fprintf(stderr, "bench_engine: cannot commit the KV pool first: fresh pages are "
			"cleared inside the timed runs\n");
	uint32_t vocab = m->hp.vocab;
	uint32_t *prompt = malloc(PROMPT * sizeof(uint32_t));
	struct sampler_params sp;
	struct sampler *smp;
	sampler_params_default(&sp);
	if (!prompt || sampler_create(&smp, &sp, vocab))
		return 1;
	double pre[RUNS], dec[RUNS], tg[RUNS];
	/* A fixed pseudo-random prompt: throughput does not depend on the text. */
	uint32_t x = 12345;
	/* Run -1 warms caches and the pool (not in quick mode: its figures are indicative anyway). */
	for (int run = bench_pick(-1, 0); run < runs; run++) {
		struct engine_seq s;
		struct generate_result r;
		for (uint32_t i = 0; i < PROMPT; i++) {
			x = x * 1103515245u + 12345u;
			prompt[i] = (x >> 8) % vocab;
		}
		/* The prompt in one pass, then DECODE greedy tokens fed back (one more sampled). */
		struct generate_params gp = { .max_tokens = DECODE + 1 };
		engine_seq_init(e, &s, 0);
		if (generate(e, smp, &s, prompt, PROMPT, &gp, &r))
			return 1;
		engine_seq_release(e, &s);
		double t_pre = r.prefill_ns * 1e-9, t_dec = r.decode_ns * 1e-9;
		/* tg128: from an empty cache, every token through the decode path. */
		gp.max_tokens = DECODE;
		engine_seq_init(e, &s, 0);
		if (generate(e, smp, &s, prompt, 1, &gp, &r))
			return 1;
		engine_seq_release(e, &s);
		if (run >= 0) {
			pre[run] = PROMPT / t_pre;
			dec[run] = DECODE / t_dec;
			tg[run] = DECODE / ((r.prefill_ns + r.decode_ns) * 1e-9);
		}
	}
	printf("engine, %s, %d threads, %d runs%s\n", m->hp.name, THREADS, runs, bench_mark());
	printf("| phase                              | tok/s median |     min |     max | target |\n");
	printf("|------------------------------------|--------------|---------|---------|--------|\n");
	print_row("prefill, 512-token prompt (pp512)", pre, ">= 350");
	print_row("decode 128 from empty (tg128)", tg, ">= 130");
	print_row("decode 128 after the 512 prompt", dec, "-");
	sampler_destroy(smp);
	free(prompt);
	engine_destroy(e);
	kvpool_destroy(pool);
	be->ops->destroy(be);
	model_free(m);
	return 0;
}
