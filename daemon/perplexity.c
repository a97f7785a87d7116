/* perplexity.c — `kvd --perplexity` and `--kl-divergence`: llama-perplexity's chunked scores and base files, on the engine. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "daemon/config.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/kvpool.h"
#include "daemon/log.h"
#include "daemon/model/model.h"
#include "daemon/perplexity.h"
#include "daemon/tokenizer/tokenizer.h"
#include "kernels/backend.h"

#define PPL_ROWS 512		/* engine rows a pass, as --prompt's prefill */

/* ---- the math, as llama.cpp's perplexity.cpp does it (float where it uses float) ---- */

uint64_t ppl_file_bytes(uint32_t n_ctx, uint32_t n_vocab, uint32_t n_chunk)
{
	return PPL_HEADER_BYTES + 4ull * n_chunk * n_ctx +
	       2ull * ppl_row_slots(n_vocab) * n_chunk * ppl_scored(n_ctx);
}

int ppl_nearest_int(float f)
{
	/* Adding 1.5 * 2^23 leaves the integer in the mantissa, rounded half to even. */
	float val = f + 12582912.f;
	int32_t i;
	memcpy(&i, &val, sizeof(i));
	return (i & 0x007fffff) - 0x00400000;
}

/* The top logit and log(sum exp(l - top)) of logits (n,), the sum and its log in double. */
static double log_sum_exp(const float *l, uint32_t n, float *max_out)
{
	float max = l[0];
	for (uint32_t i = 1; i < n; i++)
		max = l[i] > max ? l[i] : max;
	double sum = 0.0;
	for (uint32_t i = 0; i < n; i++)
		sum += expf(l[i] - max);
	*max_out = max;
	return log(sum);
}

/* The plain run's NLL of tok: llama.cpp keeps this one in double. */
static double nll_of(const float *l, uint32_t n, uint32_t tok)
{
	float max;
	double lse = log_sum_exp(l, n, &max);
	return -((double)(l[tok] - max) - lse);
}

float ppl_quantize_row(const float *logits, uint32_t n_vocab, uint32_t tok, uint16_t *row)
{
	float max, min = logits[0];
	float lse = (float)log_sum_exp(logits, n_vocab, &max);
	for (uint32_t i = 1; i < n_vocab; i++)
		min = logits[i] < min ? logits[i] : min;
	/* Below e^-16 a probability is noise to any comparison: it is stored as 0. */
	if (min < max - 16)
		min = max - 16;
	float min_log_prob = min - max - lse;
	float scale = (max - min) / 65535.f;
	memcpy(row, &scale, sizeof(float));
	memcpy(row + 2, &min_log_prob, sizeof(float));
	uint16_t *q = row + 4;
	if (scale) {
		float inv = 1 / scale;
		for (uint32_t i = 0; i < n_vocab; i++)
			q[i] = logits[i] > min ? (uint16_t)ppl_nearest_int(inv * (logits[i] - min)) : 0;
	} else {
		memset(q, 0, n_vocab * sizeof(uint16_t));
	}
	if (n_vocab & 1)
		q[n_vocab] = 0;
	return max + lse - logits[tok];
}

float ppl_row_log_prob(const uint16_t *row, uint32_t i)
{
	float scale, min_log_prob;
	memcpy(&scale, row, sizeof(float));
	memcpy(&min_log_prob, row + 2, sizeof(float));
	return scale * row[4 + i] + min_log_prob;
}

void ppl_kld_add(struct ppl_kld *k, const float *logits, const uint16_t *row, uint32_t n_vocab,
		 uint32_t tok, float *kld, float *p_diff)
{
	float max;
	float lse = (float)log_sum_exp(logits, n_vocab, &max);
	uint32_t imax = 0;	/* the first of equal tops, on both sides */
	for (uint32_t i = 1; i < n_vocab; i++)
		if (logits[i] > logits[imax])
			imax = i;
	float scale, min_log_prob;
	memcpy(&scale, row, sizeof(float));
	memcpy(&min_log_prob, row + 2, sizeof(float));
	const uint16_t *q = row + 4;
	float nll = max + lse - logits[tok];
	float nll_base = -(scale * q[tok] + min_log_prob);
	k->sum_nll += nll;
	k->sum_nll2 += nll * nll;
	k->sum_nll_base += nll_base;
	k->sum_nll_base2 += nll_base * nll_base;
	k->sum_nll_nll_base += nll * nll_base;
	max += lse;
	double sum = 0;
	uint32_t imax_base = 0;
	float top_base = 0;
	for (uint32_t i = 0; i < n_vocab; i++) {
		float lp = scale * q[i] + min_log_prob;
		if (i == 0 || lp > top_base) {
			top_base = lp;
			imax_base = i;
		}
		if (lp > -16.f)
			sum += expf(lp) * (lp - logits[i] + max);
	}
	k->sum_kld += sum;
	k->sum_kld2 += sum * sum;
	k->count++;
	k->n_same_top += imax == imax_base;
	float pd = expf(-nll) - expf(-nll_base);
	double pd2 = pd * pd;
	k->sum_p_diff += pd;
	k->sum_p_diff2 += pd2;
	k->sum_p_diff4 += pd2 * pd2;
	*kld = (float)sum;
	*p_diff = pd;
}

/* ---- one run ---- */

struct ppl {
	const struct kvd_options *o;
	struct engine *eng;
	const struct tokenizer *tok;
	uint32_t n_ctx, n_vocab, n_chunk;
	uint32_t bos;		/* each chunk's first token is this for the pass; TOK_NONE: kept */
	uint32_t *tokens;	/* (n_chunk * n_ctx,) the text's, or the base file's */
	struct engine_row *rows;	/* (engine_max_rows,) */
	float *logits;		/* (engine_max_rows, n_vocab) */
	uint16_t *row;		/* (ppl_row_slots,) one stored row */
	FILE *base;		/* the base file, written (plain run) or read (--kl-divergence) */
	const char *base_path;
	int created;		/* base_path is a regular file this run wrote: a failure removes it */
	int kld;
	/* the plain run */
	double nll, nll2;
	uint64_t count;
	char *values;		/* "[1]x,[2]y,", held back while a progress line shares the terminal */
	size_t values_len;
	FILE *values_f;
	/* --kl-divergence */
	struct ppl_kld k;
	float *kld_values, *p_diff_values;	/* (n_chunk * ppl_scored,) */
	/* progress */
	int tty;		/* stderr is a terminal: a progress line there */
	int shown;
	uint64_t t0, t_pass;
	uint32_t chunk;
};

typedef int (*score_fn)(struct ppl *p, const float *logits, uint32_t next);

static void erase_progress(struct ppl *p)
{
	if (p->shown)
		fputs("\r\033[K", stderr);
	p->shown = 0;
}

static void show_progress(struct ppl *p, uint32_t done)
{
	if (!p->tty)
		return;
	uint64_t total = (uint64_t)p->n_chunk * p->n_ctx, now = (uint64_t)p->chunk * p->n_ctx + done;
	double s = (double)(log_now_ns() - p->t0) * 1e-9;
	fprintf(stderr, "\r\033[Kperplexity: chunk %u/%u, %llu/%llu positions", p->chunk + 1,
		p->n_chunk, (unsigned long long)now, (unsigned long long)total);
	if (s > 0 && now)
		fprintf(stderr, ", %.1f tok/s, ETA %.1f min", now / s, (total - now) / (now / s) / 60);
	if (!p->kld && p->count)
		fprintf(stderr, ", PPL %.4f", exp(p->nll / p->count));
	p->shown = 1;
}

/* Chunk c of p->tokens from an empty sequence; fn for each scored position, in order. */
static int eval_chunk(struct ppl *p, uint32_t c, score_fn fn)
{
	const uint32_t *t = p->tokens + (size_t)c * p->n_ctx;
	uint32_t max = engine_max_rows(p->eng), first = p->n_ctx / 2;
	struct engine_seq seq;
	int rc = 0;
	engine_seq_init(p->eng, &seq, 0);
	for (uint32_t pos = 0; pos < p->n_ctx && !rc; pos += max) {
		uint32_t n = p->n_ctx - pos < max ? p->n_ctx - pos : max;
		for (uint32_t i = 0; i < n; i++) {
			uint32_t q = pos + i;
			/* The last position predicts nothing scored: its logits are not asked for. */
			p->rows[i] = (struct engine_row){ &seq, q, q == 0 && p->bos != TOK_NONE ? p->bos : t[q],
							  q >= first && q + 1 < p->n_ctx };
		}
		if ((rc = engine_forward(p->eng, p->rows, n, p->logits))) {
			fprintf(stderr, "kvd: forward pass failed: %s\n", strerror(-rc));
			break;
		}
		for (uint32_t i = 0, k = 0; i < n && !rc; i++)
			if (p->rows[i].want_logits)
				rc = fn(p, p->logits + (size_t)k++ * p->n_vocab, t[pos + i + 1]);
		show_progress(p, pos + n);
	}
	engine_seq_release(p->eng, &seq);
	return rc;
}

static int io_error(struct ppl *p, const char *what)
{
	int rc = errno ? -errno : -EIO;
	erase_progress(p);
	fprintf(stderr, "kvd: %s %s: %s\n", what, p->base_path, errno ? strerror(errno) : "short read");
	return rc;
}

/* ---- the text ---- */

/* FILE's text, less one trailing newline (llama.cpp's -f), NUL-terminated into *out; the caller frees. */
static int read_text(const char *path, char **out, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		int rc = -errno;
		fprintf(stderr, "kvd: %s: %s\n", path, strerror(errno));
		return rc;
	}
	char *buf = NULL, chunk[65536];
	size_t n = 0, got;
	FILE *m = open_memstream(&buf, &n);
	while (m && (got = fread(chunk, 1, sizeof(chunk), f)) > 0)
		fwrite(chunk, 1, got, m);
	int bad = ferror(f);
	fclose(f);
	if (!m || fclose(m) || bad) {
		fprintf(stderr, "kvd: %s: %s\n", path, bad ? "read error" : "out of memory");
		free(buf);
		return bad ? -EIO : -ENOMEM;
	}
	if (n && buf[n - 1] == '\n')
		buf[--n] = '\0';
	*out = buf;
	*len = n;
	return 0;
}

/* The text's tokens into p (n_chunk whole chunks of n_ctx), as llama-perplexity cuts them. */
static int text_tokens(struct ppl *p, const char *path)
{
	char *text;
	size_t len;
	int rc = read_text(path, &text, &len);
	if (rc)
		return rc;
	int add_bos = tokenizer_add_bos(p->tok);
	int n = tokenizer_encode(p->tok, text, len, add_bos, 0, NULL, 0);
	uint32_t *ids = n > 0 ? malloc((size_t)n * sizeof(uint32_t)) : NULL;
	if (n < 0 || (n > 0 && !ids) ||
	    (ids && tokenizer_encode(p->tok, text, len, add_bos, 0, ids, (size_t)n) != n)) {
		rc = n < 0 ? n : -ENOMEM;
		fprintf(stderr, "kvd: cannot tokenize %s: %s\n", path, strerror(-rc));
	} else if ((uint64_t)n < 2ull * p->n_ctx) {
		fprintf(stderr, "kvd: you need at least %llu tokens to evaluate perplexity with a context of %u\n"
			"kvd: the data file you provided tokenizes to only %d tokens\n",
			2ull * p->n_ctx, p->n_ctx, n);
		rc = -EINVAL;
	} else {
		uint32_t max = (uint32_t)n / p->n_ctx;
		p->n_chunk = p->o->chunks && p->o->chunks < max ? p->o->chunks : max;
		p->tokens = ids;
		ids = NULL;
	}
	free(ids);
	free(text);
	return rc;
}

/* ---- the base file ---- */

static int write_header(struct ppl *p)
{
	int32_t h[3] = { (int32_t)p->n_ctx, (int32_t)p->n_vocab, (int32_t)p->n_chunk };
	struct stat st;
	if (!(p->base = fopen(p->base_path, "wb")))
		return io_error(p, "cannot create");
	/* Never unlink what is not a plain file of ours: --kl-divergence-base /dev/null is fine. */
	p->created = !fstat(fileno(p->base), &st) && S_ISREG(st.st_mode);
	errno = 0;
	if (fwrite(PPL_MAGIC, 1, 8, p->base) != 8 || fwrite(h, sizeof(h), 1, p->base) != 1 ||
	    fwrite(p->tokens, sizeof(uint32_t) * p->n_ctx, p->n_chunk, p->base) != p->n_chunk)
		return io_error(p, "cannot write");
	return 0;
}

/* The header of the base file, checked against the model and the file's size; its n_ctx into *n_ctx. */
static int read_header(struct ppl *p, uint32_t vocab, uint32_t *n_ctx)
{
	char magic[8];
	int32_t h[3];
	struct stat st;
	if (!(p->base = fopen(p->base_path, "rb")) || fstat(fileno(p->base), &st))
		return io_error(p, "cannot open");
	errno = 0;
	if (fread(magic, 1, 8, p->base) != 8 || memcmp(magic, PPL_MAGIC, 8) ||
	    fread(h, sizeof(h), 1, p->base) != 1) {
		fprintf(stderr, "kvd: %s does not look like a file of log-probabilities "
			"(llama-perplexity --kl-divergence-base): no \"%s\" header\n", p->base_path, PPL_MAGIC);
		return -EINVAL;
	}
	if (h[1] != (int32_t)vocab) {
		fprintf(stderr, "kvd: %s holds log-probabilities of a vocabulary of %d tokens; this model's "
			"has %u: it was made with another model family\n", p->base_path, h[1], vocab);
		return -EINVAL;
	}
	if (h[0] < PPL_MIN_CTX || h[0] > 1 << 24 || h[2] < 1) {
		fprintf(stderr, "kvd: %s: its header says %d chunks of %d tokens, which no run writes\n",
			p->base_path, h[2], h[0]);
		return -EINVAL;
	}
	uint64_t want = ppl_file_bytes((uint32_t)h[0], vocab, (uint32_t)h[2]);
	if ((uint64_t)st.st_size != want) {
		fprintf(stderr, "kvd: %s is %llu bytes; %d chunks of %d tokens over a vocabulary of %u make "
			"%llu: it is %s\n", p->base_path, (unsigned long long)st.st_size, h[2], h[0], vocab,
			(unsigned long long)want, (uint64_t)st.st_size < want ? "cut short" : "not one such file");
		return -EINVAL;
	}
	*n_ctx = (uint32_t)h[0];
	p->n_chunk = (uint32_t)h[2];
	return 0;
}

/* The base file's tokens (the first n_chunk chunks of them), each checked to be in the vocabulary. */
static int read_tokens(struct ppl *p, uint32_t file_chunks)
{
	size_t n = (size_t)p->n_chunk * p->n_ctx;
	if (!(p->tokens = malloc(n * sizeof(uint32_t))))
		return -ENOMEM;
	errno = 0;
	if (fread(p->tokens, sizeof(uint32_t), n, p->base) != n)
		return io_error(p, "cannot read");
	for (size_t i = 0; i < n; i++)
		if (p->tokens[i] >= p->n_vocab) {
			fprintf(stderr, "kvd: %s: token %zu is %u, outside the vocabulary of %u\n",
				p->base_path, i, p->tokens[i], p->n_vocab);
			return -EINVAL;
		}
	/* The rows follow all of the file's tokens, not just those of the chunks evaluated. */
	long skip = (long)((size_t)(file_chunks - p->n_chunk) * p->n_ctx * sizeof(uint32_t));
	if (skip && fseek(p->base, skip, SEEK_CUR))
		return io_error(p, "cannot read");
	return 0;
}

/* ---- the plain run ---- */

static int score_ppl(struct ppl *p, const float *logits, uint32_t next)
{
	double v;
	if (p->base) {
		v = ppl_quantize_row(logits, p->n_vocab, next, p->row);
		errno = 0;
		if (fwrite(p->row, sizeof(uint16_t), ppl_row_slots(p->n_vocab), p->base) !=
		    ppl_row_slots(p->n_vocab))
			return io_error(p, "cannot write");
	} else {
		v = nll_of(logits, p->n_vocab, next);
	}
	p->nll += v;
	p->nll2 += v * v;
	p->count++;
	return 0;
}

/* The running value after chunk c: llama-perplexity's "[c]ppl," on one line. */
static void print_running(struct ppl *p, uint32_t c)
{
	FILE *to = p->values_f ? p->values_f : stdout;
	erase_progress(p);
	fprintf(to, "[%u]%.4lf,", c + 1, exp(p->nll / p->count));
	fflush(to);
}

static void print_final(struct ppl *p)
{
	if (p->values_f) {
		fclose(p->values_f);
		p->values_f = NULL;
		if (p->values)
			fwrite(p->values, 1, p->values_len, stdout);
	}
	printf("\n");
	double nll = p->nll / p->count, nll2 = p->nll2 / p->count, ppl = exp(nll);
	nll2 -= nll * nll;
	if (nll2 > 0)
		printf("Final estimate: PPL = %.4lf +/- %.5lf\n", ppl, sqrt(nll2 / (p->count - 1)) * ppl);
	else
		fprintf(stderr, "kvd: unexpected negative standard deviation of log(prob)\n");
}

/* ---- --kl-divergence ---- */

static int score_kld(struct ppl *p, const float *logits, uint32_t next)
{
	errno = 0;
	if (fread(p->row, sizeof(uint16_t), ppl_row_slots(p->n_vocab), p->base) !=
	    ppl_row_slots(p->n_vocab))
		return io_error(p, "cannot read");
	uint64_t i = p->k.count;
	ppl_kld_add(&p->k, logits, p->row, p->n_vocab, next, &p->kld_values[i], &p->p_diff_values[i]);
	return 0;
}

struct mau {
	double mean, unc;
};

/* llama.cpp's mean_and_uncertainty: no error bar from ten values or fewer. */
static struct mau mean_unc(double sum, double sum2, uint64_t count)
{
	if (count < 1)
		return (struct mau){ 0, 0 };
	double f = sum / count, df = sum2 / count - f * f;
	return (struct mau){ f, df > 0 && count > 10 ? sqrt(df / (count - 1)) : 0. };
}

static double covariance(double a, double b, double ab, uint64_t count)
{
	if (count < 10)
		return 0;
	return (ab / count - (a / count) * (b / count)) / (count - 1);
}

/* The per-chunk line, cumulative over the chunks so far (llama.cpp's table). */
static void print_kld_chunk(struct ppl *p, uint32_t c)
{
	const struct ppl_kld *k = &p->k;
	erase_progress(p);
	if (c == 0)
		printf("\nchunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p\n");
	struct mau lp = mean_unc(k->sum_nll, k->sum_nll2, k->count);
	struct mau lb = mean_unc(k->sum_nll_base, k->sum_nll_base2, k->count);
	double ppl = exp(lp.mean), cov = covariance(k->sum_nll, k->sum_nll_base, k->sum_nll_nll_base, k->count);
	struct mau kl = mean_unc(k->sum_kld, k->sum_kld2, k->count);
	struct mau mse = mean_unc(k->sum_p_diff2, k->sum_p_diff4, k->count);
	double rms = sqrt(mse.mean), top = (double)k->n_same_top / k->count;
	printf("%4u", c + 1);
	printf("    %9.4lf ± %9.4lf", ppl, ppl * lp.unc);
	printf("    %10.5lf ± %10.5lf", lp.mean - lb.mean, sqrt(lp.unc * lp.unc + lb.unc * lb.unc - 2 * cov));
	printf("    %10.5lf ± %10.5lf", kl.mean, kl.unc);
	printf("    %6.3lf ± %6.3lf %%", 100.0 * rms, 100.0 * 0.5 / rms * mse.unc);
	printf("    %6.3lf ± %6.3lf %%", 100.0 * top, 100.0 * sqrt(top * (1 - top) / (k->count - 1)));
	printf("\n");
	fflush(stdout);
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

/* Of sorted v (n > 0,): llama.cpp's interpolated percentile. */
static float percentile(const float *v, size_t n, float fraction)
{
	if (fraction <= 0)
		return v[0];
	if (fraction >= 1)
		return v[n - 1];
	float pos = fraction * (n - 1);
	size_t ip = (size_t)pos;
	pos -= ip;
	return (1 - pos) * v[ip] + pos * v[ip + 1 < n ? ip + 1 : n - 1];
}

static float median(const float *v, size_t n)
{
	return n % 2 ? v[n / 2] : 0.5f * (v[n / 2] + v[n / 2 - 1]);
}

static void print_ppl_stats(const struct ppl_kld *k)
{
	struct mau lp = mean_unc(k->sum_nll, k->sum_nll2, k->count);
	struct mau lb = mean_unc(k->sum_nll_base, k->sum_nll_base2, k->count);
	double cov = covariance(k->sum_nll, k->sum_nll_base, k->sum_nll_nll_base, k->count);
	double ppl = exp(lp.mean), ppl_unc = ppl * lp.unc;
	double base = exp(lb.mean), base_unc = base * lb.unc;
	double ratio = lp.mean - lb.mean, ratio_unc = sqrt(lp.unc * lp.unc + lb.unc * lb.unc - 2 * cov);
	printf("====== Perplexity statistics ======\n");
	printf("Mean PPL(Q)                   : %10.6lf ± %10.6lf\n", ppl, ppl_unc);
	printf("Mean PPL(base)                : %10.6lf ± %10.6lf\n", base, base_unc);
	printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2lf%%\n", 100 * cov / (lp.unc * lb.unc));
	printf("Mean ln(PPL(Q)/PPL(base))     : %10.6lf ± %10.6lf\n", ratio, ratio_unc);
	printf("Mean PPL(Q)/PPL(base)         : %10.6lf ± %10.6lf\n", exp(ratio), exp(ratio) * ratio_unc);
	printf("Mean PPL(Q)-PPL(base)         : %10.6lf ± %10.6lf\n", ppl - base,
	       sqrt(ppl_unc * ppl_unc + base_unc * base_unc - 2 * ppl * base * cov));
	printf("\n");
}

static void print_kld_stats(const struct ppl_kld *k, const float *v, size_t n)
{
	static const struct { const char *label; float f; } pct[] = {
		{ "99.9%", 0.999f }, { "99.0%", 0.990f }, { "95.0%", 0.950f }, { "90.0%", 0.900f },
		{ "", -1 }, { "10.0%", 0.100f }, { " 5.0%", 0.050f }, { " 1.0%", 0.010f }, { " 0.1%", 0.001f },
	};
	struct mau kl = mean_unc(k->sum_kld, k->sum_kld2, k->count);
	printf("====== KL divergence statistics ======\n");
	printf("Mean    KLD: %10.6lf ± %10.6lf\n", kl.mean, kl.unc);
	printf("Maximum KLD: %10.6f\n", v[n - 1]);
	for (size_t i = 0; i < sizeof(pct) / sizeof(pct[0]); i++)
		if (pct[i].f < 0)
			printf("Median  KLD: %10.6f\n", median(v, n));
		else
			printf("%s   KLD: %10.6f\n", pct[i].label, percentile(v, n, pct[i].f));
	printf("Minimum KLD: %10.6f\n", v[0]);
	printf("\n");
}

static void print_p_diff_stats(const struct ppl_kld *k, const float *v, size_t n)
{
	static const struct { const char *label; float f; } pct[] = {
		{ "99.9%", 0.999f }, { "99.0%", 0.990f }, { "95.0%", 0.950f }, { "90.0%", 0.900f },
		{ "75.0%", 0.750f }, { "", -1 }, { "25.0%", 0.250f }, { "10.0%", 0.100f },
		{ " 5.0%", 0.050f }, { " 1.0%", 0.010f }, { " 0.1%", 0.001f },
	};
	struct mau pd = mean_unc(k->sum_p_diff, k->sum_p_diff2, k->count);
	struct mau mse = mean_unc(k->sum_p_diff2, k->sum_p_diff4, k->count);
	double rms = sqrt(mse.mean), top = (double)k->n_same_top / k->count;
	printf("====== Token probability statistics ======\n");
	printf("Mean    Δp: %6.3lf ± %5.3lf %%\n", 100.0 * pd.mean, 100.0 * pd.unc);
	printf("Maximum Δp: %6.3lf%%\n", 100.0 * v[n - 1]);
	for (size_t i = 0; i < sizeof(pct) / sizeof(pct[0]); i++)
		if (pct[i].f < 0)
			printf("Median  Δp: %6.3lf%%\n", 100.0 * median(v, n));
		else
			printf("%s   Δp: %6.3lf%%\n", pct[i].label, 100.0 * percentile(v, n, pct[i].f));
	printf("Minimum Δp: %6.3lf%%\n", 100.0 * v[0]);
	printf("RMS Δp    : %6.3lf ± %5.3lf %%\n", 100.0 * rms, 100.0 * 0.5 / rms * mse.unc);
	printf("Same top p: %6.3lf ± %5.3lf %%\n", 100.0 * top, 100.0 * sqrt(top * (1 - top) / (k->count - 1)));
}

/* After the table: the statistics, which llama.cpp prints only from 100 positions on. */
static void print_kld_final(struct ppl *p)
{
	printf("\n");
	size_t n = (size_t)p->k.count;
	if (n < 100) {
		fprintf(stderr, "kvd: %zu scored positions: the statistics need at least 100 (more --chunks "
			"or a longer --ctx for the base file)\n", n);
		return;
	}
	qsort(p->kld_values, n, sizeof(float), cmp_float);
	qsort(p->p_diff_values, n, sizeof(float), cmp_float);
	print_ppl_stats(&p->k);
	print_kld_stats(&p->k, p->kld_values, n);
	print_p_diff_stats(&p->k, p->p_diff_values, n);
}

/* ---- the run ---- */

int perplexity_mode(const struct kvd_options *o)
{
	return o->perplexity || o->kld;
}

/* n_ctx and the tokens: from the base file (--kl-divergence) or the text; the model's context set to it. */
static int setup_tokens(struct ppl *p, struct model *m)
{
	char err[256];
	uint32_t n_ctx = p->o->ppl_ctx ? p->o->ppl_ctx : PPL_DEFAULT_CTX;
	int rc;
	if (p->kld) {
		uint32_t file_ctx = 0;
		if ((rc = read_header(p, p->n_vocab, &file_ctx)))
			return rc;
		if (p->o->ppl_ctx && p->o->ppl_ctx != file_ctx) {
			fprintf(stderr, "kvd: %s was written with chunks of %u tokens, not --ctx %u: leave "
				"--ctx out to use the file's\n", p->base_path, file_ctx, p->o->ppl_ctx);
			return -EINVAL;
		}
		n_ctx = file_ctx;
	}
	if (n_ctx < PPL_MIN_CTX) {
		fprintf(stderr, "kvd: --ctx %u is too short a chunk: --perplexity needs %u or more\n", n_ctx,
			PPL_MIN_CTX);
		return -EINVAL;
	}
	if ((rc = model_set_ctx(m, n_ctx, err, sizeof(err)))) {
		fprintf(stderr, "kvd: %s\n", err);
		return rc;
	}
	p->n_ctx = n_ctx;
	if (!p->kld)
		return text_tokens(p, p->o->perplexity);
	uint32_t file_chunks = p->n_chunk;
	if (p->o->chunks && p->o->chunks < p->n_chunk)
		p->n_chunk = p->o->chunks;
	return read_tokens(p, file_chunks);
}

/* The buffers of one pass and of the statistics. */
static int alloc_buffers(struct ppl *p)
{
	uint32_t max = engine_max_rows(p->eng);
	size_t n = (size_t)p->n_chunk * ppl_scored(p->n_ctx);
	p->rows = calloc(max, sizeof(*p->rows));
	p->logits = malloc((size_t)max * p->n_vocab * sizeof(float));
	p->row = malloc(ppl_row_slots(p->n_vocab) * sizeof(uint16_t));
	if (p->kld) {
		p->kld_values = malloc(n * sizeof(float));
		p->p_diff_values = malloc(n * sizeof(float));
	}
	if (!p->rows || !p->logits || !p->row || (p->kld && (!p->kld_values || !p->p_diff_values))) {
		fprintf(stderr, "kvd: out of memory for the logits of %u positions\n", max);
		return -ENOMEM;
	}
	/* Values written between progress lines on one terminal would be wiped: they wait for the end. */
	if (!p->kld && p->tty && isatty(1) && !(p->values_f = open_memstream(&p->values, &p->values_len)))
		return -ENOMEM;
	return 0;
}

static int evaluate(struct ppl *p)
{
	int rc = 0;
	fprintf(stderr, "%s: calculating %s over %u chunks, n_ctx=%u, batch_size=%u\n",
		p->kld ? "kl_divergence" : "perplexity", p->kld ? "KL divergence" : "perplexity",
		p->n_chunk, p->n_ctx, engine_max_rows(p->eng));
	if (!p->kld && p->base_path && (rc = write_header(p)))
		return rc;
	p->t0 = log_now_ns();
	for (p->chunk = 0; p->chunk < p->n_chunk && !rc; p->chunk++) {
		rc = eval_chunk(p, p->chunk, p->kld ? score_kld : score_ppl);
		if (rc)
			break;
		if (p->chunk == 0) {
			double s = (double)(log_now_ns() - p->t0) * 1e-9, eta = s * p->n_chunk;
			erase_progress(p);
			fprintf(stderr, "%s: %.2f seconds per pass - ETA ", p->kld ? "kl_divergence" : "perplexity", s);
			if (eta >= 3600)
				fprintf(stderr, "%d hours ", (int)(eta / 3600));
			fprintf(stderr, "%.2f minutes\n", fmod(eta, 3600) / 60);
		}
		if (p->kld)
			print_kld_chunk(p, p->chunk);
		else
			print_running(p, p->chunk);
	}
	erase_progress(p);
	if (!rc && p->base && !p->kld && fflush(p->base))
		rc = io_error(p, "cannot write");
	return rc;
}

static void print_speed(const struct ppl *p, const struct backend *be)
{
	double s = (double)(log_now_ns() - p->t0) * 1e-9;
	uint64_t n = (uint64_t)p->n_chunk * p->n_ctx;
	fprintf(stderr, "kvd: %u chunks of %u tokens, %llu positions in %.3f s (%.1f tok/s), %u threads, %s backend\n",
		p->n_chunk, p->n_ctx, (unsigned long long)n, s, n / s, be->n_threads, be->ops->name);
}

static void ppl_free(struct ppl *p)
{
	if (p->values_f)
		fclose(p->values_f);
	free(p->values);
	free(p->kld_values);
	free(p->p_diff_values);
	free(p->row);
	free(p->logits);
	free(p->rows);
	free(p->tokens);
}

int perplexity_run(const struct kvd_options *o, struct model *m, struct backend *be,
		   oneshot_pool_fn make_pool)
{
	char err[256];
	struct tokenizer *tok;
	struct kvpool *pool = NULL;
	struct ppl p = { .o = o, .n_vocab = m->hp.vocab, .kld = o->kld, .base_path = o->kld_base,
			 .tty = isatty(2) };
	int rc = tokenizer_for_model(&tok, m, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "kvd: tokenizer: %s\n", err);
		return rc;
	}
	p.tok = tok;
	p.bos = tokenizer_add_bos(tok) ? tokenizer_bos(tok) : TOK_NONE;
	if ((rc = setup_tokens(&p, m)) || (rc = make_pool(o, m, be, p.n_ctx, &pool)))
		goto out;
	if ((rc = engine_create(&p.eng, m, be, pool, p.n_ctx < PPL_ROWS ? p.n_ctx : PPL_ROWS))) {
		fprintf(stderr, "kvd: cannot set up the engine: %s\n", strerror(-rc));
		goto out;
	}
	if ((rc = alloc_buffers(&p)) || (rc = evaluate(&p)))
		goto out;
	if (p.kld)
		print_kld_final(&p);
	else
		print_final(&p);
	print_speed(&p, be);
out:
	if (p.base && fclose(p.base) && !rc && !p.kld)
		rc = io_error(&p, "cannot write");
	/* A base file cut short by a failure would only be refused later: it goes. */
	if (rc && p.created)
		unlink(p.base_path);
	ppl_free(&p);
	engine_destroy(p.eng);
	if (pool)
		kvpool_destroy(pool);
	tokenizer_destroy(tok);
	return rc;
}
