/* test_sampler.c — sampler: greedy ties, seeding, softmax frequencies, top-k/p, min-p, penalties, params, log-probabilities. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "daemon/engine/sampler.h"

#define BIG_VOCAB 49152u

static struct sampler *make(const struct sampler_params *p, uint32_t vocab)
{
	struct sampler *s = NULL;

	assert_int_equal(sampler_create(&s, p, vocab), 0);
	assert_non_null(s);
	return s;
}

static struct sampler_params params_t(float temperature, uint64_t seed)
{
	struct sampler_params p;

	sampler_params_default(&p);
	p.temperature = temperature;
	p.seed = seed;
	return p;
}

/* Deterministic test logits, roughly N(0, 3) like a real model's row. */
static void fill_logits(float *l, uint32_t n, uint64_t seed)
{
	uint64_t x = seed * 2654435761u + 1;
	uint32_t i;

	for (i = 0; i < n; i++) {
		double a, b;

		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		a = ((x >> 11) + 0.5) * 0x1.0p-53;
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		b = ((x >> 11) + 0.5) * 0x1.0p-53;
		l[i] = (float)(3.0 * sqrt(-2.0 * log(a)) * cos(2.0 * M_PI * b));
	}
}

/* Draw n tokens from a fresh copy of logits each time, counting them. */
static void draw_counts(struct sampler *s, const float *logits, uint32_t vocab,
			unsigned n, unsigned *counts)
{
	float *row = malloc(vocab * sizeof(*row));
	unsigned i;

	assert_non_null(row);
	memset(counts, 0, vocab * sizeof(*counts));
	for (i = 0; i < n; i++) {
		uint32_t t;

		memcpy(row, logits, vocab * sizeof(*row));
		t = sampler_sample(s, row, NULL, 0);
		assert_true(t < vocab);
		counts[t]++;
	}
	free(row);
}

static int cmp_desc_id(const void *a, const void *b, void *arg)
{
	const float *l = arg;
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	if (l[x] != l[y])
		return l[x] > l[y] ? -1 : 1;
	return x < y ? -1 : x > y;
}

/* ids (vocab,) sorted by logit descending, lowest id first among equals. */
static uint32_t *sorted_ids(const float *l, uint32_t vocab)
{
	uint32_t *ids = malloc(vocab * sizeof(*ids)), i;

	assert_non_null(ids);
	for (i = 0; i < vocab; i++)
		ids[i] = i;
	qsort_r(ids, vocab, sizeof(*ids), cmp_desc_id, (void *)l);
	return ids;
}

static void test_greedy_argmax_and_ties(void **state)
{
	struct sampler_params p = params_t(0.0f, 1);
	struct sampler *s = make(&p, 8);
	float a[8] = { 0.1f, -3.0f, 2.5f, 2.4f, NAN, -INFINITY, 1.0f, 0.0f };
	float b[8] = { 1.0f, 7.0f, 3.0f, 7.0f, 7.0f, 0.0f, -1.0f, 6.9f };
	float c[8] = { -2.0f, -2.0f, -2.0f, -2.0f, -2.0f, -2.0f, -2.0f, -2.0f };
	int i;

	(void)state;
	for (i = 0; i < 3; i++) {	/* repeatable, no hidden state */
		assert_int_equal(sampler_sample(s, a, NULL, 0), 2);
		assert_int_equal(sampler_sample(s, b, NULL, 0), 1);
		assert_int_equal(sampler_sample(s, c, NULL, 0), 0);
	}
	sampler_destroy(s);
}

/* The greedy pick as a plain scan: the first strict improvement on -inf, 0 if none. */
static uint32_t scan_argmax(const float *l, uint32_t n)
{
	uint32_t best = 0, i;
	float m = -INFINITY;

	for (i = 0; i < n; i++)
		if (l[i] > m) {
			m = l[i];
			best = i;
		}
	return best;
}

/*
 * Greedy over widths around the sampler's block of sixteen and a real
 * vocabulary: the maximum planted twice, in the tail, at id 0, NaNs (never
 * win), all NaN or -inf (id 0), zeros of both signs; each as the scan picks.
 */
static void test_greedy_argmax_wide(void **state)
{
	static const uint32_t widths[] = { 1, 15, 16, 17, 33, 1000, BIG_VOCAB };
	struct sampler_params p = params_t(0.0f, 1);
	float *l = malloc(BIG_VOCAB * sizeof(*l));
	unsigned w, k;
	uint32_t i;

	(void)state;
	assert_non_null(l);
	for (w = 0; w < sizeof(widths) / sizeof(widths[0]); w++) {
		const uint32_t n = widths[w];
		struct sampler *s = make(&p, n);

		for (k = 0; k < 8; k++) {
			uint32_t a = (k * 7919u + 13) % n, b = (k * 104729u + 5) % n;

			fill_logits(l, n, 100 + k + w);
			switch (k) {
			case 0:
				l[a] = l[b] = 50.0f;
				break;
			case 1:
				l[n - 1] = 60.0f;
				break;
			case 2:
				l[0] = 70.0f;
				l[a] = NAN;
				break;
			case 3:
				l[a] = NAN;
				l[b] = 80.0f;
				l[0] = NAN;
				break;
			case 4:
				for (i = 0; i < n; i++)
					l[i] = NAN;
				break;
			case 5:
				for (i = 0; i < n; i++)
					l[i] = i % 2 ? -INFINITY : NAN;
				break;
			case 6:
				for (i = 0; i < n; i++)
					l[i] = -1.0f - fabsf(l[i]);
				l[a] = -0.0f;
				l[b] = 0.0f;
				break;
			default:
				for (i = 0; i < n; i++)
					l[i] = 3.0f;
				break;
			}
			uint32_t want = scan_argmax(l, n);
			assert_int_equal(sampler_sample(s, l, NULL, 0), want);
		}
		sampler_destroy(s);
	}
	free(l);
}

static void draw_sequence(uint64_t seed, uint32_t top_k, float top_p, uint32_t *out,
			  unsigned n)
{
	struct sampler_params p = params_t(1.0f, seed);
	float *logits = malloc(BIG_VOCAB * sizeof(*logits));
	float *row = malloc(BIG_VOCAB * sizeof(*row));
	struct sampler *s;
	unsigned i;

	assert_non_null(logits);
	assert_non_null(row);
	p.top_k = top_k;
	p.top_p = top_p;
	s = make(&p, BIG_VOCAB);
	fill_logits(logits, BIG_VOCAB, 7);
	for (i = 0; i < n; i++) {
		memcpy(row, logits, BIG_VOCAB * sizeof(*row));
		out[i] = sampler_sample(s, row, NULL, 0);
	}
	sampler_destroy(s);
	free(row);
	free(logits);
}

static void test_seed_reproducible(void **state)
{
	enum { N = 1000 };
	static uint32_t a[N], b[N], c[N];
	struct { uint32_t k; float p; } cfg[] = { { 0, 1.0f }, { 40, 1.0f }, { 0, 0.9f },
						  { 100, 0.95f } };
	unsigned i, j, same;

	(void)state;
	for (j = 0; j < sizeof(cfg) / sizeof(cfg[0]); j++) {
		draw_sequence(12345, cfg[j].k, cfg[j].p, a, N);
		draw_sequence(12345, cfg[j].k, cfg[j].p, b, N);
		draw_sequence(12346, cfg[j].k, cfg[j].p, c, N);
		assert_memory_equal(a, b, sizeof(a));
		for (i = 0, same = 0; i < N; i++)
			same += a[i] == c[i];
		/* independent streams rarely agree; a shared stream would agree always */
		assert_true(same < N / 2);
	}
}

static void test_top_k1_is_greedy(void **state)
{
	struct sampler_params p = params_t(1.5f, 99);
	float *l = malloc(BIG_VOCAB * sizeof(*l));
	struct sampler *s;
	float ties[4] = { 1.0f, 5.0f, 5.0f, 5.0f };
	unsigned i;

	(void)state;
	assert_non_null(l);
	p.top_k = 1;
	s = make(&p, BIG_VOCAB);
	for (i = 0; i < 50; i++) {
		uint32_t want, j;

		fill_logits(l, BIG_VOCAB, 100 + i);
		for (want = 0, j = 1; j < BIG_VOCAB; j++)
			if (l[j] > l[want])
				want = j;
		assert_int_equal(sampler_sample(s, l, NULL, 0), want);
	}
	sampler_destroy(s);

	p.top_k = 1;
	s = make(&p, 4);
	for (i = 0; i < 100; i++)
		assert_int_equal(sampler_sample(s, ties, NULL, 0), 1);
	sampler_destroy(s);
	free(l);
}

/* Pearson chi-square of counts against probabilities q (n,). */
static double chi_square(const unsigned *counts, const double *q, unsigned n, unsigned draws)
{
	double chi = 0.0;
	unsigned i;

	for (i = 0; i < n; i++) {
		double e = q[i] * draws, d = counts[i] - e;

		chi += d * d / e;
	}
	return chi;
}

static void softmax(const float *l, double t, double *q, unsigned n)
{
	double m = -INFINITY, z = 0.0;
	unsigned i;

	for (i = 0; i < n; i++)
		m = l[i] > m ? l[i] : m;
	for (i = 0; i < n; i++)
		z += q[i] = exp((l[i] - m) / t);
	for (i = 0; i < n; i++)
		q[i] /= z;
}

static void test_frequencies_match_softmax(void **state)
{
	enum { V = 8, DRAWS = 20000 };
	const float logits[V] = { 1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f, 2.2f, -0.3f };
	const float temps[] = { 1.0f, 0.6f, 2.0f };
	unsigned counts[V], i, j;
	double q[V];

	(void)state;
	for (j = 0; j < sizeof(temps) / sizeof(temps[0]); j++) {
		struct sampler_params p = params_t(temps[j], 2024 + j);
		struct sampler *s = make(&p, V);
		double chi;

		draw_counts(s, logits, V, DRAWS, counts);
		softmax(logits, temps[j], q, V);
		chi = chi_square(counts, q, V, DRAWS);
		/* 7 degrees of freedom: P(chi2 > 24.32) = 0.001 */
		if (chi >= 24.32) {
			for (i = 0; i < V; i++)
				print_message("t=%.1f id %u: %u vs %.1f\n", temps[j], i, counts[i],
					      q[i] * DRAWS);
		}
		assert_true(chi < 24.32);
		sampler_destroy(s);
	}
}

static void test_top_p_keeps_nucleus(void **state)
{
	enum { V = 6, DRAWS = 20000 };
	/* probs 0.4 0.3 0.15 0.1 0.05 0: top-p 0.8 keeps ids 0..2 (0.85) */
	const float logits[V] = { logf(0.4f), logf(0.3f), logf(0.15f), logf(0.1f), logf(0.05f),
				  -INFINITY };
	struct sampler_params p = params_t(1.0f, 5);
	float *big = malloc(BIG_VOCAB * sizeof(*big));
	unsigned *bc = malloc(BIG_VOCAB * sizeof(*bc));
	unsigned counts[V], i, k;
	const float tops[] = { 0.3f, 0.9f, 0.99f };
	struct sampler *s;
	double q[3] = { 0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85 };

	(void)state;
	assert_non_null(big);
	assert_non_null(bc);
	p.top_p = 0.8f;
	s = make(&p, V);
	draw_counts(s, logits, V, DRAWS, counts);
	assert_int_equal(counts[3] + counts[4] + counts[5], 0);
	/* inside the nucleus, renormalised softmax; 2 dof: P(chi2 > 13.8) = 0.001 */
	assert_true(chi_square(counts, q, 3, DRAWS) < 13.8);
	sampler_destroy(s);

	/* One token already covers the mass: always it. */
	p.top_p = 0.3f;
	s = make(&p, V);
	draw_counts(s, logits, V, 200, counts);
	assert_int_equal(counts[0], 200);
	sampler_destroy(s);

	/*
	 * Full vocab against a reference nucleus from a full sort. Row 0 has a
	 * few strong tokens and a long Gaussian tail; in row 3 the nucleus is
	 * 20 near-equal tokens, several per top-p bucket, each with ~5% of the
	 * mass, so each one must show up too.
	 */
	for (k = 0; k < 4; k++) {
		uint32_t *ids, n;
		double z = 0.0, cum = 0.0, m;
		float top = k < 3 ? tops[k] : 0.8f;
		unsigned inside = 0, missing = 0;

		fill_logits(big, BIG_VOCAB, 3);
		for (i = 0; i < BIG_VOCAB; i++)
			big[i] *= k < 3 ? 1.0f : 0.1f;
		for (i = 0; i < (k < 3 ? 50u : 20u); i++)
			big[i * 97] = k < 3 ? big[i * 97] + 9.0f : 12.0f - 0.01f * i;
		ids = sorted_ids(big, BIG_VOCAB);
		m = big[ids[0]];
		for (i = 0; i < BIG_VOCAB; i++)
			z += exp(big[i] - m);
		for (n = 0; n < BIG_VOCAB && cum < top * z; n++)
			cum += exp(big[ids[n]] - m);
		p.top_p = top;
		s = make(&p, BIG_VOCAB);
		draw_counts(s, big, BIG_VOCAB, 3000, bc);
		for (i = 0; i < n; i++) {
			inside += bc[ids[i]];
			missing += bc[ids[i]] == 0;
		}
		assert_int_equal(inside, 3000);
		if (k == 3) {
			assert_true(n > 3 && n < 20);
			assert_int_equal(missing, 0);
		}
		sampler_destroy(s);
		free(ids);
	}
	free(bc);
	free(big);
}

static void test_min_p_keeps_above_threshold(void **state)
{
	enum { V = 6, DRAWS = 20000 };
	/* probs 0.5 0.2 0.1 0.09 0.06 0.05: min-p 0.2 keeps p >= 0.1, ids 0..2 */
	const float logits[V] = { logf(0.5f), logf(0.2f), logf(0.1f), logf(0.09f), logf(0.06f),
				  logf(0.05f) };
	struct sampler_params p = params_t(1.0f, 8);
	float *big = malloc(BIG_VOCAB * sizeof(*big));
	unsigned *bc = malloc(BIG_VOCAB * sizeof(*bc));
	unsigned counts[V], i, inside;
	double q[3] = { 0.5 / 0.8, 0.2 / 0.8, 0.1 / 0.8 };
	struct sampler *s;
	uint32_t *ids, n;

	(void)state;
	assert_non_null(big);
	assert_non_null(bc);
	p.min_p = 0.19f;
	s = make(&p, V);
	draw_counts(s, logits, V, DRAWS, counts);
	assert_int_equal(counts[3] + counts[4] + counts[5], 0);
	assert_true(chi_square(counts, q, 3, DRAWS) < 13.8);
	sampler_destroy(s);

	/* min-p after top-p: the intersection, here min-p's tighter set. */
	p.top_p = 0.95f;
	s = make(&p, V);
	draw_counts(s, logits, V, 2000, counts);
	assert_int_equal(counts[3] + counts[4] + counts[5], 0);
	assert_true(counts[2] > 0);
	sampler_destroy(s);

	/* Full vocab at temperature 0.8: kept iff exp((l - max) / 0.8) >= 0.05. */
	fill_logits(big, BIG_VOCAB, 11);
	ids = sorted_ids(big, BIG_VOCAB);
	for (n = 0; n < BIG_VOCAB; n++)
		if (exp((big[ids[n]] - big[ids[0]]) / 0.8) < 0.05)
			break;
	p = params_t(0.8f, 9);
	p.min_p = 0.05f;
	s = make(&p, BIG_VOCAB);
	draw_counts(s, big, BIG_VOCAB, 3000, bc);
	for (i = 0, inside = 0; i < n; i++)
		inside += bc[ids[i]];
	assert_int_equal(inside, 3000);
	sampler_destroy(s);
	free(ids);
	free(bc);
	free(big);
}

static void test_top_k_keeps_k_best(void **state)
{
	struct sampler_params p = params_t(3.0f, 77);
	float *big = malloc(BIG_VOCAB * sizeof(*big));
	unsigned *bc = malloc(BIG_VOCAB * sizeof(*bc));
	uint32_t *ids, i, seen = 0, inside = 0;
	struct sampler *s;

	(void)state;
	assert_non_null(big);
	assert_non_null(bc);
	fill_logits(big, BIG_VOCAB, 21);
	ids = sorted_ids(big, BIG_VOCAB);
	p.top_k = 20;
	s = make(&p, BIG_VOCAB);
	draw_counts(s, big, BIG_VOCAB, 4000, bc);
	for (i = 0; i < 20; i++) {
		inside += bc[ids[i]];
		seen += bc[ids[i]] > 0;
	}
	assert_int_equal(inside, 4000);
	assert_int_equal(seen, 20);	/* at t=3 the 20 best are close to uniform */
	sampler_destroy(s);
	free(ids);
	free(bc);
	free(big);
}

static void test_repeat_penalty(void **state)
{
	struct sampler_params p = params_t(0.0f, 1);
	struct sampler *s;
	float l[4];
	const uint32_t hist[] = { 3, 0, 0, 0 };
	const uint32_t far[] = { 0, 2, 2, 2, 70000 };	/* out-of-range id is ignored */

	(void)state;
	p.repeat_penalty = 1.2f;
	p.repeat_last_n = 64;
	s = make(&p, 4);

	/* 2.0 / 1.2 = 1.67 < 1.9: the repeated token loses. */
	memcpy(l, (float[4]){ 2.0f, 1.9f, -1.0f, -4.0f }, sizeof(l));
	assert_int_equal(sampler_sample(s, l, NULL, 0), 0);
	memcpy(l, (float[4]){ 2.0f, 1.9f, -1.0f, -4.0f }, sizeof(l));
	assert_int_equal(sampler_sample(s, l, hist, 4), 1);
	assert_float_equal(l[0], 2.0f / 1.2f, 1e-6);
	assert_float_equal(l[3], -4.0f * 1.2f, 1e-6);	/* negative: multiplied */
	assert_float_equal(l[2], -1.0f, 0);

	/* Once per distinct token: 2.0 / 1.2 still beats 1.5; 2.0 / 1.2^3 would not. */
	memcpy(l, (float[4]){ 2.0f, 1.5f, -1.0f, -4.0f }, sizeof(l));
	assert_int_equal(sampler_sample(s, l, hist, 4), 0);
	sampler_destroy(s);

	/* Only the last repeat_last_n tokens count. */
	p.repeat_penalty = 2.0f;
	p.repeat_last_n = 4;
	s = make(&p, 4);
	memcpy(l, (float[4]){ 2.0f, 1.9f, 1.8f, 0.0f }, sizeof(l));
	assert_int_equal(sampler_sample(s, l, far, 5), 0);
	assert_float_equal(l[2], 0.9f, 1e-6);
	sampler_destroy(s);

	/* Penalty 1 is off. */
	p.repeat_penalty = 1.0f;
	s = make(&p, 4);
	memcpy(l, (float[4]){ 2.0f, 1.9f, -1.0f, -4.0f }, sizeof(l));
	assert_int_equal(sampler_sample(s, l, hist, 4), 0);
	sampler_destroy(s);
}

static void test_invalid_params(void **state)
{
	struct sampler_params p;
	struct sampler *s = (struct sampler *)&p;	/* must be cleared on failure */
	int i;

	(void)state;
	for (i = 0; i < 12; i++) {
		sampler_params_default(&p);
		switch (i) {
		case 0: p.temperature = NAN; break;
		case 1: p.temperature = -0.5f; break;
		case 2: p.temperature = INFINITY; break;
		case 3: p.top_p = 1.5f; break;
		case 4: p.top_p = NAN; break;
		case 5: p.top_p = -0.1f; break;
		case 6: p.min_p = -0.1f; break;
		case 7: p.min_p = 1.01f; break;
		case 8: p.min_p = NAN; break;
		case 9: p.repeat_penalty = NAN; break;
		case 10: p.repeat_penalty = -1.0f; break;
		case 11: p.repeat_penalty = INFINITY; break;
		}
		assert_int_equal(sampler_create(&s, &p, 100), -EINVAL);
		assert_null(s);
	}
	sampler_params_default(&p);
	assert_int_equal(sampler_create(&s, &p, 0), -EINVAL);
	assert_int_equal(sampler_create(&s, NULL, 10), -EINVAL);

	/* The edges of each range are accepted. */
	p.temperature = 0.0f;
	p.top_p = 0.0f;
	p.min_p = 1.0f;
	p.repeat_penalty = 0.0f;
	p.top_k = 1000000;
	assert_int_equal(sampler_create(&s, &p, 10), 0);
	sampler_destroy(s);
	sampler_destroy(NULL);
}

/* Degenerate rows must still give a valid token. */
static void test_degenerate_rows(void **state)
{
	struct sampler_params p = params_t(1.0f, 4);
	float l[5];
	struct sampler *s;
	int i;

	(void)state;
	p.top_p = 0.5f;
	p.top_k = 3;
	s = make(&p, 5);
	for (i = 0; i < 20; i++) {
		memcpy(l, (float[5]){ -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY },
		       sizeof(l));
		assert_true(sampler_sample(s, l, NULL, 0) < 5);
		memcpy(l, (float[5]){ NAN, 1.0f, NAN, 3.0f, NAN }, sizeof(l));
		/* NaN never wins or counts; p(3) = 0.88 alone covers top-p 0.5 */
		assert_int_equal(sampler_sample(s, l, NULL, 0), 3);
		memcpy(l, (float[5]){ 0.0f, INFINITY, 1.0f, INFINITY, 2.0f }, sizeof(l));
		assert_int_equal(sampler_sample(s, l, NULL, 0), 1);
	}
	sampler_destroy(s);

	p = params_t(1e-38f, 4);	/* 1 / t overflows: behaves as greedy */
	s = make(&p, 5);
	memcpy(l, (float[5]){ 0.0f, 3.0f, 1.0f, 3.0f, 2.0f }, sizeof(l));
	assert_int_equal(sampler_sample(s, l, NULL, 0), 1);
	sampler_destroy(s);
}


/* ---- log-probabilities ---- */

/* The log-softmax of l in double, the reference. */
static double ref_norm(const float *l, uint32_t n)
{
	double m = -INFINITY, sum = 0.0;

	for (uint32_t i = 0; i < n; i++)
		m = l[i] > m ? l[i] : m;
	for (uint32_t i = 0; i < n; i++)
		sum += exp((double)l[i] - m);
	return m + log(sum);
}

/* The k best are the k largest, in order, ties by id, their values log-softmax; a pure function of the row. */
static void test_log_softmax_top(void **state)
{
	(void)state;
	uint32_t n = BIG_VOCAB;
	float *l = malloc(n * sizeof(*l));
	struct sampler_logprob top[SAMPLER_MAX_TOP], again[SAMPLER_MAX_TOP];

	assert_non_null(l);
	fill_logits(l, n, 7);
	l[100] = l[200] = 40.0f;	/* a tie at the top: the lower id first */
	double norm = sampler_log_softmax_top(l, n, SAMPLER_MAX_TOP, top);
	assert_true(fabs(norm - ref_norm(l, n)) < 1e-9);
	assert_int_equal(top[0].id, 100);
	assert_int_equal(top[1].id, 200);
	for (uint32_t j = 0; j < SAMPLER_MAX_TOP; j++) {
		assert_true(fabs(top[j].logprob - ((double)l[top[j].id] - norm)) < 1e-6);
		if (j)
			assert_true(top[j].logprob <= top[j - 1].logprob);
	}
	/* Nothing outside the top is larger than its last. */
	uint32_t above = 0;
	for (uint32_t i = 0; i < n; i++)
		above += l[i] > l[top[SAMPLER_MAX_TOP - 1].id];
	assert_true(above < SAMPLER_MAX_TOP);
	assert_true(sampler_log_softmax_top(l, n, SAMPLER_MAX_TOP, again) == norm);
	assert_memory_equal(top, again, sizeof(top));
	free(l);
}

/*
 * A pick's log-probabilities come from the row as passed in, before the
 * penalties: a penalised, sampled token keeps its raw value.
 */
static void test_logprobs_raw(void **state)
{
	(void)state;
	const uint32_t n = 64;
	float l[64], raw[64];
	struct sampler_params p = params_t(0.0f, 1);

	p.logprobs = 1;
	p.top_logprobs = 3;
	p.repeat_penalty = 1.5f;
	struct sampler *s = make(&p, n);
	const struct sampler_logprob *lp;

	assert_int_equal(sampler_logprobs(s, &lp), 0);
	fill_logits(raw, n, 3);
	raw[5] = 9.0f;
	raw[6] = 8.0f;
	memcpy(l, raw, sizeof(l));
	uint32_t hist[] = { 5 };	/* 9 / 1.5 = 6 < 8: the penalty makes 6 the pick */
	uint32_t tok = sampler_sample(s, l, hist, 1);
	assert_int_equal(tok, 6);
	assert_int_equal(sampler_logprobs(s, &lp), 4);
	double norm = ref_norm(raw, n);
	assert_int_equal(lp[0].id, 6);
	assert_true(fabs(lp[0].logprob - (8.0 - norm)) < 1e-6);
	assert_int_equal(lp[1].id, 5);	/* the raw distribution's best, unpenalised */
	assert_true(fabs(lp[1].logprob - (9.0 - norm)) < 1e-6);
	assert_int_equal(lp[2].id, 6);
	sampler_destroy(s);

	/* Off by default; top_logprobs needs logprobs and at most SAMPLER_MAX_TOP. */
	s = make(&(struct sampler_params){ .repeat_penalty = 1.0f, .top_p = 1.0f }, n);
	memcpy(l, raw, sizeof(l));
	sampler_sample(s, l, NULL, 0);
	assert_int_equal(sampler_logprobs(s, &lp), 0);
	sampler_destroy(s);
	p.top_logprobs = SAMPLER_MAX_TOP + 1;
	assert_int_equal(sampler_create(&s, &p, n), -EINVAL);
	p.logprobs = 0;
	p.top_logprobs = 1;
	assert_int_equal(sampler_create(&s, &p, n), -EINVAL);
}

/* ---- OpenAI's presence and frequency penalties ---- */

/* n greedy picks from a fresh copy of row each time, with the sampler's own history only. */
static void picks(struct sampler *s, const float *row, uint32_t vocab, const uint32_t *hist,
		  size_t n_hist, uint32_t *out, unsigned n)
{
	float l[16];

	assert_true(vocab <= 16);
	for (unsigned i = 0; i < n; i++) {
		memcpy(l, row, vocab * sizeof(*l));
		out[i] = sampler_sample(s, l, hist, n_hist);
	}
}

/*
 * logit -= presence * [count > 0] + frequency * count over the sampler's
 * own picks, not the prompt; the worked sequences below follow from the
 * formula with greedy ties to the lower id.
 */
static void test_presence_frequency(void **state)
{
	(void)state;
	const float row[8] = { 5.0f, 4.5f, 4.0f, 0, 0, 0, 0, 0 };
	const uint32_t prompt[] = { 0, 0, 0 };
	struct sampler_params p = params_t(0.0f, 1);
	uint32_t got[4];

	p.frequency_penalty = 1.0f;
	struct sampler *s = make(&p, 8);
	picks(s, row, 8, prompt, 3, got, 4);	/* the prompt's zeros count for nothing */
	assert_int_equal(got[0], 0);
	assert_int_equal(got[1], 1);	/* 5 - 1 < 4.5 */
	assert_int_equal(got[2], 0);	/* 4 == 4: the lower id */
	assert_int_equal(got[3], 2);	/* 5 - 2 < 4 */
	sampler_destroy(s);

	p.frequency_penalty = 0.0f;
	p.presence_penalty = 1.0f;
	s = make(&p, 8);
	picks(s, row, 8, NULL, 0, got, 4);
	assert_int_equal(got[0], 0);
	assert_int_equal(got[1], 1);
	assert_int_equal(got[2], 0);
	assert_int_equal(got[3], 0);	/* presence counts once: 4 == 4, the lower id */
	sampler_destroy(s);

	p.presence_penalty = -2.0f;	/* negative ones encourage repeats */
	s = make(&p, 8);
	picks(s, (const float[8]){ 4.0f, 5.0f, 0, 0, 0, 0, 0, 0 }, 8, NULL, 0, got, 3);
	assert_int_equal(got[0], 1);
	assert_int_equal(got[1], 1);
	assert_int_equal(got[2], 1);
	sampler_destroy(s);

	/* OpenAI's range, -2..2. */
	p.presence_penalty = 2.5f;
	assert_int_equal(sampler_create(&s, &p, 8), -EINVAL);
	p.presence_penalty = 0.0f;
	p.frequency_penalty = NAN;
	assert_int_equal(sampler_create(&s, &p, 8), -EINVAL);
	p.frequency_penalty = -2.01f;
	assert_int_equal(sampler_create(&s, &p, 8), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy_argmax_and_ties),
		cmocka_unit_test(test_greedy_argmax_wide),
		cmocka_unit_test(test_seed_reproducible),
		cmocka_unit_test(test_top_k1_is_greedy),
		cmocka_unit_test(test_frequencies_match_softmax),
		cmocka_unit_test(test_top_p_keeps_nucleus),
		cmocka_unit_test(test_min_p_keeps_above_threshold),
		cmocka_unit_test(test_top_k_keeps_k_best),
		cmocka_unit_test(test_repeat_penalty),
		cmocka_unit_test(test_invalid_params),
		cmocka_unit_test(test_degenerate_rows),
		cmocka_unit_test(test_log_softmax_top),
		cmocka_unit_test(test_logprobs_raw),
		cmocka_unit_test(test_presence_frequency),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
