/* generate.h — one sequence to completion: prefill a prompt, then sample and decode until it ends. */
#ifndef KVD_GENERATE_H
#define KVD_GENERATE_H

#include <stdint.h>
#include "daemon/engine/engine.h"

struct sampler;
struct tokenizer;

/* Why generation stopped. */
enum generate_stop {
	GENERATE_EOS = 1,	/* an end-of-generation token (counted in n_out, not fed back) */
	GENERATE_LENGTH,	/* max_tokens generated */
	GENERATE_CONTEXT,	/* the next token would not fit the context */
	GENERATE_CALLER,	/* on_token asked to stop */
};

/*
 * Each generated token, once sampled and before it is fed back; eog: it
 * ends generation (nothing follows). Return 0 to go on, nonzero to stop
 * after this token.
 */
typedef int (*generate_token_fn)(void *arg, uint32_t token, int eog);

/* After each prefill pass: done of the prompt's total positions are cached (done == total last). */
typedef void (*generate_progress_fn)(void *arg, uint32_t done, uint32_t total);

struct generate_params {
	uint32_t max_tokens;		/* at most this many tokens; 0: prefill only */
	uint32_t ctx;			/* positions a sequence may use; 0 (or above the model's): the model's */
	const struct tokenizer *tok;	/* whose end-of-generation tokens stop; NULL: none do */
	generate_token_fn on_token;	/* may be NULL */
	generate_progress_fn on_prefill;	/* may be NULL */
	void *arg;			/* both callbacks' */
};

struct generate_result {
	uint32_t n_prompt;
	uint32_t n_out;		/* tokens generated, an end-of-generation token included */
	int stop;		/* enum generate_stop; 0 before decoding */
	uint64_t prefill_ns;	/* the prefill passes */
	uint64_t decode_ns;	/* sampling, on_token and decode passes */
};

/*
 * Feed tokens (n,) at positions engine_seq_len(s).. in passes of
 * engine_max_rows rows (the passes a batch of them would take: how the
 * rows are split never changes a result); logits (vocab,) get the last
 * token's. gp (may be NULL): its on_prefill hears of each pass. 0 or
 * engine_forward's -errno (-ENOMEM for the row buffer).
 */
int generate_prefill(struct engine *e, struct engine_seq *s, const uint32_t *tokens, uint32_t n,
		     float *logits, const struct generate_params *gp);

/*
 * From a sequence whose last fed token's logits (vocab,) are in logits:
 * sample with smp (history: the sequence's tokens), report the token, feed
 * it, and again, until end of generation, max_tokens, the context's end
 * or on_token stops it. The context ends where the daemon's scheduler ends
 * it: a token sampled when the sequence holds ctx - 1 positions is the
 * last. The last token is never fed. logits is overwritten. res->n_out, stop and
 * decode_ns are set. 0 or engine_forward's -errno.
 */
int generate_decode(struct engine *e, struct sampler *smp, struct engine_seq *s, float *logits,
		    const struct generate_params *gp, struct generate_result *res);

/*
 * Both: prompt (n > 0,) into s (empty, or continued from its length), then
 * decoding as above. The one generation loop of `kvd --prompt`, the tests'
 * reference generators and the benchmarks, so they produce the same tokens
 * as each other bit for bit. s stays the caller's to release. 0, -EINVAL
 * (empty prompt), -ENOMEM or engine_forward's -errno; res is filled as far
 * as it got.
 */
int generate(struct engine *e, struct sampler *smp, struct engine_seq *s, const uint32_t *prompt,
	     uint32_t n, const struct generate_params *gp, struct generate_result *res);

#endif
