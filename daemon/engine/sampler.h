/* sampler.h — turns a logits row into a token: greedy, temperature, top-k/p, min-p, penalty. */
#ifndef KVD_SAMPLER_H
#define KVD_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

struct sampler_params {
	float temperature;	/* <= 0: greedy (argmax, lowest id wins ties) */
	uint32_t top_k;		/* 0: off */
	float top_p;		/* >= 1 or <= 0: off */
	float min_p;		/* <= 0: off */
	float repeat_penalty;	/* 1 or <= 0: off; >1 discourages recent tokens */
	uint32_t repeat_last_n;	/* how many recent tokens the penalty looks at */
	uint64_t seed;		/* the same seed and inputs give the same tokens */
};

struct sampler;

/* Returns 0 or -EINVAL (bad params, vocab 0) / -ENOMEM. */
int sampler_create(struct sampler **out, const struct sampler_params *p, uint32_t vocab);
void sampler_destroy(struct sampler *s);
void sampler_params_default(struct sampler_params *p);	/* greedy, filters off */

/*
 * Pick the next token from logits (vocab,), which may be modified in place.
 * history (n_history,) are the sequence's tokens so far, for the penalty.
 * Returns a token id < vocab. Advances the sampler's random state.
 */
uint32_t sampler_sample(struct sampler *s, float *logits, const uint32_t *history,
			size_t n_history);

#endif
