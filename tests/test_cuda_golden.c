/* test_cuda_golden.c — the CUDA backend on the default model against the CPU backend: teacher-forced greedy steps of the golden prompts, and both against llama.cpp's F32 distributions (skipped without a device). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/kvpool.h"
#include "daemon/model/model.h"
#include "kernels/backend.h"
#include "tests/devsim.h"
#include "tests/lib/kldref.h"
#include "tests/lib/logits.h"

#define MAX_PROMPTS 16
#define NGEN 32
#define MAX_ROWS 512
/*
 * Teacher-forced: both backends are fed the CPU's greedy tokens, and at
 * each step the device's argmax must be the CPU's, except where the CPU's
 * own top two logits are within TF_MISS_GAP, on at most TF_MAX_MISS of the
 * steps. The rule of tests/test_golden.c for two engines that each carry
 * their own rounding noise: the CPU rounds activations to int8 for its dot
 * products, the CUDA kernels keep them in f32 (mat-vec) or f16 (GEMM), so
 * either may be the one nearer the F32 model at a close call; the KLD
 * test below judges which. A kernel that is wrong misses wide gaps.
 */
#define TF_MISS_GAP 0.3f
#define TF_MAX_MISS 0.03
/* Mean per-step divergence of the device's distribution from the CPU's: measured 4e-3 (max 0.017) on the host simulation. */
#define STEP_MAX_KLD 0.02
/* The accuracy judgement, as issue 34 sets it: the device's KLD from F32 within 1.1x the CPU's. */
#define KLD_REF "tests/golden/kld_ref.txt"
#define KLD_SLACK 1.10
#define TOP1_SLACK 0.01

static struct model *M;
static uint32_t *prompt[MAX_PROMPTS], prompt_n[MAX_PROMPTS];
static int n_prompts;
static struct kldref R;
static char why[256];
/*
 * The host simulation of the device (tests/cudasim) runs the kernels'
 * code thread by thread, about a second a decode step: there the suites
 * take the prompts up to 60 tokens for 8 steps each, and the KLD chunks
 * only; on a device, everything.
 */
static int quick;

struct side {
	struct backend *be;
	struct kvpool *pool;
	struct engine *e;
};

static struct side cpu, dev;
static int have_dev;

static const char *model_path(void)
{
	const char *p = getenv("KVD_MODEL");
	return p && *p ? p : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

/* The prompts of tests/golden/logits.txt (token ids after "prompt <i> <n>"). */
static int load_prompts(const char *path)
{
	FILE *f = fopen(path, "r");
	char word[64];
	if (!f)
		return -1;
	while (n_prompts < MAX_PROMPTS && fscanf(f, "%63s", word) == 1) {
		int idx;
		uint32_t n;
		if (strcmp(word, "prompt") || fscanf(f, "%d %u", &idx, &n) != 2 || n == 0 || n > 4096)
			continue;
		prompt[n_prompts] = malloc(n * sizeof(uint32_t));
		for (uint32_t i = 0; i < n; i++)
			if (fscanf(f, "%u", &prompt[n_prompts][i]) != 1)
				goto bad;
		prompt_n[n_prompts++] = n;
	}
	fclose(f);
	return n_prompts;
bad:
	fclose(f);
	return -1;
}

static int side_open(struct side *s, struct backend *be)
{
	struct kvpool_config pc = { .n_blocks = 256, .block_tokens = 16,
				    .n_layers = M->hp.n_layers, .kv_dim = M->hp.kv_dim,
				    .kv_type = KB_F16 };
	s->be = be;
	int rc = kvpool_create_on(&s->pool, &pc, be);
	if (!rc)
		rc = engine_create(&s->e, M, be, s->pool, MAX_ROWS);
	return rc;
}

static void side_close(struct side *s)
{
	engine_destroy(s->e);
	kvpool_destroy(s->pool);
	if (s->be)
		s->be->ops->destroy(s->be);
}

/* Top-1 minus top-2 of l (n,). */
static float top2_gap(const float *l, uint32_t n)
{
	float a = -INFINITY, b = -INFINITY;
	for (uint32_t i = 0; i < n; i++) {
		if (l[i] > a) {
			b = a;
			a = l[i];
		} else if (l[i] > b) {
			b = l[i];
		}
	}
	return a - b;
}

/* KL(p || q) of two logits rows, each through log-softmax in double; lp, lq (n,) scratch. */
static double kld_rows(const float *p, const float *q, uint32_t n, double *lp, double *lq)
{
	logits_log_softmax(lp, p, n);
	logits_log_softmax(lq, q, n);
	double k = 0;
	for (uint32_t i = 0; i < n; i++)
		k += exp(lp[i]) * (lp[i] - lq[i]);
	return k;
}

/* Prompt p on one side: prefill in chunks of MAX_ROWS, the last row's logits into l. */
static void prefill(struct side *s, struct engine_seq *seq, int p, struct engine_row *rows,
		    float *l)
{
	uint32_t n = prompt_n[p];
	for (uint32_t c = 0; c < n; c += MAX_ROWS) {
		uint32_t m = n - c < MAX_ROWS ? n - c : MAX_ROWS;
		for (uint32_t i = 0; i < m; i++)
			rows[i] = (struct engine_row){ seq, c + i, prompt[p][c + i], c + i == n - 1 };
		assert_int_equal(engine_forward(s->e, rows, m, l), 0);
	}
}

struct tf_count {
	uint32_t steps, misses, wide;
	double kld_sum, kld_max;
};

/* Prompt p teacher-forced for ngen steps on both sides; 1 when every step agrees or misses at a close call. */
static int teacher_forced(int p, int ngen, struct tf_count *tc)
{
	const uint32_t vocab = M->hp.vocab;
	struct engine_seq sc, sd;
	struct engine_row *rows = calloc(MAX_ROWS, sizeof(*rows));
	float *lc = malloc(vocab * sizeof(float)), *ld = malloc(vocab * sizeof(float));
	double *a = malloc(vocab * sizeof(double)), *b = malloc(vocab * sizeof(double));
	assert_true(rows && lc && ld && a && b);
	engine_seq_init(cpu.e, &sc, 0);
	engine_seq_init(dev.e, &sd, 0);
	prefill(&cpu, &sc, p, rows, lc);
	prefill(&dev, &sd, p, rows, ld);
	int clean = 1;
	for (int t = 0; t < ngen; t++) {
		uint32_t want = logits_argmax(lc, vocab), got = logits_argmax(ld, vocab);
		double k = kld_rows(lc, ld, vocab, a, b);
		tc->steps++;
		tc->kld_sum += k;
		tc->kld_max = k > tc->kld_max ? k : tc->kld_max;
		if (got != want) {
			float gap = top2_gap(lc, vocab);
			tc->misses++;
			if (gap > TF_MISS_GAP) {
				tc->wide++;
				clean = 0;
			}
			printf("prompt %d step %d: device %u, CPU %u (CPU top-2 gap %.4f%s), KLD %.2g\n", p,
			       t, got, want, (double)gap, gap > TF_MISS_GAP ? ", not a close call" : "", k);
		}
		uint32_t pos = prompt_n[p] + (uint32_t)t;
		struct engine_row rc = { &sc, pos, want, 1 }, rd = { &sd, pos, want, 1 };
		assert_int_equal(engine_forward(cpu.e, &rc, 1, lc), 0);
		assert_int_equal(engine_forward(dev.e, &rd, 1, ld), 0);
	}
	engine_seq_release(cpu.e, &sc);
	engine_seq_release(dev.e, &sd);
	free(rows);
	free(lc);
	free(ld);
	free(a);
	free(b);
	return clean;
}

static void need_dev(void)
{
	if (!M)
		fail_msg("cannot load %s (run `make model`)", model_path());
	if (!have_dev) {
		printf("skipped: no CUDA device (%s)\n", why);
		skip();
	}
}

static void test_greedy_vs_cpu(void **state)
{
	(void)state;
	need_dev();
	struct tf_count tc = { 0 };
	int clean = 0, run = 0, ngen = quick ? 8 : NGEN;
	for (int p = 0; p < n_prompts; p++) {
		if (quick && prompt_n[p] > 60)
			continue;
		run++;
		clean += teacher_forced(p, ngen, &tc);
	}
	printf("teacher-forced along the CPU's greedy tokens, %d prompts x %d steps: %d prompts agree "
	       "at every step but close calls (CPU top-2 gap <= %.1f); %u of %u steps differ (%u at a "
	       "wider gap); KLD from the CPU's distribution mean %.3g, max %.3g per step\n", run, ngen,
	       clean, (double)TF_MISS_GAP, tc.misses, tc.steps, tc.wide, tc.kld_sum / tc.steps,
	       tc.kld_max);
	assert_int_equal(tc.wide, 0);
	assert_true(tc.misses <= (uint32_t)(TF_MAX_MISS * tc.steps) + 1);
	assert_true(tc.kld_sum / tc.steps <= STEP_MAX_KLD);
}

/* Both backends against llama.cpp's F32 on the same positions: the device no further from it than 1.1x the CPU. */
static void test_kld_vs_cpu(void **state)
{
	(void)state;
	need_dev();
	uint32_t chunks = quick ? R.kld_chunks : R.chunks;
	struct kldref_result rc, rd;
	assert_int_equal(kldref_run(&R, cpu.e, chunks, 0.1f, &rc), 0);
	assert_int_equal(kldref_run(&R, dev.e, chunks, 0.1f, &rd), 0);
	printf("KLD against llama.cpp F32, %u positions (top-%u + rest): %s %.6f, cpu %.6f "
	       "(limit %.6f), llama.cpp Q4_1 %.6f\n", rd.n_kld, R.top, dev.be->ops->name, rd.mean_kld,
	       rc.mean_kld, rc.mean_kld * KLD_SLACK, R.peer_kld);
	printf("same top-1, %u positions: %s %.2f%%, cpu %.2f%% (limit %.2f%%)\n", rd.n,
	       dev.be->ops->name, 100 * rd.same_top, 100 * rc.same_top,
	       100 * (rc.same_top - TOP1_SLACK));
	assert_int_equal(rd.n_kld, R.kld_positions);
	assert_true(rd.mean_kld > -1e-6);
	assert_true(rd.mean_kld <= rc.mean_kld * KLD_SLACK);
	assert_true(rd.same_top >= rc.same_top - TOP1_SLACK);
}

static int setup(void **state)
{
	(void)state;
	char err[256];
	if (load_prompts("tests/golden/logits.txt") < 8) {
		fprintf(stderr, "tests/golden/logits.txt: missing or malformed\n");
		return -1;
	}
	if (model_load(&M, model_path(), err, sizeof(err))) {
		M = NULL;
		return 0;
	}
	if (kldref_load(&R, KLD_REF, M->hp.vocab)) {
		fprintf(stderr, "%s: missing or malformed\n", KLD_REF);
		return -1;
	}
	struct backend *c, *g = NULL;
	if (backend_cpu_create(&c, 0) || side_open(&cpu, c))
		return -1;
	const char *sim = getenv("KVD_TEST_DEVSIM");
	int rc = sim && !strcmp(sim, "1") ? devsim_create(&g, 0)
					  : backend_cuda_create(&g, 0, why, sizeof(why));
	if (!rc) {
		rc = side_open(&dev, g);
		if (rc) {
			snprintf(why, sizeof(why), "cannot set up the engine on the device: %s",
				 strerror(-rc));
			return -1;
		}
		have_dev = 1;
		quick = strstr(why, "cudasim") != NULL;
		printf("device: %s%s\n", why, quick ? " (fewer prompts, steps and chunks)" : "");
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (have_dev)
		side_close(&dev);
	if (cpu.e)
		side_close(&cpu);
	model_free(M);
	kldref_free(&R);
	for (int i = 0; i < n_prompts; i++)
		free(prompt[i]);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy_vs_cpu),
		cmocka_unit_test(test_kld_vs_cpu),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
