/* engine.h — the transformer forward pass over a batch of (sequence, position, token) rows. */
#ifndef KVD_ENGINE_H
#define KVD_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include "daemon/engine/kvpool.h"

struct model;
struct backend;
struct engine;

/* One sequence: its block table in the engine's KV pool. */
struct engine_seq {
	struct kvseq kv;
};

struct engine_row {
	struct engine_seq *seq;
	uint32_t pos;		/* position of token in seq */
	uint32_t token;
	uint32_t want_logits;	/* 1: produce this row's logits */
};

/*
 * 0 when be has every optional operation m's architecture needs (add_bias,
 * scale, geglu, softcap: see backend.h); else -ENOTSUP with err naming the
 * backend, the operation and the architecture.
 */
int engine_supports(const struct model *m, const struct backend *be, char *err, size_t errlen);

/*
 * max_rows: the most rows one engine_forward() call may take. K/V live in
 * pool (borrowed; its layers and kv_dim must match the model). -ENOTSUP,
 * with engine_supports()'s message logged, when the backend lacks an
 * operation the model needs.
 */
int engine_create(struct engine **out, struct model *m, struct backend *be,
		  struct kvpool *pool, uint32_t max_rows);
void engine_destroy(struct engine *e);
uint32_t engine_max_rows(const struct engine *e);
/* The model it runs: vocab and ctx_len size a caller's logits and sequences. */
const struct model *engine_model(const struct engine *e);

/*
 * The pool as a scheduler sees it, so serve/ needs no kvpool_* call: its
 * geometry (tokens per block, blocks in all) for admission and HELLO, and
 * its counters (see struct kvpool_stats) after each step.
 */
uint32_t engine_pool_block_tokens(const struct engine *e);
uint32_t engine_pool_blocks(const struct engine *e);
void engine_pool_stats(const struct engine *e, struct kvpool_stats *out);
/* kvpool_check() of the pool against every live sequence, for debugging and tests. */
int engine_pool_check(const struct engine *e, const struct kvseq *const *seqs, size_t n, char *err,
		      size_t errlen);

/* ns: the prefix-cache namespace (the owner's uid, or 0 for global sharing). */
void engine_seq_init(struct engine *e, struct engine_seq *s, uint32_t ns);
void engine_seq_release(struct engine *e, struct engine_seq *s);
/* Positions cached. */
static inline uint32_t engine_seq_len(const struct engine_seq *s)
{
	return s->kv.n_tokens;
}
/* Blocks in its table: the cached positions' and any prepared ahead. */
static inline uint32_t engine_seq_blocks(const struct engine_seq *s)
{
	return s->kv.n_blocks;
}
/* Token ids at positions [0, engine_seq_len): the sampler's history. */
static inline const uint32_t *engine_seq_tokens(const struct engine_seq *s)
{
	return s->kv.tokens;
}
/* Its prefix-cache namespace, as given to engine_seq_init. */
static inline uint32_t engine_seq_ns(const struct engine_seq *s)
{
	return s->kv.ns;
}
/*
 * Reserve blocks for positions [from, to) before a step, so a scheduler
 * learns of -ENOSPC while it can still preempt someone (kvseq_prepare's
 * contract: nothing is lost on failure). engine_forward prepares what is
 * missing itself; blocks prepared here are simply found ready.
 */
int engine_seq_prepare(struct engine *e, struct engine_seq *s, uint32_t from, uint32_t to);
/*
 * Before prefilling tokens (n,) into an empty sequence: reuse cached blocks
 * of its prefix. Returns how many leading tokens need no computing.
 */
int engine_seq_attach_prefix(struct engine *e, struct engine_seq *s, const uint32_t *tokens,
			     uint32_t n);

/* Bytes of activation scratch held now (engine and backend). */
size_t engine_scratch_bytes(const struct engine *e);

/*
 * Run n rows through every layer. Rows of one sequence must be contiguous
 * with consecutive positions starting at or below its length (a position
 * below it rewrites the sequence from there on). K/V of every row is
 * cached; logits (n_want, vocab) receive, in row order, the logits of rows
 * with want_logits. Returns 0 or -errno (-ERANGE token or position out of
 * range, -EINVAL malformed batch, -ENOSPC KV pool full, -EIO device
 * failure); on error no sequence grows. logits may be NULL (see
 * engine_argmax).
 */
int engine_forward(struct engine *e, const struct engine_row *rows, uint32_t n, float *logits);

/*
 * Greedy tokens of the last successful engine_forward: ids (n_want,) = the
 * argmax of each logits row, computed where the logits are (on a device
 * only the ids come back, so engine_forward may be given logits NULL).
 * The lowest id wins a tie. -ENODATA when the last call produced none.
 */
int engine_argmax(struct engine *e, uint32_t *ids);

#endif
