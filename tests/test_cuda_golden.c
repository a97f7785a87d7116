/* test_cuda_golden.c — greedy decoding of the golden prompts on the CUDA backend against the CPU backend's (skipped without a device). */
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

#define MAX_PROMPTS 16
#define NGEN 32
#define MAX_ROWS 512
/* As tests/test_golden.c: closer top-two logits than this make either pick right. */
#define NEAR_TIE 5e-2f
#define MIN_AGREE 7

static struct model *M;
static uint32_t *prompt[MAX_PROMPTS], prompt_n[MAX_PROMPTS];
static int n_prompts;
static char why[256];

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

/* Prompt p greedily for NGEN tokens; gaps (NGEN,) = top-1 minus top-2 logit at each step. */
static void generate(struct side *s, int p, uint32_t *out, float *gaps)
{
	struct engine_seq seq;
	struct engine_row *rows = calloc(MAX_ROWS, sizeof(*rows));
	float *logits = gaps ? malloc(M->hp.vocab * sizeof(float)) : NULL;
	uint32_t n = prompt_n[p];
	assert_non_null(rows);
	engine_seq_init(s->e, &seq, 0);
	for (uint32_t c = 0; c < n; c += MAX_ROWS) {
		uint32_t m = n - c < MAX_ROWS ? n - c : MAX_ROWS;
		for (uint32_t i = 0; i < m; i++)
			rows[i] = (struct engine_row){ &seq, c + i, prompt[p][c + i], c + i == n - 1 };
		assert_int_equal(engine_forward(s->e, rows, m, logits), 0);
	}
	for (int t = 0; t < NGEN; t++) {
		assert_int_equal(engine_argmax(s->e, &out[t]), 0);
		if (gaps) {
			float a = -INFINITY, b = -INFINITY;
			for (uint32_t i = 0; i < M->hp.vocab; i++) {
				if (logits[i] > a) {
					b = a;
					a = logits[i];
				} else if (logits[i] > b) {
					b = logits[i];
				}
			}
			gaps[t] = a - b;
		}
		struct engine_row r = { &seq, n + (uint32_t)t, out[t], 1 };
		assert_int_equal(engine_forward(s->e, &r, 1, logits), 0);
	}
	engine_seq_release(s->e, &seq);
	free(rows);
	free(logits);
}

static void test_greedy_vs_cpu(void **state)
{
	(void)state;
	if (!M)
		fail_msg("cannot load %s (run `make model`)", model_path());
	if (!have_dev) {
		printf("skipped: no CUDA device (%s)\n", why);
		skip();
	}
	int agree = 0;
	for (int p = 0; p < n_prompts; p++) {
		uint32_t want[NGEN], got[NGEN];
		float gaps[NGEN];
		generate(&cpu, p, want, gaps);
		generate(&dev, p, got, NULL);
		int t = 0;
		while (t < NGEN && got[t] == want[t])
			t++;
		if (t == NGEN) {
			agree++;
			printf("prompt %d: %d tokens identical\n", p, NGEN);
		} else if (gaps[t] <= NEAR_TIE) {
			agree++;
			printf("prompt %d: differs at step %d, a near-tie (CPU top-2 gap %.4f)\n", p, t,
			       (double)gaps[t]);
		} else {
			printf("prompt %d: differs at step %d (%u vs CPU %u, CPU top-2 gap %.4f)\n", p, t,
			       got[t], want[t], (double)gaps[t]);
		}
	}
	printf("greedy agreement with the CPU backend: %d of %d prompts\n", agree, n_prompts);
	assert_true(agree * 8 >= MIN_AGREE * n_prompts);	/* at least 7 of every 8 */
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
	for (int i = 0; i < n_prompts; i++)
		free(prompt[i]);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy_vs_cpu),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
