/* engine.h — the transformer forward pass over a batch of (sequence, position, token) rows. */
#ifndef KVD_ENGINE_H
#define KVD_ENGINE_H

#include <stddef.h>
#include <stdint.h>

struct model;
struct backend;
struct engine;

/* One sequence's K/V store (contiguous per sequence; the paged pool replaces it). */
struct engine_seq {
	uint32_t n_pos;		/* positions cached: 0..n_pos-1 */
	uint32_t n_ctx;		/* capacity in positions */
	uint32_t kv_type;	/* KB_F16 or KB_F32 */
	void *k;		/* (n_layers, n_ctx, kv_dim) of kv_type, RoPE applied */
	void *v;		/* (n_layers, n_ctx, kv_dim) of kv_type */
};

struct engine_row {
	struct engine_seq *seq;
	uint32_t pos;		/* position of token in seq */
	uint32_t token;
	uint32_t want_logits;	/* 1: produce this row's logits */
};

/* max_rows: the most rows one engine_forward() call may take. */
int engine_create(struct engine **out, struct model *m, struct backend *be, uint32_t max_rows);
void engine_destroy(struct engine *e);
uint32_t engine_max_rows(const struct engine *e);

/* K/V element type of sequences initialised from now on: KB_F16 (default) or KB_F32. */
int engine_set_kv_type(struct engine *e, uint32_t kb_type);

/* n_ctx 0 = the model's context length. Returns 0 or -errno. */
int engine_seq_init(struct engine *e, struct engine_seq *s, uint32_t n_ctx);
void engine_seq_release(struct engine_seq *s);

/*
 * Run n rows through every layer. Rows of one sequence must be contiguous
 * with consecutive positions starting at or below its n_pos (a position
 * below n_pos overwrites the cache from there on). K/V of every row is
 * cached; logits (n_want, vocab) receive, in row order, the logits of rows
 * with want_logits. Returns 0 or -errno (-ERANGE token or position out of
 * range, -EINVAL malformed batch); on error no sequence's n_pos changes.
 */
int engine_forward(struct engine *e, const struct engine_row *rows, uint32_t n, float *logits);

#endif
