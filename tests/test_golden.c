/* test_golden.c — the engine against llama.cpp: KL divergence from its F32 reference, its logits and greedy tokens on the same GGUF. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/generate.h"
#include "daemon/engine/kvpool.h"
#include "daemon/engine/sampler.h"
#include "daemon/model/model.h"
#include "kernels/backend.h"
#include "tests/lib/kldref.h"
#include "tests/lib/logits.h"

#define MAX_PROMPTS 16
#define NTOP 64
#define NGEN 32
/*
 * A step where the reference's top two logits are closer than this is a
 * near-tie: 8-bit activation quantization amplifies one-ulp differences
 * (another exp() approximation, another summation order) at rounding
 * boundaries into logit changes of this order, so either pick is right.
 */
#define NEAR_TIE 5e-2f
/*
 * Teacher-forced, kvd's argmax follows llama.cpp's Q4_1 greedy token on
 * nearly every step: two Q4_1 engines each round activations to int8 in
 * their own order, so each carries its own realization of that noise (a
 * mean KLD of ~3e-3 from the F32 model; both Q4_1 engines miss the F32
 * top at ~3.4% of the positions of kld_ref.txt, at top-2 gaps up to ~0.12).
 * A miss is allowed where llama.cpp's own top two are within TF_MISS_GAP
 * (2.5 times that widest gap; two noisy engines compared with each other),
 * on at most TF_MAX_MISS of the steps; a real error misses wide gaps.
 */
#define TF_MISS_GAP 0.3f
#define TF_MAX_MISS 0.03
/*
 * The accuracy judgement (tests/golden/kld_ref.txt, gen_kld.py): kvd's
 * mean KL divergence from llama.cpp's F32 reference may exceed llama.cpp's
 * own Q4_1 figure on the same positions by 10%, its same-top-1 rate fall
 * short of llama.cpp's by one point. The reference backend computes the
 * reference's model without quantized dot products: its divergence is ~0.
 */
#define KLD_REF "tests/golden/kld_ref.txt"
#define KLD_SLACK 1.10
#define TOP1_SLACK 0.01
#define REF_MAX_KLD 1e-4
#define REF_CHUNKS 1	/* the reference backend is slow: one chunk judges ~0 */

struct golden {
	uint32_t n;
	uint32_t *ids;
	uint32_t top_id[NTOP];
	float top_logit[NTOP];
	uint32_t greedy[NGEN];
	float top2[NGEN][2];
};

static struct golden G[MAX_PROMPTS];
static struct kldref R;
static int n_golden;
static struct model *M;
static struct backend *B;
static struct engine *E;
static struct kvpool *P;

static const char *model_path(void)
{
	const char *p = getenv("KVD_MODEL");
	return p && *p ? p : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

static int expect_word(FILE *f, const char *w)
{
	char buf[32];
	return fscanf(f, "%31s", buf) == 1 && !strcmp(buf, w) ? 0 : -1;
}

static int load_golden(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	int c;
	while ((c = fgetc(f)) == '#')
		while ((c = fgetc(f)) != '\n' && c != EOF)
			;
	ungetc(c, f);
	int idx;
	uint32_t n;
	while (n_golden < MAX_PROMPTS && fscanf(f, " prompt %d %u", &idx, &n) == 2) {
		struct golden *g = &G[n_golden];
		g->n = n;
		g->ids = calloc(n, sizeof(uint32_t));
		for (uint32_t i = 0; i < n; i++)
			if (fscanf(f, "%u", &g->ids[i]) != 1)
				goto bad;
		if (expect_word(f, "top64"))
			goto bad;
		for (int i = 0; i < NTOP; i++)
			if (fscanf(f, " %u:%f", &g->top_id[i], &g->top_logit[i]) != 2)
				goto bad;
		if (expect_word(f, "greedy"))
			goto bad;
		for (int i = 0; i < NGEN; i++)
			if (fscanf(f, "%u", &g->greedy[i]) != 1)
				goto bad;
		if (expect_word(f, "top2"))
			goto bad;
		for (int i = 0; i < NGEN; i++)
			if (fscanf(f, " %f:%f", &g->top2[i][0], &g->top2[i][1]) != 2)
				goto bad;
		n_golden++;
	}
	fclose(f);
	return n_golden;
bad:
	fclose(f);
	return -1;
}

static int setup(void **state)
{
	(void)state;
	char err[256];
	if (load_golden("tests/golden/logits.txt") < 8) {
		fprintf(stderr, "tests/golden/logits.txt: missing or malformed\n");
		return -1;
	}
	int rc = model_load(&M, model_path(), err, sizeof(err));
	if (rc) {
		fprintf(stderr, "cannot load %s: %s (run `make model`)\n", model_path(), err);
		return -1;
	}
	if (kldref_load(&R, KLD_REF, M->hp.vocab)) {
		fprintf(stderr, "%s: missing or malformed\n", KLD_REF);
		return -1;
	}
	struct kvpool_config pc = { .n_blocks = 1024 / 16 * 2, .block_tokens = 16,
				    .n_layers = M->hp.n_layers, .kv_dim = M->hp.kv_dim,
				    .kv_type = KB_F16 };
	if (backend_cpu_create(&B, 0) || kvpool_create(&P, &pc) ||
	    engine_create(&E, M, B, P, 512))
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
	for (int i = 0; i < n_golden; i++)
		free(G[i].ids);
	kldref_free(&R);
	return 0;
}

/* Prefill ids into s in chunks of the engine's row limit; logits of the last row. */
static int prefill(struct engine_seq *s, const uint32_t *ids, uint32_t n, float *logits)
{
	return generate_prefill(E, s, ids, n, logits, NULL);
}

static void test_final_logits(void **state)
{
	(void)state;
	uint32_t vocab = M->hp.vocab;
	float *logits = malloc(vocab * sizeof(float));
	for (int p = 0; p < n_golden; p++) {
		struct golden *g = &G[p];
		struct engine_seq s;
		engine_seq_init(E, &s, 0);
		assert_int_equal(prefill(&s, g->ids, g->n, logits), 0);
		assert_int_equal(engine_seq_len(&s), g->n);
		float maxref = 0, maxd = 0;
		for (int i = 0; i < NTOP; i++) {
			maxref = fmaxf(maxref, fabsf(g->top_logit[i]));
			maxd = fmaxf(maxd, fabsf(logits[g->top_id[i]] - g->top_logit[i]));
		}
		uint32_t am = logits_argmax(logits, vocab);
		float gap = g->top_logit[0] - g->top_logit[1];
		printf("prompt %d (%u tokens): max|d| %.4f (%.2f%% of max|ref| %.2f), argmax %u ref %u\n",
		       p, g->n, maxd, 100 * maxd / maxref, maxref, am, g->top_id[0]);
		assert_true(maxd <= 5e-2f * maxref);
		if (gap > NEAR_TIE)
			assert_int_equal(am, g->top_id[0]);
		engine_seq_release(E, &s);
	}
	free(logits);
}

/* Follows the reference's greedy tokens; stops generation at the first that differs. */
struct follow {
	const uint32_t *want;
	int t;
	int first_diff;
};

static int follow_token(void *arg, uint32_t token, int eog)
{
	struct follow *f = arg;
	(void)eog;
	if (token != f->want[f->t]) {
		f->first_diff = f->t;
		return 1;
	}
	f->t++;
	return 0;
}

static void test_greedy(void **state)
{
	(void)state;
	struct sampler_params sp;
	struct sampler *smp;
	int same = 0, far = 0;
	/* A figure, not a judgement: one near-tie early on changes all that follows. */
	sampler_params_default(&sp);
	assert_int_equal(sampler_create(&smp, &sp, M->hp.vocab), 0);
	for (int p = 0; p < n_golden; p++) {
		struct golden *g = &G[p];
		struct engine_seq s;
		struct follow f = { .want = g->greedy, .first_diff = -1 };
		/* No end-of-generation stop: the reference ran NGEN tokens regardless. */
		struct generate_params gp = { .max_tokens = NGEN, .on_token = follow_token, .arg = &f };
		struct generate_result res;
		engine_seq_init(E, &s, 0);
		assert_int_equal(generate(E, smp, &s, g->ids, g->n, &gp, &res), 0);
		if (f.first_diff < 0) {
			assert_int_equal(res.n_out, NGEN);
			same++;
		} else {
			float gap = g->top2[f.first_diff][0] - g->top2[f.first_diff][1];
			printf("prompt %d: continuation differs at step %d (ref top-2 gap %.4f)\n", p,
			       f.first_diff, gap);
			far += gap > NEAR_TIE;
		}
		engine_seq_release(E, &s);
	}
	sampler_destroy(smp);
	printf("greedy continuations identical to llama.cpp Q4_1's: %d of %d (%d first differ at a "
	       "step that is no near-tie)\n", same, n_golden, far);
}

/*
 * Teacher-forced: feed the reference's own greedy tokens, so one early
 * divergence cannot cascade, and compare the argmax at every step.
 */
static void test_teacher_forced(void **state)
{
	(void)state;
	uint32_t vocab = M->hp.vocab;
	float *logits = malloc(vocab * sizeof(float));
	int agree = 0, total = 0, wide = 0;
	float worst_gap = 0;
	for (int p = 0; p < n_golden; p++) {
		struct golden *g = &G[p];
		struct engine_seq s;
		engine_seq_init(E, &s, 0);
		assert_int_equal(prefill(&s, g->ids, g->n, logits), 0);
		for (int t = 0; t < NGEN; t++) {
			uint32_t tok = logits_argmax(logits, vocab);
			total++;
			if (tok == g->greedy[t]) {
				agree++;
			} else {
				float gap = g->top2[t][0] - g->top2[t][1];
				worst_gap = gap > worst_gap ? gap : worst_gap;
				printf("prompt %d step %d: argmax %u, reference %u (ref top-2 gap %.4f)\n",
				       p, t, tok, g->greedy[t], gap);
				wide += gap > TF_MISS_GAP;
			}
			struct engine_row r = { &s, engine_seq_len(&s), g->greedy[t], 1 };
			assert_int_equal(engine_forward(E, &r, 1, logits), 0);
		}
		engine_seq_release(E, &s);
	}
	printf("teacher-forced argmax agreement: %d of %d steps (largest ref gap at a miss %.4f)\n",
	       agree, total, worst_gap);
	free(logits);
	if (total - agree > TF_MAX_MISS * total)
		fail_msg("teacher-forced: %d misses in %d steps (at most %.0f%%)", total - agree, total,
			 TF_MAX_MISS * 100);
	if (wide)
		fail_msg("teacher-forced: %d misses where llama.cpp's top two differ by more than %.2f",
			 wide, (double)TF_MISS_GAP);
}

/* The accuracy judgement: the default backend against llama.cpp's F32, no worse than llama.cpp's Q4_1. */
static void test_kld(void **state)
{
	(void)state;
	struct kldref_result r;
	assert_int_equal(kldref_run(&R, E, R.chunks, 2 * NEAR_TIE, &r), 0);
	printf("KLD against llama.cpp F32, %u positions (top-%u + rest): kvd %s %.6f, llama.cpp Q4_1 %.6f "
	       "(limit %.6f; its full-vocab figure %.6f)\n", r.n_kld, R.top, B->ops->name, r.mean_kld,
	       R.peer_kld, R.peer_kld * KLD_SLACK, R.peer_kld_full);
	printf("same top-1, %u positions: kvd %.2f%%, llama.cpp Q4_1 %.2f%% (limit %.2f%%)\n", r.n,
	       100 * r.same_top, 100 * R.peer_same_top, 100 * (R.peer_same_top - TOP1_SLACK));
	assert_int_equal(r.n, R.positions);
	assert_int_equal(r.n_kld, R.kld_positions);
	/* A lower bound of the full divergence, never below 0 but for rounding. */
	assert_true(r.mean_kld > -1e-6);
	assert_true(r.mean_kld <= R.peer_kld * KLD_SLACK);
	assert_true(r.same_top >= R.peer_same_top - TOP1_SLACK);
}

/*
 * The reference backend computes the reference's model (F32 math over the
 * same weights): its divergence from llama.cpp's F32 is rounding only. A
 * build without one says so and skips.
 */
static void test_kld_ref_backend(void **state)
{
	(void)state;
	enum kb_kind kind;
	struct backend *rb = NULL;
	struct kvpool *rp = NULL;
	struct engine *re = NULL;
	char why[1024] = "";
	int rc = backend_parse("ref", &kind);
	if (!rc)
		rc = backend_create(&rb, kind, 0, why, sizeof(why));
	if (rc == -EINVAL || rc == -ENOENT || rc == -ENOSYS) {
		print_message("SKIPPED: no ref backend in this build (%s)\n", *why ? why : strerror(-rc));
		skip();
	}
	assert_int_equal(rc, 0);
	struct kvpool_config pc = { .n_blocks = 2 * R.ctx / 16, .block_tokens = 16,
				    .n_layers = M->hp.n_layers, .kv_dim = M->hp.kv_dim, .kv_type = KB_F16 };
	rc = kvpool_create(&rp, &pc);
	if (!rc)
		rc = engine_create(&re, M, rb, rp, R.ctx);
	struct kldref_result r = { 0 };
	if (!rc)
		rc = kldref_run(&R, re, REF_CHUNKS, 2 * NEAR_TIE, &r);
	engine_destroy(re);
	kvpool_destroy(rp);
	rb->ops->destroy(rb);
	assert_int_equal(rc, 0);
	printf("KLD against llama.cpp F32, %u positions: %s backend %.3g (limit %.0e), same top-1 %.2f%%\n",
	       r.n_kld, "ref", r.mean_kld, REF_MAX_KLD, 100 * r.same_top);
	assert_true(fabs(r.mean_kld) <= REF_MAX_KLD);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_final_logits),
		cmocka_unit_test(test_greedy),
		cmocka_unit_test(test_teacher_forced),
		cmocka_unit_test(test_kld),
		cmocka_unit_test(test_kld_ref_backend),
	};
	/* KVD_TEST_FILTER=test_kld* runs only the tests matching the pattern. */
	const char *filter = getenv("KVD_TEST_FILTER");
	if (filter && *filter)
		cmocka_set_test_filter(filter);
	return cmocka_run_group_tests(tests, setup, teardown);
}
