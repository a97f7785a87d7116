/* test_engine.c — the forward pass on the real model: batch invariance, chunked prefill, batch validation, refused files. */
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batch_invariance),
		cmocka_unit_test(test_prefill_chunks),
		cmocka_unit_test(test_bad_batches),
		cmocka_unit_test(test_refused_files),
		cmocka_unit_test(test_refused_additions),
		cmocka_unit_test(test_prefix_hit),
		cmocka_unit_test(test_generate),
		cmocka_unit_test(test_pool_full),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
