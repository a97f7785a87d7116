/* selfcheck.h — a device backend checked against the CPU backend on the model it is to run, before it serves anyone. */
#ifndef KVD_SELFCHECK_H
#define KVD_SELFCHECK_H

#include <stddef.h>
#include <stdint.h>

struct model;
struct backend;

struct selfcheck_report {
	char worst_op[48];	/* the layer-0 operation furthest from the CPU's result */
	double worst_err;	/* its relative error (L2), divided by its bound */
	uint32_t positions;	/* positions whose distributions were compared */
	double mean_kld, max_kld;	/* KL(CPU || device) of their next-token distributions */
	uint32_t clear_misses;	/* argmax differences where the CPU's top two are far apart */
	double seconds;
};

/*
 * dev against cpu on m, in two parts:
 *  - a few rows of layer 0, operation by operation (embedding lookup,
 *    norms, Q/K/V, RoPE, output projection, FFN), each given the CPU's
 *    inputs so that each is judged alone, once through the mat-vec path
 *    (3 rows) and once through the GEMM path (20 rows);
 *  - the next-token distributions of a short prompt (every position of
 *    its prefill, then a few decode steps) through whole engines with
 *    KV caches of kv_type.
 * 0 when both agree within the bounds (selfcheck.c); -EPROTO when they do
 * not, with why naming the operation or the figure; any other -errno
 * when dev cannot run m at all (an operation or shape it refuses, no
 * memory), with why saying where. r is filled as far as the check got.
 */
int selfcheck_run(struct model *m, struct backend *dev, struct backend *cpu, uint32_t kv_type,
		  struct selfcheck_report *r, char *why, size_t whylen);

#endif
