/*
 * bench_batch.c — decode throughput of the engine alone at batch 1, 4, 16 and 64
 * (a benchmark, not a test). Each of N sequences holds a 128-token prompt; then
 * 64 steps decode one token for every sequence in one engine_forward() call, as
 * the scheduler's continuous batching does. Without the daemon's IPC and
 * prefill phases, this is the ceiling for tools/bench_serve.sh's decode rate.
 * Each step's greedy tokens come from engine_argmax(), computed where the
 * logits are, as a device backend would. The KV pool's pages are committed
 * before anything is timed (kvpool_prefault(), kvd --kv-prefault), as
 * llama.cpp clears its cache when it makes it: without that the first runs
 * would time the kernel clearing fresh pages, in the one thread that writes
 * K and V, while the others wait.
 * Usage: bench_batch [N...]   (KVD_MODEL overrides the model, KVD_BENCH_THREADS the threads;
 * KVD_BENCH_CLOCK=cpu times by process CPU time, steadier on a shared machine with 1 thread)
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
#include "tests/lib/logits.h"

#define RUNS 3
#define PROMPT 128
#define STEPS 64

static uint32_t steps = STEPS;	/* STEPS, or a quarter in quick mode */
#define MAX_N 64

static clockid_t clock_id = CLOCK_MONOTONIC;

static double clock_s(void)
{
	struct timespec ts;
	clock_gettime(clock_id, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Decode tok/s of one run with n sequences (each prefilled with PROMPT tokens first). */
static double run_batch(struct engine *e, struct engine_seq *seq, uint32_t n, uint32_t vocab,
			float *logits, struct engine_row *rows, struct rng *seed)
{
	uint32_t tok[MAX_N];
	for (uint32_t s = 0; s < n; s++) {
		engine_seq_init(e, &seq[s], 0);
		for (uint32_t i = 0; i < PROMPT; i++) {
			rows[i] = (struct engine_row){ &seq[s], i, rng_below(seed, vocab), i == PROMPT - 1 };
		}
		if (engine_forward(e, rows, PROMPT, logits))
			return -1;
		tok[s] = logits_argmax(logits, vocab);
	}
	double t0 = clock_s();
	for (uint32_t step = 0; step < steps; step++) {
		for (uint32_t s = 0; s < n; s++)
			rows[s] = (struct engine_row){ &seq[s], PROMPT + step, tok[s], 1 };
		if (engine_forward(e, rows, n, NULL) || engine_argmax(e, tok))
			return -1;
	}
	double t1 = clock_s();
	for (uint32_t s = 0; s < n; s++)
		engine_seq_release(e, &seq[s]);
	return n * steps / (t1 - t0);
}

int main(int argc, char **argv)
{
	uint32_t sizes[8] = { 1, 4, 16, 64 }, n_sizes = bench_pick(4, 3);
	int runs = bench_pick(RUNS, 1);
	steps = (uint32_t)bench_pick(STEPS, STEPS / 4);
	if (argc > 1) {
		n_sizes = 0;
		for (int i = 1; i < argc && n_sizes < 8; i++) {
			long v = strtol(argv[i], NULL, 10);
			if (v < 1 || v > MAX_N) {
				fprintf(stderr, "bench_batch: batch sizes are 1..%d\n", MAX_N);
				return 2;
			}
			sizes[n_sizes++] = (uint32_t)v;
		}
	}
	const char *th = getenv("KVD_BENCH_THREADS");
	const char *ck = getenv("KVD_BENCH_CLOCK");
	if (ck && !strcmp(ck, "cpu"))
		clock_id = CLOCK_PROCESS_CPUTIME_ID;
	uint32_t threads = th && *th ? (uint32_t)atoi(th) : 2;
	struct fixture fx;
	char err[256];
	if (fixture_open(&fx, threads, MAX_N * ((PROMPT + STEPS) / 16 + 1), PROMPT, err, sizeof(err))) {
		fprintf(stderr, "bench_batch: %s\n", err);
		fixture_close(&fx);
		return 1;
	}
	int pf = kvpool_prefault(fx.pool);
	if (pf)
		fprintf(stderr, "bench_batch: cannot commit the KV pool first (%s): fresh pages are "
			"cleared inside the timed steps\n", strerror(-pf));
	struct model *m = fx.m;
	struct engine *e = fx.eng;
	uint32_t vocab = m->hp.vocab;
	float *logits = malloc((size_t)MAX_N * vocab * sizeof(float));
	struct engine_row *rows = calloc(PROMPT, sizeof(*rows));
	struct engine_seq *seq = calloc(MAX_N, sizeof(*seq));
	if (!logits || !rows || !seq)
		return 1;
	struct rng seed = rng_make(777);
	double med[8];
	printf("engine decode throughput, %s, %u threads, %d-token contexts, %d steps, "
	       "median of %d runs%s%s%s\n", m->hp.name, threads, PROMPT, steps, runs,
	       clock_id == CLOCK_MONOTONIC ? "" : ", per CPU second",
	       pf ? "" : ", KV pool committed first", bench_mark());
	printf("| batch | tok/s median |     min |     max | vs batch %u |\n", sizes[0]);
	printf("|-------|--------------|---------|---------|------------|\n");
	for (uint32_t k = 0; k < n_sizes; k++) {
		double v[RUNS];
		for (int r = 0; r < runs; r++) {
			v[r] = run_batch(e, seq, sizes[k], vocab, logits, rows, &seed);
			if (v[r] < 0) {
				fprintf(stderr, "bench_batch: engine_forward failed\n");
				return 1;
			}
		}
		double lo = v[0], hi = v[0];
		for (int r = 1; r < runs; r++) {
			lo = v[r] < lo ? v[r] : lo;
			hi = v[r] > hi ? v[r] : hi;
		}
		med[k] = median(v, runs);
		printf("| %5u | %12.1f | %7.1f | %7.1f | %9.2fx |\n", sizes[k], med[k], lo, hi,
		       med[k] / med[0]);
	}
	free(seq);
	free(rows);
	free(logits);
	fixture_close(&fx);
	return 0;
}
