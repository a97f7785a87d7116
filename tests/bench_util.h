/* bench_util.h — the clock and the statistics every benchmark program prints. */
#ifndef KVD_BENCH_UTIL_H
#define KVD_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/log.h"
#include "daemon/model/model.h"

/* Seconds on the daemon's one clock (log_now_ns). */
static inline double now_s(void)
{
	return (double)log_now_ns() * 1e-9;
}

/*
 * Quick mode ($KVD_BENCH_QUICK=1, from `make bench QUICK=1`): every part
 * runs, with fewer repetitions and smaller sizes, and says so in its
 * heading; its figures are indicative, not results to compare.
 */
static inline int bench_quick(void)
{
	const char *q = getenv("KVD_BENCH_QUICK");
	return q && *q && strcmp(q, "0");
}

/* full, or quick where bench_quick(). */
static inline int bench_pick(int full, int quick)
{
	return bench_quick() ? quick : full;
}

/* What a heading appends to say the run was quick ("" otherwise). */
static inline const char *bench_mark(void)
{
	return bench_quick() ? " [QUICK: fewer runs, smaller sizes; indicative only]" : "";
}

static inline int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Median of v (n,), which it sorts. */
static inline double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The model named by $KVD_MODEL, else the default one; NULL (said on stderr, as prog) on failure. */
static inline struct model *bench_load_model(const char *prog)
{
	const char *path = getenv("KVD_MODEL");
	char err[256];
	struct model *m;
	if (!path || !*path)
		path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
	if (model_load(&m, path, err, sizeof(err))) {
		fprintf(stderr, "%s: %s: %s (run `make model`)\n", prog, path, err);
		return NULL;
	}
	return m;
}

#endif
