/* sampler.c — logits row to token: penalties, then greedy or temperature, top-k, top-p, min-p, draw; and the row's log-probabilities. */
#include "daemon/engine/sampler.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/*
 * Below this scaled logit expf() is 0 in float (the smallest denormal is
 * e^-103.3), so dropping such tokens up front changes no probability.
 */
#define SAMPLER_X_CUT (-104.0f)

/* Ranges this short are sorted outright when looking for the nucleus edge. */
#define SAMPLER_SMALL 16

/* Top-p histograms x into this many buckets to find the nucleus edge. */
#define SAMPLER_BUCKETS 256

struct sampler_cand {
	float x;	/* (logit - max) / temperature, <= 0; the max token has 0 */
	float w;	/* expf(x), unnormalised probability; filled before top-p */
	uint32_t id;
};

struct sampler {
	struct sampler_params p;
	uint32_t vocab;
	uint64_t rng[4];		/* xoshiro256** state, never all zero */
	struct sampler_cand *cand;	/* (vocab,) scratch, rebuilt every call */
	uint32_t *mark;			/* (vocab,) penalty dedup: mark[id] == stamp once seen */
	uint32_t stamp;
	double bucket_w[SAMPLER_BUCKETS];	/* top-p: weight per x bucket */
	uint32_t *count;		/* (vocab,) presence/frequency: times each id was returned */
	uint32_t *seen;			/* (n_seen,) the ids returned, each once */
	uint32_t n_seen;
	float *raw;			/* (vocab,) logprobs: the row before the penalties */
	struct sampler_logprob lp[1 + SAMPLER_MAX_TOP];	/* the last pick's, sampler_logprobs() */
	uint32_t n_lp;
};

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t sampler_rng_next(struct sampler *s)
{
	uint64_t *t = s->rng;
	uint64_t r = rotl64(t[1] * 5, 7) * 9;
	uint64_t u = t[1] << 17;

	t[2] ^= t[0];
	t[3] ^= t[1];
	t[1] ^= t[2];
	t[0] ^= t[3];
	t[2] ^= u;
	t[3] = rotl64(t[3], 45);
	return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double sampler_rng_unit(struct sampler *s)
{
	return (double)(sampler_rng_next(s) >> 11) * 0x1.0p-53;
}

void sampler_params_default(struct sampler_params *p)
{
	memset(p, 0, sizeof(*p));
	p->temperature = 0.0f;
	p->top_k = 0;
	p->top_p = 1.0f;
	p->min_p = 0.0f;
	p->repeat_penalty = 1.0f;
	p->repeat_last_n = 64;
	p->seed = 0;
	p->presence_penalty = 0.0f;
	p->frequency_penalty = 0.0f;
	p->logprobs = 0;
	p->top_logprobs = 0;
}

/* A knob is usable when finite and in [0, hi]; NaN is not finite. */
static int sampler_knob_ok(float v, float hi)
{
	return isfinite(v) && v >= 0.0f && v <= hi;
}

int sampler_create(struct sampler **out, const struct sampler_params *p, uint32_t vocab)
{
	struct sampler *s;
	uint64_t sm;
	int i;

	*out = NULL;
	if (!p || vocab == 0)
		return -EINVAL;
	/*
	 * The header calls negative top_p / penalty "off"; we refuse negatives
	 * instead, since they are almost always a client's sign error. 0 still
	 * means off (greedy for temperature).
	 */
	if (!sampler_knob_ok(p->temperature, FLT_MAX) || !sampler_knob_ok(p->top_p, 1.0f) ||
	    !sampler_knob_ok(p->min_p, 1.0f) || !sampler_knob_ok(p->repeat_penalty, FLT_MAX))
		return -EINVAL;
	/* OpenAI's range; negative ones encourage repeats, as there. */
	if (!(fabsf(p->presence_penalty) <= 2.0f) || !(fabsf(p->frequency_penalty) <= 2.0f) ||
	    p->top_logprobs > SAMPLER_MAX_TOP || p->top_logprobs > vocab ||
	    (p->top_logprobs && !p->logprobs))
		return -EINVAL;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->cand = malloc((size_t)vocab * sizeof(*s->cand));
	if (!s->cand)
		goto err_free_s;
	s->mark = calloc(vocab, sizeof(*s->mark));
	if (!s->mark)
		goto err_free_cand;
	if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
		s->count = calloc(vocab, sizeof(*s->count));
		s->seen = malloc((size_t)vocab * sizeof(*s->seen));
		if (!s->count || !s->seen)
			goto err_free_extra;
	}
	if (p->logprobs && !(s->raw = malloc((size_t)vocab * sizeof(*s->raw))))
		goto err_free_extra;

	s->p = *p;
	s->vocab = vocab;
	sm = p->seed;
	for (i = 0; i < 4; i++)
		s->rng[i] = splitmix64(&sm);
	*out = s;
	return 0;

err_free_extra:
	free(s->count);
	free(s->seen);
	free(s->mark);
err_free_cand:
	free(s->cand);
err_free_s:
	free(s);
	return -ENOMEM;
}

void sampler_destroy(struct sampler *s)
{
	if (!s)
		return;
	free(s->raw);
	free(s->seen);
	free(s->count);
	free(s->mark);
	free(s->cand);
	free(s);
}

/*
 * OpenAI's and vLLM's presence/frequency penalties over the sampler's own
 * picks: subtracted, whatever the logit's sign (unlike the repeat penalty).
 */
static void sampler_penalize_output(struct sampler *s, float *logits)
{
	for (uint32_t i = 0; i < s->n_seen; i++) {
		uint32_t t = s->seen[i];

		logits[t] -= s->p.presence_penalty + s->p.frequency_penalty * (float)s->count[t];
	}
}

static void sampler_note_pick(struct sampler *s, uint32_t tok)
{
	if (!s->count)
		return;
	if (s->count[tok]++ == 0)
		s->seen[s->n_seen++] = tok;	/* at most vocab distinct ids */
}

/* Larger logit first, lower id among equals; NaN as -inf. */
static inline int lp_before(float a, uint32_t ia, float b, uint32_t ib)
{
	return a > b || (a == b && ia < ib);
}

double sampler_log_softmax_top(const float *logits, uint32_t vocab, uint32_t k,
			       struct sampler_logprob *top)
{
	float m = -INFINITY;
	uint32_t n = 0, i, j;

	for (i = 0; i < vocab; i++) {
		float x = isnan(logits[i]) ? -INFINITY : logits[i];

		m = x > m ? x : m;
		if (!k || (n == k && !lp_before(x, i, top[k - 1].logprob, top[k - 1].id)))
			continue;
		/* Insertion into the k best so far (k <= 20: a sorted array beats a heap). */
		j = n < k ? n++ : k - 1;
		for (; j > 0 && lp_before(x, i, top[j - 1].logprob, top[j - 1].id); j--)
			top[j] = top[j - 1];
		top[j] = (struct sampler_logprob){ i, x };
	}
	if (m == -INFINITY) {
		for (i = 0; i < n; i++)
			top[i].logprob = -INFINITY;
		return INFINITY;	/* no distribution: every logprob -inf */
	}
	double sum = 0.0;

	/* expf summed in double: float's rounding per term, none in the sum (exp() costs 3x). */
	for (i = 0; i < vocab; i++)
		if (!isnan(logits[i]))
			sum += expf(logits[i] - m);
	double norm = (double)m + log(sum);

	for (i = 0; i < n; i++)
		top[i].logprob = (float)((double)top[i].logprob - norm);
	return norm;
}

static float lp_of(const float *raw, uint32_t tok, double norm)
{
	if (isnan(raw[tok]) || norm == INFINITY)
		return -INFINITY;
	return (float)((double)raw[tok] - norm);
}

uint32_t sampler_logprobs(const struct sampler *s, const struct sampler_logprob **out)
{
	*out = s->lp;
	return s->n_lp;
}

/*
 * llama.cpp's repetition penalty: each distinct token among the last
 * repeat_last_n has a positive logit divided by the penalty and a negative
 * one multiplied, so the penalty always pushes it down (for penalty > 1).
 */
static void sampler_penalize(struct sampler *s, float *logits, const uint32_t *history,
			     size_t n_history)
{
	float pen = s->p.repeat_penalty;
	size_t n = s->p.repeat_last_n, i;

	if (pen <= 0.0f || pen == 1.0f || n == 0 || !history)
		return;
	if (n > n_history)
		n = n_history;
	if (++s->stamp == 0) {	/* wrapped: old marks could collide */
		memset(s->mark, 0, (size_t)s->vocab * sizeof(*s->mark));
		s->stamp = 1;
	}
	for (i = n_history - n; i < n_history; i++) {
		uint32_t t = history[i];

		if (t >= s->vocab || s->mark[t] == s->stamp)
			continue;
		s->mark[t] = s->stamp;
		logits[t] = logits[t] > 0.0f ? logits[t] / pen : logits[t] * pen;
	}
}

/*
 * Largest logit, lowest id among equals; NaN never wins. Returns 0 if none.
 * Sixteen running maxima, then the first id holding the largest, so the
 * loop vectorises (a scan keeping each strict improvement, ~8x slower, was
 * a tenth of a 16-stream decode step).
 */
static uint32_t sampler_argmax(const float *logits, uint32_t vocab, float *max)
{
	enum { L = 16 };
	float m[L], mx = -INFINITY;
	uint32_t i = 0;

	for (int l = 0; l < L; l++)
		m[l] = -INFINITY;
	for (; i + L <= vocab; i += L)
		for (int l = 0; l < L; l++)	/* x > m ? x : m never takes a NaN */
			m[l] = logits[i + l] > m[l] ? logits[i + l] : m[l];
	for (int l = 0; l < L; l++)
		mx = m[l] > mx ? m[l] : mx;
	for (; i < vocab; i++)
		mx = logits[i] > mx ? logits[i] : mx;
	*max = mx;
	if (!(mx > -INFINITY))
		return 0;
	for (i = 0; logits[i] != mx; i++)
		;
	return i;
}

/* Total order for selection: larger x first, then lower id, so ties are stable. */
static inline int cand_before(const struct sampler_cand *a, const struct sampler_cand *b)
{
	return a->x > b->x || (a->x == b->x && a->id < b->id);
}

static inline void cand_swap(struct sampler_cand *c, uint32_t i, uint32_t j)
{
	struct sampler_cand t = c[i];

	c[i] = c[j];
	c[j] = t;
}

/*
 * Partition c[lo, hi) (hi - lo >= 2) around a median-of-three pivot: on
 * return c[lo, m) come before c[m] and c[m + 1, hi) after it. *left_w is the
 * w sum of c[lo, m), for the nucleus search.
 */
static uint32_t cand_partition(struct sampler_cand *c, uint32_t lo, uint32_t hi,
			       double *left_w)
{
	uint32_t mid = lo + (hi - lo) / 2, last = hi - 1, store = lo, i;
	double sum = 0.0;

	if (cand_before(&c[mid], &c[lo]))
		cand_swap(c, lo, mid);
	if (cand_before(&c[last], &c[lo]))
		cand_swap(c, lo, last);
	if (cand_before(&c[mid], &c[last]))
		cand_swap(c, mid, last);
	/* c[last] is now the median of the three */
	for (i = lo; i < last; i++) {
		if (cand_before(&c[i], &c[last])) {
			sum += c[i].w;
			cand_swap(c, i, store++);
		}
	}
	cand_swap(c, store, last);
	*left_w = sum;
	return store;
}

/*
 * Top-k keeps a heap of the k best seen so far, its worst at the root, so
 * most of a 49152-entry row costs one compare against h[0].
 */
static void cand_sift_down(struct sampler_cand *h, uint32_t n, uint32_t i)
{
	for (;;) {
		uint32_t l = 2 * i + 1, r = l + 1, w = i;

		if (l < n && cand_before(&h[w], &h[l]))
			w = l;
		if (r < n && cand_before(&h[w], &h[r]))
			w = r;
		if (w == i)
			return;
		cand_swap(h, i, w);
		i = w;
	}
}

static void cand_heapify(struct sampler_cand *h, uint32_t n)
{
	uint32_t i;

	for (i = n / 2; i-- > 0;)
		cand_sift_down(h, n, i);
}

static void cand_sort(struct sampler_cand *c, uint32_t lo, uint32_t hi)
{
	uint32_t i, j;

	for (i = lo + 1; i < hi; i++) {
		struct sampler_cand t = c[i];

		for (j = i; j > lo && cand_before(&t, &c[j - 1]); j--)
			c[j] = c[j - 1];
		c[j] = t;
	}
}

/*
 * The nucleus: rearrange c[0, n) and return the smallest K such that the K
 * best weigh at least target (0 < target <= their total); c[0, K) are those.
 * Quickselect on mass rather than count, so no full sort: expected O(n).
 */
static uint32_t cand_select_mass(struct sampler_cand *c, uint32_t n, double target)
{
	uint32_t lo = 0, hi = n, m, i;
	double cum = 0.0, left;	/* cum: weight of c[0, lo), all in the nucleus */

	while (hi - lo > SAMPLER_SMALL) {
		m = cand_partition(c, lo, hi, &left);
		if (cum + left >= target) {
			hi = m;
		} else if (cum + left + c[m].w >= target) {
			return m + 1;
		} else {
			cum += left + c[m].w;
			lo = m + 1;
		}
	}
	cand_sort(c, lo, hi);
	for (i = lo; i < hi; i++) {
		cum += c[i].w;
		if (cum >= target)
			return i + 1;
	}
	/* Only rounding between two summation orders lands here; keep all seen. */
	return hi > 0 ? hi : 1;
}

static inline uint32_t sampler_bucket(float x, float xmin, float scale)
{
	uint32_t b = (uint32_t)((x - xmin) * scale);

	return b < SAMPLER_BUCKETS ? b : SAMPLER_BUCKETS - 1;
}

/*
 * Nucleus of c[0, n) without ordering the whole row: bucket the candidates
 * by x, walk buckets from the top until top_p * total is reached, and run
 * the exact select only inside that edge bucket. Returns K; c[0, K) are the
 * nucleus, the same set a full sort would keep.
 */
static uint32_t sampler_top_p(struct sampler *s, uint32_t n, double total)
{
	struct sampler_cand *c = s->cand;
	double target = (double)s->p.top_p * total, above = 0.0;
	float xmin = 0.0f, scale;
	uint32_t i, b, edge, head = 0, mid;

	for (i = 0; i < n; i++)
		xmin = c[i].x < xmin ? c[i].x : xmin;
	if (n <= SAMPLER_BUCKETS || xmin == 0.0f)
		return cand_select_mass(c, n, target);

	scale = SAMPLER_BUCKETS / -xmin;
	memset(s->bucket_w, 0, sizeof(s->bucket_w));
	for (i = 0; i < n; i++) {
		b = sampler_bucket(c[i].x, xmin, scale);
		s->bucket_w[b] += c[i].w;
	}
	for (edge = SAMPLER_BUCKETS - 1; edge > 0; edge--) {
		if (above + s->bucket_w[edge] >= target)
			break;
		above += s->bucket_w[edge];
	}

	/* Buckets above the edge to the front, then the edge bucket. */
	for (i = 0; i < n; i++) {
		b = sampler_bucket(c[i].x, xmin, scale);
		if (b > edge)
			cand_swap(c, i, head++);
	}
	mid = head;
	for (i = mid; i < n; i++) {
		b = sampler_bucket(c[i].x, xmin, scale);
		if (b == edge)
			cand_swap(c, i, mid++);
	}
	return head + cand_select_mass(c + head, mid - head, target - above);
}

static uint32_t sampler_pick(struct sampler *s, float *logits, const uint32_t *history,
			     size_t n_history)
{
	const struct sampler_params *p = &s->p;
	struct sampler_cand *c = s->cand;
	uint32_t vocab = s->vocab, best, n = 0, i, k;
	float max, inv_t, cut;
	double u, total, acc;
	int top_p_on = p->top_p > 0.0f && p->top_p < 1.0f;

	/* Drawn every call so the stream position depends only on the call count. */
	u = sampler_rng_unit(s);

	sampler_penalize(s, logits, history, n_history);
	sampler_penalize_output(s, logits);
	best = sampler_argmax(logits, vocab, &max);
	if (p->temperature <= 0.0f || p->top_k == 1 || !isfinite(max))
		return best;

	/*
	 * Min-p keeps x >= ln(min_p), a threshold fixed by the max alone, so
	 * unless top-p (which renormalises) runs in between, it can be applied
	 * while gathering candidates, before any expf.
	 */
	inv_t = 1.0f / p->temperature;
	cut = SAMPLER_X_CUT;
	if (p->min_p > 0.0f && !top_p_on && logf(p->min_p) > cut)
		cut = logf(p->min_p);
	k = p->top_k > 0 && p->top_k < vocab ? p->top_k : vocab;
	for (i = 0; i < vocab; i++) {
		struct sampler_cand e = { .x = (logits[i] - max) * inv_t, .id = i };

		if (!(e.x >= cut))	/* also drops NaN */
			continue;
		if (n < k) {
			c[n++] = e;
			if (n == k && k < vocab)
				cand_heapify(c, n);
		} else if (cand_before(&e, &c[0])) {
			c[0] = e;
			cand_sift_down(c, n, 0);
		}
	}
	if (n == 0)	/* temperature so small that 1/t overflowed: greedy */
		return best;

	total = 0.0;
	for (i = 0; i < n; i++) {
		c[i].w = expf(c[i].x);
		total += c[i].w;
	}

	if (top_p_on) {
		uint32_t j;

		n = sampler_top_p(s, n, total);
		if (p->min_p > 0.0f) {
			float lmin = logf(p->min_p);

			j = 0;
			for (i = 0; i < n; i++)
				if (c[i].x >= lmin)
					c[j++] = c[i];
			n = j;	/* the max, x == 0, always stays */
		}
		total = 0.0;
		for (i = 0; i < n; i++)
			total += c[i].w;
	}

	u *= total;
	acc = 0.0;
	for (i = 0; i < n; i++) {
		acc += c[i].w;
		if (u < acc)
			return c[i].id;
	}
	/* u rounded up to total: take the last candidate that has weight. */
	for (i = n; i-- > 0;)
		if (c[i].w > 0.0f)
			return c[i].id;
	return best;
}

uint32_t sampler_sample(struct sampler *s, float *logits, const uint32_t *history,
			size_t n_history)
{
	double norm = 0.0;
	uint32_t tok;

	/* The raw row, before the penalties change it in place. */
	if (s->p.logprobs) {
		memcpy(s->raw, logits, (size_t)s->vocab * sizeof(*logits));
		norm = sampler_log_softmax_top(logits, s->vocab, s->p.top_logprobs, s->lp + 1);
	}
	tok = sampler_pick(s, logits, history, n_history);
	sampler_note_pick(s, tok);
	if (s->p.logprobs) {
		s->lp[0] = (struct sampler_logprob){ tok, lp_of(s->raw, tok, norm) };
		s->n_lp = 1 + s->p.top_logprobs;
	}
	return tok;
}
