/* kldref.c — reading tests/golden/kld_ref.txt and scoring an engine's distributions against it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon/engine/engine.h"
#include "tests/lib/kldref.h"
#include "tests/lib/logits.h"

static int expect_word(FILE *f, const char *w)
{
	char buf[32];
	return fscanf(f, "%31s", buf) == 1 && !strcmp(buf, w) ? 0 : -1;
}

static void skip_comments(FILE *f)
{
	int c;
	while ((c = fgetc(f)) == '#')
		while ((c = fgetc(f)) != '\n' && c != EOF)
			;
	ungetc(c, f);
}

/* "key value" into *v; 0 or -1. */
static int read_key(FILE *f, const char *key, double *v)
{
	return expect_word(f, key) || fscanf(f, "%lf", v) != 1 ? -1 : 0;
}

static int load_header(struct kldref *r, FILE *f)
{
	double v[6];
	static const char *const keys[] = { "ctx", "chunks", "kld_chunks", "top", "positions",
					     "kld_positions" };
	for (int i = 0; i < 6; i++)
		if (read_key(f, keys[i], &v[i]))
			return -1;
	r->ctx = (uint32_t)v[0];
	r->chunks = (uint32_t)v[1];
	r->kld_chunks = (uint32_t)v[2];
	r->top = (uint32_t)v[3];
	r->positions = (uint32_t)v[4];
	r->kld_positions = (uint32_t)v[5];
	if (read_key(f, "peer_kld", &r->peer_kld) || read_key(f, "peer_same_top", &r->peer_same_top) ||
	    read_key(f, "peer_kld_full", &r->peer_kld_full))
		return -1;
	uint32_t scored = r->ctx - 1 - r->ctx / 2;
	if (r->ctx < 4 || r->ctx > 512 || !r->chunks || r->chunks > 64 || !r->kld_chunks ||
	    r->kld_chunks > r->chunks || !r->top || r->top > KLDREF_TOP_MAX ||
	    r->positions != r->chunks * scored || r->kld_positions != r->kld_chunks * scored)
		return -1;
	r->tokens = calloc((size_t)r->chunks * r->ctx, sizeof(uint32_t));
	r->pos = calloc(r->positions, sizeof(struct kldref_pos));
	return r->tokens && r->pos ? 0 : -1;
}

static int load_pos(const struct kldref *r, FILE *f, struct kldref_pos *p, uint32_t want_pos,
		    int with_top)
{
	if (expect_word(f, "pos") ||
	    fscanf(f, "%u %u %u %f", &p->pos, &p->next, &p->argmax, &p->gap) != 4 || p->pos != want_pos ||
	    (with_top && fscanf(f, "%lf", &p->lrest) != 1))
		return -1;
	for (uint32_t i = 0; with_top && i < r->top; i++)
		if (fscanf(f, " %u:%lf", &p->id[i], &p->lp[i]) != 2 || p->id[i] >= r->vocab)
			return -1;
	return p->next < r->vocab && p->argmax < r->vocab ? 0 : -1;
}

int kldref_load(struct kldref *r, const char *path, uint32_t vocab)
{
	memset(r, 0, sizeof(*r));
	r->vocab = vocab;
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	skip_comments(f);
	int rc = load_header(r, f);
	uint32_t scored = r->ctx - 1 - r->ctx / 2;
	for (uint32_t c = 0; !rc && c < r->chunks; c++) {
		unsigned idx;
		uint32_t *t = r->tokens + (size_t)c * r->ctx;
		if (expect_word(f, "chunk") || fscanf(f, "%u", &idx) != 1 || idx != c)
			rc = -1;
		for (uint32_t i = 0; !rc && i < r->ctx; i++)
			if (fscanf(f, "%u", &t[i]) != 1 || t[i] >= vocab)
				rc = -1;
		for (uint32_t j = 0; !rc && j < scored; j++)
			rc = load_pos(r, f, &r->pos[c * scored + j], r->ctx / 2 + j, c < r->kld_chunks);
	}
	fclose(f);
	if (rc)
		kldref_free(r);
	return rc;
}

void kldref_free(struct kldref *r)
{
	free(r->tokens);
	free(r->pos);
	r->tokens = NULL;
	r->pos = NULL;
}

/*
 * KLD over the reference's top ids plus one bucket for the rest (gen_kld.py):
 * the divergence of both distributions coarsened to top + 1 outcomes. l is
 * the engine's logits (vocab,); mask (vocab,) is scratch, left zeroed.
 */
static double kld_top(const struct kldref *r, const struct kldref_pos *p, const float *l,
		      uint8_t *mask)
{
	float max = l[0];
	for (uint32_t i = 1; i < r->vocab; i++)
		max = l[i] > max ? l[i] : max;
	double sum = 0, rest = 0;
	for (uint32_t i = 0; i < r->top; i++)
		mask[p->id[i]] = 1;
	for (uint32_t i = 0; i < r->vocab; i++) {
		double e = exp((double)l[i] - max);
		sum += e;
		rest += mask[i] ? 0 : e;
	}
	double lse = max + log(sum), kld = 0;
	for (uint32_t i = 0; i < r->top; i++) {
		kld += exp(p->lp[i]) * (p->lp[i] - ((double)l[p->id[i]] - lse));
		mask[p->id[i]] = 0;
	}
	return kld + exp(p->lrest) * (p->lrest - (log(rest) + max - lse));
}

/* Chunk c through e in one pass from an empty sequence; its scored positions into *out. */
static int run_chunk(const struct kldref *r, struct engine *e, uint32_t c, float clear_gap,
		     struct engine_row *rows, float *logits, uint8_t *mask,
		     struct kldref_result *out)
{
	uint32_t scored = r->ctx - 1 - r->ctx / 2;
	const uint32_t *t = r->tokens + (size_t)c * r->ctx;
	struct engine_seq s;
	engine_seq_init(e, &s, 0);
	for (uint32_t q = 0; q < r->ctx; q++)
		rows[q] = (struct engine_row){ &s, q, t[q], q >= r->ctx / 2 && q + 1 < r->ctx };
	int rc = engine_forward(e, rows, r->ctx, logits);
	engine_seq_release(e, &s);
	for (uint32_t j = 0; !rc && j < scored; j++, out->n++) {
		const struct kldref_pos *p = &r->pos[c * scored + j];
		const float *l = logits + (size_t)j * r->vocab;
		if (p->next != t[p->pos + 1])
			return -EINVAL;
		uint32_t am = logits_argmax(l, r->vocab);
		if (c < r->kld_chunks) {
			out->mean_kld += kld_top(r, p, l, mask);
			out->n_kld++;
		}
		out->same_top += am == p->argmax;
		/* Near-ties flip either way; a miss at a clear top is worth a line. */
		if (am != p->argmax && p->gap > clear_gap)
			printf("chunk %u pos %u: argmax %u, reference %u (ref top-2 gap %.4f)\n", c, p->pos,
			       am, p->argmax, p->gap);
	}
	return rc;
}

int kldref_run(const struct kldref *r, struct engine *e, uint32_t n_chunks, float clear_gap,
	       struct kldref_result *out)
{
	uint32_t scored = r->ctx - 1 - r->ctx / 2;
	struct engine_row *rows = calloc(r->ctx, sizeof(*rows));
	float *logits = malloc((size_t)scored * r->vocab * sizeof(float));
	uint8_t *mask = calloc(r->vocab, 1);
	int rc = rows && logits && mask ? 0 : -ENOMEM;
	*out = (struct kldref_result){ 0 };
	if (!rc && (r->ctx > engine_max_rows(e) || n_chunks > r->chunks))
		rc = -E2BIG;
	for (uint32_t c = 0; !rc && c < n_chunks; c++)
		rc = run_chunk(r, e, c, clear_gap, rows, logits, mask, out);
	if (out->n_kld)
		out->mean_kld /= out->n_kld;
	if (out->n)
		out->same_top /= out->n;
	free(mask);
	free(logits);
	free(rows);
	return rc;
}
