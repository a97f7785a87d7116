/* perplexity.h — `kvd --perplexity` and `--kl-divergence`: llama-perplexity's scores and its base-file format, in-process. */
#ifndef KVD_PERPLEXITY_H
#define KVD_PERPLEXITY_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/oneshot.h"

#define PPL_DEFAULT_CTX 512	/* llama-perplexity's -c */
#define PPL_MIN_CTX 4		/* a chunk must score at least one position */
#define PPL_MAGIC "_logits_"
#define PPL_HEADER_BYTES 20	/* the magic, then int32 n_ctx, n_vocab, n_chunk */

/*
 * The base file (llama.cpp's --kl-divergence-base, native byte order):
 * the header, int32 tokens (n_chunk * n_ctx,) as tokenised (no BOS
 * substitution), then per chunk ppl_scored(n_ctx) rows of
 * ppl_row_slots(n_vocab) uint16: float scale, float min_log_prob (the
 * first four slots), the quantised log-probability of every id, one pad
 * slot when n_vocab is odd.
 */

/* Positions scored in a chunk: n_ctx/2 .. n_ctx-2, each predicting the next token. */
static inline uint32_t ppl_scored(uint32_t n_ctx)
{
	return n_ctx - 1 - n_ctx / 2;
}

static inline size_t ppl_row_slots(uint32_t n_vocab)
{
	return 2 * (((size_t)n_vocab + 1) / 2) + 4;
}

/* Bytes of a base file of n_chunk chunks. */
uint64_t ppl_file_bytes(uint32_t n_ctx, uint32_t n_vocab, uint32_t n_chunk);

/* llama.cpp's nearest_int: round half to even, for |f| < 2^22. */
int ppl_nearest_int(float f);

/*
 * One position's logits (n_vocab,) into a stored row (ppl_row_slots,):
 * log-probabilities within 16 of the top one quantised to 16 bits, those
 * below stored as 0. Returns the NLL of tok, in llama.cpp's float math.
 */
float ppl_quantize_row(const float *logits, uint32_t n_vocab, uint32_t tok, uint16_t *row);
/* The log-probability of id i that row stores. */
float ppl_row_log_prob(const uint16_t *row, uint32_t i);

/* The sums behind --kl-divergence's statistics (llama.cpp's kl_divergence_result). */
struct ppl_kld {
	double sum_nll, sum_nll2;		/* the model's NLL of each next token */
	double sum_nll_base, sum_nll_base2;	/* the base file's */
	double sum_nll_nll_base;
	double sum_kld, sum_kld2;
	double sum_p_diff, sum_p_diff2, sum_p_diff4;	/* p(next) - p_base(next) */
	uint64_t count, n_same_top;
};

/*
 * One scored position: the model's logits (n_vocab,) against the base
 * row for next token tok, into k; its KL divergence and Δp into *kld and
 * *p_diff. Base entries at log-probability -16 or below are left out of
 * the divergence, as llama.cpp does.
 */
void ppl_kld_add(struct ppl_kld *k, const float *logits, const uint16_t *row, uint32_t n_vocab,
		 uint32_t tok, float *kld, float *p_diff);

struct kvd_options;

/* The options ask for --perplexity or --kl-divergence. */
int perplexity_mode(const struct kvd_options *o);

/*
 * --perplexity FILE (optionally writing --kl-divergence-base) or
 * --kl-divergence (reading it): set the model's context to the chunk
 * size, reserve a pool with make_pool for one chunk, evaluate, print the
 * results on stdout and the speed (and, on a terminal, the progress) on
 * stderr. Messages go to stderr; 0 or -errno.
 */
int perplexity_run(const struct kvd_options *o, struct model *m, struct backend *be,
		   oneshot_pool_fn make_pool);

#endif
