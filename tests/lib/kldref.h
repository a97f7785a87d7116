/* kldref.h — tests/golden/kld_ref.txt (llama.cpp's F32 next-token distributions over the GPL) and an engine scored against it. */
#ifndef KVD_TESTS_LIB_KLDREF_H
#define KVD_TESTS_LIB_KLDREF_H

#include <stdint.h>

struct engine;

#define KLDREF_TOP_MAX 64

/* One scored position of the reference: its top log-probs and the log of the rest's mass. */
struct kldref_pos {
	uint32_t pos, next, argmax;
	float gap;		/* the reference's top-2 log-prob gap */
	double lrest;		/* positions of the first kld_chunks only, as id and lp */
	uint32_t id[KLDREF_TOP_MAX];
	double lp[KLDREF_TOP_MAX];
};

struct kldref {
	uint32_t ctx, chunks, kld_chunks, top, positions, kld_positions;
	double peer_kld, peer_same_top, peer_kld_full;	/* llama.cpp Q4_1 against its F32 */
	uint32_t vocab;
	uint32_t *tokens;	/* (chunks, ctx) */
	struct kldref_pos *pos;	/* (positions,) chunk by chunk, ctx/2 .. ctx-2 in each */
};

/* The file at path (format: tests/golden/gen_kld.py) for a model of vocab tokens; 0 or -1. */
int kldref_load(struct kldref *r, const char *path, uint32_t vocab);
void kldref_free(struct kldref *r);

struct kldref_result {
	double mean_kld;	/* over the positions of the first kld_chunks chunks run */
	double same_top;	/* share of all positions run whose argmax is the reference's */
	uint32_t n_kld, n;	/* positions of each */
};

/*
 * The first n_chunks chunks of r through e (whose max rows must hold
 * r->ctx), each in one pass from an empty sequence, scored as
 * llama-perplexity scores them: KL divergence over the reference's top
 * ids plus one bucket for the rest, and the same-top-1 rate. A miss where
 * the reference's top-2 gap is over clear_gap is printed. 0 or -errno.
 */
int kldref_run(const struct kldref *r, struct engine *e, uint32_t n_chunks, float clear_gap,
	       struct kldref_result *out);

#endif
