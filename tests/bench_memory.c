/*
 * bench_memory.c — the memory curve of one long request (a benchmark, not a
 * test): process RSS, KV-pool bytes in use and activation scratch, sampled
 * after every engine step of a 2048-token prefill and 512 decode steps.
 * Writes build/bench/memory_curve.csv and, when gnuplot is installed,
 * build/bench/memory_curve.png.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "tests/bench_util.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/kvpool.h"
#include "daemon/model/model.h"
#include "kernels/backend.h"
#include "tests/lib/fixture.h"
#include "tests/lib/rng.h"

#define PROMPT 2048
#define CHUNK 512
#define DECODE 512
#define OUT_DIR "build/bench"

static double rss_mib(void)
{
	long pages = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
			resident = 0;
		fclose(f);
	}
	return (double)resident * (double)sysconf(_SC_PAGESIZE) / (1 << 20);
}

static void sample(FILE *csv, double t0, const char *phase, uint32_t pos, struct kvpool *pool,
		   const struct engine *e)
{
	struct kvpool_stats st;
	kvpool_get_stats(pool, &st);
	fprintf(csv, "%.4f,%s,%u,%.3f,%.3f,%.3f\n", now_s() - t0, phase, pos, rss_mib(),
		(double)st.bytes_used / (1 << 20), (double)engine_scratch_bytes(e) / (1 << 20));
}

/* The gnuplot script for the curve in csv, drawn into png. */
static void plot(FILE *gp, const char *csv, const char *png, uint32_t prompt, uint32_t decode)
{
	fprintf(gp, "set terminal pngcairo size 900,480 font 'sans,10'\n"
		"set output '%s'\n"
		"set datafile separator ','\n"
		"set title 'kvd memory over one request: %u-token prefill, then %u decode steps%s'\n"
		"set xlabel 'time (s)'\n"
		"set ylabel 'MiB'\n"
		"set key left top\n"
		"set grid\n"
		"plot '%s' using 1:4 with lines lw 2 title 'process RSS', \\\n"
		"     '' using 1:5 with lines lw 2 title 'KV pool in use', \\\n"
		"     '' using 1:6 with lines lw 2 title 'activation scratch'\n",
		png, prompt, decode, bench_quick() ? " (quick)" : "", csv);
}

int main(void)
{
	struct fixture fx;
	char err[256];
	/* The pool is reserved up front for 8192 tokens; pages are touched as blocks fill. */
	if (fixture_open(&fx, 2, 8192 / 16, CHUNK, err, sizeof(err))) {
		fprintf(stderr, "bench_memory: %s\n", err);
		fixture_close(&fx);
		return 1;
	}
	struct model *m = fx.m;
	struct kvpool *pool = fx.pool;
	struct engine *e = fx.eng;
	const struct kvpool_config pc = *kvpool_config(pool);
	/* Quick: a shorter request, into files of its own so that a full curve is never overwritten. */
	const uint32_t prompt = bench_pick(PROMPT, PROMPT / 2), decode = bench_pick(DECODE, DECODE / 8);
	const char *suffix = bench_quick() ? "-quick" : "";
	char csv_path[96], png_path[96];
	snprintf(csv_path, sizeof(csv_path), OUT_DIR "/memory_curve%s.csv", suffix);
	snprintf(png_path, sizeof(png_path), OUT_DIR "/memory_curve%s.png", suffix);
	mkdir("build", 0755);
	mkdir(OUT_DIR, 0755);
	FILE *csv = fopen(csv_path, "w");
	if (!csv) {
		perror(csv_path);
		return 1;
	}
	fprintf(csv, "seconds,phase,position,rss_mib,kv_used_mib,scratch_mib\n");
	float *logits = malloc((size_t)m->hp.vocab * sizeof(float));
	struct engine_row *rows = calloc(CHUNK, sizeof(*rows));
	struct engine_seq s;
	engine_seq_init(e, &s, 0);
	struct rng x = rng_make(1);
	double t0 = now_s();
	sample(csv, t0, "start", 0, pool, e);
	for (uint32_t p = 0; p < prompt; p += CHUNK) {
		for (uint32_t i = 0; i < CHUNK; i++) {
			rows[i] = (struct engine_row){ &s, p + i, rng_below(&x, m->hp.vocab),
						       p + i == prompt - 1 };
		}
		if (engine_forward(e, rows, CHUNK, logits))
			return 1;
		sample(csv, t0, "prefill", p + CHUNK, pool, e);
	}
	uint32_t tok = 0;
	for (uint32_t i = 0; i < decode; i++) {
		for (uint32_t v = 1; v < m->hp.vocab; v++)
			tok = logits[v] > logits[tok] ? v : tok;
		struct engine_row r = { &s, prompt + i, tok, 1 };
		if (engine_forward(e, &r, 1, logits))
			return 1;
		sample(csv, t0, "decode", prompt + i + 1, pool, e);
	}
	fclose(csv);
	struct kvpool_stats st;
	kvpool_get_stats(pool, &st);
	printf("memory curve: %s (%u prefill + %u decode positions)%s\n", csv_path, prompt, decode,
	       bench_mark());
	printf("| measure                         | MiB     |\n|---------------------------------|---------|\n");
	printf("| KV pool reserved                | %7.1f |\n", (double)st.bytes_total / (1 << 20));
	printf("| KV pool in use at the end       | %7.1f |\n", (double)st.bytes_used / (1 << 20));
	printf("| KV per token (KiB)              | %7.1f |\n",
	       (double)kvpool_token_bytes(pc.kv_type, pc.n_layers, pc.kv_dim) / 1024);
	printf("| scratch after decode            | %7.3f |\n", (double)engine_scratch_bytes(e) / (1 << 20));
	FILE *gp = popen("gnuplot 2>/dev/null", "w");
	if (gp) {
		plot(gp, csv_path, png_path, prompt, decode);
		if (pclose(gp) == 0)
			printf("plot: %s\n", png_path);
		else
			printf("plot: gnuplot failed or is missing (make deps installs it)\n");
	}
	engine_seq_release(e, &s);
	free(rows);
	free(logits);
	fixture_close(&fx);
	return 0;
}
