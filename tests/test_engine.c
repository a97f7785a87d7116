/* test_engine.c — the forward pass on the real model (batch invariance, chunked prefill, batch validation, refused files) and on tiny models of each architecture. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/generate.h"
#include "daemon/engine/kvpool.h"
#include "daemon/engine/sampler.h"
#include "daemon/model/gguf.h"
#include "daemon/model/model.h"
#include "kernels/backend.h"
#include "tests/lib/gguf_patch.h"
#include "tests/lib/rng.h"

#define MAX_ROWS 64

static struct model *M;
static struct backend *B;
static struct engine *E;
static struct kvpool *P;
static char load_err[256];

static const char *model_path(void)
{
	const char *p = getenv("KVD_MODEL");
	return p && *p ? p : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

/* An engine over a fresh pool of n_blocks 16-token blocks of kv_type. */
static int make_engine(uint32_t kv_type, uint32_t n_blocks, struct kvpool **pool, struct engine **e)
{
	struct kvpool_config pc = { .n_blocks = n_blocks, .block_tokens = 16,
				    .n_layers = M->hp.n_layers, .kv_dim = M->hp.kv_dim,
				    .kv_type = kv_type };
	int rc = kvpool_create(pool, &pc);
	if (rc)
		return rc;
	rc = engine_create(e, M, B, *pool, MAX_ROWS);
	if (rc)
		kvpool_destroy(*pool);
	return rc;
}

static int setup(void **state)
{
	(void)state;
	if (model_load(&M, model_path(), load_err, sizeof(load_err))) {
		M = NULL;
		return 0;	/* each test fails with the message */
	}
	if (backend_cpu_create(&B, 0) || make_engine(KB_F16, 256, &P, &E))
		return -1;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	engine_destroy(E);
	kvpool_destroy(P);
	if (B)
		B->ops->destroy(B);
	model_free(M);
	return 0;
}

static void need_model(void)
{
	if (!M)
		fail_msg("cannot load model '%s': %s -- run `make model` (or set KVD_MODEL)",
			 model_path(), load_err);
}

/* n token ids below the vocabulary size, fixed by seed. */
static void rand_tokens(uint32_t *ids, uint32_t n, uint64_t seed)
{
	uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
	for (uint32_t i = 0; i < n; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		ids[i] = (uint32_t)((s >> 33) % M->hp.vocab);
	}
}

static void seq_new(struct engine_seq *s)
{
	engine_seq_init(E, s, 0);
}

/* Rows p0.. of ids into s in one call; logits of the last row, or of every row when all. */
static int run_on(struct engine *e, struct engine_seq *s, uint32_t p0, const uint32_t *ids,
		  uint32_t n, int all, float *logits)
{
	struct engine_row rows[MAX_ROWS + 1];
	assert_true(n <= MAX_ROWS + 1);
	for (uint32_t i = 0; i < n; i++)
		rows[i] = (struct engine_row){ s, p0 + i, ids[i], all || i == n - 1 };
	return engine_forward(e, rows, n, logits);
}

static int run(struct engine_seq *s, uint32_t p0, const uint32_t *ids, uint32_t n, int all,
	       float *logits)
{
	return run_on(E, s, p0, ids, n, all, logits);
}

static void same_logits(const float *got, const float *want, const char *what)
{
	uint32_t v = M->hp.vocab;
	if (!memcmp(got, want, v * sizeof(float)))
		return;
	uint32_t first = v;
	float maxd = 0.0f;
	for (uint32_t i = 0; i < v; i++) {
		if (got[i] != want[i] && first == v)
			first = i;
		maxd = fmaxf(maxd, fabsf(got[i] - want[i]));
	}
	fail_msg("%s: logits differ (first at token %u: %a vs %a; max |d| %g)", what, first,
		 (double)got[first], (double)want[first], (double)maxd);
}

/* Both sequences of pool cache the same positions with the same bits in every layer. */
static void same_cache_in(const struct kvpool *pool, const struct engine_seq *a,
			  const struct engine_seq *b)
{
	const struct kvpool_config *pc = kvpool_config(pool);
	const size_t row = kvpool_row_bytes(pc->kv_type, pc->kv_dim);
	assert_int_equal(engine_seq_len(a), engine_seq_len(b));
	for (uint32_t p = 0; p < engine_seq_len(a); p++) {
		const uint8_t *ba = kvpool_block(pool, a->kv.blocks[p / pc->block_tokens]);
		const uint8_t *bb = kvpool_block(pool, b->kv.blocks[p / pc->block_tokens]);
		size_t slot = (p % pc->block_tokens) * row;
		for (uint32_t l = 0; l < M->hp.n_layers; l++)
			for (int kv = 0; kv < 2; kv++) {
				size_t off = ((size_t)l * 2 + kv) * pc->block_tokens * row + slot;
				if (memcmp(ba + off, bb + off, row))
					fail_msg("position %u layer %u: %s rows differ", p, l, kv ? "V" : "K");
			}
	}
}

static void same_cache(const struct engine_seq *a, const struct engine_seq *b)
{
	same_cache_in(P, a, b);
}

static void sane_logits(const float *lg)
{
	float lo = INFINITY, hi = -INFINITY;
	for (uint32_t i = 0; i < M->hp.vocab; i++) {
		assert_true(isfinite(lg[i]));
		lo = fminf(lo, lg[i]);
		hi = fmaxf(hi, lg[i]);
	}
	assert_true(hi - lo > 1.0f);
}

/* Two prompts in one call, or each alone; then one decode step for both, or each alone. */
static void test_batch_invariance(void **state)
{
	(void)state;
	need_model();
	const uint32_t v = M->hp.vocab;
	uint32_t a[7], b[11];
	struct engine_seq sa, sb, ra, rb;
	float *lg = malloc(2 * v * sizeof(float)), *la = malloc(v * sizeof(float));
	float *lb = malloc(v * sizeof(float));
	struct engine_row rows[14];
	assert_true(lg && la && lb);
	rand_tokens(a, 7, 1);
	rand_tokens(b, 11, 2);
	seq_new(&sa);
	seq_new(&sb);
	seq_new(&ra);
	seq_new(&rb);

	for (uint32_t i = 0; i < 5; i++)
		rows[i] = (struct engine_row){ &sa, i, a[i], i == 4 };
	for (uint32_t i = 0; i < 9; i++)
		rows[5 + i] = (struct engine_row){ &sb, i, b[i], i == 8 };
	assert_int_equal(engine_forward(E, rows, 14, lg), 0);
	assert_int_equal(engine_seq_len(&sa), 5);
	assert_int_equal(engine_seq_len(&sb), 9);
	assert_int_equal(run(&ra, 0, a, 5, 0, la), 0);
	assert_int_equal(run(&rb, 0, b, 9, 0, lb), 0);
	sane_logits(la);
	same_logits(lg, la, "prefill: 5-token prompt batched with a 9-token one vs alone");
	same_logits(lg + v, lb, "prefill: 9-token prompt batched with a 5-token one vs alone");
	same_cache(&sa, &ra);
	same_cache(&sb, &rb);

	rows[0] = (struct engine_row){ &sa, 5, a[5], 1 };
	rows[1] = (struct engine_row){ &sb, 9, b[9], 1 };
	assert_int_equal(engine_forward(E, rows, 2, lg), 0);
	assert_int_equal(run(&ra, 5, a + 5, 1, 0, la), 0);
	assert_int_equal(run(&rb, 9, b + 9, 1, 0, lb), 0);
	same_logits(lg, la, "decode: sequence A in a 2-row batch vs alone");
	same_logits(lg + v, lb, "decode: sequence B in a 2-row batch vs alone");

	/* The other order in the batch changes nothing either. */
	rows[0] = (struct engine_row){ &sb, 10, b[10], 1 };
	rows[1] = (struct engine_row){ &sa, 6, a[6], 1 };
	assert_int_equal(engine_forward(E, rows, 2, lg), 0);
	assert_int_equal(run(&ra, 6, a + 6, 1, 0, la), 0);
	assert_int_equal(run(&rb, 10, b + 10, 1, 0, lb), 0);
	same_logits(lg, lb, "decode, B first: B");
	same_logits(lg + v, la, "decode, B first: A");
	same_cache(&sa, &ra);
	same_cache(&sb, &rb);

	engine_seq_release(E, &sa);
	engine_seq_release(E, &sb);
	engine_seq_release(E, &ra);
	engine_seq_release(E, &rb);
	free(lg);
	free(la);
	free(lb);
}

#define PROMPT 40

/* One call, chunks of 7, one token at a time: the same logits at every position. */
static void prefill_chunks(uint32_t kv_type)
{
	const uint32_t v = M->hp.vocab;
	uint32_t ids[PROMPT];
	struct engine_seq one, chunk, step;
	struct kvpool *pool;
	struct engine *e;
	float *all = malloc((size_t)PROMPT * v * sizeof(float)), *lg = malloc(v * sizeof(float));
	assert_true(all && lg);
	rand_tokens(ids, PROMPT, 3);
	assert_int_equal(make_engine(kv_type, 16, &pool, &e), 0);
	engine_seq_init(e, &one, 0);
	engine_seq_init(e, &chunk, 0);
	engine_seq_init(e, &step, 0);

	assert_int_equal(run_on(e, &one, 0, ids, PROMPT, 1, all), 0);
	assert_int_equal(engine_seq_len(&one), PROMPT);
	sane_logits(all + (size_t)(PROMPT - 1) * v);
	for (uint32_t p = 0; p < PROMPT; p += 7) {
		uint32_t n = PROMPT - p < 7 ? PROMPT - p : 7;
		char what[64];
		assert_int_equal(run_on(e, &chunk, p, ids + p, n, 0, lg), 0);
		snprintf(what, sizeof(what), "chunk ending at position %u", p + n - 1);
		same_logits(lg, all + (size_t)(p + n - 1) * v, what);
	}
	for (uint32_t p = 0; p < PROMPT; p++) {
		char what[64];
		assert_int_equal(run_on(e, &step, p, ids + p, 1, 0, lg), 0);
		snprintf(what, sizeof(what), "token-by-token, position %u", p);
		same_logits(lg, all + (size_t)p * v, what);
	}
	same_cache_in(pool, &one, &chunk);
	same_cache_in(pool, &one, &step);

	/* A position below the length rewinds: re-running the tail gives the same again. */
	assert_int_equal(run_on(e, &one, 33, ids + 33, PROMPT - 33, 0, lg), 0);
	assert_int_equal(engine_seq_len(&one), PROMPT);
	same_logits(lg, all + (size_t)(PROMPT - 1) * v, "rewound to position 33");
	same_cache_in(pool, &one, &step);

	engine_seq_release(e, &one);
	engine_seq_release(e, &chunk);
	engine_seq_release(e, &step);
	engine_destroy(e);
	kvpool_destroy(pool);
	free(all);
	free(lg);
}

static void test_prefill_chunks(void **state)
{
	(void)state;
	need_model();
	prefill_chunks(KB_F16);
	prefill_chunks(KB_F32);
	prefill_chunks(KB_Q8_0);
}

static void test_bad_batches(void **state)
{
	(void)state;
	need_model();
	const uint32_t v = M->hp.vocab;
	uint32_t ids[MAX_ROWS + 1];
	struct engine_seq s, t, c, fresh;
	struct engine_row rows[MAX_ROWS + 1];
	float *lg = malloc((MAX_ROWS + 1) * (size_t)v * sizeof(float));
	float *want = malloc(v * sizeof(float));
	assert_true(lg && want);
	rand_tokens(ids, MAX_ROWS + 1, 4);
	seq_new(&s);
	seq_new(&t);
	seq_new(&c);
	assert_int_equal(run(&s, 0, ids, 3, 0, lg), 0);

	/* Token out of the vocabulary, alone and behind a valid sequence's rows. */
	rows[0] = (struct engine_row){ &s, 3, v, 1 };
	assert_int_equal(engine_forward(E, rows, 1, lg), -ERANGE);
	rows[0] = (struct engine_row){ &t, 0, ids[0], 0 };
	rows[1] = (struct engine_row){ &t, 1, ids[1], 1 };
	rows[2] = (struct engine_row){ &s, 3, v + 1000, 1 };
	assert_int_equal(engine_forward(E, rows, 3, lg), -ERANGE);
	assert_int_equal(engine_seq_len(&s), 3);
	assert_int_equal(engine_seq_len(&t), 0);

	/* Positions at or past the model's context length. */
	rows[0] = (struct engine_row){ &c, M->hp.ctx_len, ids[0], 1 };
	assert_int_equal(engine_forward(E, rows, 1, lg), -ERANGE);
	assert_int_equal(engine_seq_len(&c), 0);
	rows[0] = (struct engine_row){ &s, UINT32_MAX, ids[0], 1 };
	assert_int_equal(engine_forward(E, rows, 1, lg), -ERANGE);

	/* A gap, a repeat, a start past the length. */
	rows[0] = (struct engine_row){ &s, 3, ids[3], 0 };
	rows[1] = (struct engine_row){ &s, 5, ids[4], 1 };
	assert_int_equal(engine_forward(E, rows, 2, lg), -EINVAL);
	rows[1] = (struct engine_row){ &s, 3, ids[4], 1 };
	assert_int_equal(engine_forward(E, rows, 2, lg), -EINVAL);
	rows[1] = (struct engine_row){ &s, 2, ids[4], 1 };
	assert_int_equal(engine_forward(E, rows, 2, lg), -EINVAL);
	rows[0] = (struct engine_row){ &s, 4, ids[3], 1 };
	assert_int_equal(engine_forward(E, rows, 1, lg), -EINVAL);

	/* One row more than the engine takes. */
	assert_int_equal(run(&t, 0, ids, MAX_ROWS + 1, 0, lg), -EINVAL);
	assert_int_equal(engine_seq_len(&t), 0);

	/*
	 * One sequence's rows in two runs with another sequence between them;
	 * each run alone would be valid (the second starts within the length).
	 */
	rows[0] = (struct engine_row){ &s, 2, ids[2], 1 };
	rows[1] = (struct engine_row){ &t, 0, ids[0], 1 };
	rows[2] = (struct engine_row){ &s, 3, ids[3], 1 };
	assert_int_equal(engine_forward(E, rows, 3, lg), -EINVAL);
	rows[0] = (struct engine_row){ NULL, 0, ids[0], 1 };
	assert_int_equal(engine_forward(E, rows, 1, lg), -EINVAL);
	assert_int_equal(engine_seq_len(&s), 3);
	assert_int_equal(engine_seq_len(&t), 0);
	assert_int_equal(engine_seq_len(&c), 0);

	/* Nothing the refused calls did shows: s continues as a fresh sequence would. */
	seq_new(&fresh);
	assert_int_equal(run(&fresh, 0, ids, 5, 0, want), 0);
	assert_int_equal(run(&s, 3, ids + 3, 2, 0, lg), 0);
	same_logits(lg, want, "after refused batches");
	same_cache(&s, &fresh);

	engine_seq_release(E, &s);
	engine_seq_release(E, &t);
	engine_seq_release(E, &c);
	engine_seq_release(E, &fresh);
	free(lg);
	free(want);
}

/*
 * A prompt whose first blocks are cached gives the same logits as a cold
 * run, computing only the rest; the counters say how much was reused.
 */
static void test_prefix_hit(void **state)
{
	(void)state;
	need_model();
	const uint32_t v = M->hp.vocab, n = 45;	/* two full 16-token blocks + 13 */
	uint32_t ids[45];
	struct engine_seq cold, warm, other;
	struct kvpool_stats st0, st1;
	float *lc = malloc(v * sizeof(float)), *lw = malloc(v * sizeof(float));
	assert_true(lc && lw);
	rand_tokens(ids, n, 7);

	engine_seq_init(E, &cold, 1000);
	assert_int_equal(engine_seq_attach_prefix(E, &cold, ids, n), 0);
	assert_int_equal(run(&cold, 0, ids, n, 0, lc), 0);

	/* Same namespace: 32 tokens come from the cache, 13 are computed. */
	kvpool_get_stats(P, &st0);
	engine_seq_init(E, &warm, 1000);
	int hit = engine_seq_attach_prefix(E, &warm, ids, n);
	assert_int_equal(hit, 32);
	assert_int_equal(engine_seq_len(&warm), 32);
	assert_int_equal(run(&warm, (uint32_t)hit, ids + hit, n - (uint32_t)hit, 0, lw), 0);
	kvpool_get_stats(P, &st1);
	assert_int_equal(st1.prefix_hit_tokens - st0.prefix_hit_tokens, 32);
	assert_int_equal(st1.prefix_hit_blocks - st0.prefix_hit_blocks, 2);
	same_logits(lw, lc, "prompt with a 32-token prefix hit vs cold");
	same_cache(&warm, &cold);
	/* The shared blocks are the same blocks, not copies. */
	assert_int_equal(warm.kv.blocks[0], cold.kv.blocks[0]);
	assert_int_equal(warm.kv.blocks[1], cold.kv.blocks[1]);
	assert_int_not_equal(warm.kv.blocks[2], cold.kv.blocks[2]);

	/* Another uid sees nothing of it. */
	engine_seq_init(E, &other, 1001);
	assert_int_equal(engine_seq_attach_prefix(E, &other, ids, n), 0);
	engine_seq_release(E, &other);

	/* Both released: the blocks stay cached and serve a third request. */
	engine_seq_release(E, &cold);
	engine_seq_release(E, &warm);
	engine_seq_init(E, &warm, 1000);
	assert_int_equal(engine_seq_attach_prefix(E, &warm, ids, n), 32);
	assert_int_equal(run(&warm, 32, ids + 32, n - 32, 0, lw), 0);
	same_logits(lw, lc, "third request after both were released");
	engine_seq_release(E, &warm);
	free(lc);
	free(lw);
}

/* Records generated tokens; stops generation after stop_at of them (0: never). And prefill progress. */
struct record {
	uint32_t tokens[16];
	uint32_t n;
	uint32_t stop_at;
	uint32_t done[8];	/* on_prefill's positions done, by call */
	uint32_t n_progress;
	uint32_t total;		/* its total, the same every call */
};

static void record_progress(void *arg, uint32_t done, uint32_t total)
{
	struct record *r = arg;
	assert_true(r->n_progress < 8);
	assert_true(r->n_progress == 0 || total == r->total);
	r->total = total;
	r->done[r->n_progress++] = done;
}

static int record_token(void *arg, uint32_t token, int eog)
{
	struct record *r = arg;
	assert_false(eog);	/* no tokenizer given: nothing ends generation */
	assert_true(r->n < 16);
	r->tokens[r->n++] = token;
	return r->stop_at && r->n == r->stop_at;
}

/* Greedy generation with gp (on_token set here) from ids (n,); checks what is left cached. */
static void generate_case(struct sampler *smp, const uint32_t *ids, uint32_t n,
			  struct generate_params *gp, struct record *rec,
			  struct generate_result *res)
{
	struct engine_seq s;
	gp->on_token = record_token;
	gp->arg = rec;
	seq_new(&s);
	assert_int_equal(generate(E, smp, &s, ids, n, gp, res), 0);
	assert_int_equal(res->n_prompt, n);
	assert_int_equal(res->n_out, rec->n);
	/* Every token but the last was fed back. */
	assert_int_equal(engine_seq_len(&s), n + rec->n - 1);
	assert_memory_equal(engine_seq_tokens(&s) + n, rec->tokens, (rec->n - 1) * sizeof(uint32_t));
	engine_seq_release(E, &s);
}

/*
 * generate(): a prompt longer than the engine's rows is prefilled in
 * passes, greedy decoding is the argmax fed back, and each stop (length,
 * context, caller) ends it where documented.
 */
static void test_generate(void **state)
{
	(void)state;
	need_model();
	const uint32_t v = M->hp.vocab, n = MAX_ROWS + 36;
	uint32_t ids[MAX_ROWS + 36], want[6];
	struct sampler_params sp;
	struct sampler *smp;
	struct engine_seq ref;
	float *lg = malloc(v * sizeof(float));
	assert_non_null(lg);
	rand_tokens(ids, n, 11);
	sampler_params_default(&sp);
	assert_int_equal(sampler_create(&smp, &sp, v), 0);

	/* The reference: two hand-made prefill passes, then argmax and feed. */
	seq_new(&ref);
	assert_int_equal(run(&ref, 0, ids, MAX_ROWS, 0, lg), 0);
	assert_int_equal(run(&ref, MAX_ROWS, ids + MAX_ROWS, n - MAX_ROWS, 0, lg), 0);
	for (uint32_t t = 0; t < 6; t++) {
		want[t] = 0;
		for (uint32_t i = 1; i < v; i++)
			want[t] = lg[i] > lg[want[t]] ? i : want[t];
		assert_int_equal(run(&ref, n + t, &want[t], 1, 0, lg), 0);
	}
	engine_seq_release(E, &ref);

	struct record rec = {0};
	struct generate_params gp = { .max_tokens = 6 };
	struct generate_result res;
	generate_case(smp, ids, n, &gp, &rec, &res);
	assert_int_equal(res.stop, GENERATE_LENGTH);
	assert_memory_equal(rec.tokens, want, sizeof(want));

	/* The context ends as the scheduler ends it: the token sampled at ctx - 1 positions is the last. */
	rec = (struct record){0};
	gp = (struct generate_params){ .max_tokens = 6, .ctx = n + 3 };
	generate_case(smp, ids, n, &gp, &rec, &res);
	assert_int_equal(res.stop, GENERATE_CONTEXT);
	assert_int_equal(rec.n, 3);
	assert_memory_equal(rec.tokens, want, 3 * sizeof(uint32_t));

	rec = (struct record){ .stop_at = 2 };
	gp = (struct generate_params){ .max_tokens = 6 };
	generate_case(smp, ids, n, &gp, &rec, &res);
	assert_int_equal(res.stop, GENERATE_CALLER);
	assert_int_equal(rec.n, 2);

	/* on_prefill hears of each pass (kvd --prompt's progress line), and changes no token. */
	rec = (struct record){0};
	gp = (struct generate_params){ .max_tokens = 6, .on_prefill = record_progress };
	generate_case(smp, ids, n, &gp, &rec, &res);
	assert_int_equal(rec.n_progress, 2);
	assert_int_equal(rec.total, n);
	assert_int_equal(rec.done[0], MAX_ROWS);
	assert_int_equal(rec.done[1], n);
	assert_memory_equal(rec.tokens, want, sizeof(want));

	/* max_tokens 0 is a prefill only: the prompt cached, nothing sampled. */
	struct engine_seq s;
	gp = (struct generate_params){ .max_tokens = 0 };
	seq_new(&s);
	assert_int_equal(generate(E, smp, &s, ids, n, &gp, &res), 0);
	assert_int_equal(res.n_out, 0);
	assert_int_equal(res.stop, GENERATE_LENGTH);
	assert_int_equal(engine_seq_len(&s), n);
	engine_seq_release(E, &s);

	seq_new(&s);
	assert_int_equal(generate(E, smp, &s, ids, 0, &gp, &res), -EINVAL);
	engine_seq_release(E, &s);
	sampler_destroy(smp);
	free(lg);
}

/* A pool too small for a prompt: -ENOSPC for that request, nothing else lost. */
static void test_pool_full(void **state)
{
	(void)state;
	need_model();
	const uint32_t v = M->hp.vocab;
	uint32_t ids[48];
	struct kvpool *pool;
	struct engine *e;
	struct engine_seq a, b;
	struct kvpool_stats st;
	float *lg = malloc(v * sizeof(float)), *want = malloc(v * sizeof(float));
	assert_true(lg && want);
	rand_tokens(ids, 48, 9);
	assert_int_equal(make_engine(KB_F16, 3, &pool, &e), 0);	/* 48 positions */
	engine_seq_init(e, &a, 0);
	engine_seq_init(e, &b, 0);
	assert_int_equal(run_on(e, &a, 0, ids, 20, 0, want), 0);	/* 2 blocks */
	assert_int_equal(run_on(e, &b, 0, ids + 20, 20, 0, lg), -ENOSPC);
	assert_int_equal(engine_seq_len(&b), 0);
	assert_int_equal(engine_seq_len(&a), 20);
	kvpool_get_stats(pool, &st);
	assert_int_equal(st.blocks_in_use, 2);
	/* a goes on; b fits once a is gone. */
	assert_int_equal(run_on(e, &a, 20, ids + 20, 4, 0, lg), 0);
	engine_seq_release(e, &a);
	assert_int_equal(run_on(e, &b, 0, ids, 20, 0, lg), 0);
	same_logits(lg, want, "after the pool had been full");
	engine_seq_release(e, &b);
	kvpool_get_stats(pool, &st);
	assert_int_equal(st.blocks_in_use, 0);
	engine_destroy(e);
	kvpool_destroy(pool);
	free(lg);
	free(want);
}

/*
 * A temporary copy of the model's first n bytes (all when n is 0) at path,
 * a mkstemp template. Returns 0, or -1 with nothing left behind.
 */
static int copy_model(char *path, size_t n)
{
	static char buf[1 << 20];
	int in = open(model_path(), O_RDONLY), out = mkstemp(path);
	size_t done = 0;
	int rc = in >= 0 && out >= 0 ? 0 : -1;
	while (!rc && (!n || done < n)) {
		size_t want = n && n - done < sizeof(buf) ? n - done : sizeof(buf);
		ssize_t got = read(in, buf, want);
		if (got <= 0) {
			rc = got < 0 ? -1 : 0;
			break;
		}
		if (write(out, buf, (size_t)got) != got)
			rc = -1;
		done += (size_t)got;
	}
	if (in >= 0)
		close(in);
	if (out >= 0 && close(out))
		rc = -1;
	if (rc && out >= 0)
		unlink(path);
	return rc;
}

/*
 * Offset of the last byte of the general.architecture string value in the
 * header, its value copied to arch; -1 if not found in the first MiB.
 */
static off_t arch_offset(const char *path, char *arch, size_t archlen)
{
	static const char key[] = "general.architecture";
	static uint8_t head[1 << 20];
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, head, sizeof(head));
	close(fd);
	/* key (u64 length + bytes), type u32 8 (string), value (u64 length + bytes) */
	for (ssize_t i = 8; i + (ssize_t)sizeof(key) + 12 < n; i++) {
		uint64_t klen, vlen;
		uint32_t type;
		memcpy(&klen, head + i - 8, 8);
		if (klen != sizeof(key) - 1 || memcmp(head + i, key, klen))
			continue;
		memcpy(&type, head + i + klen, 4);
		memcpy(&vlen, head + i + klen + 4, 8);
		size_t at = (size_t)i + klen + 12;
		if (type != 8 || vlen == 0 || vlen >= archlen || at + vlen > (size_t)n)
			return -1;
		memcpy(arch, head + at, vlen);
		arch[vlen] = 0;
		return (off_t)(at + vlen - 1);
	}
	return -1;
}

/* model_load of path; *untouched says the output pointer stayed NULL. Frees what loads. */
static int try_load(const char *path, char *err, size_t errlen, int *untouched)
{
	struct model *m = NULL;
	err[0] = 0;
	int rc = model_load(&m, path, err, errlen);
	*untouched = m == NULL;
	model_free(m);
	return rc;
}

static void test_refused_files(void **state)
{
	(void)state;
	need_model();
	char path[] = "/tmp/kvd-test-engine-XXXXXX", arch[32] = "", err[256], err0[256];
	int untouched, untouched0;

	/* Every file is unlinked before any assertion, so a failure leaves no copy behind. */
	assert_int_equal(copy_model(path, 0), 0);
	int rc0 = try_load(path, err0, sizeof(err0), &untouched0);
	off_t at = arch_offset(path, arch, sizeof(arch));
	int fd = open(path, O_WRONLY);
	ssize_t wrote = fd >= 0 && at >= 0 ? pwrite(fd, "b", 1, at) : -1;
	if (fd >= 0)
		close(fd);
	int rc = try_load(path, err, sizeof(err), &untouched);
	unlink(path);
	/* The copy loads as it is: what fails after the patch fails for the patch alone. */
	if (rc0)
		fail_msg("unpatched copy refused: %s", err0);
	assert_string_equal(arch, "llama");
	assert_int_equal(wrote, 1);
	assert_int_equal(rc, -ENOTSUP);
	assert_true(untouched);
	if (!strstr(err, "llamb"))
		fail_msg("refusal does not name the architecture: '%s'", err);

	/* Cut in the header, and one byte short of the last tensor's data. */
	static const size_t cuts[] = { 1 << 20, 0 };
	for (int i = 0; i < 2; i++) {
		char tp[] = "/tmp/kvd-test-engine-XXXXXX";
		size_t n = cuts[i];
		struct stat st;
		assert_int_equal(copy_model(tp, n), 0);
		int cut = n ? 0 : stat(tp, &st) || truncate(tp, st.st_size - 1);
		rc = cut ? 0 : try_load(tp, err, sizeof(err), &untouched);
		unlink(tp);
		assert_int_equal(cut, 0);
		if (rc >= 0)
			fail_msg("a copy cut at %zu bytes loaded", n);
		assert_true(untouched);
		assert_true(err[0] != 0);
		printf("cut copy %s refused: %d (%s)\n", n ? "in the header" : "by one byte", rc, err);
	}
}

/* Load the default model with kv and tensor added; rc, and the refusal's text in err. */
static int load_extended(const struct gguf_add_kv *kv, int n_kv, const char *tensor, char *err,
			 size_t errlen)
{
	char path[] = "/tmp/kvd-test-engine-XXXXXX";
	int fd = mkstemp(path), untouched;
	assert_true(fd >= 0);
	close(fd);
	int rc = gguf_extend(model_path(), path, kv, n_kv, tensor, 32);
	if (rc) {
		unlink(path);
		fail_msg("gguf_extend: %d", rc);
	}
	rc = try_load(path, err, errlen, &untouched);
	unlink(path);
	assert_true(rc == 0 || untouched);
	return rc;
}

/*
 * What a newer converter adds that changes the math is honoured or refused
 * by name, never ignored: a tensor the forward pass does not read, RoPE
 * scaling kvd does not do, a value head size unlike the key's, experts.
 * Llama 3's rope_freqs and linear or YaRN scaling load; so does what
 * changes nothing (linear by 1, a value_length equal to the head size).
 */
static void test_refused_additions(void **state)
{
	(void)state;
	need_model();
	static const struct {
		struct gguf_add_kv kv[2];
		int n_kv;
		const char *tensor;
		const char *named;	/* NULL: loads */
	} cases[] = {
		{ { { 0 } }, 0, "rope_freqs.weight", NULL },
		{ { { 0 } }, 0, "blk.0.post_attention_norm.weight", "blk.0.post_attention_norm.weight" },
		{ { { "llama.rope.scaling.type", GGUF_VT_STRING, "linear", 0, 0 },
		    { "llama.rope.scaling.factor", GGUF_VT_F32, NULL, 0, 4.0f } }, 2, NULL, NULL },
		{ { { "llama.rope.scaling.type", GGUF_VT_STRING, "yarn", 0, 0 } }, 1, NULL, NULL },
		{ { { "llama.rope.scaling.type", GGUF_VT_STRING, "longrope", 0, 0 } }, 1, NULL,
		  "longrope" },
		{ { { "llama.rope.scaling.type", GGUF_VT_STRING, "linear", 0, 0 },
		    { "llama.rope.scaling.factor", GGUF_VT_F32, NULL, 0, 1.0f } }, 2, NULL, NULL },
		{ { { "llama.rope.scaling.type", GGUF_VT_STRING, "none", 0, 0 } }, 1, NULL, NULL },
		{ { { "llama.attention.key_length", GGUF_VT_U32, NULL, 64, 0 },
		    { "llama.attention.value_length", GGUF_VT_U32, NULL, 128, 0 } }, 2, NULL,
		  "llama.attention.value_length" },
		{ { { "llama.attention.value_length", GGUF_VT_U32, NULL, 64, 0 } }, 1, NULL, NULL },
		{ { { "llama.expert_count", GGUF_VT_U32, NULL, 8, 0 } }, 1, NULL, "llama.expert_count" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char err[512] = "";
		int rc = load_extended(cases[i].kv, cases[i].n_kv, cases[i].tensor, err, sizeof(err));
		const char *what = cases[i].tensor ? cases[i].tensor : cases[i].kv[0].key;
		if (!cases[i].named) {
			if (rc)
				fail_msg("case %zu (%s): refused: %s", i, what, err);
			continue;
		}
		if (rc != -ENOTSUP || !strstr(err, cases[i].named))
			fail_msg("case %zu (%s): rc %d, '%s' does not name %s", i, what, rc, err,
				 cases[i].named);
		printf("refused: %s\n", err);
	}
}

/* ---- tiny synthetic models of each architecture ---- */

#define T_DIM 64
#define T_HEADS 4
#define T_KV 2
#define T_FFN 96
#define T_VOCAB 48
#define T_LAYERS 3
#define T_CTX 256

/* What a converter would write for one architecture, in miniature. */
struct tiny_cfg {
	const char *arch;
	uint32_t head_dim;		/* 0: dim / heads, and no key_length */
	int fused_qkv, fused_up, biases, post_norms, output;
	int rope_freqs;			/* 1: rope_freqs.weight of factors 1 + i / 4 */
	const struct gguf_add_kv *kv;	/* more keys */
	int n_kv;
	const char *extra;		/* one more 1-D tensor of 8 elements */
	const char *drop;		/* a tensor to leave out */
};

struct tiny_tensor {
	char name[48];
	uint64_t ne0, ne1;		/* ne1 1: a vector */
	int kind;			/* 0 weight, 1 norm, 2 rope factors */
};

static uint32_t tiny_head(const struct tiny_cfg *c)
{
	return c->head_dim ? c->head_dim : T_DIM / T_HEADS;
}

static void tt_add(struct tiny_tensor *t, int *n, const struct tiny_cfg *c, int kind,
		   uint64_t ne0, uint64_t ne1, const char *fmt, ...)
{
	struct tiny_tensor *x = &t[*n];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(x->name, sizeof(x->name), fmt, ap);
	va_end(ap);
	if (c->drop && !strcmp(c->drop, x->name))
		return;
	x->ne0 = ne0, x->ne1 = ne1, x->kind = kind;
	(*n)++;
}

/* The tensors of c, in the order llama.cpp's converter writes them; returns how many. */
static int tiny_tensors(const struct tiny_cfg *c, struct tiny_tensor *t)
{
	const uint64_t hd = tiny_head(c), qd = T_HEADS * hd, kvd = T_KV * hd;
	int n = 0;
	tt_add(t, &n, c, 0, T_DIM, T_VOCAB, "token_embd.weight");
	if (c->rope_freqs)
		tt_add(t, &n, c, 2, hd / 2, 1, "rope_freqs.weight");
	for (int l = 0; l < T_LAYERS; l++) {
		tt_add(t, &n, c, 1, T_DIM, 1, "blk.%d.attn_norm.weight", l);
		if (c->fused_qkv) {
			tt_add(t, &n, c, 0, T_DIM, qd + 2 * kvd, "blk.%d.attn_qkv.weight", l);
		} else {
			tt_add(t, &n, c, 0, T_DIM, qd, "blk.%d.attn_q.weight", l);
			tt_add(t, &n, c, 0, T_DIM, kvd, "blk.%d.attn_k.weight", l);
			tt_add(t, &n, c, 0, T_DIM, kvd, "blk.%d.attn_v.weight", l);
		}
		if (c->biases) {
			tt_add(t, &n, c, 0, qd, 1, "blk.%d.attn_q.bias", l);
			tt_add(t, &n, c, 0, kvd, 1, "blk.%d.attn_k.bias", l);
			tt_add(t, &n, c, 0, kvd, 1, "blk.%d.attn_v.bias", l);
		}
		tt_add(t, &n, c, 0, qd, T_DIM, "blk.%d.attn_output.weight", l);
		if (c->post_norms)
			tt_add(t, &n, c, 1, T_DIM, 1, "blk.%d.post_attention_norm.weight", l);
		tt_add(t, &n, c, 1, T_DIM, 1, "blk.%d.ffn_norm.weight", l);
		if (c->fused_up) {
			tt_add(t, &n, c, 0, T_DIM, 2 * T_FFN, "blk.%d.ffn_up.weight", l);
		} else {
			tt_add(t, &n, c, 0, T_DIM, T_FFN, "blk.%d.ffn_gate.weight", l);
			tt_add(t, &n, c, 0, T_DIM, T_FFN, "blk.%d.ffn_up.weight", l);
		}
		tt_add(t, &n, c, 0, T_FFN, T_DIM, "blk.%d.ffn_down.weight", l);
		if (c->post_norms)
			tt_add(t, &n, c, 1, T_DIM, 1, "blk.%d.post_ffw_norm.weight", l);
	}
	tt_add(t, &n, c, 1, T_DIM, 1, "output_norm.weight");
	if (c->output)
		tt_add(t, &n, c, 0, T_DIM, T_VOCAB, "output.weight");
	if (c->extra)
		tt_add(t, &n, c, 0, 8, 1, "%s", c->extra);
	return n;
}

static void w_kv_u32(struct wbuf *w, const char *arch, const char *suffix, uint32_t v)
{
	char key[96];
	snprintf(key, sizeof(key), "%s.%s", arch, suffix);
	w_key(w, key, GGUF_VT_U32);
	w_u32(w, v);
}

static void w_kv(struct wbuf *w, const struct gguf_add_kv *kv)
{
	w_key(w, kv->key, kv->type);
	if (kv->type == GGUF_VT_STRING)
		w_str(w, kv->str);
	else if (kv->type == GGUF_VT_F32)
		w_bytes(w, &kv->f32, 4);
	else
		w_u32(w, kv->u32);
}

static uint64_t tiny_header(struct wbuf *w, const struct tiny_cfg *c, int n_t)
{
	uint64_t n_kv = 8 + (c->head_dim ? 2 : 0) + (uint64_t)c->n_kv;
	w_bytes(w, "GGUF", 4);
	w_u32(w, 3);
	w_u64(w, (uint64_t)n_t);
	w_u64(w, n_kv);
	w_key(w, "general.architecture", GGUF_VT_STRING);
	w_str(w, c->arch);
	w_kv_u32(w, c->arch, "block_count", T_LAYERS);
	w_kv_u32(w, c->arch, "embedding_length", T_DIM);
	w_kv_u32(w, c->arch, "attention.head_count", T_HEADS);
	w_kv_u32(w, c->arch, "attention.head_count_kv", T_KV);
	w_kv_u32(w, c->arch, "feed_forward_length", T_FFN);
	w_kv_u32(w, c->arch, "context_length", T_CTX);
	char key[96];
	snprintf(key, sizeof(key), "%s.attention.layer_norm_rms_epsilon", c->arch);
	float eps = 1e-5f;
	w_key(w, key, GGUF_VT_F32);
	w_bytes(w, &eps, 4);
	if (c->head_dim) {
		w_kv_u32(w, c->arch, "attention.key_length", c->head_dim);
		w_kv_u32(w, c->arch, "attention.value_length", c->head_dim);
	}
	for (int i = 0; i < c->n_kv; i++)
		w_kv(w, &c->kv[i]);
	return n_kv;
}

/* Write c as a GGUF at path (a mkstemp template); weights small and fixed by each tensor's index. */
static void tiny_write(char *path, const struct tiny_cfg *c)
{
	static struct tiny_tensor t[128];
	int n_t = tiny_tensors(c, t);
	struct wbuf w = { 0 };
	tiny_header(&w, c, n_t);
	uint64_t off = 0;
	for (int i = 0; i < n_t; i++) {
		w_str(&w, t[i].name);
		w_u32(&w, t[i].ne1 > 1 ? 2 : 1);
		w_u64(&w, t[i].ne0);
		if (t[i].ne1 > 1)
			w_u64(&w, t[i].ne1);
		w_u32(&w, GGUF_T_F32);
		w_u64(&w, off);
		off += (t[i].ne0 * t[i].ne1 * 4 + 31) & ~(uint64_t)31;
	}
	w_pad(&w, 32);
	for (int i = 0; i < n_t; i++) {
		/* Seeded by name, so a tensor added or left out changes no other. */
		uint64_t h = 1469598103934665603ull;
		for (const char *p = t[i].name; *p; p++)
			h = (h ^ (uint8_t)*p) * 1099511628211ull;
		struct rng r = rng_make(h);
		for (uint64_t j = 0; j < t[i].ne0 * t[i].ne1; j++) {
			float v = t[i].kind == 1 ? 1.0f + 0.2f * rng_sym(&r)
				: t[i].kind == 2 ? 1.0f + (float)j / 4.0f
						 : 0.3f * rng_sym(&r);
			w_bytes(&w, &v, 4);
		}
		w_pad(&w, 32);
	}
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	ssize_t wrote = write(fd, w.p, w.len);
	close(fd);
	free(w.p);
	if (wrote != (ssize_t)w.len) {
		unlink(path);
		fail_msg("writing %s failed", path);
	}
}

/* model_load of c; rc, the model in *out (when 0), the refusal in err. */
static int tiny_load(const struct tiny_cfg *c, struct model **out, char *err, size_t errlen)
{
	char path[] = "/tmp/kvd-test-arch-XXXXXX";
	tiny_write(path, c);
	struct model *m = NULL;
	err[0] = 0;
	int rc = model_load(&m, path, err, errlen);
	unlink(path);	/* the mapping outlives the name */
	if (rc)
		assert_null(m);
	*out = m;
	return rc;
}

static struct model *tiny_must(const struct tiny_cfg *c)
{
	struct model *m;
	char err[512];
	if (tiny_load(c, &m, err, sizeof(err)))
		fail_msg("%s: refused: %s", c->arch, err);
	return m;
}

static const uint8_t *tensor_data(const struct model *m, const char *name)
{
	const struct gguf_tensor *t = gguf_find_tensor(m->gguf, name);
	assert_non_null(t);
	return t->data;
}

/* Each architecture binds its own tensors with the shapes its metadata gives. */
static void test_arch_binds(void **state)
{
	(void)state;
	struct tiny_cfg llama = { .arch = "llama", .output = 1 };
	struct model *m = tiny_must(&llama);
	assert_int_equal(m->hp.arch_id, MODEL_ARCH_LLAMA);
	assert_int_equal(m->hp.rope_neox, 0);
	assert_int_equal(m->hp.head_dim, 16);
	assert_int_equal(m->hp.q_dim, T_DIM);
	assert_false(m->hp.tied_output);
	assert_ptr_equal(m->output.data, tensor_data(m, "output.weight"));
	assert_null(m->layers[0].bq);
	assert_null(m->rope.h_freq_factors);
	assert_string_equal(m->hp.rope_scaling, "none");
	assert_int_equal(m->hp.act, MODEL_ACT_SILU);
	assert_true(m->hp.embd_scale == 0.0f && m->hp.final_softcap == 0.0f);
	model_free(m);

	struct tiny_cfg qwen2 = { .arch = "qwen2", .biases = 1 };
	m = tiny_must(&qwen2);
	assert_int_equal(m->hp.rope_neox, 1);
	assert_true(m->hp.qkv_bias);
	assert_true(m->hp.tied_output);
	assert_ptr_equal(m->layers[1].bk, tensor_data(m, "blk.1.attn_k.bias"));
	assert_ptr_equal(m->layers[2].bv, tensor_data(m, "blk.2.attn_v.bias"));
	model_free(m);

	/* Fused weights: views at row offsets of the one tensor, nothing copied. */
	struct tiny_cfg phi3 = { .arch = "phi3", .fused_qkv = 1, .fused_up = 1, .output = 1 };
	m = tiny_must(&phi3);
	const struct model_layer *L = &m->layers[1];
	const uint8_t *qkv = tensor_data(m, "blk.1.attn_qkv.weight");
	const uint8_t *up = tensor_data(m, "blk.1.ffn_up.weight");
	size_t rb = T_DIM * sizeof(float);
	assert_int_equal(m->hp.rope_neox, 1);
	assert_ptr_equal(L->wq.data, qkv);
	assert_ptr_equal(L->wk.data, qkv + (size_t)T_DIM * rb);
	assert_ptr_equal(L->wv.data, qkv + (size_t)(T_DIM + 32) * rb);
	assert_int_equal(L->wq.rows, T_DIM);
	assert_int_equal(L->wk.rows, 32);
	assert_int_equal(L->wv.rows, 32);
	assert_ptr_equal(L->w_gate.data, up);
	assert_ptr_equal(L->w_up.data, up + (size_t)T_FFN * rb);
	assert_int_equal(L->w_gate.rows, T_FFN);
	assert_int_equal(L->w_up.rows, T_FFN);
	model_free(m);

	/* Gemma: output is token_embd even with an LM head absent; embeddings x sqrt(dim). */
	struct tiny_cfg gemma = { .arch = "gemma", .head_dim = 32 };
	m = tiny_must(&gemma);
	assert_true(m->hp.tied_output);
	assert_ptr_equal(m->output.data, m->tok_embd.data);
	assert_true(m->hp.embd_scale == sqrtf((float)T_DIM));
	assert_int_equal(m->hp.act, MODEL_ACT_GELU);
	assert_int_equal(m->hp.head_dim, 32);
	assert_int_equal(m->hp.q_dim, 128);
	assert_int_equal(m->layers[0].wo.cols, 128);
	assert_true(m->hp.attn_scale == 1.0f / sqrtf(32.0f));
	model_free(m);

	/* Gemma 2: post-norms, llama.cpp's default caps, even layers slide. */
	const struct gguf_add_kv g2kv[] = {
		{ "gemma2.attention.sliding_window", GGUF_VT_U32, NULL, 8, 0 },
	};
	struct tiny_cfg gemma2 = { .arch = "gemma2", .post_norms = 1, .kv = g2kv, .n_kv = 1 };
	m = tiny_must(&gemma2);
	assert_ptr_equal(m->layers[2].post_attn_norm,
			 tensor_data(m, "blk.2.post_attention_norm.weight"));
	assert_ptr_equal(m->layers[2].post_ffn_norm, tensor_data(m, "blk.2.post_ffw_norm.weight"));
	assert_true(m->hp.attn_softcap == 50.0f && m->hp.final_softcap == 30.0f);
	assert_int_equal(m->layers[0].window, 8);
	assert_int_equal(m->layers[1].window, 0);
	assert_int_equal(m->layers[2].window, 8);
	model_free(m);

	/* Mistral Nemo: a head size that is not dim / heads. */
	struct tiny_cfg nemo = { .arch = "llama", .head_dim = 24, .output = 1 };
	m = tiny_must(&nemo);
	assert_int_equal(m->hp.q_dim, T_HEADS * 24);
	assert_int_equal(m->hp.kv_dim, T_KV * 24);
	assert_int_equal(m->layers[0].wq.rows, T_HEADS * 24);
	assert_int_equal(m->layers[0].wo.cols, T_HEADS * 24);
	assert_int_equal(m->layers[0].wo.rows, T_DIM);
	assert_int_equal(m->hp.rot_dim, 24);
	assert_int_equal(model_kv_bytes_per_token(m, 2), 2u * T_LAYERS * T_KV * 24 * 2);
	model_free(m);
}

/* What the forward pass would ignore or cannot do is refused, naming the tensor or key. */
static void test_arch_refusals(void **state)
{
	(void)state;
	static const struct gguf_add_kv vlen[] = {
		{ "llama.attention.key_length", GGUF_VT_U32, NULL, 16, 0 },
		{ "llama.attention.value_length", GGUF_VT_U32, NULL, 8, 0 },
	};
	static const struct gguf_add_kv lrope[] = { { "phi3.rope.scaling.type", GGUF_VT_STRING, "longrope", 0, 0 } };
	static const struct gguf_add_kv ascale[] = { { "llama.attention.scale", GGUF_VT_F32, NULL, 0, 0.5f } };
	static const struct gguf_add_kv cap[] = { { "llama.final_logit_softcapping", GGUF_VT_F32, NULL, 0, 30.0f } };
	static const struct gguf_add_kv swab[] = { { "gemma2.rope.freq_base_swa", GGUF_VT_F32, NULL, 0, 500.0f } };
	static const struct gguf_add_kv logmul[] = {
		{ "llama.rope.scaling.type", GGUF_VT_STRING, "yarn", 0, 0 },
		{ "llama.rope.scaling.yarn_log_multiplier", GGUF_VT_F32, NULL, 0, 0.1f },
	};
	static const struct gguf_add_kv both[] = { { "llama.rope.scaling.type", GGUF_VT_STRING, "llama3", 0, 0 } };
	const struct {
		struct tiny_cfg c;
		const char *named;
	} cases[] = {
		{ { .arch = "llama", .kv = vlen, .n_kv = 2 }, "llama.attention.value_length" },
		{ { .arch = "phi3", .fused_qkv = 1, .fused_up = 1, .kv = lrope, .n_kv = 1 }, "phi3.rope.scaling.type" },
		{ { .arch = "phi3", .fused_qkv = 1, .fused_up = 1, .extra = "rope_factors_long.weight" }, "rope_factors_long.weight" },
		{ { .arch = "llama", .kv = ascale, .n_kv = 1 }, "llama.attention.scale" },
		{ { .arch = "llama", .kv = cap, .n_kv = 1 }, "llama.final_logit_softcapping" },
		{ { .arch = "gemma2", .post_norms = 1, .kv = swab, .n_kv = 1 }, "gemma2.rope.freq_base_swa" },
		{ { .arch = "gemma2", .post_norms = 1, .drop = "blk.1.post_ffw_norm.weight" }, "blk.1.post_ffw_norm.weight" },
		{ { .arch = "gemma", .output = 1 }, "output.weight" },
		{ { .arch = "llama", .extra = "blk.0.attn_output.bias" }, "blk.0.attn_output.bias" },
		{ { .arch = "qwen2", .extra = "rope_freqs.weight" }, "rope_freqs.weight" },
		{ { .arch = "llama", .rope_freqs = 1, .kv = both, .n_kv = 1 }, "rope_freqs.weight" },
		{ { .arch = "llama", .kv = logmul, .n_kv = 2 }, "llama.rope.scaling.yarn_log_multiplier" },
		{ { .arch = "phi3", .fused_qkv = 1, .drop = "blk.0.ffn_up.weight" }, "blk.0.ffn_up.weight" },
		{ { .arch = "gpt2" }, "gpt2" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct model *m;
		char err[512];
		int rc = tiny_load(&cases[i].c, &m, err, sizeof(err));
		if (!rc)
			model_free(m);
		if (rc >= 0 || !strstr(err, cases[i].named))
			fail_msg("case %zu (%s): rc %d, '%s' does not name %s", i, cases[i].c.arch, rc,
				 err, cases[i].named);
		printf("refused: %s\n", err);
	}
}

/* Linear, YaRN and llama3 metadata become the rope parameters llama.cpp would pass to ggml. */
static void test_rope_scaling(void **state)
{
	(void)state;
	char err[512];
	static const struct gguf_add_kv lin[] = {
		{ "llama.rope.scaling.type", GGUF_VT_STRING, "linear", 0, 0 },
		{ "llama.rope.scaling.factor", GGUF_VT_F32, NULL, 0, 4.0f },
	};
	struct tiny_cfg c = { .arch = "llama", .kv = lin, .n_kv = 2 };
	struct model *m = tiny_must(&c);
	assert_true(m->rope.freq_scale == 0.25f && m->rope.ext_factor == 0.0f);
	assert_int_equal(m->hp.max_ctx, 4 * T_CTX);
	/* Past the trained context up to what the scaling reaches, by default the trained one. */
	assert_int_equal(model_set_ctx(m, 0, err, sizeof(err)), 0);
	assert_int_equal(m->hp.ctx_len, T_CTX);
	assert_int_equal(model_set_ctx(m, 4 * T_CTX, err, sizeof(err)), 0);
	assert_int_equal(model_set_ctx(m, 4 * T_CTX + 1, err, sizeof(err)), -ERANGE);
	assert_non_null(strstr(err, "linear"));
	model_free(m);

	static const struct gguf_add_kv yarn[] = {
		{ "qwen2.rope.scaling.type", GGUF_VT_STRING, "yarn", 0, 0 },
		{ "qwen2.rope.scaling.factor", GGUF_VT_F32, NULL, 0, 4.0f },
		{ "qwen2.rope.scaling.original_context_length", GGUF_VT_U32, NULL, 64, 0 },
		{ "qwen2.rope.freq_base", GGUF_VT_F32, NULL, 0, 10000.0f },
	};
	c = (struct tiny_cfg){ .arch = "qwen2", .kv = yarn, .n_kv = 4 };
	m = tiny_must(&c);
	/* ggml_rope_yarn_corr_dims for 16 dims, 64 positions, base 1e4, beta 32 and 1. */
	float lo = floorf(16 * logf(64 / (32 * 2 * (float)M_PI)) / (2 * logf(10000.0f)));
	float hi = ceilf(16 * logf(64 / (1 * 2 * (float)M_PI)) / (2 * logf(10000.0f)));
	assert_true(m->rope.freq_scale == 0.25f && m->rope.ext_factor == 1.0f);
	assert_true(m->rope.corr_lo == (lo > 0 ? lo : 0) && m->rope.corr_hi == (hi < 15 ? hi : 15));
	/* mscale 1 + 0.1 ln 4, cancelled by the factor ggml applies on top of it. */
	assert_true(fabsf(m->rope.attn_factor - 1.0f) < 1e-6f);
	assert_int_equal(m->hp.max_ctx, T_CTX);	/* 64 x 4 is the trained 256 */
	model_free(m);

	static const struct gguf_add_kv l3[] = {
		{ "llama.rope.scaling.type", GGUF_VT_STRING, "llama3", 0, 0 },
		{ "llama.rope.scaling.factor", GGUF_VT_F32, NULL, 0, 8.0f },
		{ "llama.rope.scaling.low_freq_factor", GGUF_VT_F32, NULL, 0, 1.0f },
		{ "llama.rope.scaling.high_freq_factor", GGUF_VT_F32, NULL, 0, 4.0f },
		{ "llama.rope.scaling.original_context_length", GGUF_VT_U32, NULL, 64, 0 },
	};
	c = (struct tiny_cfg){ .arch = "llama", .kv = l3, .n_kv = 5 };
	m = tiny_must(&c);
	float want[8];
	model_llama3_factors(want, 16, 10000.0f, 8.0f, 1.0f, 4.0f, 64.0f);
	assert_non_null(m->rope.h_freq_factors);
	assert_memory_equal(m->rope.h_freq_factors, want, sizeof(want));
	/* The highest frequency is kept, the lowest divided by the whole factor. */
	assert_true(want[0] == 1.0f && want[7] == 8.0f);
	assert_true(m->rope.freq_scale == 1.0f);
	model_free(m);

	/* The same formula as the converter's, written independently (tests/golden/gen_arch.py). */
	const char *golden = "tests/golden/arch/llama3-freqs.gguf";
	assert_int_equal(model_load(&m, golden, err, sizeof(err)), 0);
	const float *f = m->rope.h_freq_factors;
	assert_non_null(f);
	model_llama3_factors(want, 16, m->hp.rope_theta, 8.0f, 1.0f, 4.0f, 256.0f);
	int between = 0;
	for (int i = 0; i < 8; i++) {
		between += want[i] > 1.0f && want[i] < 8.0f;
		if (fabsf(f[i] - want[i]) > 1e-6f * want[i])
			fail_msg("llama3 factor %d: %.9g computed, %.9g in %s", i, (double)want[i],
				 (double)f[i], golden);
	}
	model_free(m);
	assert_true(between > 0);	/* the smooth branch was exercised */

	static const struct gguf_add_kv bad[] = { { "llama.rope.scaling.type", GGUF_VT_STRING, "dynamic", 0, 0 } };
	c = (struct tiny_cfg){ .arch = "llama", .kv = bad, .n_kv = 1 };
	assert_int_equal(tiny_load(&c, &m, err, sizeof(err)), -ENOTSUP);
	assert_non_null(strstr(err, "llama.rope.scaling.type"));
	assert_non_null(strstr(err, "dynamic"));
}

static int no_scale(struct backend *b, float *x, float s, uint32_t n, uint32_t dim)
{
	(void)b, (void)x, (void)s, (void)n, (void)dim;
	return -ENOTSUP;
}

/* A backend without an operation the architecture needs is refused, naming all three. */
static void test_backend_lacks(void **state)
{
	(void)state;
	struct backend *cpu;
	assert_int_equal(backend_cpu_create(&cpu, 1), 0);
	struct backend_ops ops = *cpu->ops;
	struct backend fake = *cpu;
	fake.ops = &ops;
	/* Gemma needs scale and geglu: the backend has the one and lacks the other. */
	ops.scale = no_scale;
	ops.geglu = NULL;
	struct tiny_cfg gemma = { .arch = "gemma" };
	struct model *m = tiny_must(&gemma);
	char err[256] = "";
	int rc = engine_supports(m, &fake, err, sizeof(err));
	struct kvpool *pool = NULL;
	struct kvpool_config pc = { .n_blocks = 4, .block_tokens = 16, .n_layers = T_LAYERS,
				    .kv_dim = m->hp.kv_dim, .kv_type = KB_F32 };
	struct engine *e = NULL;
	int rc_create = kvpool_create(&pool, &pc) ? -1 : engine_create(&e, m, &fake, pool, 4);
	engine_destroy(e);
	kvpool_destroy(pool);
	struct tiny_cfg llama = { .arch = "llama" };
	struct model *m2 = tiny_must(&llama);
	int rc_llama = engine_supports(m2, &fake, NULL, 0);
	model_free(m2);
	model_free(m);
	cpu->ops->destroy(cpu);
	assert_int_equal(rc, -ENOTSUP);
	assert_int_equal(rc_create, -ENOTSUP);
	assert_int_equal(rc_llama, 0);
	if (!strstr(err, "'cpu'") || !strstr(err, "geglu") || !strstr(err, "'gemma'"))
		fail_msg("'%s' does not name the backend, the op and the architecture", err);
	printf("refused: %s\n", err);
}

/*
 * The forward pass of tiny model c on the CPU: the last row's logits of a
 * fixed prompt of n tokens, fed chunk rows per call, into lg (T_VOCAB).
 * -ENOTSUP when the backend does not compute one of its operations yet.
 */
static int tiny_forward_chunks(const struct tiny_cfg *c, uint32_t n, uint32_t chunk, float *lg)
{
	struct model *m = tiny_must(c);
	struct backend *cpu;
	struct kvpool *pool = NULL;
	struct engine *e = NULL;
	struct kvpool_config pc = { .n_blocks = 16, .block_tokens = 16, .n_layers = T_LAYERS,
				    .kv_dim = m->hp.kv_dim, .kv_type = KB_F32 };
	int rc = backend_cpu_create(&cpu, 1);
	if (rc) {
		model_free(m);
		return rc;
	}
	if (!(rc = kvpool_create(&pool, &pc)))
		rc = engine_create(&e, m, cpu, pool, MAX_ROWS);
	if (!rc) {
		struct engine_seq s;
		struct engine_row rows[MAX_ROWS];
		engine_seq_init(e, &s, 0);
		for (uint32_t i = 0; i < n; i++)
			rows[i] = (struct engine_row){ &s, i, (i * 7 + 3) % T_VOCAB, i == n - 1 };
		for (uint32_t i = 0; !rc && i < n; i += chunk)
			rc = engine_forward(e, rows + i, n - i < chunk ? n - i : chunk, lg);
		engine_seq_release(e, &s);
	}
	engine_destroy(e);
	kvpool_destroy(pool);
	cpu->ops->destroy(cpu);
	model_free(m);
	return rc;
}

static int tiny_forward(const struct tiny_cfg *c, uint32_t n, float *lg)
{
	return tiny_forward_chunks(c, n, n, lg);
}

/* Llama 3's rope_freqs change the angles: the same weights without them give other logits. */
static void test_rope_freqs_logits(void **state)
{
	(void)state;
	struct tiny_cfg with = { .arch = "llama", .rope_freqs = 1 };
	struct tiny_cfg without = { .arch = "llama" };
	float a[T_VOCAB], b[T_VOCAB];
	int rc = tiny_forward(&with, 20, a);
	if (rc == -ENOTSUP)
		skip();
	assert_int_equal(rc, 0);
	assert_int_equal(tiny_forward(&without, 20, b), 0);
	assert_memory_not_equal(a, b, sizeof(a));
}

/*
 * Every architecture runs end to end where the backend computes all it
 * needs, and a row's logits are bit for bit the same whether its prompt
 * came as one batch or one token per step (past gemma2's window of 4).
 */
static void test_arch_forward(void **state)
{
	(void)state;
	static const struct gguf_add_kv g2kv[] = {
		{ "gemma2.attention.sliding_window", GGUF_VT_U32, NULL, 4, 0 },
	};
	const struct tiny_cfg cases[] = {
		{ .arch = "llama", .output = 1 },
		{ .arch = "llama", .head_dim = 24, .output = 1 },
		{ .arch = "qwen2", .biases = 1 },
		{ .arch = "phi3", .fused_qkv = 1, .fused_up = 1, .output = 1 },
		{ .arch = "gemma", .head_dim = 32 },
		{ .arch = "gemma2", .post_norms = 1, .kv = g2kv, .n_kv = 1 },
	};
	int ran = 0;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		float lg[T_VOCAB];
		int rc = tiny_forward(&cases[i], 12, lg);
		if (rc == -ENOTSUP) {
			printf("%s: not computed by the CPU backend yet\n", cases[i].arch);
			continue;
		}
		if (rc)
			fail_msg("case %zu (%s): forward %d", i, cases[i].arch, rc);
		for (int j = 0; j < T_VOCAB; j++)
			if (!isfinite(lg[j]))
				fail_msg("case %zu (%s): logit %d is %g", i, cases[i].arch, j, lg[j]);
		if (!strcmp(cases[i].arch, "gemma2"))
			for (int j = 0; j < T_VOCAB; j++)
				assert_true(fabsf(lg[j]) <= 30.0f);
		float one[T_VOCAB];
		assert_int_equal(tiny_forward_chunks(&cases[i], 12, 1, one), 0);
		if (memcmp(one, lg, sizeof(lg)))
			fail_msg("case %zu (%s): decoding token by token differs from one prefill",
				 i, cases[i].arch);
		ran++;
	}
	printf("%d of %zu architectures ran\n", ran, sizeof(cases) / sizeof(cases[0]));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batch_invariance),
		cmocka_unit_test(test_prefill_chunks),
		cmocka_unit_test(test_bad_batches),
		cmocka_unit_test(test_refused_files),
		cmocka_unit_test(test_refused_additions),
		cmocka_unit_test(test_arch_binds),
		cmocka_unit_test(test_arch_refusals),
		cmocka_unit_test(test_rope_scaling),
		cmocka_unit_test(test_backend_lacks),
		cmocka_unit_test(test_rope_freqs_logits),
		cmocka_unit_test(test_arch_forward),
		cmocka_unit_test(test_prefix_hit),
		cmocka_unit_test(test_generate),
		cmocka_unit_test(test_pool_full),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
