/* sampler.h — turns a logits row into a token: greedy, temperature, top-k/p, min-p, penalties; and its log-probabilities. */
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
	/*
	 * OpenAI's presence and frequency penalties, over the tokens this
	 * sampler has returned (the request's output, not its prompt):
	 * logit[t] -= presence * (count[t] > 0) + frequency * count[t], after
	 * the repeat penalty. 0: off; [-2, 2].
	 */
	float presence_penalty;
	float frequency_penalty;
	int logprobs;		/* keep the raw log-probabilities of each pick (sampler_logprobs()) */
	uint32_t top_logprobs;	/* with logprobs: this many most likely tokens too, <= SAMPLER_MAX_TOP */
};

#define SAMPLER_MAX_TOP 20

struct sampler_logprob {
	uint32_t id;
	float logprob;		/* natural log, <= 0 */
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

/*
 * With params.logprobs: the last sampler_sample()'s log-probabilities, in
 * the model's raw distribution (log-softmax of the logits as passed in,
 * before penalties, temperature and filters): [0] the token it returned,
 * then the top_logprobs most likely, most likely first, lower id first
 * among equals. Returns how many (1 + top_logprobs), 0 before any sample
 * or without params.logprobs. Owned by s, rewritten by the next sample.
 */
uint32_t sampler_logprobs(const struct sampler *s, const struct sampler_logprob **out);

/*
 * The log-sum-exp of logits (vocab,), so logprob(t) = logits[t] - norm, and
 * the k (<= vocab) most likely into top (k,), as sampler_logprobs() orders
 * them. NaN logits count as -inf. A pure function of the row.
 */
double sampler_log_softmax_top(const float *logits, uint32_t vocab, uint32_t k,
			       struct sampler_logprob *top);

#endif
